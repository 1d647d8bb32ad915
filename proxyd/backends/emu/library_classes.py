"""The emulated libraries by API (backend.library): mathlibs.py's cuFFT,
cuRAND, cuSPARSE and cuSOLVER, with cuSPARSE's generic API
(sparse_generic.py) and cuRAND's host generators (curand_host.py)."""
from __future__ import annotations

from .curand_host import EmuCurandHost
from .mathlibs import CLASSES as _BASE
from .sparse_generic import EmuCusparseGeneric

CLASSES = {**_BASE, "cusparse": EmuCusparseGeneric, "curand": EmuCurandHost}
