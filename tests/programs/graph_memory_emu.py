"""Emulated kernels of graph_memory.cu (int32 arithmetic, wrapping like the GPU's)."""
import numpy as np

from gpuproxy.emu import kernel


def _n(k, index):
    return min(k.param(index, "i"), k.grid[0] * k.block[0])


@kernel("_Z8k_squarePKiPii")
def k_square(k):
    # (const int *in, int *out, int n): out[i] = in[i] * in[i]
    n = _n(k, 2)
    if n > 0:
        x = k.array(k.param(0, "P"), n, "i4")
        k.array(k.param(1, "P"), n, "i4")[:] = x * x


@kernel("_Z5k_negPKiPii")
def k_neg(k):
    # (const int *in, int *out, int n): out[i] = -in[i]
    n = _n(k, 2)
    if n > 0:
        k.array(k.param(1, "P"), n, "i4")[:] = -k.array(k.param(0, "P"), n, "i4")


@kernel("_Z5k_accPiPKii")
def k_acc(k):
    # (int *acc, const int *x, int n): acc[i] += x[i]
    n = _n(k, 2)
    if n > 0:
        acc = k.array(k.param(0, "P"), n, "i4")
        acc += k.array(k.param(1, "P"), n, "i4")


@kernel("_Z6k_fillPiii")
def k_fill(k):
    # (int *d, int n, int v): d[i] = v + i % 3
    n = _n(k, 1)
    if n > 0:
        v = k.param(2, "i")
        k.array(k.param(0, "P"), n, "i4")[:] = (np.int32(v) + np.arange(n) % 3).astype(np.int32)
