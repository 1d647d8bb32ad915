"""The oldest NVIDIA driver the worker runs on, and its calls newer than that.

The sites gpuproxy exists for run drivers too old for cuda-checkpoint
(below R550), down to R470 (CUDA 11.4). The worker (backends/cuda.py) calls
the driver API through cffi in ABI mode, which looks a function up only when
it is first used, so a driver that lacks one still loads. What this module
adds: the driver functions the worker calls that CUDA 11.4's cuda.h does not
declare are listed with the CUDA version that introduced each (the suffix of
their PFN_ typedef in cudaTypedefs.h, CUDA 13); the worker uses them only
when the driver's cuDriverGetVersion reports that version, and otherwise
answers the call with CUDA_ERROR_NOT_SUPPORTED and one line naming it, in
proxyd's log and to the application (or, for context creation, uses the
older entry point).
tests/test_oldcuda.py checks this table against an older cuda.h.

GPUPROXY_DRIVER_VERSION_CAP=11040 forces the oldest-driver mode on a newer
driver (the only way to test it on the H100 machine's driver 580): the
worker then behaves as on a CUDA 11.4 driver.

Not locked: the table is read-only; GatedLib fills its cache from the
worker's threads, which store the same value for a name.
"""
from __future__ import annotations

import logging
import os

from ..core.session import CudaError

log = logging.getLogger("proxyd")

MIN_DRIVER = 11040          # R470, CUDA 11.4
CAP_ENV = "GPUPROXY_DRIVER_VERSION_CAP"
CUDA_ERROR_NOT_SUPPORTED = 801

# The worker's driver calls that a CUDA 11.4 driver lacks -> the CUDA
# version that introduced them (cudaTypedefs.h, PFN_<name>_v<version>).
NEWER = {
    "cuCtxCreate_v4": 12050,
    "cuCtxSetFlags": 12010,
    "cuFuncGetParamInfo": 12040,
    "cuFuncLoad": 12040,
    # conditional graph nodes on the GPU (cuda_cond.py)
    "cuGraphAddNode_v2": 12030,
    "cuGraphConditionalHandleCreate": 12030,
    "cuStreamBeginCaptureToGraph": 12030,
    "cuStreamGetCaptureInfo_v3": 12030,
    "cuLaunchKernelEx": 11060,
    "cuOccupancyMaxActiveClusters": 11070,
}


def effective_version(reported: int) -> int:
    """The driver version the worker acts on: what the driver reports, or
    less under GPUPROXY_DRIVER_VERSION_CAP."""
    cap = os.environ.get(CAP_ENV)
    if cap:
        try:
            return min(reported, int(cap))
        except ValueError:
            log.warning("%s=%r is not a CUDA version number (like 11040); ignored", CAP_ENV, cap)
    return reported


class GatedLib:
    """The cffi library with the functions newer than the driver answered by
    a stand-in that logs one line and raises CudaError(CUDA_ERROR_NOT_SUPPORTED).
    Every name is looked up once, then kept as an attribute of this object,
    so the hot path pays a plain attribute read as on the cffi library."""

    def __init__(self, lib, version: int):
        object.__setattr__(self, "_lib", lib)
        object.__setattr__(self, "version", version)

    def has(self, name: str) -> bool:
        return NEWER.get(name, 0) <= self.version

    def __getattr__(self, name: str):
        if self.has(name):
            try:
                fn = getattr(self._lib, name)
            except AttributeError as e:
                # declared (cffi knows it) but not exported by this driver:
                # an application calling a function the host driver lacks
                if "not found in library" not in str(e):
                    raise

                def fn(*_args, _name=name):
                    msg = (f"{_name} is not in this driver (CUDA {self.version // 1000}."
                           f"{self.version % 1000 // 10}): not supported")
                    log.warning("%s", msg)
                    raise CudaError(CUDA_ERROR_NOT_SUPPORTED, msg)
        else:
            need = NEWER[name]

            def fn(*_args, _name=name, _need=need):
                # raised, not returned: the message goes back with the
                # answer and the shim prints it (core/session.CudaError)
                msg = (f"{_name} needs a CUDA {_need // 1000}.{_need % 1000 // 10} driver; "
                       f"this one is {self.version // 1000}.{self.version % 1000 // 10}: not supported")
                log.warning("%s", msg)
                raise CudaError(CUDA_ERROR_NOT_SUPPORTED, msg)
        object.__setattr__(self, name, fn)
        return fn
