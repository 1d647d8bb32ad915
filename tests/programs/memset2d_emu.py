"""Emulated kernel of memset2d.cu."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z5accumPfmPKhmii")
def accum(k):
    # (float *acc, size_t apitch, const unsigned char *b, size_t bpitch, int w, int h):
    # row y of acc (apitch bytes apart) gets row y of b (bpitch apart) added
    acc, ap, b, bp = k.param(0, "P"), k.param(1, "Q"), k.param(2, "P"), k.param(3, "Q")
    w, h = k.param(4, "i"), k.param(5, "i")
    w = min(w, k.grid[0] * k.block[0])
    for y in range(min(h, k.grid[1])):
        row = k.array(acc + y * ap, w, "f4")
        row[:] = row + k.array(b + y * bp, w, "u1").astype(np.float32)
