"""Emulated kernels of graph_capture.cu (int32 arithmetic, wrapping like the GPU's)."""
import numpy as np

from gpuproxy.emu import kernel


def _n(k, index):
    return min(k.param(index, "i"), k.grid[0] * k.block[0])


@kernel("_Z6g_stepPii")
def g_step(k):
    # (int *x, int n): x[i] = x[i] * 3 + i % 7
    n = _n(k, 1)
    if n <= 0:
        return
    x = k.array(k.param(0, "P"), n, "i4")
    x[:] = x * np.int32(3) + (np.arange(n) % 7).astype(np.int32)


@kernel("_Z5g_mixPiPKii")
def g_mix(k):
    # (int *y, const int *x, int n): y[i] += x[i] - 1
    n = _n(k, 2)
    if n <= 0:
        return
    y = k.array(k.param(0, "P"), n, "i4")
    y += k.array(k.param(1, "P"), n, "i4") - np.int32(1)
