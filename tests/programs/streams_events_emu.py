"""Emulated kernels of streams_events.cu (int32 arithmetic wraps like the GPU's)."""
import numpy as np

from gpuproxy.emu import kernel


def _threads_x(k):
    return k.grid[0] * k.block[0]


@kernel("_Z9scale_addPiiii")
def scale_add(k):
    # grid-stride over i < n: x[i] = x[i] * mul + add
    n = k.param(1, "i")
    if n <= 0:
        return
    x = k.array(k.param(0, "P"), n, "i4")
    x[:] = x * np.int32(k.param(2, "i")) + np.int32(k.param(3, "i"))


@kernel("_Z7combinePiPKii")
def combine(k):
    # i < n: dst[i] = dst[i] + src[i] + i
    n = k.param(2, "i")
    m = min(n, _threads_x(k))
    if m <= 0:
        return
    dst = k.array(k.param(0, "P"), m, "i4")
    src = k.array(k.param(1, "P"), m, "i4")
    dst[:] = dst + src + np.arange(m, dtype=np.int32)


@kernel("_Z9add_constPiii")
def add_const(k):
    # i < n: x[i] += v
    n = k.param(1, "i")
    m = min(n, _threads_x(k))
    if m <= 0:
        return
    x = k.array(k.param(0, "P"), m, "i4")
    x += np.int32(k.param(2, "i"))
