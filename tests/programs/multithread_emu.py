"""Emulated kernels of multithread.cu.

accumulate() adds into one buffer shared by the kernels of 4 host threads'
streams with atomicAdd: the emulator must not run two emulated kernels at the
same time (or must make each launch atomic), or those additions race.
"""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z10accumulatePiPKiS_i")
def accumulate(k):
    # (int *acc, const int *in, int *total, int n), grid-stride over i < n:
    #   acc[i] += in[i]; atomicAdd(&total[i & 63], in[i])
    n = k.param(3, "i")
    if n <= 0:
        return
    acc = k.array(k.param(0, "P"), n, "i4")
    src = k.array(k.param(1, "P"), n, "i4")
    total = k.array(k.param(2, "P"), min(n, 64), "i4")
    acc += src
    np.add.at(total, np.arange(n) & 63, src)


@kernel("_Z10add_scaledPiPKiii")
def add_scaled(k):
    # (int *dst, const int *src, int n, int mul): i < n: dst[i] += src[i] * mul
    n = k.param(2, "i")
    m = min(n, k.grid[0] * k.block[0])
    if m <= 0:
        return
    dst = k.array(k.param(0, "P"), m, "i4")
    src = k.array(k.param(1, "P"), m, "i4")
    dst += src * np.int32(k.param(3, "i"))
