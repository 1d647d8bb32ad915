"""Emulated kernels of ipc.cu (int32 arithmetic)."""
from gpuproxy.emu import kernel


@kernel("_Z9add_constPiii")
def add_const(k):
    # (int *x, int n, int add): x[i] += add for i < n
    n = min(k.param(1, "i"), k.grid[0] * k.block[0])
    if n <= 0:
        return
    x = k.array(k.param(0, "P"), n, "i4")
    x += k.param(2, "i")
