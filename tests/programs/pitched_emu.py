"""Emulated kernel of pitched.cu."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z7add_rowPfmii")
def add_row(k):
    # row y starts at p + y * pitch; x < w of it gets y added
    p, pitch, w, h = k.param(0, "P"), k.param(1, "Q"), k.param(2, "i"), k.param(3, "i")
    w = min(w, k.grid[0] * k.block[0])
    for y in range(min(h, k.grid[1])):
        row = k.array(p + y * pitch, w, "f4")
        row[:] = row + np.float32(y)
