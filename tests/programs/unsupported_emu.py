"""Emulated kernels of unsupported.cu."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z15square_plus_onePii")
def square_plus_one(k):
    # (int *x, int n): i < n: x[i] = x[i] * x[i] + 1
    n = k.param(1, "i")
    m = min(n, k.grid[0] * k.block[0])
    if m <= 0:
        return
    x = k.array(k.param(0, "P"), m, "i4")
    x[:] = x * x + np.int32(1)
