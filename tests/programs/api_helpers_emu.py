"""Emulated kernel of api_helpers.cu (the cuBLAS helpers are copies and
cublasSscal runs in proxyd/emu/blas.py)."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z14twice_plus_onePfi")
def twice_plus_one(k):
    # (float *x, int n): x[i] = x[i] * 2 + 1 for i < n
    n = min(k.param(1, "i"), k.grid[0] * k.block[0])
    if n <= 0:
        return
    x = k.array(k.param(0, "P"), n, "f4")
    x[...] = x * np.float32(2.0) + np.float32(1.0)
