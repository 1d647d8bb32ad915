"""Emulated kernels of vmm_app.cu (int32 arithmetic)."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z7vmm_addPiii")
def vmm_add(k):
    # (int *x, int n, int k): x[i] += k + i % 13 for i < n
    n = min(k.param(1, "i"), k.grid[0] * k.block[0])
    if n <= 0:
        return
    x = k.array(k.param(0, "P"), n, "i4")
    x += (k.param(2, "i") + np.arange(n) % 13).astype(np.int32)
