"""Writes the library spec families (specs/cublas, specs/cublaslt, specs/nvml)
from NVIDIA's headers and, where installed, the real libraries' exports.

    python autogen/bootstrap.py --libraries [--lib-include DIR ...] [--lib-dir DIR ...] [--check]

The headers come from NVIDIA's PyPI wheels (nvidia-cublas for CUDA 13:
nvidia/cu13/include/cublas*.h; nvidia-nvml-dev: nvidia/cu13/include/nvml.h);
the real libraries from the same wheels (libcublas.so.13, libcublasLt.so.13)
or the driver (libnvidia-ml.so.1). Like bootstrap.py for the driver and the
runtime, it keeps every existing entry exactly as it is and appends what is
new with the next free id, `status: unsupported`; entries listed in
SUPPORTED below get their hand-written description when they are first
written. Each file also records, in `types`, the size, alignment and class
of every named type its prototypes use (asked of the compiler), so that the
build writes the shim's prototypes from the spec alone: `pip install .`
needs no NVIDIA wheel (docs/libraries.md).
"""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

try:
    from . import header as hdr
except ImportError:  # run as a script
    import header as hdr  # type: ignore

# api -> how its file is made. ids: the api's id range (autogen/specload.py).
LIBS = {
    "cublas": {
        "library": "libcublas.so.13", "header": "cublas.h", "own": ("cublas_api.h", "cublas.h"),
        "defines": [], "prefix": "cublas", "status_type": "cublasStatus_t",
        # cublas_api.h: CUBLAS_STATUS_SUCCESS 0, _NOT_SUPPORTED 15,
        # _EXECUTION_FAILED 13 (what a call answers when proxyd is gone),
        # _INVALID_VALUE 7 (what the shim answers for what it judges itself)
        "errors": {"success": 0, "not_supported": 15, "unavailable": 13, "invalid": 7},
    },
    "cublaslt": {
        "library": "libcublasLt.so.13", "header": "cublasLt.h", "own": ("cublasLt.h",),
        "defines": [], "prefix": "cublasLt", "status_type": "cublasStatus_t",
        "errors": {"success": 0, "not_supported": 15, "unavailable": 13, "invalid": 7},
    },
    "nvml": {
        # both the versioned names (nvmlInit_v2) and the old ones (nvmlInit),
        # which the library exports too (nvml.h, NVML_NO_UNVERSIONED_FUNC_DEFS)
        "library": "libnvidia-ml.so.1", "header": "nvml.h", "own": ("nvml.h",),
        "defines": ["-DNVML_NO_UNVERSIONED_FUNC_DEFS"], "prefix": "nvml", "status_type": "nvmlReturn_t",
        # nvml.h: NVML_SUCCESS 0, NVML_ERROR_NOT_SUPPORTED 3, NVML_ERROR_GPU_IS_LOST 15
        "errors": {"success": 0, "not_supported": 3, "unavailable": 15},
    },
    "cudnn": {
        # cuDNN 9 (nvidia-cudnn-cu13 wheel: nvidia/cudnn/include, lib):
        # libcudnn.so.9 is the front library that programs link; it exports
        # every function of the four headers and dlopens its sub-libraries
        # (libcudnn_graph/ops/cnn/adv/engines_*/heuristic.so.9) itself
        "library": "libcudnn.so.9", "header": "cudnn.h",
        "own": ("cudnn.h", "cudnn_graph.h", "cudnn_ops.h", "cudnn_cnn.h", "cudnn_adv.h"),
        "defines": [], "prefix": "cudnn", "status_type": "cudnnStatus_t",
        # cudnn_graph.h: CUDNN_STATUS_SUCCESS 0, _NOT_SUPPORTED 3000,
        # _EXECUTION_FAILED 5000 (what a call answers when proxyd is gone)
        "errors": {"success": 0, "not_supported": 3000, "unavailable": 5000},
    },
    # issue 12 part 2: cuFFT, cuRAND (host API), cuSPARSE, cuSOLVER. CUDA 13's
    # wheels (nvidia-cufft, -curand, -cusparse, -cusolver) keep the CUDA 12
    # sonames of these four: libcufft.so.12, libcurand.so.10, ...
    "cufft": {
        # cufftXt.h includes cufft.h; libtorch calls cufftXtMakePlanMany/cufftXtExec
        "library": "libcufft.so.12", "header": "cufftXt.h", "own": ("cufft.h", "cufftXt.h"),
        "defines": [], "prefix": "cufft", "status_type": "cufftResult",
        # cufft.h: CUFFT_SUCCESS 0, CUFFT_NOT_SUPPORTED 0x10, CUFFT_EXEC_FAILED 6
        "errors": {"success": 0, "not_supported": 16, "unavailable": 6},
    },
    "curand": {
        "library": "libcurand.so.10", "header": "curand.h", "own": ("curand.h",),
        "defines": [], "prefix": "curand", "status_type": "curandStatus_t",
        # curand.h has no not-supported code: CURAND_STATUS_ARCH_MISMATCH (204,
        # "GPU does not support requested feature") is the nearest;
        # CURAND_STATUS_LAUNCH_FAILURE 201 when proxyd is gone
        "errors": {"success": 0, "not_supported": 204, "unavailable": 201},
    },
    "cusparse": {
        "library": "libcusparse.so.12", "header": "cusparse.h", "own": ("cusparse.h",),
        "defines": [], "prefix": "cusparse", "status_type": "cusparseStatus_t",
        # cusparse.h: CUSPARSE_STATUS_NOT_SUPPORTED 10, _EXECUTION_FAILED 6
        "errors": {"success": 0, "not_supported": 10, "unavailable": 6},
    },
    "cusolver": {
        # the dense API (cusolverDn.h, with cusolver_common.h); the library's
        # sparse/refactorisation/multi-GPU exports are listed undeclared
        "library": "libcusolver.so.12", "header": "cusolverDn.h", "own": ("cusolverDn.h", "cusolver_common.h"),
        "defines": [], "prefix": "cusolver", "status_type": "cusolverStatus_t",
        # cusolver_common.h: CUSOLVER_STATUS_NOT_SUPPORTED 9, _EXECUTION_FAILED 6
        "errors": {"success": 0, "not_supported": 9, "unavailable": 6},
    },
    # issue 22: NCCL (nvidia-nccl-cu13 wheel: nvidia/nccl/include/nccl.h,
    # nvidia/nccl/lib/libnccl.so.2; exports unversioned, like NVML's)
    "nccl": {
        "library": "libnccl.so.2", "header": "nccl.h", "own": ("nccl.h",),
        "defines": [], "prefix": "nccl", "status_type": "ncclResult_t",
        # nccl.h has no not-supported code: ncclInvalidUsage (5) is the
        # nearest; ncclSystemError (2) when proxyd is gone; ncclInvalidArgument (4)
        "errors": {"success": 0, "not_supported": 5, "unavailable": 2, "invalid": 4},
    },
}
ID_RANGES = {"nccl": (47000, 47999), "cublas": (20000, 24999), "cublaslt": (25000, 26999), "nvml": (27000, 29999),
             "cudnn": (30000, 31999), "cufft": (40000, 40999), "curand": (41000, 41999),
             "cusparse": (42000, 43999), "cusolver": (44000, 46999)}

# opaque handle typedefs -> object kind (docs/spec-format.md, kinds)
HANDLE_KINDS = {
    "cublasHandle_t": "cublas_handle",
    "cublasLtHandle_t": "cublaslt_handle",
    "cublasLtMatmulDesc_t": "cublaslt_matmul_desc",
    "cublasLtMatrixLayout_t": "cublaslt_layout",
    "cublasLtMatmulPreference_t": "cublaslt_preference",
    "cublasLtMatrixTransformDesc_t": "cublaslt_transform_desc",
    "cublasLtEmulationDesc_t": "cublaslt_emulation_desc",
    "cudaStream_t": "stream",
    "nvmlDevice_t": "nvml_device",
    "nvmlUnit_t": "nvml_unit",
    "nvmlEventSet_t": "nvml_event_set",
    "nvmlSystemEventSet_t": "nvml_event_set",
    "nvmlGpuInstance_t": "nvml_gpu_instance",
    "nvmlComputeInstance_t": "nvml_compute_instance",
    "nvmlGpmSample_t": "nvml_gpm_sample",
    "cudnnHandle_t": "cudnn_handle",
    "cudnnBackendDescriptor_t": "cudnn_backend_desc",
    # cufftHandle is an int (cufft.h): the plan's session id, not (kind << 32) | id
    "cufftHandle": "cufft_plan",
    "curandGenerator_t": "curand_generator",
    "cusparseHandle_t": "cusparse_handle",
    "cusparseSpMatDescr_t": "cusparse_spmat", "cusparseConstSpMatDescr_t": "cusparse_spmat",
    "cusparseDnVecDescr_t": "cusparse_dnvec", "cusparseConstDnVecDescr_t": "cusparse_dnvec",
    "cusparseDnMatDescr_t": "cusparse_dnmat", "cusparseConstDnMatDescr_t": "cusparse_dnmat",
    "cusparseSpVecDescr_t": "cusparse_spvec", "cusparseConstSpVecDescr_t": "cusparse_spvec",
    "cusolverDnHandle_t": "cusolver_dn_handle",
    "cusolverDnParams_t": "cusolver_dn_params",
    "syevjInfo_t": "cusolver_syevj_info",
    "gesvdjInfo_t": "cusolver_gesvdj_info",
    "ncclComm_t": "nccl_comm",
    "ncclWindow_t": "nccl_window",
}


