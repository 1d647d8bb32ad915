"""Emulated kernels of overlap_streams.cu (unsigned 32-bit wrap-around)."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z9mix_chunkPKjPjijj")
def mix_chunk(k):
    # (const unsigned *in, unsigned *out, int n, unsigned chunk, unsigned round)
    # grid-stride: out[i] = in[i] * 2654435761 + ((chunk * 0x9E3779B9) ^ round)
    n = k.param(2, "i")
    if n <= 0:
        return
    chunk, rnd = k.param(3, "I"), k.param(4, "I")
    add = ((chunk * 0x9E3779B9) & 0xFFFFFFFF) ^ rnd
    src = k.array(k.param(0, "P"), n, "u4")
    out = k.array(k.param(1, "P"), n, "u4")
    out[:] = src * np.uint32(2654435761) + np.uint32(add)
