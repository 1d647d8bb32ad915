"""Emulated kernels of peer_copy.cu (unsigned 32-bit arithmetic, wrapping)."""
import numpy as np

from gpuproxy.emu import kernel


def _n(k, i):
    return max(0, min(k.param(i, "i"), k.grid[0] * k.block[0]))


@kernel("_Z5step0Pjii")
def step0(k):
    # a[i] = a[i] * 1664525u + 1013904223u + i + k
    n = _n(k, 1)
    a = k.array(k.param(0, "P"), n, "u4")
    step = np.uint32(k.param(2, "i") & 0xFFFFFFFF)
    with np.errstate(over="ignore"):
        a[:] = a * np.uint32(1664525) + np.uint32(1013904223) + np.arange(n, dtype=np.uint32) + step


@kernel("_Z8peer_mixPjPKjS1_i")
def peer_mix(k):
    # out[i] = local[i] ^ (peer[i] >> 3); peer is another device's memory
    n = _n(k, 3)
    local = k.array(k.param(1, "P"), n, "u4")
    peer = k.array(k.param(2, "P"), n, "u4")
    k.array(k.param(0, "P"), n, "u4")[:] = local ^ (peer >> np.uint32(3))


@kernel("_Z5accumPjPKji")
def accum(k):
    # acc[i] += b[i]
    n = _n(k, 2)
    acc = k.array(k.param(0, "P"), n, "u4")
    with np.errstate(over="ignore"):
        acc += k.array(k.param(1, "P"), n, "u4")