def handle_kind(t: str):
    """The object kind of an opaque handle type, or None. cuDNN's legacy
    descriptors (cudnnTensorDescriptor_t, cudnnFilterDescriptor_t, ...:
    cudnn_ops.h, cudnn_cnn.h, cudnn_adv.h) share one kind, cudnn_desc."""
    t = base_type(t)
    if t in HANDLE_KINDS:
        return HANDLE_KINDS[t]
    if re.fullmatch(r"cudnn\w+Descriptor_t", t):
        return "cudnn_desc"
    return None
BUILTIN = {"void", "char", "signed char", "unsigned char", "short", "unsigned short", "int", "unsigned int",
           "long", "unsigned long", "long long", "unsigned long long", "float", "double", "size_t",
           "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t"}
C_WORDS = {"char", "short", "int", "long", "signed", "unsigned", "float", "double", "void"}
NUMERIC_ELEM = {"float": "sizeof(float)", "double": "sizeof(double)", "cuComplex": "sizeof(cuComplex)",
                "cuDoubleComplex": "sizeof(cuDoubleComplex)", "__half": "sizeof(__half)", "int": "sizeof(int)"}

# ----------------------------------------------------------------- supported
# Hand descriptions of the supported functions, written when an entry is new
# (later edits live in the YAML). Param roles: name=role[:kind][@size]; a
# scalar_ptr's size is the host value's size and `mode` (in the YAML) the C
# expression that is true when the pointer is a device pointer.
H = "handle=handle:cublas_handle"
DH = "handle=handle:cudnn_handle"
LH = "lightHandle=handle:cublaslt_handle"


def _cub_gemm_scalar(ty):
    return (f"alpha=scalar_ptr@sizeof({ty})", f"beta=scalar_ptr@sizeof({ty})")


def _object(key=None):
    return {"rule": "object", "key": key} if key else "object"


NONE_SYNC = {"rule": "none-needed", "why": "synchronisation: a dump synchronises every context first"}
# ---- cuFFT, cuRAND, cuSPARSE, cuSOLVER (issue 12 part 2; docs/libraries.md).
# What PyTorch 2.11 (libtorch_cuda.so, libtorch_cuda_linalg.so: nm -D -u)
# and CuPy 14 (cupy_backends/cuda/libs) call first. Execution calls that
# return nothing to the host are asynchronous; workspace-size queries and
# handle creation are synchronous.
P = "plan=handle:cufft_plan"
G = "generator=handle:curand_generator"
SH = "handle=handle:cusparse_handle"
DH = "handle=handle:cusolver_dn_handle"
_EXEC = {"objects": "cufft_plan:use", "restore": "memory", "sync": False}
_GEN = {"objects": "curand_generator:use", "restore": "memory", "sync": False}
_SP_SCALAR = "scalar_ptr@gp_data_type_size(computeType)"


def _int_arr(n, elem="int"):
    return f"in_buffer@{n} * sizeof({elem})"


