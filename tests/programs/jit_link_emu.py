"""Emulated kernel of jit_link.cu: jit_apply(int *p, unsigned n) calls the
device function the second PTX unit defines, twice_plus(x) = 2x + 7."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("jit_apply")
def jit_apply(k):
    n = k.param(1, "I")
    m = min(n, k.grid[0] * k.block[0])
    if m <= 0:
        return
    data = k.array(k.param(0, "P"), m, "i4")
    data[:] = (data.astype(np.int64) * 2 + 7).astype(np.int32)
