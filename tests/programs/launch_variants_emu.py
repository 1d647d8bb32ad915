"""Emulated kernels of launch_variants.cu. One call computes the whole grid,
so coop_sum's grid-wide barrier holds by construction; cluster_info reads the
launch's cluster shape (k.cluster)."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z8coop_sumPKiPxS1_ii")
def coop_sum(k):
    # (const int *in, long long *partial, long long *out, int n, int k):
    # partial[b] = sum over block b's grid-stride elements of in[i] * k; *out += sum(partial)
    if not k.cooperative:
        raise RuntimeError("coop_sum needs a cooperative launch (grid-wide barrier)")
    n, mult = k.param(3, "i"), k.param(4, "i")
    nb, bs = k.grid[0], k.block[0]
    vals = k.array(k.param(0, "P"), n, "i4").astype(np.int64) * mult
    block_of = (np.arange(n) % (nb * bs)) // bs
    partial = k.array(k.param(1, "P"), nb, "i8")
    partial[:] = 0
    np.add.at(partial, block_of, vals)
    k.array(k.param(2, "P"), 1, "i8")[0] += partial.sum()


@kernel("_Z12cluster_infoPi")
def cluster_info(k):
    # (int *out): out[block] = cluster size * 100 + rank of the block in its cluster (1-D grid)
    cx, cy, cz = k.cluster
    size = cx * cy * cz
    out = k.array(k.param(0, "P"), k.grid[0], "i4")
    out[:] = size * 100 + np.arange(k.grid[0]) % cx


@kernel("fill_pattern")
def fill_pattern(k):
    # (int *data, int n, int base, int step): data[i] = base + i * step (grid-stride, all i < n)
    n, base, step = k.param(1, "i"), k.param(2, "i"), k.param(3, "i")
    if n <= 0:
        return
    k.array(k.param(0, "P"), n, "i4")[:] = (base + np.arange(n, dtype=np.int64) * step).astype(np.int32)