MATH_SUPPORTED: Dict[str, Dict] = {
    # --- cuFFT (cufft.h, cufftXt.h). Plans are created in the worker's
    # current context: cufftCreate/cufftPlan* make sure the app has one.
    "cufftCreate": {"params": ["handle=out_value:cufft_plan"], "objects": "cufft_plan:create",
                    "restore": "object", "shim": "override"},
    "cufftDestroy": {"params": [P], "objects": "cufft_plan:destroy", "restore": "object"},
    "cufftPlan1d": {"params": ["plan=out_value:cufft_plan", "nx=scalar", "type=scalar", "batch=scalar"],
                    "objects": "cufft_plan:create", "restore": "object", "shim": "override"},
    "cufftPlan2d": {"params": ["plan=out_value:cufft_plan", "nx=scalar", "ny=scalar", "type=scalar"],
                    "objects": "cufft_plan:create", "restore": "object", "shim": "override"},
    "cufftPlanMany": {"params": ["plan=out_value:cufft_plan", "rank=scalar", "n=" + _int_arr("rank"),
                                 "inembed=" + _int_arr("rank"), "istride=scalar", "idist=scalar",
                                 "onembed=" + _int_arr("rank"), "ostride=scalar", "odist=scalar", "type=scalar",
                                 "batch=scalar"],
                      "objects": "cufft_plan:create", "restore": "object", "shim": "override"},
    # MakePlan* configure a plan made by cufftCreate: settings of the plan,
    # replayed on restore after the ones made before them (SetAutoAllocation)
    "cufftMakePlan1d": {"params": [P, "nx=scalar", "type=scalar", "batch=scalar", "workSize=out_value"],
                        "objects": "cufft_plan:use", "restore": _object(["plan"])},
    "cufftMakePlanMany": {"params": [P, "rank=scalar", "n=" + _int_arr("rank"), "inembed=" + _int_arr("rank"),
                                     "istride=scalar", "idist=scalar", "onembed=" + _int_arr("rank"),
                                     "ostride=scalar", "odist=scalar", "type=scalar", "batch=scalar",
                                     "workSize=out_value"],
                          "objects": "cufft_plan:use", "restore": _object(["plan"])},
    "cufftMakePlanMany64": {"params": [P, "rank=scalar", "n=" + _int_arr("rank", "long long"),
                                       "inembed=" + _int_arr("rank", "long long"), "istride=scalar",
                                       "idist=scalar", "onembed=" + _int_arr("rank", "long long"),
                                       "ostride=scalar", "odist=scalar", "type=scalar", "batch=scalar",
                                       "workSize=out_value"],
                            "objects": "cufft_plan:use", "restore": _object(["plan"])},
    "cufftXtMakePlanMany": {"params": [P, "rank=scalar", "n=" + _int_arr("rank", "long long"),
                                       "inembed=" + _int_arr("rank", "long long"), "istride=scalar",
                                       "idist=scalar", "inputtype=scalar", "onembed=" + _int_arr("rank", "long long"),
                                       "ostride=scalar", "odist=scalar", "outputtype=scalar", "batch=scalar",
                                       "workSize=out_value", "executiontype=scalar"],
                            "objects": "cufft_plan:use", "restore": _object(["plan"])},
    "cufftGetSize": {"params": ["handle=handle:cufft_plan", "workSize=out_value"], "objects": "cufft_plan:use",
                     "restore": "query"},
    "cufftSetWorkArea": {"params": [P, "workArea=device_ptr"], "objects": "cufft_plan:use",
                         "restore": _object(["plan"])},
    "cufftSetAutoAllocation": {"params": [P, "autoAllocate=scalar"], "objects": "cufft_plan:use",
                               "restore": _object(["plan"])},
    "cufftSetStream": {"params": [P, "stream=handle:stream"], "objects": "cufft_plan:use stream:use",
                       "restore": _object(["plan"])},
    "cufftExecC2C": {"params": [P, "idata=device_ptr", "odata=device_ptr", "direction=scalar"], **_EXEC},
    "cufftExecR2C": {"params": [P, "idata=device_ptr", "odata=device_ptr"], **_EXEC},
    "cufftExecC2R": {"params": [P, "idata=device_ptr", "odata=device_ptr"], **_EXEC},
    "cufftExecZ2Z": {"params": [P, "idata=device_ptr", "odata=device_ptr", "direction=scalar"], **_EXEC},
    "cufftExecD2Z": {"params": [P, "idata=device_ptr", "odata=device_ptr"], **_EXEC},
    "cufftExecZ2D": {"params": [P, "idata=device_ptr", "odata=device_ptr"], **_EXEC},
    "cufftXtExec": {"params": [P, "input=device_ptr", "output=device_ptr", "direction=scalar"], **_EXEC},
    "cufftGetVersion": {"params": ["version=out_value"], "restore": "query"},
    "cufftGetProperty": {"params": ["type=scalar", "value=out_value"], "restore": "query"},
    # --- cuRAND host API (curand.h). The generator's position is restored
    # from its seed, its offset and the count of numbers generated since
    # (proxyd/families/libraries.py, curand_position).
    "curandCreateGenerator": {"params": ["generator=out_value:curand_generator", "rng_type=scalar"],
                              "objects": "curand_generator:create", "restore": "object", "shim": "override"},
    "curandDestroyGenerator": {"params": [G], "objects": "curand_generator:destroy", "restore": "object"},
    "curandGetVersion": {"params": ["version=out_value"], "restore": "query"},
    "curandGetProperty": {"params": ["type=scalar", "value=out_value"], "restore": "query"},
    "curandSetStream": {"params": [G, "stream=handle:stream"], "objects": "curand_generator:use stream:use",
                        "restore": _object(["generator"])},
    "curandSetPseudoRandomGeneratorSeed": {"params": [G, "seed=scalar"], "objects": "curand_generator:use",
                                           "restore": _object(["generator"])},
    "curandSetGeneratorOffset": {"params": [G, "offset=scalar"], "objects": "curand_generator:use",
                                 "restore": _object(["generator"])},
    "curandSetGeneratorOrdering": {"params": [G, "order=scalar"], "objects": "curand_generator:use",
                                   "restore": _object(["generator"])},
    "curandSetQuasiRandomGeneratorDimensions": {"params": [G, "num_dimensions=scalar"],
                                                "objects": "curand_generator:use",
                                                "restore": _object(["generator"])},
    "curandGenerate": {"params": [G, "outputPtr=device_ptr", "num=scalar"], **_GEN},
    "curandGenerateLongLong": {"params": [G, "outputPtr=device_ptr", "num=scalar"], **_GEN},
    "curandGenerateUniform": {"params": [G, "outputPtr=device_ptr", "num=scalar"], **_GEN},
    "curandGenerateUniformDouble": {"params": [G, "outputPtr=device_ptr", "num=scalar"], **_GEN},
    "curandGenerateNormal": {"params": [G, "outputPtr=device_ptr", "n=scalar", "mean=scalar", "stddev=scalar"],
                             **_GEN},
    "curandGenerateNormalDouble": {"params": [G, "outputPtr=device_ptr", "n=scalar", "mean=scalar",
                                              "stddev=scalar"], **_GEN},
    "curandGenerateLogNormal": {"params": [G, "outputPtr=device_ptr", "n=scalar", "mean=scalar",
                                           "stddev=scalar"], **_GEN},
    "curandGenerateLogNormalDouble": {"params": [G, "outputPtr=device_ptr", "n=scalar", "mean=scalar",
                                                 "stddev=scalar"], **_GEN},
    "curandGeneratePoisson": {"params": [G, "outputPtr=device_ptr", "n=scalar", "lambda=scalar"], **_GEN},
    # --- cuSPARSE (cusparse.h): handle, generic-API descriptors, SpMV/SpMM
    "cusparseCreate": {"params": ["handle=out_value:cusparse_handle"], "objects": "cusparse_handle:create",
                       "restore": "object", "shim": "override"},
    "cusparseDestroy": {"params": [SH], "objects": "cusparse_handle:destroy", "restore": "object",
                        "shim": "override"},
    "cusparseGetVersion": {"params": [SH, "version=out_value"], "objects": "cusparse_handle:use",
                           "restore": "query"},
    # cusparse.h: names and descriptions of cusparseStatus_t, answered in the app
    "cusparseGetErrorName": {"params": ["status=scalar"], "restore": "client", "shim": "override"},
    "cusparseGetErrorString": {"params": ["status=scalar"], "restore": "client", "shim": "override"},
    "cusparseSetStream": {"params": [SH, "streamId=handle:stream"], "objects": "cusparse_handle:use stream:use",
                          "restore": _object(["handle"])},
    "cusparseGetStream": {"params": [SH, "streamId=out_value:stream"], "objects": "cusparse_handle:use",
                          "restore": "query"},
    "cusparseSetPointerMode": {"params": [SH, "mode=scalar"], "objects": "cusparse_handle:use",
                               "restore": _object(["handle"]), "shim": "override"},
    "cusparseGetPointerMode": {"params": [SH, "mode=out_value"], "objects": "cusparse_handle:use",
                               "restore": "query"},
    "cusparseCreateCsr": {"params": ["spMatDescr=out_value:cusparse_spmat", "rows=scalar", "cols=scalar",
                                     "nnz=scalar", "csrRowOffsets=device_ptr", "csrColInd=device_ptr",
                                     "csrValues=device_ptr", "csrRowOffsetsType=scalar", "csrColIndType=scalar",
                                     "idxBase=scalar", "valueType=scalar"],
                          "objects": "cusparse_spmat:create", "restore": "object"},
    "cusparseCsrSetPointers": {"params": ["spMatDescr=handle:cusparse_spmat", "csrRowOffsets=device_ptr",
                                          "csrColInd=device_ptr", "csrValues=device_ptr"],
                               "objects": "cusparse_spmat:use", "restore": _object(["spMatDescr"])},
    "cusparseDestroySpMat": {"params": ["spMatDescr=handle:cusparse_spmat"], "objects": "cusparse_spmat:destroy",
                             "restore": "object"},
    "cusparseCreateDnVec": {"params": ["dnVecDescr=out_value:cusparse_dnvec", "size=scalar", "values=device_ptr",
                                       "valueType=scalar"], "objects": "cusparse_dnvec:create",
                            "restore": "object"},
    "cusparseDnVecSetValues": {"params": ["dnVecDescr=handle:cusparse_dnvec", "values=device_ptr"],
                               "objects": "cusparse_dnvec:use", "restore": _object(["dnVecDescr"])},
    "cusparseDestroyDnVec": {"params": ["dnVecDescr=handle:cusparse_dnvec"], "objects": "cusparse_dnvec:destroy",
                             "restore": "object"},
    "cusparseCreateDnMat": {"params": ["dnMatDescr=out_value:cusparse_dnmat", "rows=scalar", "cols=scalar",
                                       "ld=scalar", "values=device_ptr", "valueType=scalar", "order=scalar"],
                            "objects": "cusparse_dnmat:create", "restore": "object"},
    "cusparseDestroyDnMat": {"params": ["dnMatDescr=handle:cusparse_dnmat"], "objects": "cusparse_dnmat:destroy",
                             "restore": "object"},
    "cusparseSpMV_bufferSize": {"params": [SH, "opA=scalar", "alpha=" + _SP_SCALAR, "matA=handle:cusparse_spmat",
                                           "vecX=handle:cusparse_dnvec", "beta=" + _SP_SCALAR,
                                           "vecY=handle:cusparse_dnvec", "computeType=scalar", "alg=scalar",
                                           "bufferSize=out_value"],
                                "objects": "cusparse_handle:use cusparse_spmat:use cusparse_dnvec:use",
                                "restore": "query"},
    "cusparseSpMV": {"params": [SH, "opA=scalar", "alpha=" + _SP_SCALAR, "matA=handle:cusparse_spmat",
                                "vecX=handle:cusparse_dnvec", "beta=" + _SP_SCALAR, "vecY=handle:cusparse_dnvec",
                                "computeType=scalar", "alg=scalar", "externalBuffer=device_ptr"],
                     "objects": "cusparse_handle:use cusparse_spmat:use cusparse_dnvec:use",
                     "restore": "memory", "sync": False},
    "cusparseSpMM_bufferSize": {"params": [SH, "opA=scalar", "opB=scalar", "alpha=" + _SP_SCALAR,
                                           "matA=handle:cusparse_spmat", "matB=handle:cusparse_dnmat",
                                           "beta=" + _SP_SCALAR, "matC=handle:cusparse_dnmat", "computeType=scalar",
                                           "alg=scalar", "bufferSize=out_value"],
                                "objects": "cusparse_handle:use cusparse_spmat:use cusparse_dnmat:use",
                                "restore": "query"},
    "cusparseSpMM": {"params": [SH, "opA=scalar", "opB=scalar", "alpha=" + _SP_SCALAR,
                                "matA=handle:cusparse_spmat", "matB=handle:cusparse_dnmat", "beta=" + _SP_SCALAR,
                                "matC=handle:cusparse_dnmat", "computeType=scalar", "alg=scalar",
                                "externalBuffer=device_ptr"],
                     "objects": "cusparse_handle:use cusparse_spmat:use cusparse_dnmat:use",
                     "restore": "memory", "sync": False},
    # --- cuSOLVER dense (cusolverDn.h): Cholesky and LU, legacy and 64-bit API
    "cusolverGetVersion": {"params": ["version=out_value"], "restore": "query"},
    "cusolverGetProperty": {"params": ["type=scalar", "value=out_value"], "restore": "query"},
    "cusolverDnCreate": {"params": ["handle=out_value:cusolver_dn_handle"], "objects": "cusolver_dn_handle:create",
                         "restore": "object", "shim": "override"},
    "cusolverDnDestroy": {"params": [DH], "objects": "cusolver_dn_handle:destroy", "restore": "object"},
    "cusolverDnSetStream": {"params": [DH, "streamId=handle:stream"],
                            "objects": "cusolver_dn_handle:use stream:use", "restore": _object(["handle"])},
    "cusolverDnGetStream": {"params": [DH, "streamId=out_value:stream"], "objects": "cusolver_dn_handle:use",
                            "restore": "query"},
    "cusolverDnCreateParams": {"params": ["params=out_value:cusolver_dn_params"],
                               "objects": "cusolver_dn_params:create", "restore": "object"},
    "cusolverDnDestroyParams": {"params": ["params=handle:cusolver_dn_params"],
                                "objects": "cusolver_dn_params:destroy", "restore": "object"},
    "cusolverDnXpotrf_bufferSize": {
        "params": [DH, "params=handle:cusolver_dn_params", "uplo=scalar", "n=scalar", "dataTypeA=scalar",
                   "A=device_ptr", "lda=scalar", "computeType=scalar", "workspaceInBytesOnDevice=out_value",
                   "workspaceInBytesOnHost=out_value"],
        "objects": "cusolver_dn_handle:use cusolver_dn_params:use", "restore": "query"},
    # bufferOnHost is scratch (cusolverDn.h): the worker passes its own copy
    "cusolverDnXpotrf": {
        "params": [DH, "params=handle:cusolver_dn_params", "uplo=scalar", "n=scalar", "dataTypeA=scalar",
                   "A=device_ptr", "lda=scalar", "computeType=scalar", "bufferOnDevice=device_ptr",
                   "workspaceInBytesOnDevice=scalar", "bufferOnHost=in_buffer@workspaceInBytesOnHost",
                   "workspaceInBytesOnHost=scalar", "info=device_ptr"],
        "objects": "cusolver_dn_handle:use cusolver_dn_params:use", "restore": "memory", "sync": False},
    "cusolverDnXpotrs": {
        "params": [DH, "params=handle:cusolver_dn_params", "uplo=scalar", "n=scalar", "nrhs=scalar",
                   "dataTypeA=scalar", "A=device_ptr", "lda=scalar", "dataTypeB=scalar", "B=device_ptr",
                   "ldb=scalar", "info=device_ptr"],
        "objects": "cusolver_dn_handle:use cusolver_dn_params:use", "restore": "memory", "sync": False},
}
for _t, _ty in (("S", "float"), ("D", "double")):
    MATH_SUPPORTED.update({
        f"cusolverDn{_t}potrf_bufferSize": {"params": [DH, "uplo=scalar", "n=scalar", "A=device_ptr", "lda=scalar",
                                                       "Lwork=out_value"],
                                            "objects": "cusolver_dn_handle:use", "restore": "query"},
        f"cusolverDn{_t}potrf": {"params": [DH, "uplo=scalar", "n=scalar", "A=device_ptr", "lda=scalar",
                                            "Workspace=device_ptr", "Lwork=scalar", "devInfo=device_ptr"],
                                 "objects": "cusolver_dn_handle:use", "restore": "memory", "sync": False},
        f"cusolverDn{_t}potrs": {"params": [DH, "uplo=scalar", "n=scalar", "nrhs=scalar", "A=device_ptr",
                                            "lda=scalar", "B=device_ptr", "ldb=scalar", "devInfo=device_ptr"],
                                 "objects": "cusolver_dn_handle:use", "restore": "memory", "sync": False},
        f"cusolverDn{_t}getrf_bufferSize": {"params": [DH, "m=scalar", "n=scalar", "A=device_ptr", "lda=scalar",
                                                       "Lwork=out_value"],
                                            "objects": "cusolver_dn_handle:use", "restore": "query"},
        f"cusolverDn{_t}getrf": {"params": [DH, "m=scalar", "n=scalar", "A=device_ptr", "lda=scalar",
                                            "Workspace=device_ptr", "devIpiv=device_ptr", "devInfo=device_ptr"],
                                 "objects": "cusolver_dn_handle:use", "restore": "memory", "sync": False},
        f"cusolverDn{_t}getrs": {"params": [DH, "trans=scalar", "n=scalar", "nrhs=scalar", "A=device_ptr",
                                            "lda=scalar", "devIpiv=device_ptr", "B=device_ptr", "ldb=scalar",
                                            "devInfo=device_ptr"],
                                 "objects": "cusolver_dn_handle:use", "restore": "memory", "sync": False},
    })


