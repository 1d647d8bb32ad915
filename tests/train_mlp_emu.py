"""Emulated kernels of examples/train_mlp_pycuda.py, for proxyd's emu backend.

Each function computes what the CUDA kernel of the same name computes, in
float32 and in the kernel's order of operations (the example compiles with
--fmad=false, so a*b+c is two roundings, as numpy does it): sums run over k
(or i, or c) in the kernel's loop order, one numpy operation per loop step,
vectorised over the threads. expf/logf are numpy's float32 exp/log, which
may differ from CUDA's by an ulp or two: equal curves on the GPU are the GPU
check's business; here the curve must match the numpy reference
(tests/train_mlp_reference.py) within float tolerance.

The kernels are extern "C" (pycuda's SourceModule wraps the source so), so
they register by their plain names.
"""
import numpy as np

from gpuproxy.emu import kernel

F32 = np.float32


def _threads(k) -> int:
    return k.grid[0] * k.grid[1] * k.grid[2] * k.block[0] * k.block[1] * k.block[2]


@kernel("matmul")
def matmul(k):
    pa, pb, pc = (k.param(i, "P") for i in range(3))
    M, N, K, ta, tb = (k.param(i, "i") for i in range(3, 8))
    # i = blockIdx.y*blockDim.y + threadIdx.y, j = blockIdx.x*blockDim.x + threadIdx.x
    rows = min(M, k.grid[1] * k.block[1])
    cols = min(N, k.grid[0] * k.block[0])
    if rows <= 0 or cols <= 0:
        return
    A = k.array(pa, M * K, "f4").reshape((K, M) if ta else (M, K))
    B = k.array(pb, K * N, "f4").reshape((N, K) if tb else (K, N))
    C = k.array(pc, M * N, "f4").reshape(M, N)
    acc = np.zeros((rows, cols), F32)
    for kk in range(K):
        a = A[kk, :rows] if ta else A[:rows, kk]
        b = B[:cols, kk] if tb else B[kk, :cols]
        acc = acc + np.multiply.outer(a, b)
    C[:rows, :cols] = acc


@kernel("bias_act")
def bias_act(k):
    pz, pb = k.param(0, "P"), k.param(1, "P")
    M, N, relu = (k.param(i, "i") for i in range(2, 5))
    n = min(M * N, _threads(k))
    if n <= 0:
        return
    Z = k.array(pz, M * N, "f4")
    b = k.array(pb, N, "f4")
    v = Z[:n] + b[np.arange(n) % N]
    if relu:
        v = np.where(v < F32(0), F32(0), v)
    Z[:n] = v


@kernel("relu_backward")
def relu_backward(k):
    pdh, ph = k.param(0, "P"), k.param(1, "P")
    n = min(k.param(2, "i"), _threads(k))
    if n <= 0:
        return
    dH, H = k.array(pdh, n, "f4"), k.array(ph, n, "f4")
    dH[~(H > F32(0))] = F32(0)


@kernel("softmax_xent")
def softmax_xent(k):
    pz, py, pdz, pl = (k.param(i, "P") for i in range(4))
    M, C = k.param(4, "i"), k.param(5, "i")
    rows = min(M, _threads(k))
    if rows <= 0:
        return
    Z = k.array(pz, M * C, "f4").reshape(M, C)[:rows]
    y = k.array(py, M, "i4")[:rows]
    dZ = k.array(pdz, M * C, "f4").reshape(M, C)
    loss = k.array(pl, M, "f4")
    m = Z[:, 0].copy()
    for c in range(1, C):
        m = np.fmax(m, Z[:, c])
    s = np.zeros(rows, F32)
    for c in range(C):
        s = s + np.exp(Z[:, c] - m)
    zy = Z[np.arange(rows), y]
    loss[:rows] = np.log(s) - (zy - m)
    inv = F32(1) / F32(M)
    for c in range(C):
        p = np.exp(Z[:, c] - m) / s
        onehot = np.where(y == c, F32(1), F32(0))
        dZ[:rows, c] = (p - onehot) * inv


@kernel("col_sum")
def col_sum(k):
    pdz, pdb = k.param(0, "P"), k.param(1, "P")
    M, N = k.param(2, "i"), k.param(3, "i")
    cols = min(N, _threads(k))
    if cols <= 0:
        return
    dZ = k.array(pdz, M * N, "f4").reshape(M, N)
    s = np.zeros(cols, F32)
    for i in range(M):
        s = s + dZ[i, :cols]
    k.array(pdb, N, "f4")[:cols] = s


@kernel("sgd")
def sgd(k):
    pw, pg = k.param(0, "P"), k.param(1, "P")
    lr = F32(k.param(2, "f"))
    n = min(k.param(3, "i"), _threads(k))
    if n <= 0:
        return
    w, g = k.array(pw, n, "f4"), k.array(pg, n, "f4")
    w[:] = w - lr * g
