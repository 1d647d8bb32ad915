"""Emulated kernels of graph_conditional.cu (extern "C" names). A kernel's
cudaGraphSetConditional(h, v) is k.set_conditional(h, v)."""
import numpy as np

from gpuproxy.emu import kernel


def _n(k, index):
    return min(k.param(index, "i"), k.grid[0] * k.block[0])


@kernel("k_reset")
def k_reset(k):
    # (int *counter, const int *limit, handle h)
    k.array(k.param(0, "P"), 1, "i4")[0] = 0
    k.set_conditional(k.param(2, "Q"), int(k.array(k.param(1, "P"), 1, "i4")[0] > 0))


@kernel("k_body")
def k_body(k):
    # (int *data, int n, int *counter, const int *limit, handle h)
    n = _n(k, 1)
    if n > 0:
        d = k.array(k.param(0, "P"), n, "i4")
        d += (np.arange(n) % 7 + 1).astype(np.int32)
    counter = k.array(k.param(2, "P"), 1, "i4")
    counter[0] += 1
    k.set_conditional(k.param(4, "Q"), int(counter[0] < k.array(k.param(3, "P"), 1, "i4")[0]))


@kernel("k_check")
def k_check(k):
    # (const int *counter, handle h)
    k.set_conditional(k.param(1, "Q"), int(k.array(k.param(0, "P"), 1, "i4")[0] % 2 == 0))


@kernel("k_pick")
def k_pick(k):
    c = int(k.array(k.param(0, "P"), 1, "i4")[0])
    if c % 3 != 0:
        k.set_conditional(k.param(1, "Q"), c % 3)


@kernel("k_more")
def k_more(k):
    k.set_conditional(k.param(1, "Q"), int(k.array(k.param(0, "P"), 1, "i4")[0] > 3))


@kernel("k_add")
def k_add(k):
    # (int *data, int n, int v)
    n = _n(k, 1)
    if n > 0:
        d = k.array(k.param(0, "P"), n, "i4")
        d += np.int32(k.param(2, "i"))
