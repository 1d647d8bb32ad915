"""Emulated kernels of graph_explicit.cu (int32 arithmetic, wrapping like the GPU's)."""
import numpy as np

from gpuproxy.emu import kernel


def _n(k, index):
    return min(k.param(index, "i"), k.grid[0] * k.block[0])


@kernel("_Z7k_scalePiii")
def k_scale(k):
    # (int *x, int n, int a): x[i] = x[i] * a + i % 5
    n = _n(k, 1)
    if n <= 0:
        return
    x = k.array(k.param(0, "P"), n, "i4")
    x[:] = x * np.int32(k.param(2, "i")) + (np.arange(n) % 5).astype(np.int32)


@kernel("_Z5k_addPiPKii")
def k_add(k):
    # (int *y, const int *x, int n): y[i] += x[i]
    n = _n(k, 2)
    if n <= 0:
        return
    y = k.array(k.param(0, "P"), n, "i4")
    y += k.array(k.param(1, "P"), n, "i4")


@kernel("_Z6k_fillPiii")
def k_fill(k):
    # (int *x, int n, int v): x[i] = v + i % 3
    n = _n(k, 1)
    if n <= 0:
        return
    x = k.array(k.param(0, "P"), n, "i4")
    x[:] = np.int32(k.param(2, "i")) + (np.arange(n) % 3).astype(np.int32)
