"""The emulated cuFFT, cuRAND, cuSPARSE and cuSOLVER (proxyd/backends/emu/mathlibs.py)
against numpy's own routines, for what the corpus program does not reach:
advanced cuFFT layouts, double precision, SpMM in both orders, the
transposed SpMV, upper Cholesky, transposed LU solves, the 64-bit cuSOLVER
API, LAPACK's info, and the statistics of the emulated generators. The
library path through the shim is tested by tests/test_libraries.py and the
corpus program tests/programs/mathlibs.cu."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from gpuproxy.emu.mathlibs import EmuCufft, EmuCurand, EmuCusolver, EmuCusparse
from gpuproxy.proxyd.core.session import CudaError

BASE = 0x7F0000000000


class Memory:
    """A flat stand-in for emulated device memory: resolve() as the emulated
    backend's, over one buffer at BASE."""

    def __init__(self, size=1 << 22):
        self.buf = np.zeros(size, np.uint8)
        self.top = BASE

    def resolve(self, addr, n):
        off = addr - BASE
        if off < 0 or off + n > self.buf.size:
            raise CudaError(1, f"{addr:#x}+{n} outside the test memory")
        return self.buf[off:off + n]

    def put(self, arr) -> int:
        a = np.ascontiguousarray(arr)
        addr = self.top
        self.top += (a.nbytes + 255) // 256 * 256 or 256
        self.resolve(addr, a.nbytes)[:] = a.view(np.uint8).ravel()
        return addr

    def get(self, addr, n, dtype):
        return self.resolve(addr, n * np.dtype(dtype).itemsize).view(dtype).copy()


@pytest.fixture
def mem():
    return Memory()


def _ints(*v, size=4):
    return np.array(v, np.int32 if size == 4 else np.int64).tobytes()


def test_cufft_advanced_layout_and_double_precision(mem):
    fft = EmuCufft(mem, "cufft")
    rng = np.random.default_rng(1)
    # 2 batches of 8-point C2C, input strided by 2 with batch distance 20
    # (cuFFT docs, "Advanced Data Layout"), output packed
    x = (rng.standard_normal((2, 8)) + 1j * rng.standard_normal((2, 8))).astype(np.complex64)
    raw = np.zeros(40, np.complex64)
    for b in range(2):
        raw[b * 20 + 2 * np.arange(8)] = x[b]
    i, o = mem.put(raw), mem.put(np.zeros(16, np.complex64))
    code, (plan,) = fft.f_cufftPlanMany(True, 1, _ints(8), _ints(8), 2, 20, None, 1, 8, 0x29, 2)
    assert code == 0
    assert fft.f_cufftExecC2C(plan, i, o, -1) == (0, [])
    np.testing.assert_allclose(mem.get(o, 16, np.complex64).reshape(2, 8), np.fft.fft(x, axis=1), rtol=1e-5,
                               atol=1e-5)
    # Z2Z inverse is not normalised
    z = rng.standard_normal(16) + 1j * rng.standard_normal(16)
    zi = mem.put(z)
    code, (p2,) = fft.f_cufftPlan1d(True, 16, 0x69, 1)
    assert fft.f_cufftExecZ2Z(p2, zi, zi, 1) == (0, [])
    np.testing.assert_allclose(mem.get(zi, 16, np.complex128), np.fft.ifft(z) * 16, rtol=1e-12, atol=1e-12)
    # D2Z / Z2D through cufftXtMakePlanMany (CUDA_R_64F -> CUDA_C_64F) on a cufftCreate plan, 2-D
    r = rng.standard_normal((6, 10))
    ri, ro = mem.put(r), mem.put(np.zeros(6 * 6, np.complex128))
    code, (p3,) = fft.f_cufftCreate(True)
    assert fft.f_cufftXtMakePlanMany(p3, 2, _ints(6, 10, size=8), None, 1, 0, 1, None, 1, 0, 5, 1, True, 5) == \
        (0, [0])
    assert fft.f_cufftXtExec(p3, ri, ro, -1) == (0, [])
    np.testing.assert_allclose(mem.get(ro, 36, np.complex128).reshape(6, 6), np.fft.rfft2(r), rtol=1e-12,
                               atol=1e-12)
    code, (p4,) = fft.f_cufftPlan2d(True, 6, 10, 0x6C)
    back = mem.put(np.zeros(60))
    assert fft.f_cufftExecZ2D(p4, ro, back) == (0, [])
    np.testing.assert_allclose(mem.get(back, 60, np.float64).reshape(6, 10) / 60, r, rtol=1e-12, atol=1e-12)
    # the wrong exec for a plan's type, an unknown type
    assert fft.f_cufftExecR2C(p2, zi, zi)[0] == 3
    assert fft.f_cufftPlan1d(True, 8, 0x77, 1)[0] == 3