SUPPORTED: Dict[str, Dict] = {
    # --- cuBLAS handles and their settings (cublas_api.h, "cuBLAS Helper Function Reference")
    "cublasCreate_v2": {"params": ["handle=out_value:cublas_handle"], "objects": "cublas_handle:create",
                        "restore": "object", "shim": "override"},
    "cublasDestroy_v2": {"params": [H], "objects": "cublas_handle:destroy", "restore": "object",
                         "shim": "override"},
    "cublasGetVersion_v2": {"params": [H, "version=out_value"], "objects": "cublas_handle:use", "restore": "query"},
    "cublasGetProperty": {"params": ["type=scalar", "value=out_value"], "restore": "query"},
    "cublasGetCudartVersion": {"params": [], "restore": "query"},
    "cublasSetStream_v2": {"params": [H, "streamId=handle:stream"], "objects": "cublas_handle:use stream:use",
                           "restore": _object(["handle"])},
    "cublasGetStream_v2": {"params": [H, "streamId=out_value:stream"], "objects": "cublas_handle:use",
                           "restore": "query"},
    "cublasSetWorkspace_v2": {"params": [H, "workspace=device_ptr", "workspaceSizeInBytes=scalar"],
                              "objects": "cublas_handle:use", "restore": _object(["handle"])},
    "cublasSetMathMode": {"params": [H, "mode=scalar"], "objects": "cublas_handle:use",
                          "restore": _object(["handle"])},
    "cublasGetMathMode": {"params": [H, "mode=out_value"], "objects": "cublas_handle:use", "restore": "query"},
    "cublasSetPointerMode_v2": {"params": [H, "mode=scalar"], "objects": "cublas_handle:use",
                                "restore": _object(["handle"]), "shim": "override"},
    "cublasGetPointerMode_v2": {"params": [H, "mode=out_value"], "objects": "cublas_handle:use",
                                "restore": "query"},
    "cublasSetAtomicsMode": {"params": [H, "mode=scalar"], "objects": "cublas_handle:use",
                             "restore": _object(["handle"])},
    "cublasGetAtomicsMode": {"params": [H, "mode=out_value"], "objects": "cublas_handle:use",
                             "restore": "query"},
    "cublasGetStatusName": {"params": ["status=scalar"], "restore": "client", "shim": "override"},
    "cublasGetStatusString": {"params": ["status=scalar"], "restore": "client", "shim": "override"},
    # --- gemm (asynchronous, like a kernel launch)
    "cublasSgemm_v2": {"params": [H, "transa=scalar", "transb=scalar", "m=scalar", "n=scalar", "k=scalar",
                                  "alpha=scalar_ptr@sizeof(float)", "A=device_ptr", "lda=scalar", "B=device_ptr",
                                  "ldb=scalar", "beta=scalar_ptr@sizeof(float)", "C=device_ptr", "ldc=scalar"],
                       "objects": "cublas_handle:use", "restore": "memory", "sync": False},
    "cublasDgemm_v2": {"params": [H, "transa=scalar", "transb=scalar", "m=scalar", "n=scalar", "k=scalar",
                                  "alpha=scalar_ptr@sizeof(double)", "A=device_ptr", "lda=scalar", "B=device_ptr",
                                  "ldb=scalar", "beta=scalar_ptr@sizeof(double)", "C=device_ptr", "ldc=scalar"],
                       "objects": "cublas_handle:use", "restore": "memory", "sync": False},
    "cublasGemmEx": {"params": [H, "transa=scalar", "transb=scalar", "m=scalar", "n=scalar", "k=scalar",
                                "alpha=scalar_ptr@gp_cublas_scalar_size(computeType, Ctype)", "A=device_ptr",
                                "Atype=scalar", "lda=scalar", "B=device_ptr", "Btype=scalar", "ldb=scalar",
                                "beta=scalar_ptr@gp_cublas_scalar_size(computeType, Ctype)", "C=device_ptr",
                                "Ctype=scalar", "ldc=scalar", "computeType=scalar", "algo=scalar"],
                     "objects": "cublas_handle:use", "restore": "memory", "sync": False},
    "cublasSgemmStridedBatched": {"params": [H, "transa=scalar", "transb=scalar", "m=scalar", "n=scalar", "k=scalar",
                                             "alpha=scalar_ptr@sizeof(float)", "A=device_ptr", "lda=scalar",
                                             "strideA=scalar", "B=device_ptr", "ldb=scalar", "strideB=scalar",
                                             "beta=scalar_ptr@sizeof(float)", "C=device_ptr", "ldc=scalar",
                                             "strideC=scalar", "batchCount=scalar"],
                                  "objects": "cublas_handle:use", "restore": "memory", "sync": False},
    "cublasDgemmStridedBatched": {"params": [H, "transa=scalar", "transb=scalar", "m=scalar", "n=scalar", "k=scalar",
                                             "alpha=scalar_ptr@sizeof(double)", "A=device_ptr", "lda=scalar",
                                             "strideA=scalar", "B=device_ptr", "ldb=scalar", "strideB=scalar",
                                             "beta=scalar_ptr@sizeof(double)", "C=device_ptr", "ldc=scalar",
                                             "strideC=scalar", "batchCount=scalar"],
                                  "objects": "cublas_handle:use", "restore": "memory", "sync": False},
    "cublasGemmStridedBatchedEx": {"params": [H, "transa=scalar", "transb=scalar", "m=scalar", "n=scalar",
                                              "k=scalar", "alpha=scalar_ptr@gp_cublas_scalar_size(computeType, Ctype)",
                                              "A=device_ptr", "Atype=scalar", "lda=scalar", "strideA=scalar",
                                              "B=device_ptr", "Btype=scalar", "ldb=scalar", "strideB=scalar",
                                              "beta=scalar_ptr@gp_cublas_scalar_size(computeType, Ctype)",
                                              "C=device_ptr", "Ctype=scalar", "ldc=scalar", "strideC=scalar",
                                              "batchCount=scalar", "computeType=scalar", "algo=scalar"],
                                   "objects": "cublas_handle:use", "restore": "memory", "sync": False},
    # --- cuBLASLt (cublasLt.h)
    "cublasLtCreate": {"params": ["lightHandle=out_value:cublaslt_handle"], "objects": "cublaslt_handle:create",
                       "restore": "object", "shim": "override"},
    "cublasLtDestroy": {"params": [LH], "objects": "cublaslt_handle:destroy", "restore": "object"},
    "cublasLtGetVersion": {"params": [], "restore": "query"},
    "cublasLtGetCudartVersion": {"params": [], "restore": "query"},
    "cublasLtGetProperty": {"params": ["type=scalar", "value=out_value"], "restore": "query"},
    "cublasLtGetStatusName": {"params": ["status=scalar"], "restore": "client", "shim": "override"},
    "cublasLtGetStatusString": {"params": ["status=scalar"], "restore": "client", "shim": "override"},
    "cublasLtMatmulDescCreate": {"params": ["matmulDesc=out_value:cublaslt_matmul_desc", "computeType=scalar",
                                            "scaleType=scalar"], "objects": "cublaslt_matmul_desc:create",
                                 "restore": "object", "shim": "override"},
    "cublasLtMatmulDescDestroy": {"params": ["matmulDesc=handle:cublaslt_matmul_desc"],
                                  "objects": "cublaslt_matmul_desc:destroy", "restore": "object",
                                  "shim": "override"},
    "cublasLtMatmulDescSetAttribute": {"params": ["matmulDesc=handle:cublaslt_matmul_desc", "attr=scalar",
                                                  "buf=in_buffer@sizeInBytes", "sizeInBytes=scalar"],
                                       "objects": "cublaslt_matmul_desc:use",
                                       "restore": _object(["matmulDesc", "attr"]), "shim": "override"},
    "cublasLtMatmulDescGetAttribute": {"params": ["matmulDesc=handle:cublaslt_matmul_desc", "attr=scalar",
                                                  "buf=out_buffer@sizeInBytes", "sizeInBytes=scalar",
                                                  "sizeWritten=out_value"],
                                       "objects": "cublaslt_matmul_desc:use", "restore": "query"},
    "cublasLtMatrixLayoutCreate": {"params": ["matLayout=out_value:cublaslt_layout", "type=scalar", "rows=scalar",
                                              "cols=scalar", "ld=scalar"], "objects": "cublaslt_layout:create",
                                   "restore": "object"},
    "cublasLtMatrixLayoutDestroy": {"params": ["matLayout=handle:cublaslt_layout"],
                                    "objects": "cublaslt_layout:destroy", "restore": "object"},
    "cublasLtMatrixLayoutSetAttribute": {"params": ["matLayout=handle:cublaslt_layout", "attr=scalar",
                                                    "buf=in_buffer@sizeInBytes", "sizeInBytes=scalar"],
                                         "objects": "cublaslt_layout:use",
                                         "restore": _object(["matLayout", "attr"])},
    "cublasLtMatrixLayoutGetAttribute": {"params": ["matLayout=handle:cublaslt_layout", "attr=scalar",
                                                    "buf=out_buffer@sizeInBytes", "sizeInBytes=scalar",
                                                    "sizeWritten=out_value"],
                                         "objects": "cublaslt_layout:use", "restore": "query"},
    "cublasLtMatmulPreferenceCreate": {"params": ["pref=out_value:cublaslt_preference"],
                                       "objects": "cublaslt_preference:create", "restore": "object"},
    "cublasLtMatmulPreferenceDestroy": {"params": ["pref=handle:cublaslt_preference"],
                                        "objects": "cublaslt_preference:destroy", "restore": "object"},
    "cublasLtMatmulPreferenceSetAttribute": {"params": ["pref=handle:cublaslt_preference", "attr=scalar",
                                                        "buf=in_buffer@sizeInBytes", "sizeInBytes=scalar"],
                                             "objects": "cublaslt_preference:use",
                                             "restore": _object(["pref", "attr"])},
    "cublasLtMatmulAlgoGetHeuristic": {
        "params": [LH, "operationDesc=handle:cublaslt_matmul_desc", "Adesc=handle:cublaslt_layout",
                   "Bdesc=handle:cublaslt_layout", "Cdesc=handle:cublaslt_layout", "Ddesc=handle:cublaslt_layout",
                   "preference=handle:cublaslt_preference", "requestedAlgoCount=scalar",
                   "heuristicResultsArray=out_buffer@requestedAlgoCount * sizeof(cublasLtMatmulHeuristicResult_t)",
                   "returnAlgoCount=out_value"],
        "objects": "cublaslt_handle:use cublaslt_matmul_desc:use cublaslt_layout:use cublaslt_preference:use",
        "restore": "query"},
    "cublasLtMatmul": {
        "params": [LH, "computeDesc=handle:cublaslt_matmul_desc",
                   "alpha=scalar_ptr@gp_lt_scale_size(computeDesc)", "A=device_ptr", "Adesc=handle:cublaslt_layout",
                   "B=device_ptr", "Bdesc=handle:cublaslt_layout", "beta=scalar_ptr@gp_lt_scale_size(computeDesc)",
                   "C=device_ptr", "Cdesc=handle:cublaslt_layout", "D=device_ptr", "Ddesc=handle:cublaslt_layout",
                   "algo=in_buffer@sizeof(cublasLtMatmulAlgo_t)", "workspace=device_ptr",
                   "workspaceSizeInBytes=scalar", "stream=handle:stream"],
        "objects": "cublaslt_handle:use cublaslt_matmul_desc:use cublaslt_layout:use stream:use",
        "restore": "memory", "sync": False},
    # --- NVML (nvml.h): what PyTorch and nvidia-smi-like tools ask
    "nvmlInit_v2": {"params": [], "restore": "client"},
    "nvmlInit": {"params": [], "restore": "client"},
    "nvmlInitWithFlags": {"params": ["flags=scalar"], "restore": "client"},
    "nvmlShutdown": {"params": [], "restore": "client"},
    "nvmlErrorString": {"params": ["result=scalar"], "restore": "client", "shim": "override"},
    "nvmlDeviceGetCount_v2": {"params": ["deviceCount=out_value"], "restore": "query"},
    "nvmlDeviceGetCount": {"params": ["deviceCount=out_value"], "restore": "query"},
    "nvmlDeviceGetHandleByIndex_v2": {"params": ["index=scalar", "device=out_value:nvml_device"],
                                      "restore": "query"},
    "nvmlDeviceGetHandleByIndex": {"params": ["index=scalar", "device=out_value:nvml_device"],
                                   "restore": "query"},
    "nvmlDeviceGetIndex": {"params": ["device=handle:nvml_device", "index=out_value"],
                           "objects": "nvml_device:use", "restore": "query"},
    "nvmlDeviceGetName": {"params": ["device=handle:nvml_device", "name=out_buffer@length", "length=scalar"],
                          "objects": "nvml_device:use", "restore": "query"},
    "nvmlDeviceGetUUID": {"params": ["device=handle:nvml_device", "uuid=out_buffer@length", "length=scalar"],
                          "objects": "nvml_device:use", "restore": "query"},
    "nvmlDeviceGetMemoryInfo": {"params": ["device=handle:nvml_device", "memory=out_value"],
                                "objects": "nvml_device:use", "restore": "query"},
    # NCCL and PyTorch's distributed code ask it (issue 22)
    "nvmlDeviceGetCudaComputeCapability": {"params": ["device=handle:nvml_device", "major=out_value",
                                                      "minor=out_value"],
                                           "objects": "nvml_device:use", "restore": "query"},
    "nvmlSystemGetDriverVersion": {"params": ["version=out_buffer@length", "length=scalar"], "restore": "query"},
    "nvmlSystemGetCudaDriverVersion": {"params": ["cudaDriverVersion=out_value"], "restore": "query"},
    "nvmlSystemGetCudaDriverVersion_v2": {"params": ["cudaDriverVersion=out_value"], "restore": "query"},
    "nvmlSystemGetNVMLVersion": {"params": ["version=out_buffer@length", "length=scalar"], "restore": "query"},
    # --- cuDNN 9 (cudnn_graph.h): the handle, versions, errors and the
    # backend (graph) API that cudnn-frontend -- and so PyTorch's
    # convolutions and attention -- is built on. The backend calls are
    # hand-marshalled (interceptor/lib_cudnn.c, proxyd/families/cudnn.py):
    # attribute arrays whose element size follows the attribute type, and
    # descriptor handles inside them.
    "cudnnGetVersion": {"params": [], "restore": "query"},
    "cudnnGetMaxDeviceVersion": {"params": [], "restore": "query"},
    "cudnnGetCudartVersion": {"params": [], "restore": "query"},
    "cudnnGetProperty": {"params": ["type=scalar", "value=out_value"], "restore": "query"},
    "cudnnGetErrorString": {"params": ["status=scalar"], "restore": "client", "shim": "override"},
    "cudnnGetLastErrorString": {"params": ["message=out_buffer@max_size", "max_size=scalar"], "restore": "query"},
    "cudnnCreate": {"params": ["handle=out_value:cudnn_handle"], "objects": "cudnn_handle:create",
                    "restore": "object", "shim": "override"},
    "cudnnDestroy": {"params": ["handle=handle:cudnn_handle"], "objects": "cudnn_handle:destroy",
                     "restore": "object"},
    "cudnnSetStream": {"params": ["handle=handle:cudnn_handle", "streamId=handle:stream"],
                       "objects": "cudnn_handle:use stream:use", "restore": _object(["handle"]), "sync": False},
    "cudnnGetStream": {"params": ["handle=handle:cudnn_handle", "streamId=out_value:stream"],
                       "objects": "cudnn_handle:use", "restore": "query"},
    "cudnnBackendCreateDescriptor": {"params": ["descriptorType=scalar", "descriptor=out_value:cudnn_backend_desc"],
                                     "objects": "cudnn_backend_desc:create", "restore": "object",
                                     "shim": "override", "sync": False},
    "cudnnBackendDestroyDescriptor": {"params": ["descriptor=handle:cudnn_backend_desc"],
                                      "objects": "cudnn_backend_desc:destroy", "restore": "object",
                                      "shim": "override", "sync": False},
    "cudnnBackendSetAttribute": {"params": ["descriptor=handle:cudnn_backend_desc", "attributeName=scalar",
                                            "attributeType=scalar", "elementCount=scalar",
                                            "arrayOfElements=in_buffer@?"],
                                 "objects": "cudnn_backend_desc:use", "restore": _object(["descriptor", "attributeName"]),
                                 "shim": "override", "sync": False},
    "cudnnBackendGetAttribute": {"params": ["descriptor=handle:cudnn_backend_desc", "attributeName=scalar",
                                            "attributeType=scalar", "requestedElementCount=scalar",
                                            "elementCount=out_value", "arrayOfElements=out_buffer@?"],
                                 "objects": "cudnn_backend_desc:use", "restore": "object", "shim": "override"},
    "cudnnBackendFinalize": {"params": ["descriptor=handle:cudnn_backend_desc"], "objects": "cudnn_backend_desc:use",
                             "restore": "object", "shim": "override"},
    # legacy tensor descriptors and batch normalization (cudnn_ops.h): what
    # PyTorch's BatchNorm2d calls. Descriptor settings are asynchronous and
    # kept for restore; alpha/beta are host scalars, double for double
    # tensors and float otherwise (cuDNN docs, "Scaling Parameters"), which
    # the shim tracks per descriptor (lib_cudnn.c).
    "cudnnCreateTensorDescriptor": {"params": ["tensorDesc=out_value:cudnn_desc"], "objects": "cudnn_desc:create",
                                    "restore": "object"},
    "cudnnDestroyTensorDescriptor": {"params": ["tensorDesc=handle:cudnn_desc"], "objects": "cudnn_desc:destroy",
                                     "restore": "object", "shim": "override", "sync": False},
    "cudnnSetTensorNdDescriptor": {"params": ["tensorDesc=handle:cudnn_desc", "dataType=scalar", "nbDims=scalar",
                                              "dimA=in_buffer@nbDims * sizeof(int)",
                                              "strideA=in_buffer@nbDims * sizeof(int)"],
                                   "objects": "cudnn_desc:use", "restore": _object(["tensorDesc"]),
                                   "shim": "override", "sync": False},
    "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize": {
        "params": [DH, "mode=scalar", "bnOps=scalar", "xDesc=handle:cudnn_desc", "zDesc=handle:cudnn_desc",
                   "yDesc=handle:cudnn_desc", "bnScaleBiasMeanVarDesc=handle:cudnn_desc",
                   "activationDesc=handle:cudnn_desc", "sizeInBytes=out_value"],
        "objects": "cudnn_handle:use cudnn_desc:use", "restore": "query"},
    "cudnnGetBatchNormalizationBackwardExWorkspaceSize": {
        "params": [DH, "mode=scalar", "bnOps=scalar", "xDesc=handle:cudnn_desc", "yDesc=handle:cudnn_desc",
                   "dyDesc=handle:cudnn_desc", "dzDesc=handle:cudnn_desc", "dxDesc=handle:cudnn_desc",
                   "dBnScaleBiasDesc=handle:cudnn_desc", "activationDesc=handle:cudnn_desc", "sizeInBytes=out_value"],
        "objects": "cudnn_handle:use cudnn_desc:use", "restore": "query"},
    "cudnnGetBatchNormalizationTrainingExReserveSpaceSize": {
        "params": [DH, "mode=scalar", "bnOps=scalar", "activationDesc=handle:cudnn_desc", "xDesc=handle:cudnn_desc",
                   "sizeInBytes=out_value"],
        "objects": "cudnn_handle:use cudnn_desc:use", "restore": "query"},
    "cudnnBatchNormalizationForwardTrainingEx": {
        "params": [DH, "mode=scalar", "bnOps=scalar", "alpha=scalar_ptr@gp_cudnn_scalar_size(xDesc)",
                   "beta=scalar_ptr@gp_cudnn_scalar_size(xDesc)", "xDesc=handle:cudnn_desc", "xData=device_ptr",
                   "zDesc=handle:cudnn_desc", "zData=device_ptr", "yDesc=handle:cudnn_desc", "yData=device_ptr",
                   "bnScaleBiasMeanVarDesc=handle:cudnn_desc", "bnScale=device_ptr", "bnBias=device_ptr",
                   "exponentialAverageFactor=scalar", "resultRunningMean=device_ptr",
                   "resultRunningVariance=device_ptr", "epsilon=scalar", "resultSaveMean=device_ptr",
                   "resultSaveInvVariance=device_ptr", "activationDesc=handle:cudnn_desc", "workspace=device_ptr",
                   "workSpaceSizeInBytes=scalar", "reserveSpace=device_ptr", "reserveSpaceSizeInBytes=scalar"],
        "objects": "cudnn_handle:use cudnn_desc:use", "restore": "memory", "sync": False},
    "cudnnBatchNormalizationBackwardEx": {
        "params": [DH, "mode=scalar", "bnOps=scalar", "alphaDataDiff=scalar_ptr@gp_cudnn_scalar_size(xDesc)",
                   "betaDataDiff=scalar_ptr@gp_cudnn_scalar_size(xDesc)",
                   "alphaParamDiff=scalar_ptr@gp_cudnn_scalar_size(xDesc)",
                   "betaParamDiff=scalar_ptr@gp_cudnn_scalar_size(xDesc)", "xDesc=handle:cudnn_desc",
                   "xData=device_ptr", "yDesc=handle:cudnn_desc", "yData=device_ptr", "dyDesc=handle:cudnn_desc",
                   "dyData=device_ptr", "dzDesc=handle:cudnn_desc", "dzData=device_ptr", "dxDesc=handle:cudnn_desc",
                   "dxData=device_ptr", "dBnScaleBiasDesc=handle:cudnn_desc", "bnScaleData=device_ptr",
                   "bnBiasData=device_ptr", "dBnScaleData=device_ptr", "dBnBiasData=device_ptr", "epsilon=scalar",
                   "savedMean=device_ptr", "savedInvVariance=device_ptr", "activationDesc=handle:cudnn_desc",
                   "workSpace=device_ptr", "workSpaceSizeInBytes=scalar", "reserveSpace=device_ptr",
                   "reserveSpaceSizeInBytes=scalar"],
        "objects": "cudnn_handle:use cudnn_desc:use", "restore": "memory", "sync": False},
    "cudnnBatchNormalizationForwardInference": {
        "params": [DH, "mode=scalar", "alpha=scalar_ptr@gp_cudnn_scalar_size(xDesc)",
                   "beta=scalar_ptr@gp_cudnn_scalar_size(xDesc)", "xDesc=handle:cudnn_desc", "x=device_ptr",
                   "yDesc=handle:cudnn_desc", "y=device_ptr", "bnScaleBiasMeanVarDesc=handle:cudnn_desc",
                   "bnScale=device_ptr", "bnBias=device_ptr", "estimatedMean=device_ptr",
                   "estimatedVariance=device_ptr", "epsilon=scalar"],
        "objects": "cudnn_handle:use cudnn_desc:use", "restore": "memory", "sync": False},
    "cudnnBackendExecute": {"params": ["handle=handle:cudnn_handle", "executionPlan=handle:cudnn_backend_desc",
                                       "variantPack=handle:cudnn_backend_desc"],
                            "objects": "cudnn_handle:use cudnn_backend_desc:use", "restore": "memory",
                            "sync": False},
    **MATH_SUPPORTED,
}

