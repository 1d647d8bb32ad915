"""Which backend a process drives (--backend: cuda, emu, or auto: cuda when
a GPU is found, else emu), and the emulated kernels it loads. Called by
the worker (worker/entry.py) and by tools that serve in-process.
"""
from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger("proxyd")


def pick_backend(name: str | None, emu_devices: int):
    if name in (None, "auto"):
        try:
            from .cuda import CudaBackend, CudaUnavailable
            try:
                b = CudaBackend()
                if b.device_count() > 0:
                    return b
            except CudaUnavailable as e:
                log.info("no usable GPU (%s): using the emulated backend", e)
        except ImportError as e:
            log.info("cuda backend unavailable (%s): using the emulated backend", e)
        name = "emu"
    if name == "cuda":
        from .cuda import CudaBackend, CudaUnavailable
        try:
            return CudaBackend()
        except CudaUnavailable as e:
            sys.exit(f"proxyd: --backend cuda: {e}")
    if name == "emu":
        from gpuproxy.emu.backend import EmuBackend
        return EmuBackend(devices=emu_devices)
    sys.exit(f"proxyd: unknown backend {name!r} (cuda or emu)")


def load_emu_kernels(files):
    """Loads the emulated kernels named on the command line and in
    $GPUPROXY_EMU_KERNELS (a worker's job: kernels run where the session is)."""
    files = list(files) + [p for p in os.environ.get("GPUPROXY_EMU_KERNELS", "").split(":") if p]
    if files:
        from gpuproxy.emu import load_kernel_file
        for f in files:
            try:
                load_kernel_file(f)
            except Exception as e:
                sys.exit(f"proxyd: cannot load emulated kernels from {f}: {e}")