def test_curand_statistics_and_positions(mem):
    rnd = EmuCurand(mem, "curand")
    code, (g,) = rnd.f_curandCreateGenerator(True, 100)
    rnd.f_curandSetPseudoRandomGeneratorSeed(g, 99)
    n = 200000
    out = mem.put(np.zeros(n, np.float64))
    assert rnd.f_curandGenerateNormalDouble(g, out, n, 1.5, 2.0) == (0, [])
    v = mem.get(out, n, np.float64)
    assert abs(v.mean() - 1.5) < 0.02 and abs(v.std() - 2.0) < 0.02
    assert rnd.f_curandGenerateLogNormal(g, out, 1000, 0.0, 0.5) == (0, [])
    assert (mem.get(out, 1000, np.float32) > 0).all()
    assert rnd.f_curandGeneratePoisson(g, out, 50000, 4.0) == (0, [])
    k = mem.get(out, 50000, np.uint32)
    assert abs(k.mean() - 4.0) < 0.05 and abs(k.var() - 4.0) < 0.15
    assert rnd.f_curandGenerateUniformDouble(g, out, n) == (0, [])
    u = mem.get(out, n, np.float64)
    assert u.min() > 0.0 and u.max() <= 1.0 and abs(u.mean() - 0.5) < 0.005
    # the seed keeps the position; the offset sets it
    rnd.f_curandSetGeneratorOffset(g, 0)
    rnd.f_curandGenerate(g, out, 8)
    a = mem.get(out, 8, np.uint32)
    rnd.f_curandSetGeneratorOffset(g, 4)
    rnd.f_curandGenerate(g, out, 4)
    assert (mem.get(out, 4, np.uint32) == a[4:]).all()
    assert rnd.f_curandGenerateNormal(g, out, 3, 0.0, 1.0)[0] == 105      # odd count
    assert rnd.f_curandSetQuasiRandomGeneratorDimensions(g, 2)[0] == 103   # not quasirandom


def test_cusparse_spmm_orders_and_transposed_spmv(mem):
    sp = EmuCusparse(mem, "cusparse")
    rng = np.random.default_rng(2)
    dense = rng.standard_normal((5, 4)) * (rng.random((5, 4)) < 0.5)
    rows, cols = np.nonzero(dense)
    rp = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=5))]).astype(np.int64) + 1   # one-based
    code, (h,) = sp.f_cusparseCreate(True)
    code, (A,) = sp.f_cusparseCreateCsr(True, 5, 4, rows.size, mem.put(rp), mem.put(cols.astype(np.int64) + 1),
                                        mem.put(dense[rows, cols]), 3, 3, 1, 1)
    assert code == 0
    alpha, beta = struct.pack("d", 1.5), struct.pack("d", -0.5)
    # y = alpha A^T x + beta y
    x, y = rng.standard_normal(5), rng.standard_normal(4)
    xa, ya = mem.put(x), mem.put(y)
    _, (vx,) = sp.f_cusparseCreateDnVec(True, 5, xa, 1)
    _, (vy,) = sp.f_cusparseCreateDnVec(True, 4, ya, 1)
    assert sp.f_cusparseSpMV(h, 1, alpha, A, vx, beta, vy, 1, 0, 0) == (0, [])
    np.testing.assert_allclose(mem.get(ya, 4, np.float64), 1.5 * dense.T @ x - 0.5 * y, rtol=1e-12)
    # C = alpha A B + beta C, B and C column-major (ld 6) then row-major (ld 3)
    for order, ldb, ldc in ((1, 6, 6), (2, 3, 3)):
        B, C = rng.standard_normal((4, 3)), rng.standard_normal((5, 3))
        braw = np.zeros((3, ldb)) if order == 1 else np.zeros((4, ldb))
        craw = np.zeros((3, ldc)) if order == 1 else np.zeros((5, ldc))
        if order == 1:
            braw[:, :4], craw[:, :5] = B.T, C.T
        else:
            braw[:, :3], craw[:, :3] = B, C
        ba, ca = mem.put(braw), mem.put(craw)
        _, (mb,) = sp.f_cusparseCreateDnMat(True, 4, 3, ldb, ba, 1, order)
        _, (mc,) = sp.f_cusparseCreateDnMat(True, 5, 3, ldc, ca, 1, order)
        assert sp.f_cusparseSpMM(h, 0, 0, alpha, A, mb, beta, mc, 1, 0, 0) == (0, [])
        got = mem.get(ca, craw.size, np.float64).reshape(craw.shape)
        got = got[:, :5].T if order == 1 else got[:, :3]
        np.testing.assert_allclose(got, 1.5 * dense @ B - 0.5 * C, rtol=1e-12, atol=1e-12)
    # device pointer mode: alpha/beta must then be addresses
    sp.f_cusparseSetPointerMode(h, 1)
    with pytest.raises(CudaError, match="pointer mode"):
        sp.f_cusparseSpMV(h, 0, alpha, A, vy, beta, vx, 1, 0, 0)


