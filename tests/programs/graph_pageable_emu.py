"""Emulated kernel of graph_pageable.cu (int32 arithmetic, wrapping like the GPU's)."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z7p_scalePiii")
def p_scale(k):
    # (int *x, int n, int m): x[i] = x[i] * m + i % 5
    n = min(k.param(1, "i"), k.grid[0] * k.block[0])
    if n > 0:
        x = k.array(k.param(0, "P"), n, "i4")
        x[:] = x * np.int32(k.param(2, "i")) + (np.arange(n) % 5).astype(np.int32)
