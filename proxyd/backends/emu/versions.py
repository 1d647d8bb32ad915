"""The library versions the emulated backend reports (cublasGetVersion,
cusparseGetProperty, cudnnGetVersion, ...): those of NVIDIA's headers the
specs' prototypes were checked against (the CUDA 13 wheels: nvidia-cublas
13.10.0.20, nvidia-cusparse 12.9.4.2, nvidia-curand 10.4.5.25, nvidia-cufft
12.5.0.14, nvidia-cusolver 12.4.1.2, nvidia-cudnn-cu13 9.19.0), so a program
that compares a library's version with the header it was built against, as
JAX's plugin does at start, sees the same numbers on the emulated backend as
with those libraries on a GPU. Each encoded version follows its header's
macro:

  cublas_api.h    CUBLAS_VERSION   = major * 10000 + minor * 100 + patch
  cusparse.h      CUSPARSE_VERSION = major * 1000 + minor * 100 + patch
  curand.h        CURAND_VERSION   = major * 1000 + minor * 100 + patch
  cufft.h         CUFFT_VERSION    (a literal: 12500 for 12.5.0)
  cusolver_common.h CUSOLVER_VERSION = major * 1000 + minor * 100 + patch
  cudnn_version.h CUDNN_VERSION    = major * 10000 + minor * 100 + patch

tests/test_version_queries.py checks them against the headers where these
are installed. CUDART: the runtime the libraries were built for
(cuda_runtime_api.h CUDART_VERSION of CUDA 13.0).
"""
from __future__ import annotations

# api -> (major, minor, patch)
PROPERTIES = {"cublas": (13, 10, 0), "cublaslt": (13, 10, 0), "cusparse": (12, 9, 4), "curand": (10, 4, 5),
              "cufft": (12, 5, 0), "cusolver": (12, 4, 1), "cudnn": (9, 19, 0)}
_SCALE = {"cublas": 10000, "cublaslt": 10000, "cusparse": 1000, "curand": 1000, "cufft": 1000, "cusolver": 1000,
          "cudnn": 10000}
CUDART_VERSION = 13000


def version(api: str) -> int:
    """The library's encoded version, as its header's *_VERSION macro."""
    major, minor, patch = PROPERTIES[api]
    return major * _SCALE[api] + minor * 100 + patch


def prop(api: str, typ: int):
    """libraryPropertyType (library_types.h): MAJOR_VERSION 0, MINOR_VERSION 1,
    PATCH_LEVEL 2; None for any other value."""
    return PROPERTIES[api][typ] if 0 <= typ <= 2 else None
