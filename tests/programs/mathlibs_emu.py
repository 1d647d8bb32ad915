"""Emulated kernels of mathlibs.cu. Its other GPU work is cuFFT, cuRAND,
cuSPARSE and cuSOLVER calls, which the emulated backend runs in numpy
(proxyd/backends/emu/mathlibs.py, docs/libraries.md); its one kernel makes the C2C
input on the stream before the cufftExecC2C that reads it."""
import numpy as np

from gpuproxy.emu import kernel


def _val(i, seed):
    # ((i * 7 + seed * 13) % 17 - 8) / 8 with C's remainder (i, seed >= 0 here)
    return ((i * 7 + seed * 13) % 17 - 8).astype(np.float32) / np.float32(8.0)


@kernel("_Z12fill_complexP6float2ii")
def fill_complex(k):
    # (cufftComplex *x, int n, int seed): x[i] = (val(i, seed), val(i + 5, seed + 1))
    n = min(k.param(1, "i"), k.grid[0] * k.block[0])
    seed = k.param(2, "i")
    if n <= 0:
        return
    i = np.arange(n, dtype=np.int64)
    x = k.array(k.param(0, "P"), 2 * n, "f4")
    x[0::2] = _val(i, seed)
    x[1::2] = _val(i + 5, seed + 1)
