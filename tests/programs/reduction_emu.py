"""Emulated kernels of reduction.cu (1-D launches; int32 partial sums wrap like
the GPU's, the shared-memory tree is reproduced step by step)."""
import numpy as np

from gpuproxy.emu import kernel


def _tree(sdata):
    # for (s = blockDim.x / 2; s > 0; s >>= 1) { if (tid < s) sdata[tid] += sdata[tid + s]; }
    s = sdata.shape[1] // 2
    while s > 0:
        sdata[:, :s] += sdata[:, s:2 * s]
        s >>= 1
    return sdata[:, 0]


@kernel("_Z13reduce_atomicPKiiPy")
def reduce_atomic(k):
    # (const int *in, int n, unsigned long long *sum); dynamic shared memory
    # per-thread grid-stride sums, per-block tree, atomicAdd of each block's
    # partial (sign-extended to 64 bits) into *sum
    n = k.param(1, "i")
    gx, bx = k.grid[0], k.block[0]
    threads = gx * bx
    per_thread = np.zeros(threads, dtype=np.int32)
    if n > 0:
        a = k.array(k.param(0, "P"), n, "i4")
        padded = np.zeros(-(-n // threads) * threads, dtype=np.int32)
        padded[:n] = a
        per_thread = padded.reshape(-1, threads).sum(axis=0, dtype=np.int32)
    partials = _tree(per_thread.reshape(gx, bx).copy())
    total = int(partials.astype(np.int64).sum())
    acc = k.array(k.param(2, "P"), 1, "u8")
    acc[0] = np.uint64((int(acc[0]) + total) % 2**64)


@kernel("_Z15reduce_partialsPKiiPi")
def reduce_partials(k):
    # (const int *in, int n, int *part); static __shared__ int sdata[256] (blockDim.x <= 256)
    # i = b * 2 * blockDim.x + tid: v = in[i] (if i < n) + in[i + blockDim.x] (if < n); tree; part[b] = sdata[0]
    n = k.param(1, "i")
    gx, bx = k.grid[0], k.block[0]
    idx = (np.arange(gx, dtype=np.int64)[:, None] * (2 * bx) + np.arange(bx, dtype=np.int64)[None, :])
    v = np.zeros((gx, bx), dtype=np.int32)
    if n > 0:
        a = k.array(k.param(0, "P"), n, "i4")
        lo = idx < n
        v[lo] = a[idx[lo]]
        hi = idx + bx < n
        v[hi] += a[idx[hi] + bx]
    part = k.array(k.param(2, "P"), gx, "i4")
    part[:] = _tree(v)
