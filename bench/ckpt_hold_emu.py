"""Emulated kernels of bench/ckpt_hold.cu (for running the harness without a GPU)."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z4fillPjmj")
def fill(k):
    n, seed = k.param(1, "Q"), k.param(2, "I")
    p = k.array(k.param(0, "P"), n, "u4")
    i = np.arange(n, dtype=np.uint64)
    x = ((i * np.uint64(2654435761)) & np.uint64(0xFFFFFFFF)).astype(np.uint32) ^ np.uint32(seed)
    p[:] = x ^ (x >> np.uint32(13))


@kernel("_Z8checksumPKjmPy")
def checksum(k):
    n = k.param(1, "Q")
    p = k.array(k.param(0, "P"), n, "u4").astype(np.uint64)
    w = (np.arange(n, dtype=np.uint64) % np.uint64(7919)) + np.uint64(1)
    out = k.array(k.param(2, "P"), 1, "u8")
    out[0] = np.uint64(out[0]) + np.uint64(int((p * w).sum(dtype=np.uint64)) & 0xFFFFFFFFFFFFFFFF)
