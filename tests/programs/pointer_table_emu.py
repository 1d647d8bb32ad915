"""Emulated kernels of pointer_table.cu. The tables of device pointers are read
from device memory as 64-bit integers and may hold interior pointers."""
import numpy as np

from gpuproxy.emu import kernel


def _wrap32(a):
    return ((np.asarray(a, dtype=np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)


@kernel("_Z18fill_through_tablePKPiPKiii")
def fill_through_table(k):
    # (int *const *table, const int *sizes, int nbuf, int base)
    # b = blockIdx.y (< nbuf); grid-stride in x over i < sizes[b]: table[b][i] = base + b * 1000 + i
    nbuf, base = k.param(2, "i"), k.param(3, "i")
    nb = min(nbuf, k.grid[1])
    if nb <= 0:
        return
    table = k.array(k.param(0, "P"), nb, "u8")
    sizes = k.array(k.param(1, "P"), nb, "i4")
    for b in range(nb):
        n = int(sizes[b])
        if n <= 0:
            continue
        buf = k.array(int(table[b]), n, "i4")
        buf[:] = _wrap32(base + b * 1000 + np.arange(n, dtype=np.int64))


@kernel("_Z12add_positionPKPiPKii")
def add_position(k):
    # (int *const *table, const int *sizes, int nbuf)
    # blocks stride over b < nbuf, threads over i < sizes[b]: table[b][i] += b
    nbuf = k.param(2, "i")
    if nbuf <= 0:
        return
    table = k.array(k.param(0, "P"), nbuf, "u8")
    sizes = k.array(k.param(1, "P"), nbuf, "i4")
    for b in range(nbuf):
        n = int(sizes[b])
        if n <= 0:
            continue
        buf = k.array(int(table[b]), n, "i4")
        buf += np.int32(b)
