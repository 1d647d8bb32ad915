"""Emulated kernels of linalg.cu. Its matrix work is cuBLAS and cuSOLVER
calls, which the emulated backend runs in numpy (proxyd/backends/emu/blas_levels.py,
mathlibs.py; docs/libraries.md); its one kernel fills a vector with the
program's test pattern before a cublasDdot on the same stream."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z12fill_patternPdii")
def fill_pattern(k):
    # (double *x, int n, int seed): x[i] = ((i * 37 + seed * 101) % 29 - 14) / 14.5
    n = min(k.param(1, "i"), k.grid[0] * k.block[0])
    seed = k.param(2, "i")
    if n <= 0:
        return
    i = np.arange(n, dtype=np.int64)
    x = k.array(k.param(0, "P"), n, "f8")
    x[...] = ((i * 37 + seed * 101) % 29 - 14).astype(np.float64) / 14.5