# ---- NCCL (issue 22; docs/multigpu.md). Communicators are handles the shim
# chooses (interceptor/lib_nccl.c); NCCL runs in the workers. Creating,
# splitting and finalising a communicator waits for the other ranks: the
# worker does it on a thread of its own and the stand-in polls
# (ncclCommGetAsyncError) until it is done. Collectives are asynchronous
# calls on the application's stream. A session holding a communicator is
# not checkpointed yet (the consistent cut, docs/multigpu.md): the dump says so.
C = "comm=handle:nccl_comm"
_COMM_LIMIT = {"rule": "none-needed", "why": "a dump refuses a session that holds a communicator until the "
                                             "consistent cut of docs/multigpu.md lands, so no image holds one"}
_COLL = {"objects": "nccl_comm:use stream:use", "restore": "memory", "sync": False}
NCCL_SUPPORTED: Dict[str, Dict] = {
    "ncclGetVersion": {"params": ["version=out_value"], "restore": "query"},
    "ncclGetUniqueId": {"params": ["uniqueId=out_value"], "restore": _COMM_LIMIT},
    "ncclCommInitRank": {"params": ["comm=out_value:nccl_comm", "nranks=scalar", "commId=scalar", "rank=scalar"],
                         "objects": "nccl_comm:create", "restore": _COMM_LIMIT, "shim": "override"},
    "ncclCommInitRankConfig": {"params": ["comm=out_value:nccl_comm", "nranks=scalar", "commId=scalar",
                                          "rank=scalar", "config=in_buffer@sizeof(ncclConfig_t)"],
                               "objects": "nccl_comm:create", "restore": _COMM_LIMIT, "shim": "override"},
    "ncclCommSplit": {"params": [C, "color=scalar", "key=scalar", "newcomm=out_value:nccl_comm",
                                 "config=in_buffer@sizeof(ncclConfig_t)"],
                      "objects": "nccl_comm:use nccl_comm:create", "restore": _COMM_LIMIT, "shim": "override"},
    # the single-process form: ncclGetUniqueId and a group of ncclCommInitRank, one per device (lib_nccl.c)
    "ncclCommInitAll": {"params": ["comm=out_buffer:nccl_comm@ndev * sizeof(ncclComm_t)", "ndev=scalar",
                                   "devlist=in_buffer@ndev * sizeof(int)"],
                        "objects": "nccl_comm:create", "restore": _COMM_LIMIT, "shim": "override"},
    # FSDP's pre-multiplied sums: the scalar by value (host) or its address (device)
    "ncclRedOpCreatePreMulSum": {"params": ["op=out_value", "scalar=scalar_ptr@gp_nccl_type_size(datatype)",
                                            "datatype=scalar", "residence=scalar", C],
                                 "objects": "nccl_comm:use", "restore": _COMM_LIMIT},
    "ncclRedOpDestroy": {"params": ["op=scalar", C], "objects": "nccl_comm:use", "restore": _COMM_LIMIT},
    "ncclCommFinalize": {"params": [C], "objects": "nccl_comm:use", "restore": _COMM_LIMIT, "shim": "override"},
    "ncclCommDestroy": {"params": [C], "objects": "nccl_comm:destroy", "restore": _COMM_LIMIT, "shim": "override"},
    "ncclCommAbort": {"params": [C], "objects": "nccl_comm:destroy", "restore": _COMM_LIMIT, "shim": "override"},
    "ncclGetErrorString": {"params": ["result=scalar"], "restore": "client", "shim": "override"},
    "ncclGetLastError": {"params": [C], "objects": "nccl_comm:use", "restore": "client", "shim": "override"},
    "ncclCommGetAsyncError": {"params": [C, "asyncError=out_value"], "objects": "nccl_comm:use",
                              "restore": "query"},
    "ncclCommCount": {"params": [C, "count=out_value"], "objects": "nccl_comm:use", "restore": "query"},
    "ncclCommCuDevice": {"params": [C, "device=out_value"], "objects": "nccl_comm:use", "restore": "query"},
    "ncclCommUserRank": {"params": [C, "rank=out_value"], "objects": "nccl_comm:use", "restore": "query"},
    "ncclReduce": {"params": ["sendbuff=device_ptr", "recvbuff=device_ptr", "count=scalar", "datatype=scalar",
                              "op=scalar", "root=scalar", C, "stream=handle:stream"], **_COLL},
    "ncclBcast": {"params": ["buff=device_ptr", "count=scalar", "datatype=scalar", "root=scalar", C,
                             "stream=handle:stream"], **_COLL},
    "ncclBroadcast": {"params": ["sendbuff=device_ptr", "recvbuff=device_ptr", "count=scalar", "datatype=scalar",
                                 "root=scalar", C, "stream=handle:stream"], **_COLL},
    "ncclAllReduce": {"params": ["sendbuff=device_ptr", "recvbuff=device_ptr", "count=scalar", "datatype=scalar",
                                 "op=scalar", C, "stream=handle:stream"], **_COLL},
    "ncclReduceScatter": {"params": ["sendbuff=device_ptr", "recvbuff=device_ptr", "recvcount=scalar",
                                     "datatype=scalar", "op=scalar", C, "stream=handle:stream"], **_COLL},
    "ncclAllGather": {"params": ["sendbuff=device_ptr", "recvbuff=device_ptr", "sendcount=scalar",
                                 "datatype=scalar", C, "stream=handle:stream"], **_COLL},
    "ncclSend": {"params": ["sendbuff=device_ptr", "count=scalar", "datatype=scalar", "peer=scalar", C,
                            "stream=handle:stream"], **_COLL},
    "ncclRecv": {"params": ["recvbuff=device_ptr", "count=scalar", "datatype=scalar", "peer=scalar", C,
                            "stream=handle:stream"], **_COLL},
    "ncclGroupStart": {"params": [], "restore": {"rule": "none-needed", "why": "a group lasts from ncclGroupStart "
                                                 "to ncclGroupEnd, whose calls the dump never splits: both are "
                                                 "asynchronous and travel in one batch with the calls between"},
                       "sync": False, "shim": "override"},
    "ncclGroupEnd": {"params": [], "restore": {"rule": "none-needed", "why": "see ncclGroupStart"}, "sync": False,
                     "shim": "override"},
}
SUPPORTED.update(NCCL_SUPPORTED)