def test_cusolver_upper_cholesky_transposed_lu_and_64bit_api(mem):
    so = EmuCusolver(mem, "cusolver")
    rng = np.random.default_rng(3)
    n = 7
    m = rng.standard_normal((n, n))
    spd = m @ m.T + n * np.eye(n)
    b = rng.standard_normal((n, 2))
    code, (h,) = so.f_cusolverDnCreate(True)
    info = mem.put(np.array([-1], np.int32))
    # upper, double: A = U^T U
    a = mem.put(np.asfortranarray(spd).ravel(order="F"))
    assert so.f_cusolverDnDpotrf(h, 1, n, a, n, 0, 0, info) == (0, [])
    U = np.triu(mem.get(a, n * n, np.float64).reshape(n, n, order="F"))
    np.testing.assert_allclose(U.T @ U, spd, rtol=1e-12, atol=1e-12)
    bb = mem.put(b.ravel(order="F"))
    assert so.f_cusolverDnDpotrs(h, 1, n, 2, a, n, bb, n, info) == (0, [])
    np.testing.assert_allclose(mem.get(bb, 2 * n, np.float64).reshape(n, 2, order="F"), np.linalg.solve(spd, b),
                               rtol=1e-10)
    assert mem.get(info, 1, np.int32)[0] == 0
    # not positive definite: info names the first failing minor (LAPACK)
    bad = spd.copy()
    bad[2, 2] = -50.0
    a2 = mem.put(bad.ravel(order="F"))
    so.f_cusolverDnDpotrf(h, 0, n, a2, n, 0, 0, info)
    assert mem.get(info, 1, np.int32)[0] == 3
    # LU, single precision, solve with A^T
    g = (rng.standard_normal((n, n)) + 3 * np.eye(n)).astype(np.float32)
    a3, piv = mem.put(g.ravel(order="F")), mem.put(np.zeros(n, np.int32))
    assert so.f_cusolverDnSgetrf(h, n, n, a3, n, 0, piv, info) == (0, [])
    p = mem.get(piv, n, np.int32)
    assert p.min() >= 1 and p.max() <= n, "pivots are 1-based"
    rhs = rng.standard_normal(n).astype(np.float32)
    r = mem.put(rhs)
    assert so.f_cusolverDnSgetrs(h, 1, n, 1, a3, n, piv, r, n, info) == (0, [])
    np.testing.assert_allclose(mem.get(r, n, np.float32), np.linalg.solve(g.T.astype(np.float64), rhs), rtol=1e-3,
                               atol=1e-4)
    # the 64-bit API (PyTorch's cholesky): CUDA_R_64F, lower
    _, (params,) = so.f_cusolverDnCreateParams(True)
    a4 = mem.put(spd.ravel(order="F"))
    assert so.f_cusolverDnXpotrf_bufferSize(h, params, 0, n, 1, a4, n, 1, True, True) == (0, [0, 0])
    assert so.f_cusolverDnXpotrf(h, params, 0, n, 1, a4, n, 1, 0, 0, None, 0, info) == (0, [])
    L = np.tril(mem.get(a4, n * n, np.float64).reshape(n, n, order="F"))
    np.testing.assert_allclose(L, np.linalg.cholesky(spd), rtol=1e-12, atol=1e-12)
    b5 = mem.put(b.ravel(order="F"))
    assert so.f_cusolverDnXpotrs(h, params, 0, n, 2, 1, a4, n, 1, b5, n, info) == (0, [])
    np.testing.assert_allclose(mem.get(b5, 2 * n, np.float64).reshape(n, 2, order="F"), np.linalg.solve(spd, b),
                               rtol=1e-10)
