"""Emulated kernels of stream_state.cu (int32 arithmetic)."""
import numpy as np

from gpuproxy.emu import kernel


def _n(k, index):
    return min(k.param(index, "i"), k.grid[0] * k.block[0])


@kernel("_Z8add_stepPiii")
def add_step(k):
    # (int *x, int n, int v): x[i] += v + i % 7 for i < n
    n, v = _n(k, 1), k.param(2, "i")
    if n <= 0:
        return
    x = k.array(k.param(0, "P"), n, "i4")
    x += (v + np.arange(n) % 7).astype(np.int32)


@kernel("_Z8mix_intoPiPKii")
def mix_into(k):
    # (int *y, const int *x, int n): y[i] += x[i]
    n = _n(k, 2)
    if n <= 0:
        return
    y = k.array(k.param(0, "P"), n, "i4")
    y += k.array(k.param(1, "P"), n, "i4")