# ------------------------------------------------------------------ headers

def default_includes() -> List[str]:
    """Where NVIDIA's wheels put the headers: $GPUPROXY_LIB_INCLUDE (a
    colon-separated list), then nvidia/cu13/include of this Python's
    site-packages."""
    out = [p for p in os.environ.get("GPUPROXY_LIB_INCLUDE", "").split(":") if p]
    for sp in sys.path:
        d = os.path.join(sp, "nvidia", "cu13", "include")
        if os.path.isdir(d):
            out.append(d)
    return out


def default_lib_dirs() -> List[str]:
    out = [p for p in os.environ.get("GPUPROXY_LIB_DIR", "").split(":") if p]
    for sp in sys.path:
        d = os.path.join(sp, "nvidia", "cu13", "lib")
        if os.path.isdir(d):
            out.append(d)
    return out


def find_file(dirs: List[str], name: str) -> Optional[str]:
    for d in dirs:
        p = os.path.join(d, name)
        if os.path.exists(p):
            return p
    return None


def _cc_flags(includes: List[str], cuda_inc: str) -> List[str]:
    out = []
    for d in includes:
        out += ["-I", d]
    return out + ["-I", cuda_inc]


def preprocess(api: str, includes: List[str], cuda_inc: str) -> Tuple[str, str]:
    """(text of the library's own headers, the folder they were found in)."""
    cfg = LIBS[api]
    where = find_file(includes, cfg["header"])
    if where is None:
        raise hdr.HeaderError(f"{cfg['header']} not found in {includes} (set --lib-include)")
    d = os.path.dirname(where)
    cmd = [hdr.compiler(), "-E", "-x", "c", *cfg["defines"], "-I", d, *_cc_flags(includes, cuda_inc), "-"]
    r = subprocess.run(cmd, input=f"#include <{cfg['header']}>\n", capture_output=True, text=True)
    if r.returncode != 0:
        raise hdr.HeaderError(f"preprocessing {cfg['header']} failed:\n{r.stderr[-3000:]}")
    targets = {os.path.realpath(os.path.join(d, h)) for h in cfg["own"]}
    out, pos, keep = [], 0, False
    for m in re.finditer(r'^#\s*(\d+)\s+"([^"]*)"[^\n]*$', r.stdout, flags=re.M):
        if keep:
            out.append(r.stdout[pos:m.start()])
        keep = os.path.realpath(m.group(2)) in targets
        pos = m.end()
    if keep:
        out.append(r.stdout[pos:])
    text = re.sub(r"^\s*#[^\n]*$", " ", "\n".join(out), flags=re.M)
    return text, d


