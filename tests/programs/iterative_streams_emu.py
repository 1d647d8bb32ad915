"""Emulated kernels of iterative_streams.cu (unsigned 32-bit wrap-around)."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z8evolve_xPjPKjij")
def evolve_x(k):
    # (unsigned *x, const unsigned *p, int n, unsigned k): grid-stride,
    # x[i] = x[i] * 5 + p[i & 255] + k
    n = k.param(2, "i")
    if n <= 0:
        return
    step = k.param(3, "I")
    x = k.array(k.param(0, "P"), n, "u4")
    p = k.array(k.param(1, "P"), min(n, 256), "u4")
    x[:] = x * np.uint32(5) + p[np.arange(n) & 255] + np.uint32(step)


@kernel("_Z6fold_yPjPKji")
def fold_y(k):
    # (unsigned *y, const unsigned *x, int n): grid-stride,
    # y[i] = (y[i] ^ (x[i] >> 3)) + (x[i] & 255)
    n = k.param(2, "i")
    if n <= 0:
        return
    y = k.array(k.param(0, "P"), n, "u4")
    x = k.array(k.param(1, "P"), n, "u4")
    y[:] = (y ^ (x >> np.uint32(3))) + (x & np.uint32(255))
