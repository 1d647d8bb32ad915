"""Emulated kernels of host_callbacks.cu (int32 arithmetic)."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z5add_kPiii")
def add_k(k):
    # (int *x, int n, int k): x[i] += k + i % 5 for i < n
    n = min(k.param(1, "i"), k.grid[0] * k.block[0])
    if n <= 0:
        return
    x = k.array(k.param(0, "P"), n, "i4")
    x += (k.param(2, "i") + np.arange(n) % 5).astype(np.int32)