_DROP = re.compile(r"\b(CUBLASAPI|CUBLASWINAPI|DECLDIR|NVML_API_EXPORT|CUDNNWINAPI|CUDNN_DEPRECATED)\b"
                   # cufft.h: CUFFTAPI is __attribute__ ((visibility ("default"))) with gcc
                   r"|__attribute__\s*\(\(\s*visibility\s*\(\s*\"default\"\s*\)\s*\)\)")


def parse_decls(api: str, text: str) -> Dict[str, hdr.Prototype]:
    prefix = LIBS[api]["prefix"]
    out: Dict[str, hdr.Prototype] = {}
    for pos, (name, ret, params) in enumerate(hdr.function_decls(_DROP.sub(" ", text))):
        if not name.startswith(prefix) or (api == "cublas" and name.startswith("cublasLt")):
            continue
        if name in out:
            continue
        out[name] = hdr.Prototype(name=name, returns=ret, params=params, api=api, header=LIBS[api]["header"],
                                  position=pos)
    return out


def base_type(t: str) -> str:
    t = re.sub(r"\[[^\]]*\]", "", t)
    t = t.replace("*", " ")
    words = [w for w in t.split() if w not in ("const", "volatile", "restrict", "__restrict", "__restrict__")]
    return " ".join(words)


def named_types(protos) -> List[str]:
    out = set()
    for p in protos:
        for t in [p.returns] + [q.type for q in p.params]:
            if t == "..." or "(*" in t:
                continue
            b = base_type(t)
            if b and b not in BUILTIN and not set(b.split()) <= C_WORDS:
                out.add(b)
    return sorted(out)


_CLASSES = {1: "int", 2: "int", 3: "int", 4: "int", 5: "pointer", 6: "pointer", 8: "float", 12: "struct",
            13: "struct", 14: "array"}


def probe_types(api: str, types: List[str], includes: List[str], cuda_inc: str, hdir: str) -> Dict[str, Dict]:
    """{type: {size, align, class}} asked of the compiler; a type it cannot
    size (declared, never defined) is {class: opaque}."""
    cfg = LIBS[api]
    head = f"#include <stdio.h>\n#include <stddef.h>\n#include <{cfg['header']}>\n"
    flags = [*cfg["defines"], "-I", hdir, *_cc_flags(includes, cuda_inc)]

    def compile_run(src):
        with tempfile.TemporaryDirectory() as d:
            c = os.path.join(d, "p.c")
            Path(c).write_text(head + "int main(void){\n" + src + "return 0;}\n")
            r = subprocess.run([hdr.compiler(), "-std=gnu11", *flags, c, "-o", os.path.join(d, "p")],
                               capture_output=True, text=True)
            if r.returncode != 0:
                return None
            return subprocess.run([os.path.join(d, "p")], capture_output=True, text=True, check=True).stdout.split("\n")

    def run(ts):
        return compile_run("".join(
            f'printf("%d %d %d\\n", (int)sizeof({t}), (int)_Alignof({t}), __builtin_classify_type(*({t} *)0));\n'
            for t in ts))

    lines = run(types)
    info: Dict[str, Dict] = {}
    for t in types:
        line = lines[types.index(t)] if lines is not None else ((run([t]) or [None])[0])
        if line is None:
            info[t] = {"class": "opaque"}
            continue
        size, align, klass = (int(x) for x in line.split())
        info[t] = {"size": size, "align": align, "class": _CLASSES.get(klass, f"class{klass}")}
    ints = [t for t in types if info[t]["class"] == "int"]
    if ints:
        signs = compile_run("".join(f'printf("%d\\n", (int)(({t})-1 < ({t})0));\n' for t in ints))
        for t, line in zip(ints, signs):
            if line.strip() == "0":
                info[t]["class"] = "uint"
    return info


