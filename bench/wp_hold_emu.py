"""Emulated kernel of bench/wp_hold.cu that bench/ckpt_hold_emu.py lacks
(fill and checksum are the same kernels: load both files)."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z4tickPy")
def tick(k):
    c = k.array(k.param(0, "P"), 1, "u8")
    c[0] = np.uint64(c[0]) + np.uint64(1)
