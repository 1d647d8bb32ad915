"""Emulated kernels of alloc_loop.cu."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z12fill_patternPiii")
def fill_pattern(k):
    # (int *p, int n, int seed): grid-stride, p[i] = seed * 65599 + i (int32 wrap-around)
    n = k.param(1, "i")
    if n <= 0:
        return
    seed = k.param(2, "i")
    p = k.array(k.param(0, "P"), n, "i4")
    res = seed * 65599 + np.arange(n, dtype=np.int64)
    p[:] = ((res + 2**31) % 2**32 - 2**31).astype(np.int32)
