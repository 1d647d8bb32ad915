"""Emulated kernels of slab_ckpt.cu."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z4fillPhjj")
def fill(k):
    # (unsigned char *p, unsigned n, unsigned seed): p[i] = (seed * 131 + i * 7) & 0xFF
    n = k.param(1, "I")
    seed = k.param(2, "I")
    p = k.array(k.param(0, "P"), n, "u1")
    p[:] = ((seed * 131 + np.arange(n, dtype=np.int64) * 7) & 0xFF).astype(np.uint8)


@kernel("_Z9slow_fillPhjx")
def slow_fill(k):
    # (unsigned char *p, unsigned n, long long cycles): the spin takes no time here
    n = k.param(1, "I")
    k.array(k.param(0, "P"), n, "u1")[:] = 0x5A
