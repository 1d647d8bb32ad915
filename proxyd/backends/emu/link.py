"""The JIT linker on the emulated GPU (proxyd/families/link.py calls it through the
backend).

There is no device code to link on the emulated GPU: kernels are Python
functions found by name. What the emulation keeps is what an application
can observe: every input is checked as the driver would check it (an image
that does not parse fails cuLinkAddData with CUDA_ERROR_INVALID_PTX or
CUDA_ERROR_INVALID_IMAGE and the reason in the error log), and
cuLinkComplete answers one image holding every input's code -- a fatbinary
with one entry per PTX/cubin input, which the module loader reads as the
union of their kernels and variables (fatbin.py). Unresolved externals are
not checked.
"""
from __future__ import annotations

import struct

from gpuproxy.proxyd.core.fatbin import (ENTRY_KIND_ELF, ENTRY_KIND_PTX, FATBIN_MAGIC, FatbinError,
                                    parse_image)
from gpuproxy.proxyd.core.session import CudaError

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_IMAGE = 200
CUDA_ERROR_INVALID_PTX = 218
JIT_INPUT_PTX = 1

_FLAGS_64BIT_LINUX = 0x11      # what nvcc sets for a 64-bit Linux host (fatbin.py FLAG_*)


class EmuLink:
    def __init__(self, info_size: int, err_size: int):
        self.entries = []           # (kind code, arch, bytes)
        self.info = b""
        self.err = b""
        self.sizes = (info_size, err_size)

    def _log(self, which: str, text: str):
        cap = self.sizes[0 if which == "info" else 1]
        if not cap:
            return
        cur = getattr(self, which) + text.encode() + b"\n"
        setattr(self, which, cur[:max(cap - 1, 0)])

    def add(self, kind: int, data: bytes, name: str):
        try:
            img = parse_image(data)
        except FatbinError as e:
            self._log("err", f"{name}: {e}")
            raise CudaError(CUDA_ERROR_INVALID_PTX if kind == JIT_INPUT_PTX else CUDA_ERROR_INVALID_IMAGE,
                            f"cuLinkAddData({name}): {e}")
        for e in img.entries:
            code = ENTRY_KIND_PTX if e.kind == "ptx" else ENTRY_KIND_ELF
            self.entries.append((code, e.arch, e.data + (b"\0" if e.kind == "ptx" else b"")))
        self._log("info", f"emulated link: added {name} ({len(img.entries)} entries, "
                          f"{len(img.kernels)} kernels)")

    def complete(self) -> bytes:
        if not self.entries:
            self._log("err", "nothing to link")
            raise CudaError(CUDA_ERROR_INVALID_VALUE, "cuLinkComplete: no input was added")
        body = b""
        for code, arch, payload in self.entries:
            p = payload + bytes(-len(payload) % 8)
            body += struct.pack("<HHIQIIHHIIIQQQ", code, 0x0101, 0x40, len(p), 0, 0, 0, 1, arch, 0, 0,
                                _FLAGS_64BIT_LINUX, 0, len(p)) + p
        return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body
