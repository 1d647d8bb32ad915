"""The emulated backend's cuRAND host generators (curandCreateGeneratorHost;
proxyd/families/curand_host.py): the emulated generator (mathlibs.EmuCurand, the
same sequence and positioning as a device one), its results written to a
host buffer that becomes the call's answer instead of device memory.

Locking: the worker's main loop only.
"""
from __future__ import annotations

import numpy as np

from .mathlibs import EmuCurand


class EmuCurandHost(EmuCurand):
    _host = False

    def f_curandCreateGeneratorHost(self, out, typ):
        return self.f_curandCreateGenerator(out, typ)

    def _out(self, addr, n, dtype):
        if self._host:
            # a host generator: the results go to the answer (generate_host)
            self._result = np.zeros(int(n), dtype)
            return self._result
        return super()._out(addr, n, dtype)

    def generate_host(self, fn, args, nbytes: int):
        self._host, self._result = True, None
        try:
            code, _ = self.call(fn, args)
        finally:
            self._host = False
        if code != 0 or self._result is None:
            return code, None
        raw = self._result.tobytes()
        return code, [raw[:nbytes]]
