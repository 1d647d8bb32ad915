"""Emulated kernels of mempool_async.cu (int32 arithmetic)."""
import numpy as np

from gpuproxy.emu import kernel


def _n(k, index):
    return min(k.param(index, "i"), k.grid[0] * k.block[0])


@kernel("_Z4fillPiii")
def fill(k):
    # (int *a, int n, int k): a[i] = k * (i % 11) + 1
    n = _n(k, 1)
    if n <= 0:
        return
    a = k.array(k.param(0, "P"), n, "i4")
    a[:] = (k.param(2, "i") * (np.arange(n) % 11) + 1).astype(np.int32)


@kernel("_Z7combinePiPKiS_i")
def combine(k):
    # (int *acc, const int *a, int *b, int n): b = a + 3; acc += a * b
    n = _n(k, 3)
    if n <= 0:
        return
    acc = k.array(k.param(0, "P"), n, "i4")
    a = k.array(k.param(1, "P"), n, "i4")
    b = k.array(k.param(2, "P"), n, "i4")
    b[:] = a + 3
    acc += a * b
