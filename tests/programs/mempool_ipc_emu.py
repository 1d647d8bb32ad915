"""Emulated kernel of mempool_ipc.cu (int32 arithmetic)."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z14pool_scale_addPiiii")
def pool_scale_add(k):
    # (int *x, int n, int mul, int add): x[i] = x[i] * mul + add for i < n
    n = min(k.param(1, "i"), k.grid[0] * k.block[0])
    if n <= 0:
        return
    x = k.array(k.param(0, "P"), n, "i4")
    x[:] = x * np.int32(k.param(2, "i")) + np.int32(k.param(3, "i"))
