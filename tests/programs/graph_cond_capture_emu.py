"""Emulated kernels of graph_cond_capture.cu (extern "C" names). A kernel's
cudaGraphSetConditional(h, v) is k.set_conditional(h, v)."""
import numpy as np

from gpuproxy.emu import kernel


def _data(k):
    n = min(k.param(1, "i"), k.grid[0] * k.block[0])
    return k.array(k.param(0, "P"), n, "i4") if n > 0 else None, n


@kernel("k_fill")
def k_fill(k):
    # (int *data, int n, int *counter)
    d, n = _data(k)
    if d is not None:
        d[:] = (np.arange(n) % 5).astype(np.int32)
    k.array(k.param(2, "P"), 1, "i4")[0] = 0


@kernel("k_step")
def k_step(k):
    # (int *data, int n, int *counter, const int *limit, handle h)
    d, n = _data(k)
    if d is not None:
        d += (np.arange(n) % 3 + 1).astype(np.int32)
    counter = k.array(k.param(2, "P"), 1, "i4")
    counter[0] += 1
    k.set_conditional(k.param(4, "Q"), int(counter[0] < k.array(k.param(3, "P"), 1, "i4")[0]))


@kernel("k_scale")
def k_scale(k):
    d, _n = _data(k)
    if d is not None:
        d[:] = 2 * d + 1


@kernel("k_check")
def k_check(k):
    # (const int *counter, handle h)
    k.set_conditional(k.param(1, "Q"), int(k.array(k.param(0, "P"), 1, "i4")[0] % 2 == 0))


@kernel("k_add")
def k_add(k):
    d, _n = _data(k)
    if d is not None:
        d += np.int32(k.param(2, "i"))


@kernel("k_last")
def k_last(k):
    d, n = _data(k)
    if d is not None:
        d -= (np.arange(n) % 2).astype(np.int32)