def _row(line: str) -> Dict:
    size, align, klass, signed = (int(x) for x in line.split())
    cls = _CLASSES.get(klass, f"class{klass}")
    if cls == "int" and not signed:
        cls = "uint"
    return {"size": size, "align": align, "class": cls}


# -------------------------------------------------------------------- roles

def infer_param(api: str, fn: hdr.Prototype, i: int, types: Dict[str, Dict]) -> Dict:
    p = fn.params[i]
    t, n = p.type, p.name
    q = {"name": n, "type": t}
    b = base_type(t)
    ptr = t.count("*") + t.count("[")
    hk = handle_kind(t)
    if ptr == 0:
        if hk:
            q.update(role="handle", kind=hk)
        elif types.get(t, {}).get("class") == "pointer" or "(*" in t:
            q["role"] = "callback" if "(*" in t or "Callback" in t else "host_ptr"
        else:
            q["role"] = "scalar"
        return q
    if hk and ptr == 1 and "const" not in t:
        q.update(role="out_value", kind=hk)
        return q
    if hk:
        q.update(role="in_buffer", kind=hk, size="?")
        return q
    if n in ("alpha", "beta") and api != "nvml":
        q.update(role="scalar_ptr", size=NUMERIC_ELEM.get(b, "?"))
        return q
    if b == "char" and t.startswith("const"):
        q.update(role="in_buffer", size=f"strlen({n}) + 1")
        return q
    names = [x.name for x in fn.params]
    if api == "cublas" and ("Get" not in fn.name or b in ("float", "double", "cuComplex", "cuDoubleComplex", "void")) \
            and not re.search(r"(Get|Set)(Vector|Matrix)", fn.name):
        q["role"] = "device_ptr"
        return q
    if api == "cublaslt" and n in ("A", "B", "C", "D", "workspace", "alpha", "beta") :
        q["role"] = "device_ptr"
        return q
    if t.startswith("const"):
        size = next((x for x in ("sizeInBytes", "size") if x in names), None)
        q.update(role="in_buffer", size=size or (f"sizeof({b})" if b != "void" else "?"))
        return q
    if b in ("char", "void") or ptr > 1 or "[" in t:
        size = next((x for x in ("length", "sizeInBytes", "size", "bufferSize") if x in names), None)
        q.update(role="out_buffer", size=size or "?")
        return q
    q["role"] = "out_value"
    return q


def infer_objects(params: List[Dict]) -> List[Dict]:
    out = []
    for q in params:
        k = q.get("kind")
        if not k:
            continue
        eff = "use"
        if q["role"] == "out_value":
            eff = "create"
        e = {"kind": k, "effect": eff}
        if e not in out:
            out.append(e)
    return out


def _parse_short(s: str) -> Tuple[str, Dict]:
    name, spec = s.split("=", 1)
    size = None
    if "@" in spec:
        spec, size = spec.split("@", 1)
    role, _, kind = spec.partition(":")
    d = {"role": role}
    if kind:
        d["kind"] = kind
    if size:
        d["size"] = size
    return name, d


def new_entry(api: str, fn: hdr.Prototype, fid: int, types: Dict[str, Dict]) -> Dict:
    params = [infer_param(api, fn, i, types) for i in range(len(fn.params))]
    e = {"name": fn.name, "id": fid, "returns": fn.returns, "params": params,
         "objects": infer_objects(params), "sync": True, "status": "unsupported"}
    hand = SUPPORTED.get(fn.name)
    if hand is not None:
        byname = {q["name"]: q for q in params}
        if [x.split("=", 1)[0] for x in hand["params"]] != [q["name"] for q in params]:
            raise hdr.HeaderError(f"{fn.name}: SUPPORTED params {hand['params']} differ from the header")
        for s in hand["params"]:
            n, d = _parse_short(s)
            q = byname[n]
            for k in ("role", "kind", "size"):
                q.pop(k, None)
            q.update(d)
            if d["role"] == "scalar_ptr":
                q["mode"] = _MODE.get(api, "0").replace("WHICH", "1" if n == "beta" else "0")
        objs = []
        for o in (hand.get("objects") or "").split():
            k, eff = o.split(":")
            objs.append({"kind": k, "effect": eff})
        e["objects"] = objs
        e["sync"] = hand.get("sync", True)
        e["status"] = "supported"
        if hand.get("shim"):
            e["shim"] = hand["shim"]
        e["restore"] = hand["restore"]
    return e


# the C expression that is true when a scalar_ptr is a device pointer: the
# handle's pointer mode as the shim tracks it (interceptor/lib_state.c)
_MODE = {"cublas": "gp_cublas_device_mode(handle)", "cublaslt": "gp_lt_device_mode(computeDesc, WHICH)",
         "cusparse": "gp_cusparse_device_mode(handle)",
         "nccl": "residence == 0"}      # nccl.h: ncclScalarDevice 0, ncclScalarHostImmediate 1


# --------------------------------------------------------------------- build

PARAM_KEYS = ["name", "type", "role", "kind", "size", "mode"]
ENTRY_KEYS = ["name", "id", "returns", "params", "objects", "sync", "status", "shim", "ids", "restore", "declared"]
FILE_KEYS = ["api", "family", "library", "soname", "version_node", "header", "doc_group", "cuda_version",
             "errors", "types"]


def emit(meta: Dict, entries: List[Dict]) -> str:
    try:
        from .specyaml import entry_lines, flow
    except ImportError:
        from specyaml import entry_lines, flow  # type: ignore
    out = [f"# Generated from {meta['header']} by autogen/bootstrap.py --libraries; see docs/libraries.md.",
           "# Hand annotations (status, roles, objects, sync, shim, restore) are kept when the",
           "# tool is run again; it only adds new functions. `types` is rewritten from the headers."]
    for k in FILE_KEYS:
        if k == "types":
            out.append("types:")
            for t, v in sorted(meta["types"].items()):
                out.append(f"  {flow(t)}: {flow(v, ['size', 'align', 'class'])}")
        else:
            out.append(f"{k}: {flow(meta[k], ['min', 'max', 'success', 'not_supported', 'unavailable', 'invalid'])}")
    out.append("functions:")
    for e in entries:
        # only the keys a library entry has, in ENTRY_KEYS' order; one key
        # order for every flow value (objects' kind, effect; restore's rule, key, why)
        out += entry_lines(e, [k for k in ENTRY_KEYS if k in e], PARAM_KEYS,
                           lambda k: ['kind', 'effect', 'rule', 'key', 'why'])
    return "\n".join(out) + "\n"


def build(spec_dir: Path, includes: List[str], lib_dirs: List[str], cuda_inc: str, report) -> Dict[Path, str]:
    import yaml
    outputs = {}
    for api, cfg in LIBS.items():
        path = spec_dir / api / f"{api}.yaml"
        old = yaml.safe_load(path.read_text()) if path.exists() else None
        try:
            text, hdir = preprocess(api, includes, cuda_inc)
        except hdr.HeaderError as e:
            report.add(f"{api}: {e}; file left as it is")
            continue
        protos = parse_decls(api, text)
        lib = find_file(lib_dirs, cfg["library"])
        exports = set(hdr.elf_exported_functions(lib)) if lib else None
        if exports is None:
            report.add(f"{api}: {cfg['library']} not found in {lib_dirs}: listing the header's functions only")
        else:
            for n in sorted(set(protos) - exports):
                report.add(f"{api}: {n} is declared but not exported by {cfg['library']} (no entry)")
                del protos[n]
        entries = {e["name"]: e for e in (old or {}).get("functions", [])}
        lo, hi = ID_RANGES[api]
        next_id = max([e["id"] for e in entries.values()] + [lo - 1]) + 1
        types = probe_types(api, named_types(protos.values()), includes, cuda_inc, hdir)
        order = sorted(protos.values(), key=lambda p: p.position)
        for p in order:
            if p.name in entries:
                e = entries[p.name]
                if e.get("returns") != p.returns or [q["type"] for q in e["params"]] != [q.type for q in p.params]:
                    report.add(f"WARNING: {p.name}: spec prototype differs from the header: {p.c_decl()}")
                continue
            entries[p.name] = new_entry(api, p, next_id, types)
            report.add(f"added {p.name} ({next_id})")
            next_id += 1
        if exports is not None:
            # exported without a declaration (internal entry points): listed,
            # unsupported, prototype unknown
            for n in sorted(exports - set(protos)):
                if n not in entries:
                    entries[n] = {"name": n, "id": next_id, "returns": cfg["status_type"], "params": [],
                                  "objects": [], "sync": True, "status": "unsupported", "declared": False}
                    next_id += 1
        if next_id - 1 > hi:
            raise SystemExit(f"{api}: ids run past {hi}")
        meta = {"api": api, "family": api, "library": cfg["library"], "soname": cfg["library"],
                "version_node": cfg["library"] if api not in ("nvml", "nccl") else None, "header": cfg["header"],
                "doc_group": [], "cuda_version": {"min": 13000, "max": 13999}, "errors": cfg["errors"],
                "types": types}
        outputs[path] = emit(meta, sorted(entries.values(), key=lambda e: e["id"]))
    return outputs
