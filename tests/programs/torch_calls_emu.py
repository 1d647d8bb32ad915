"""Emulated kernels of torch_calls.cu (uint32 arithmetic)."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z7add_onePjy")
def add_one(k):
    # (unsigned *x, unsigned long long n): x[i] += 1 for i < n
    n = min(k.param(1, "Q"), k.grid[0] * k.block[0])
    if n <= 0:
        return
    x = k.array(k.param(0, "P"), n, "u4")
    x += np.uint32(1)
