"""Emulated kernels of struct_param.cu.

Floating-point parameters are read as their bit patterns (the kernels store
__double_as_longlong / __float_as_int of them), with struct formats of the same
size and alignment: "q" for a double, "i" for a float.
"""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z12check_struct6PaddeddcPx")
def check_struct(k):
    # (Padded p, double x, char ch, long long *out); block 0 / thread 0 writes out[0..7]
    # Padded {char c; double d; int i; float f[3];}: c@0, d@8, i@16, f@20; 32 bytes
    c, d_bits, i, f0, f1, f2 = k.param(0, "bqi3i")
    x_bits = k.param(1, "q")
    ch = k.param(2, "b")
    out = k.array(k.param(3, "P"), 8, "i8")
    out[:] = np.array([c, d_bits, i, f0, f1, f2, x_bits, ch], dtype=np.int64)


@kernel("_Z13mixed_scalarscdcsxfh4int4Px")
def mixed_scalars(k):
    # (char a, double b, char c, short s, long long q, float g, unsigned char h, int4 v, long long *out)
    a = k.param(0, "b")
    b_bits = k.param(1, "q")
    c = k.param(2, "b")
    s = k.param(3, "h")
    q = k.param(4, "q")
    g_bits = k.param(5, "i")
    h = k.param(6, "B")
    vx, vy, vz, vw = k.param(7, "4i")
    out = k.array(k.param(8, "P"), 11, "i8")
    out[:] = np.array([a, b_bits, c, s, q, g_bits, h, vx, vy, vz, vw], dtype=np.int64)


@kernel("_Z9apply_job3Job")
def apply_job(k):
    # Job {int *dst; int n; int vals[5];}: dst@0, n@8, vals@12; 32 bytes
    # i = threadIdx.x (every block does the same): if (i < n) dst[i] = vals[i % 5] * (i + 1)
    dst_ptr, n, *vals = k.param(0, "Pi5i")
    m = min(n, k.block[0])
    if m <= 0:
        return
    dst = k.array(dst_ptr, m, "i4")
    i = np.arange(m, dtype=np.int64)
    res = np.array(vals, dtype=np.int64)[i % 5] * (i + 1)
    dst[:] = ((res + 2**31) % 2**32 - 2**31).astype(np.int32)


@kernel("_Z7sum_big3BigPi")
def sum_big(k):
    # (Big b, int *out), Big {int v[256];}: t = global index; if (t < 256) out[t] = v[t] * 2 + t
    v = np.array(k.param(0, "256i"), dtype=np.int64)
    m = min(256, k.grid[0] * k.block[0])
    if m <= 0:
        return
    out = k.array(k.param(1, "P"), m, "i4")
    res = v[:m] * 2 + np.arange(m, dtype=np.int64)
    out[:] = ((res + 2**31) % 2**32 - 2**31).astype(np.int32)
