"""The emulated cuBLAS levels 1-3, extensions and batched LU
(proxyd/backends/emu/blas_levels.py) and the emulated cuSOLVER QR, eigen and SVD
routines (mathlibs.py), each checked against its defining property computed
here independently (products, residuals, orthogonality) or against numpy
routines other than the one the emulation uses. The shim-to-worker path
(scalar_out results in both pointer modes, pointer arrays, host info) is in
tests/test_linalg_remoting.py; NVIDIA's library runs the same calls on the
GPU (tests/programs/linalg.cu, scripts/pyframeworks/cupy_check.py)."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from gpuproxy.emu.blas import EmuLibrary
from gpuproxy.emu.mathlibs import EmuCusolver

from test_emu_mathlibs import Memory

RNG = np.random.default_rng(7)


@pytest.fixture
def mem():
    return Memory()


def _blas(mem, device_mode=False):
    b = EmuLibrary(mem, "cublas")
    code, (h,) = b.f_cublasCreate_v2(True)
    assert code == 0
    if device_mode:
        assert b.f_cublasSetPointerMode_v2(h, 1) == (0, [])
    return b, h


def _f(fmt, *v):
    return struct.pack(fmt * len(v), *v)


def _fortran(a):
    """A matrix as cuBLAS stores it (column-major)."""
    return np.ravel(a, order="F")


def _getm(mem, addr, rows, cols, dtype, ld=None):
    ld = ld or rows
    flat = mem.get(addr, ld * cols, dtype)
    return flat.reshape(cols, ld).T[:rows]


def test_level1_results_in_host_and_device_memory(mem):
    x = RNG.standard_normal(33)
    y = RNG.standard_normal(33)
    b, h = _blas(mem)
    xa, ya = mem.put(x), mem.put(y)
    # host pointer mode: the result comes back as bytes (scalar_out)
    code, (raw,) = b.f_cublasDdot_v2(h, 33, xa, 1, ya, 1, bytes(8))
    assert code == 0 and struct.unpack("d", raw)[0] == pytest.approx(sum(p * q for p, q in zip(x, y)), rel=1e-12)
    code, (raw,) = b.f_cublasDnrm2_v2(h, 11, xa, 3, bytes(8))
    assert struct.unpack("d", raw)[0] == pytest.approx(sum(v * v for v in x[::3][:11]) ** 0.5, rel=1e-12)
    code, (raw,) = b.f_cublasIdamax_v2(h, 33, xa, 1, bytes(4))
    assert struct.unpack("i", raw)[0] == 1 + max(range(33), key=lambda i: abs(x[i]))
    code, (raw,) = b.f_cublasIdamin_v2_64(h, 33, xa, 1, bytes(8))
    assert struct.unpack("q", raw)[0] == 1 + min(range(33), key=lambda i: abs(x[i]))
    # complex: dotc conjugates x; asum sums |re| + |im| (BLAS)
    z = (RNG.standard_normal(9) + 1j * RNG.standard_normal(9)).astype(np.complex64)
    w = (RNG.standard_normal(9) + 1j * RNG.standard_normal(9)).astype(np.complex64)
    za, wa = mem.put(z), mem.put(w)
    code, (raw,) = b.f_cublasCdotc_v2(h, 9, za, 1, wa, 1, bytes(8))
    want = sum(complex(p).conjugate() * complex(q) for p, q in zip(z, w))
    assert complex(*struct.unpack("ff", raw)) == pytest.approx(want, rel=1e-5)
    code, (raw,) = b.f_cublasScasum_v2(h, 9, za, 1, bytes(4))
    assert struct.unpack("f", raw)[0] == pytest.approx(sum(abs(v.real) + abs(v.imag) for v in z), rel=1e-5)
    # device pointer mode: the result is written to device memory, nothing answered
    bd, hd = _blas(mem, device_mode=True)
    res = mem.put(np.zeros(1))
    assert bd.f_cublasDdot_v2(hd, 33, xa, 1, ya, 1, res) == (0, [None])
    assert mem.get(res, 1, np.float64)[0] == pytest.approx(float(np.dot(x, y)), rel=1e-12)
    # room for a value sent to a device-mode handle: the modes disagree, fail loudly
    with pytest.raises(Exception, match="pointer mode"):
        bd.f_cublasDdot_v2(hd, 33, xa, 1, ya, 1, bytes(8))


def test_level1_updates(mem):
    b, h = _blas(mem)
    x, y = RNG.standard_normal(10), RNG.standard_normal(10)
    xa, ya = mem.put(x), mem.put(y)
    c, s = 0.6, 0.8
    assert b.f_cublasDrot_v2(h, 10, xa, 1, ya, 1, _f("d", c), _f("d", s)) == (0, [])
    np.testing.assert_allclose(mem.get(xa, 10, np.float64), c * x + s * y, rtol=1e-12)
    np.testing.assert_allclose(mem.get(ya, 10, np.float64), -s * x + c * y, rtol=1e-12)
    assert b.f_cublasDswap_v2(h, 10, xa, 1, ya, 1) == (0, [])
    np.testing.assert_allclose(mem.get(ya, 10, np.float64), c * x + s * y, rtol=1e-12)
    z = (RNG.standard_normal(6) + 1j * RNG.standard_normal(6))
    za = mem.put(z)
    assert b.f_cublasZdscal_v2(h, 6, _f("d", 2.5), za, 1) == (0, [])
    np.testing.assert_allclose(mem.get(za, 6, np.complex128), 2.5 * z, rtol=1e-12)


def test_geam_dgmm_and_in_place(mem):
    b, h = _blas(mem)
    A = RNG.standard_normal((7, 5))     # op(A) = A^T is 5 x 7
    B = RNG.standard_normal((5, 7))
    aa, ba, ca = mem.put(_fortran(A)), mem.put(_fortran(B)), mem.put(np.zeros(35))
    assert b.f_cublasDgeam(h, 1, 0, 5, 7, _f("d", 2.0), aa, 7, _f("d", -1.0), ba, 5, ca, 5) == (0, [])
    np.testing.assert_allclose(_getm(mem, ca, 5, 7, np.float64), 2 * A.T - B, rtol=1e-12)
    # in place: C is B (cuBLAS allows it when ldb == ldc and B is not transposed)
    assert b.f_cublasDgeam(h, 1, 0, 5, 7, _f("d", 1.0), aa, 7, _f("d", 3.0), ba, 5, ba, 5) == (0, [])
    np.testing.assert_allclose(_getm(mem, ba, 5, 7, np.float64), A.T + 3 * B, rtol=1e-12)
    x = RNG.standard_normal(7)
    xa = mem.put(x)
    assert b.f_cublasDdgmm(h, 1, 5, 7, ca, 5, xa, 1, ca, 5) == (0, [])     # CUBLAS_SIDE_RIGHT: C diag(x)
    np.testing.assert_allclose(_getm(mem, ca, 5, 7, np.float64), (2 * A.T - B) * x[None, :], rtol=1e-12)


@pytest.mark.parametrize("side,uplo,trans,diag", [(0, 0, 0, 0), (1, 1, 1, 0), (0, 1, 2, 1)])
def test_trsm_solves_the_triangular_system(mem, side, uplo, trans, diag):
    b, h = _blas(mem)
    m, n = 6, 4
    ka = m if side == 0 else n
    A = (RNG.standard_normal((ka, ka)) + 1j * RNG.standard_normal((ka, ka))) + 4 * np.eye(ka)
    B = RNG.standard_normal((m, n)) + 1j * RNG.standard_normal((m, n))
    aa, ba = mem.put(_fortran(A.astype(np.complex128))), mem.put(_fortran(B.astype(np.complex128)))
    alpha = 0.5 - 0.25j
    assert b.f_cublasZtrsm_v2(h, side, uplo, trans, diag, m, n, _f("d", alpha.real, alpha.imag), aa, ka, ba, m) \
        == (0, [])
    X = _getm(mem, ba, m, n, np.complex128)
    T = np.tril(A) if uplo == 0 else np.triu(A)
    if diag == 1:
        T = T - np.diag(np.diag(T)) + np.eye(ka)
    opT = T if trans == 0 else T.T if trans == 1 else T.conj().T
    lhs = opT @ X if side == 0 else X @ opT
    np.testing.assert_allclose(lhs, alpha * B, rtol=1e-10, atol=1e-10)


def test_syrk_herk_symm_and_trmm(mem):
    b, h = _blas(mem)
    n, k = 5, 3
    A = RNG.standard_normal((n, k))
    C0 = RNG.standard_normal((n, n))
    aa, ca = mem.put(_fortran(A)), mem.put(_fortran(C0))
    assert b.f_cublasDsyrk_v2(h, 0, 0, n, k, _f("d", 2.0), aa, n, _f("d", 1.0), ca, n) == (0, [])
    got = _getm(mem, ca, n, n, np.float64)
    want = 2.0 * A @ A.T + C0
    np.testing.assert_allclose(np.tril(got), np.tril(want), rtol=1e-12)
    np.testing.assert_array_equal(np.triu(got, 1), np.triu(C0, 1)), "the other triangle is not written"
    Z = RNG.standard_normal((k, n)) + 1j * RNG.standard_normal((k, n))     # trans C: op(Z) = Z^H, n x k
    za, zc = mem.put(_fortran(Z)), mem.put(np.zeros(n * n, np.complex128))
    assert b.f_cublasZherk_v2(h, 1, 2, n, k, _f("d", 1.0), za, k, _f("d", 0.0), zc, n) == (0, [])
    np.testing.assert_allclose(np.triu(_getm(mem, zc, n, n, np.complex128)), np.triu(Z.conj().T @ Z), rtol=1e-12)
    S = RNG.standard_normal((n, n))
    Bm = RNG.standard_normal((n, 4))
    sa, bma, out = mem.put(_fortran(S)), mem.put(_fortran(Bm)), mem.put(np.zeros(n * 4))
    assert b.f_cublasDsymm_v2(h, 0, 1, n, 4, _f("d", 1.0), sa, n, bma, n, _f("d", 0.0), out, n) == (0, [])
    full = np.triu(S) + np.triu(S, 1).T
    np.testing.assert_allclose(_getm(mem, out, n, 4, np.float64), full @ Bm, rtol=1e-12)
    assert b.f_cublasDtrmm_v2(h, 0, 0, 1, 1, n, 4, _f("d", 3.0), sa, n, bma, n, out, n) == (0, [])
    T = np.tril(S)
    T[np.diag_indices(n)] = 1
    np.testing.assert_allclose(_getm(mem, out, n, 4, np.float64), 3.0 * T.T @ Bm, rtol=1e-12)


def _pointer_array(mem, addrs):
    return mem.put(np.array(addrs, np.uint64))


def test_batched_lu_inverse_and_solve_over_pointer_arrays(mem):
    b, h = _blas(mem)
    n, batch = 5, 3
    As = [RNG.standard_normal((n, n)) + 1j * RNG.standard_normal((n, n)) for _ in range(batch)]
    Bs = [RNG.standard_normal((n, 2)) + 1j * RNG.standard_normal((n, 2)) for _ in range(batch)]
    a_addr = [mem.put(_fortran(a.astype(np.complex64))) for a in As]
    c_addr = [mem.put(np.zeros(n * n, np.complex64)) for _ in As]
    b_addr = [mem.put(_fortran(x.astype(np.complex64))) for x in Bs]
    Aarr, Carr, Barr = (_pointer_array(mem, x) for x in (a_addr, c_addr, b_addr))
    piv, info = mem.put(np.zeros(n * batch, np.int32)), mem.put(np.full(batch, -1, np.int32))
    assert b.f_cublasCgetrfBatched(h, n, Aarr, n, piv, info, batch) == (0, [])
    assert list(mem.get(info, batch, np.int32)) == [0] * batch
    assert b.f_cublasCgetriBatched(h, n, Aarr, n, piv, Carr, n, info, batch) == (0, [])
    for a, c in zip(As, c_addr):
        np.testing.assert_allclose(a @ _getm(mem, c, n, n, np.complex64), np.eye(n), atol=1e-4)
    # getrsBatched: info is a host value (cuBLAS documentation), answered
    assert b.f_cublasCgetrsBatched(h, 0, n, 2, Aarr, n, piv, Barr, n, True, batch) == (0, [0])
    for a, x, bb in zip(As, b_addr, Bs):
        np.testing.assert_allclose(a @ _getm(mem, x, n, 2, np.complex64), bb, atol=1e-4)
    # an invalid argument is reported through that host info, as -(its position)
    assert b.f_cublasCgetrsBatched(h, 0, n, 2, Aarr, 2, piv, Barr, n, True, batch) == (0, [-6])
    # singular: info names the first zero pivot; matinvBatched gives the inverse in one call
    sing = mem.put(np.zeros(n * n, np.float64))
    good = RNG.standard_normal((n, n)) + n * np.eye(n)
    ga, gi = mem.put(_fortran(good)), mem.put(np.zeros(n * n))
    assert b.f_cublasDgetrfBatched(h, n, _pointer_array(mem, [sing]), n, piv, info, 1) == (0, [])
    assert mem.get(info, 1, np.int32)[0] == 1
    assert b.f_cublasDmatinvBatched(h, n, _pointer_array(mem, [ga]), n, _pointer_array(mem, [gi]), n, info, 1) \
        == (0, [])
    np.testing.assert_allclose(good @ _getm(mem, gi, n, n, np.float64), np.eye(n), atol=1e-10)


def test_gemm_batched_over_pointer_arrays_and_complex_strided(mem):
    b, h = _blas(mem)
    m, n, k, batch = 4, 3, 5, 2
    As = [RNG.standard_normal((m, k)) for _ in range(batch)]
    Bs = [RNG.standard_normal((k, n)) for _ in range(batch)]
    a = [mem.put(_fortran(x)) for x in As]
    bb = [mem.put(_fortran(x)) for x in Bs]
    c = [mem.put(np.zeros(m * n)) for _ in range(batch)]
    assert b.f_cublasDgemmBatched(h, 0, 0, m, n, k, _f("d", 1.0), _pointer_array(mem, a), m,
                                  _pointer_array(mem, bb), k, _f("d", 0.0), _pointer_array(mem, c), m, batch) == (0, [])
    for x, y, z in zip(As, Bs, c):
        np.testing.assert_allclose(_getm(mem, z, m, n, np.float64), x @ y, rtol=1e-12)
    Z = RNG.standard_normal((batch, m, k)) + 1j * RNG.standard_normal((batch, m, k))
    W = RNG.standard_normal((batch, k, n)) + 1j * RNG.standard_normal((batch, k, n))
    za = mem.put(np.concatenate([_fortran(x) for x in Z]))
    wa = mem.put(np.concatenate([_fortran(x) for x in W]))
    out = mem.put(np.zeros(batch * m * n, np.complex128))
    assert b.f_cublasZgemmStridedBatched(h, 0, 0, m, n, k, _f("d", 1.0, 0.0), za, m, m * k, wa, k, k * n,
                                         _f("d", 0.0, 0.0), out, m, m * n, batch) == (0, [])
    got = mem.get(out, batch * m * n, np.complex128).reshape(batch, n, m).transpose(0, 2, 1)
    np.testing.assert_allclose(got, Z @ W, rtol=1e-12)


# ---------------------------------------------------------------- cuSOLVER

def _solver(mem):
    so = EmuCusolver(mem, "cusolver")
    code, (h,) = so.f_cusolverDnCreate(True)
    assert code == 0
    return so, h


@pytest.mark.parametrize("t,dtype", [("D", np.float64), ("Z", np.complex128)])
def test_qr_factors_and_q(mem, t, dtype):
    so, h = _solver(mem)
    m, n = 7, 4
    A = RNG.standard_normal((m, n)).astype(dtype)
    if dtype == np.complex128:
        A = A + 1j * RNG.standard_normal((m, n))
    aa, tau, info = mem.put(_fortran(A)), mem.put(np.zeros(n, dtype)), mem.put(np.full(1, -1, np.int32))
    assert getattr(so, f"f_cusolverDn{t}geqrf")(h, m, n, aa, m, tau, 0, 0, info) == (0, [])
    R = np.triu(_getm(mem, aa, m, n, dtype))[:n]
    Cm = RNG.standard_normal((m, 3)).astype(dtype)
    ca = mem.put(_fortran(Cm))
    # ormqr/unmqr: Q^T C (Q^H C) from the reflectors, before orgqr overwrites them
    mq = "ormqr" if t == "D" else "unmqr"
    assert getattr(so, f"f_cusolverDn{t}{mq}")(h, 0, 1 if t == "D" else 2, m, 3, n, aa, m, tau, ca, m, 0, 0, info) \
        == (0, [])
    qtc = _getm(mem, ca, m, 3, dtype)
    gq = "orgqr" if t == "D" else "ungqr"
    assert getattr(so, f"f_cusolverDn{t}{gq}")(h, m, n, n, aa, m, tau, 0, 0, info) == (0, [])
    Q = _getm(mem, aa, m, n, dtype)
    assert mem.get(info, 1, np.int32)[0] == 0
    np.testing.assert_allclose(Q @ R, A, atol=1e-12)
    np.testing.assert_allclose(Q.conj().T @ Q, np.eye(n), atol=1e-12)
    np.testing.assert_allclose(qtc[:n], Q.conj().T @ Cm, atol=1e-12)


def test_symmetric_eigen_with_jacobi_params(mem):
    so, h = _solver(mem)
    n = 6
    S = RNG.standard_normal((n, n))
    S = S + S.T
    code, (params,) = so.f_cusolverDnCreateSyevjInfo(True)
    assert code == 0 and so.f_cusolverDnXsyevjSetTolerance(params, 1e-10) == (0, [])
    sa, w, info = mem.put(_fortran(S)), mem.put(np.zeros(n)), mem.put(np.full(1, -1, np.int32))
    assert so.f_cusolverDnDsyevj(h, 1, 0, n, sa, n, w, 0, 0, info, params) == (0, [])
    V, ev = _getm(mem, sa, n, n, np.float64), mem.get(w, n, np.float64)
    np.testing.assert_allclose(S @ V, V * ev, atol=1e-10)
    np.testing.assert_allclose(ev, np.sort(np.linalg.eigvals(S).real), atol=1e-10)
    code, (res,) = so.f_cusolverDnXsyevjGetResidual(h, params, True)
    assert code == 0 and 0 <= res < 1e-8
    # Hermitian, eigenvalues only (jobz NOVECTOR): A is not overwritten with vectors
    Hm = RNG.standard_normal((n, n)) + 1j * RNG.standard_normal((n, n))
    Hm = Hm + Hm.conj().T
    ha, wz = mem.put(_fortran(Hm.astype(np.complex64))), mem.put(np.zeros(n, np.float32))
    assert so.f_cusolverDnCheevd(h, 0, 1, n, ha, n, wz, 0, 0, info) == (0, [])
    np.testing.assert_allclose(mem.get(wz, n, np.float32), np.sort(np.linalg.eigvals(Hm).real), atol=1e-4)
    assert so.f_cusolverDnDestroySyevjInfo(params) == (0, [])


def test_svd_gesvd_and_gesvdj(mem):
    so, h = _solver(mem)
    m, n = 7, 4
    A = RNG.standard_normal((m, n))
    ref = np.sqrt(np.sort(np.linalg.eigvals(A.T @ A).real)[::-1])
    aa, s, u, vt = mem.put(_fortran(A)), mem.put(np.zeros(n)), mem.put(np.zeros(m * n)), mem.put(np.zeros(n * n))
    info = mem.put(np.full(1, -1, np.int32))
    assert so.f_cusolverDnDgesvd(h, ord("S"), ord("S"), m, n, aa, m, s, u, m, vt, n, 0, 0, 0, info) == (0, [])
    S, U, VT = mem.get(s, n, np.float64), _getm(mem, u, m, n, np.float64), _getm(mem, vt, n, n, np.float64)
    np.testing.assert_allclose(S, ref, rtol=1e-10)
    np.testing.assert_allclose((U * S) @ VT, A, atol=1e-12)
    # cuSOLVER's gesvd needs m >= n
    assert so.f_cusolverDnDgesvd(h, ord("N"), ord("N"), n, m, aa, n, s, u, m, vt, n, 0, 0, 0, info)[0] == 3
    code, (p,) = so.f_cusolverDnCreateGesvdjInfo(True)
    aa = mem.put(_fortran(A))
    v = mem.put(np.zeros(n * n))
    assert so.f_cusolverDnDgesvdj(h, 1, 1, m, n, aa, m, s, u, m, v, n, 0, 0, info, p) == (0, [])
    S, U, V = mem.get(s, n, np.float64), _getm(mem, u, m, n, np.float64), _getm(mem, v, n, n, np.float64)
    np.testing.assert_allclose((U * S) @ V.T, A, atol=1e-12)


def test_complex_cholesky_and_lu(mem):
    so, h = _solver(mem)
    n = 5
    G = RNG.standard_normal((n, n)) + 1j * RNG.standard_normal((n, n))
    P = G @ G.conj().T + n * np.eye(n)           # Hermitian positive definite
    pa, info = mem.put(_fortran(P)), mem.put(np.full(1, -1, np.int32))
    assert so.f_cusolverDnZpotrf(h, 1, n, pa, n, 0, 0, info) == (0, [])         # upper: P = U^H U
    U = np.triu(_getm(mem, pa, n, n, np.complex128))
    np.testing.assert_allclose(U.conj().T @ U, P, atol=1e-10)
    B = RNG.standard_normal((n, 2)) + 1j * RNG.standard_normal((n, 2))
    ba = mem.put(_fortran(B))
    assert so.f_cusolverDnZpotrs(h, 1, n, 2, pa, n, ba, n, info) == (0, [])
    np.testing.assert_allclose(P @ _getm(mem, ba, n, 2, np.complex128), B, atol=1e-10)
    ga, piv = mem.put(_fortran(G)), mem.put(np.zeros(n, np.int32))
    assert so.f_cusolverDnZgetrf(h, n, n, ga, n, 0, piv, info) == (0, [])
    ba = mem.put(_fortran(B))
    assert so.f_cusolverDnZgetrs(h, 2, n, 2, ga, n, piv, ba, n, info) == (0, [])    # conjugate transpose
    np.testing.assert_allclose(G.conj().T @ _getm(mem, ba, n, 2, np.complex128), B, atol=1e-10)


def test_gesvd_overwrite_and_the_64_bit_api(mem):
    """CuPy's svd asks gesvd for U (or V^T) over A (jobu/jobvt 'O'); its
    eigh calls cusolverDnXsyevd (64-bit API, host workspace)."""
    so, h = _solver(mem)
    m, n = 6, 4
    A = RNG.standard_normal((m, n))
    aa, s, vt = mem.put(_fortran(A)), mem.put(np.zeros(n)), mem.put(np.zeros(n * n))
    info = mem.put(np.full(1, -1, np.int32))
    assert so.f_cusolverDnDgesvd(h, ord("O"), ord("S"), m, n, aa, m, s, 0, m, vt, n, 0, 0, 0, info) == (0, [])
    U, S, VT = _getm(mem, aa, m, n, np.float64), mem.get(s, n, np.float64), _getm(mem, vt, n, n, np.float64)
    np.testing.assert_allclose((U * S) @ VT, A, atol=1e-12)
    code, (p,) = so.f_cusolverDnCreateParams(True)
    R_64F = 1
    Sym = RNG.standard_normal((n, n))
    Sym = Sym + Sym.T
    sa, w = mem.put(_fortran(Sym)), mem.put(np.zeros(n))
    assert so.f_cusolverDnXsyevd_bufferSize(h, p, 1, 1, n, R_64F, sa, n, R_64F, w, R_64F, True, True)[0] == 0
    assert so.f_cusolverDnXsyevd(h, p, 1, 1, n, R_64F, sa, n, R_64F, w, R_64F, 0, 0, None, 0, info) == (0, [])
    V, ev = _getm(mem, sa, n, n, np.float64), mem.get(w, n, np.float64)
    np.testing.assert_allclose(Sym @ V, V * ev, atol=1e-10)
    G = RNG.standard_normal((n, n)) + n * np.eye(n)
    B = RNG.standard_normal((n, 2))
    ga, ba, piv = mem.put(_fortran(G)), mem.put(_fortran(B)), mem.put(np.zeros(n, np.int64))
    assert so.f_cusolverDnXgetrf(h, p, n, n, R_64F, ga, n, piv, R_64F, 0, 0, None, 0, info) == (0, [])
    assert so.f_cusolverDnXgetrs(h, p, 0, n, 2, R_64F, ga, n, piv, R_64F, ba, n, info) == (0, [])
    np.testing.assert_allclose(G @ _getm(mem, ba, n, 2, np.float64), B, atol=1e-10)


def test_syev_batched_64_bit_api(mem):
    """JAX's batched eigh calls cusolverDnXsyevBatched: batchSize matrices
    n x n one after the other (lda * n apart), eigenvalues n apart, one info
    each (cusolverDn.h)."""
    so, h = _solver(mem)
    code, (p,) = so.f_cusolverDnCreateParams(True)
    R_32F = 0
    n, batch = 5, 3
    mats = []
    for _ in range(batch):
        m = RNG.standard_normal((n, n)).astype(np.float32)
        mats.append(m + m.T)
    a = mem.put(np.concatenate([_fortran(m) for m in mats]))
    w = mem.put(np.zeros(n * batch, np.float32))
    info = mem.put(np.full(batch, -1, np.int32))
    assert so.f_cusolverDnXsyevBatched_bufferSize(h, p, 1, 1, n, R_32F, a, n, R_32F, w, R_32F, True, True,
                                                  batch)[0] == 0
    assert so.f_cusolverDnXsyevBatched(h, p, 1, 1, n, R_32F, a, n, R_32F, w, R_32F, 0, 0, None, 0, info,
                                       batch) == (0, [])
    ev = mem.get(w, n * batch, np.float32).reshape(batch, n)
    vecs = mem.get(a, n * n * batch, np.float32).reshape(batch, n, n)
    for k, m in enumerate(mats):
        np.testing.assert_allclose(ev[k], np.linalg.eigvalsh(m.astype(np.float64)), rtol=1e-4, atol=1e-4)
        v = vecs[k].T                   # column-major
        np.testing.assert_allclose(m @ v, v * ev[k], atol=1e-3)
    assert list(mem.get(info, batch, np.int32)) == [0] * batch


def test_geev_and_gesvdp_64_bit_api(mem):
    """JAX's eig calls cusolverDnXgeev (W complex; a real matrix's
    eigenvectors in LAPACK's real layout) and its svd may call
    cusolverDnXgesvdp (A = U diag(S) V^H, V itself, not V^H). Checked by the
    defining equations, not against the emulation's own numbers."""
    so, h = _solver(mem)
    code, (p,) = so.f_cusolverDnCreateParams(True)
    R_64F, C_64F = 1, 5
    n = 4
    A = np.array([[0.0, -2.0, 0.5, 0.0], [2.0, 0.0, 0.0, 1.0], [0.0, 0.3, 1.0, 0.0], [0.1, 0.0, 0.0, 3.0]])
    aa = mem.put(_fortran(A))
    w = mem.put(np.zeros(n, np.complex128))
    vl, vr = mem.put(np.zeros(n * n)), mem.put(np.zeros(n * n))
    info = mem.put(np.full(1, -1, np.int32))
    assert so.f_cusolverDnXgeev_bufferSize(h, p, 1, 1, n, R_64F, aa, n, C_64F, w, R_64F, vl, n, R_64F, vr, n, R_64F,
                                           True, True)[0] == 0
    assert so.f_cusolverDnXgeev(h, p, 1, 1, n, R_64F, aa, n, C_64F, w, R_64F, vl, n, R_64F, vr, n, R_64F, 0, 0,
                                None, 0, info) == (0, [])
    ev = mem.get(w, n, np.complex128)
    assert np.any(ev.imag != 0), "the test matrix has a complex pair"
    np.testing.assert_allclose(sorted(ev, key=lambda z: (z.real, z.imag)),
                               sorted(np.linalg.eigvals(A), key=lambda z: (z.real, z.imag)), atol=1e-10)

    def unpack(cols):
        v = np.zeros((n, n), np.complex128)
        j = 0
        while j < n:
            if ev[j].imag != 0:
                v[:, j] = cols[:, j] + 1j * cols[:, j + 1]
                v[:, j + 1] = cols[:, j] - 1j * cols[:, j + 1]
                j += 2
            else:
                v[:, j] = cols[:, j]
                j += 1
        return v
    R = unpack(_getm(mem, vr, n, n, np.float64))
    L = unpack(_getm(mem, vl, n, n, np.float64))
    np.testing.assert_allclose(A @ R, R * ev, atol=1e-10)
    np.testing.assert_allclose(L.conj().T @ A, ev[:, None] * L.conj().T, atol=1e-10)
    assert mem.get(info, 1, np.int32)[0] == 0

    m, k = 6, 4
    B = RNG.standard_normal((m, k))
    ba, s, u, v = mem.put(_fortran(B)), mem.put(np.zeros(k)), mem.put(np.zeros(m * k)), mem.put(np.zeros(k * k))
    assert so.f_cusolverDnXgesvdp_bufferSize(h, p, 1, 1, m, k, R_64F, ba, m, R_64F, s, R_64F, u, m, R_64F, v, k,
                                             R_64F, True, True)[0] == 0
    code, outs = so.f_cusolverDnXgesvdp(h, p, 1, 1, m, k, R_64F, ba, m, R_64F, s, R_64F, u, m, R_64F, v, k, R_64F,
                                        0, 0, None, 0, info, True)
    assert code == 0 and outs == [0.0]
    U, S, V = _getm(mem, u, m, k, np.float64), mem.get(s, k, np.float64), _getm(mem, v, k, k, np.float64)
    np.testing.assert_allclose((U * S) @ V.T, B, atol=1e-10)
