"""Emulated kernels of hostmem.cu (int32 arithmetic)."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z7zc_stepPKiPiS1_S1_S1_i")
def zc_step(k):
    # (const int *a, int *pin, int *reg, int *m, int *d, int n)
    n = min(k.param(5, "i"), k.grid[0] * k.block[0])
    if n <= 0:
        return
    a = k.array(k.param(0, "P"), n, "i4")
    pin = k.array(k.param(1, "P"), n, "i4")
    reg = k.array(k.param(2, "P"), n, "i4")
    m = k.array(k.param(3, "P"), n, "i4")
    d = k.array(k.param(4, "P"), n, "i4")
    reg += a
    pin[:] = 2 * a
    m[:] = m * 3 + reg % 5
    d += m % 11
