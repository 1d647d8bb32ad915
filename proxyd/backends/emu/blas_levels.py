"""The emulated backend's cuBLAS beyond gemm: level 1 (with results in host
or device memory by the handle's pointer mode), level 2, level 3, the
extensions (geam, dgmm, batched gemm over device arrays of pointers) and the
batched LU factorisation, inverse and solve (docs/libraries.md, "Emulated
backend").

Conventions followed (cuBLAS documentation, "cuBLAS Level-1/2/3 Function
Reference", "BLAS-like Extension"): column-major matrices with leading
dimensions; cublasFillMode_t LOWER 0 / UPPER 1 names the triangle that is
read (and, for syrk/herk/syr/her, the only one written); cublasDiagType_t
UNIT 1 takes the diagonal as ones without reading it; cublasSideMode_t LEFT
0 / RIGHT 1; iamax/iamin answer 1-based indices and compare |re| + |im| for
complex vectors, as asum sums them (BLAS's definitions); getrfBatched writes
LAPACK's 1-based row interchanges and, with P NULL, factors without pivoting.
Products are formed in float64/complex128 and rounded once: callers compare
with a tolerance, as with the GPU. Only positive increments are emulated.

What is supported in the spec but not emulated here (EMU_PENDING) answers
not-supported on the emulated backend with a message naming it; the GPU runs
NVIDIA's library for all of them.

Locking: the worker's main loop only (like blas.py).
"""
from __future__ import annotations

import re
import struct

import numpy as np

from gpuproxy.proxyd.core.session import CudaError

OK, INVALID = 0, 7                              # cublasStatus_t
OP_N, OP_T, OP_C = 0, 1, 2                      # cublasOperation_t
LOWER, UPPER = 0, 1                             # cublasFillMode_t
UNIT = 1                                        # cublasDiagType_t
LEFT, RIGHT = 0, 1                              # cublasSideMode_t

# prefix -> (numpy type, struct format of one real component, complex?)
TYPES = {"S": (np.float32, "f", False), "D": (np.float64, "d", False),
         "C": (np.complex64, "f", True), "Z": (np.complex128, "d", True)}
WIDE = {False: np.float64, True: np.complex128}

# supported in specs/cublas but not emulated (tests on the GPU cover them):
# the banded and packed level-2 forms, rotm, the Ex variants other than
# gemm's, syrkx/herkx, the batched triangular solve, QR and least squares
EMU_PENDING = re.compile(
    r"cublas([SDCZ](gbmv|sbmv|hbmv|spmv|hpmv|spr|spr2|hpr|hpr2|tbmv|tbsv|tpmv|tpsv|syr2|her2|syrkx|herkx|"
    r"trsmBatched|geqrfBatched|gelsBatched|tpttr|trttp|gemvBatched|gemvStridedBatched|rotm)(_v2)?(_64)?|"
    r"(Nrm2|Dot|Dotc|Scal|Axpy|Copy|Swap|Iamax|Iamin|Asum|Rot|Rotm)Ex(_64)?|"
    r"Cgemm3mEx|CgemmEx|CsyrkEx|Csyrk3mEx|CherkEx|Cherk3mEx|GemmBatchedEx|Cgemm3mBatched|"
    r"Cgemm3mStridedBatched)(_64)?$")


def _op(a, t):
    return a if t == OP_N else a.T if t == OP_T else a.conj().T


def _sym(a, uplo, herm):
    """The full symmetric (Hermitian) matrix whose uplo triangle a holds."""
    tri = np.tril(a) if uplo == LOWER else np.triu(a)
    other = (np.tril(a, -1) if uplo == LOWER else np.triu(a, 1))
    full = tri + (other.conj().T if herm else other.T)
    if herm:
        full[np.diag_indices_from(full)] = full.diagonal().real
    return full


def _tri(a, uplo, diag):
    t = np.tril(a) if uplo == LOWER else np.triu(a)
    if diag == UNIT:
        t = t.copy()
        t[np.diag_indices_from(t)] = 1
    return t


def lu_factor(w, pivot=True):
    """LAPACK getrf on a square or rectangular float64/complex128 matrix, in
    place: (1-based pivots, info: 0 or the 1-based index of the first exact
    zero pivot)."""
    m, n = w.shape
    piv = np.arange(1, min(m, n) + 1, dtype=np.int32)
    info = 0
    for j in range(min(m, n)):
        p = j + int(np.argmax(np.abs(w[j:, j]))) if pivot else j
        piv[j] = p + 1
        if w[p, j] == 0:
            info = info or j + 1
            continue
        if p != j:
            w[[j, p], :] = w[[p, j], :]
        w[j + 1:, j] /= w[j, j]
        w[j + 1:, j + 1:] -= np.outer(w[j + 1:, j], w[j, j + 1:])
    return piv, info


def lu_solve(lu, piv, b, trans):
    """Solves op(A) X = B from getrf's factors (A = P L U); piv 1-based."""
    n = lu.shape[0]
    L = np.tril(lu, -1) + np.eye(n)
    U = np.triu(lu)
    x = b.copy()
    if trans == OP_N:
        for i in range(n):
            if piv[i] - 1 != i:
                x[[i, piv[i] - 1], :] = x[[piv[i] - 1, i], :]
        return np.linalg.solve(U, np.linalg.solve(L, x))
    Lt, Ut = (L.T, U.T) if trans == OP_T else (L.conj().T, U.conj().T)
    x = np.linalg.solve(Lt, np.linalg.solve(Ut, x))
    for i in reversed(range(n)):
        if piv[i] - 1 != i:
            x[[i, piv[i] - 1], :] = x[[piv[i] - 1, i], :]
    return x


class BlasLevels:
    """Mixed into blas.EmuLibrary (which provides _obj, _mat, _vec,
    _scalar, _cscalar, _check_mode and the backend's resolve)."""

    # ------------------------------------------------------------ plumbing
    def _mode(self, h, *scalars):
        self._check_mode(self._obj(h)["pointer_mode"] == 1, *scalars)

    def _val(self, v, p):
        """alpha/beta/c/s of type prefix p (S, D: real; C, Z: complex)."""
        _, fmt, cplx = TYPES[p]
        return self._cscalar(v, fmt) if cplx else self._scalar(v, fmt)

    def _result(self, res, value, fmt):
        """Level-1 result: bytes (host pointer mode: answered) or a device
        address (device mode: written there), blas's scalar_out role."""
        if isinstance(value, complex) or fmt in ("ff", "dd"):
            raw = struct.pack(fmt, complex(value).real, complex(value).imag)
        else:
            raw = struct.pack(fmt, value)
        if res is None:
            return INVALID, None
        if isinstance(res, int):
            self.b.resolve(int(res), len(raw))[:] = np.frombuffer(raw, np.uint8)
            return OK, [None]
        return OK, [raw]

    def _ptrs(self, arr, count):
        """A device array of count device pointers (gemmBatched's Aarray)."""
        if count <= 0:
            return []
        return [int(x) for x in self.b.resolve(int(arr), 8 * count).view(np.uint64)]

    # ------------------------------------------------------------- level 1
    def _l1_dot(self, p, conj, h, n, x, incx, y, incy, result):
        self._mode(h, result)
        dt, fmt, cplx = TYPES[p]
        xv = self._vec(x, n, incx, dt).astype(WIDE[cplx])
        yv = self._vec(y, n, incy, dt).astype(WIDE[cplx])
        v = np.sum((xv.conj() if conj else xv) * yv) if n > 0 else 0
        return self._result(result, complex(v) if cplx else float(v), fmt * 2 if cplx else fmt)

    def _l1_nrm2(self, p, h, n, x, incx, result):
        self._mode(h, result)
        dt, fmt, cplx = TYPES[p]
        v = float(np.sqrt(np.sum(np.abs(self._vec(x, n, incx, dt).astype(WIDE[cplx])) ** 2))) if n > 0 else 0.0
        return self._result(result, v, fmt)

    def _l1_asum(self, p, h, n, x, incx, result):
        self._mode(h, result)
        dt, fmt, cplx = TYPES[p]
        xv = self._vec(x, n, incx, dt).astype(WIDE[cplx])
        v = float(np.sum(np.abs(xv.real) + np.abs(xv.imag))) if n > 0 else 0.0
        return self._result(result, v, fmt)

    def _l1_iam(self, p, largest, size, h, n, x, incx, result):
        self._mode(h, result)
        dt, _, cplx = TYPES[p]
        if n <= 0 or incx <= 0:
            return self._result(result, 0, "i" if size == 4 else "q")
        xv = self._vec(x, n, incx, dt).astype(WIDE[cplx])
        mag = np.abs(xv.real) + np.abs(xv.imag)
        i = int(np.argmax(mag) if largest else np.argmin(mag)) + 1
        return self._result(result, i, "i" if size == 4 else "q")

    def _l1_axpy(self, p, h, n, alpha, x, incx, y, incy):
        self._mode(h, alpha)
        dt, _, cplx = TYPES[p]
        yv = self._vec(y, n, incy, dt)
        yv[...] = (self._val(alpha, p) * self._vec(x, n, incx, dt).astype(WIDE[cplx]) + yv).astype(dt)
        return OK, []

    def _l1_scal(self, p, ap, h, n, alpha, x, incx):
        self._mode(h, alpha)
        dt, _, cplx = TYPES[p]
        xv = self._vec(x, n, incx, dt)
        xv[...] = (self._val(alpha, ap) * xv.astype(WIDE[cplx])).astype(dt)
        return OK, []

    def _l1_copy(self, p, h, n, x, incx, y, incy):
        self._obj(h)
        dt = TYPES[p][0]
        self._vec(y, n, incy, dt)[...] = self._vec(x, n, incx, dt)
        return OK, []

    def _l1_swap(self, p, h, n, x, incx, y, incy):
        self._obj(h)
        dt = TYPES[p][0]
        xv, yv = self._vec(x, n, incx, dt), self._vec(y, n, incy, dt)
        t = xv.copy()
        xv[...] = yv
        yv[...] = t
        return OK, []

    def _l1_rot(self, p, sp, h, n, x, incx, y, incy, c, s):
        """x' = c x + s y, y' = -conj(s) x + c y (c real; cuBLAS rot)."""
        self._mode(h, c, s)
        dt, _, cplx = TYPES[p]
        cr = self._val(c, "D" if TYPES[p][1] == "d" else "S")
        sv = self._val(s, sp)
        xv, yv = self._vec(x, n, incx, dt), self._vec(y, n, incy, dt)
        a, b = xv.astype(WIDE[cplx]), yv.astype(WIDE[cplx])
        xv[...] = (cr * a + sv * b).astype(dt)
        yv[...] = (-np.conj(sv) * a + cr * b).astype(dt)
        return OK, []

    # ------------------------------------------------------------- level 2
    def _l2_gemv(self, p, h, trans, m, n, alpha, A, lda, x, incx, beta, y, incy):
        self._mode(h, alpha, beta)
        dt, _, cplx = TYPES[p]
        if m < 0 or n < 0 or trans not in (OP_N, OP_T, OP_C):
            return INVALID, None
        op = _op(self._mat(A, m, n, lda, dt).astype(WIDE[cplx]), trans)
        xv = self._vec(x, op.shape[1], incx, dt)
        yv = self._vec(y, op.shape[0], incy, dt)
        al, be = self._val(alpha, p), self._val(beta, p)
        yv[...] = (al * (op @ xv.astype(WIDE[cplx])) + (be * yv.astype(WIDE[cplx]) if be != 0 else 0)).astype(dt)
        return OK, []

    def _l2_ger(self, p, conj, h, m, n, alpha, x, incx, y, incy, A, lda):
        self._mode(h, alpha)
        dt, _, cplx = TYPES[p]
        a = self._mat(A, m, n, lda, dt)
        xv = self._vec(x, m, incx, dt).astype(WIDE[cplx])
        yv = self._vec(y, n, incy, dt).astype(WIDE[cplx])
        a[...] = (a + self._val(alpha, p) * np.outer(xv, yv.conj() if conj else yv)).astype(dt)
        return OK, []

    def _l2_symv(self, p, herm, h, uplo, n, alpha, A, lda, x, incx, beta, y, incy):
        self._mode(h, alpha, beta)
        dt, _, cplx = TYPES[p]
        full = _sym(self._mat(A, n, n, lda, dt).astype(WIDE[cplx]), uplo, herm)
        yv = self._vec(y, n, incy, dt)
        al, be = self._val(alpha, p), self._val(beta, p)
        res = al * (full @ self._vec(x, n, incx, dt).astype(WIDE[cplx]))
        yv[...] = (res + (be * yv.astype(WIDE[cplx]) if be != 0 else 0)).astype(dt)
        return OK, []

    def _l2_syr(self, p, herm, h, uplo, n, alpha, x, incx, A, lda):
        """A += alpha x x^T (x x^H, alpha real): the uplo triangle only."""
        self._mode(h, alpha)
        dt, fmt, cplx = TYPES[p]
        a = self._mat(A, n, n, lda, dt)
        xv = self._vec(x, n, incx, dt).astype(WIDE[cplx])
        al = self._scalar(alpha, fmt) if herm else self._val(alpha, p)
        upd = a + al * np.outer(xv, xv.conj() if herm else xv)
        idx = np.tril_indices(n) if uplo == LOWER else np.triu_indices(n)
        a[idx] = upd[idx].astype(dt)
        if herm:
            a[np.diag_indices(n)] = a.diagonal().real
        return OK, []

    def _l2_trmv(self, p, h, uplo, trans, diag, n, A, lda, x, incx):
        self._obj(h)
        dt, _, cplx = TYPES[p]
        t = _op(_tri(self._mat(A, n, n, lda, dt).astype(WIDE[cplx]), uplo, diag), trans)
        xv = self._vec(x, n, incx, dt)
        xv[...] = (t @ xv.astype(WIDE[cplx])).astype(dt)
        return OK, []

    def _l2_trsv(self, p, h, uplo, trans, diag, n, A, lda, x, incx):
        self._obj(h)
        dt, _, cplx = TYPES[p]
        t = _op(_tri(self._mat(A, n, n, lda, dt).astype(WIDE[cplx]), uplo, diag), trans)
        xv = self._vec(x, n, incx, dt)
        xv[...] = np.linalg.solve(t, xv.astype(WIDE[cplx])).astype(dt)
        return OK, []

    # ------------------------------------------------------------- level 3
    def _l3_gemm(self, p, h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc):
        if TYPES[p][2]:
            return self._cgemm(h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, TYPES[p][0], TYPES[p][1])
        self._mode(h, alpha, beta)
        return self._gemm(ta, tb, m, n, k, self._val(alpha, p), A, lda, B, ldb, self._val(beta, p), C, ldc,
                          TYPES[p][0]), []

    def _l3_symm(self, p, herm, h, side, uplo, m, n, alpha, A, lda, B, ldb, beta, C, ldc):
        self._mode(h, alpha, beta)
        dt, _, cplx = TYPES[p]
        ka = m if side == LEFT else n
        full = _sym(self._mat(A, ka, ka, lda, dt).astype(WIDE[cplx]), uplo, herm)
        b = self._mat(B, m, n, ldb, dt).astype(WIDE[cplx])
        c = self._mat(C, m, n, ldc, dt)
        al, be = self._val(alpha, p), self._val(beta, p)
        prod = full @ b if side == LEFT else b @ full
        c[...] = (al * prod + (be * c.astype(WIDE[cplx]) if be != 0 else 0)).astype(dt)
        return OK, []

    def _l3_syrk(self, p, herm, h, uplo, trans, n, k, alpha, A, lda, beta, C, ldc):
        self._mode(h, alpha, beta)
        dt, fmt, cplx = TYPES[p]
        a = self._mat(A, n if trans == OP_N else k, k if trans == OP_N else n, lda, dt).astype(WIDE[cplx])
        opa = a if trans == OP_N else a.T if not herm else a.conj().T
        prod = opa @ (opa.conj().T if herm else opa.T)
        al, be = (self._scalar(alpha, fmt), self._scalar(beta, fmt)) if herm else \
            (self._val(alpha, p), self._val(beta, p))
        c = self._mat(C, n, n, ldc, dt)
        upd = al * prod + (be * c.astype(WIDE[cplx]) if be != 0 else 0)
        idx = np.tril_indices(n) if uplo == LOWER else np.triu_indices(n)
        c[idx] = np.asarray(upd)[idx].astype(dt)
        if herm:
            c[np.diag_indices(n)] = c.diagonal().real
        return OK, []

    def _l3_syr2k(self, p, herm, h, uplo, trans, n, k, alpha, A, lda, B, ldb, beta, C, ldc):
        self._mode(h, alpha, beta)
        dt, fmt, cplx = TYPES[p]
        shape = (n if trans == OP_N else k, k if trans == OP_N else n)
        a = self._mat(A, *shape, lda, dt).astype(WIDE[cplx])
        b = self._mat(B, *shape, ldb, dt).astype(WIDE[cplx])
        T = (lambda x: x.conj().T) if herm else (lambda x: x.T)   # noqa: E731
        opa, opb = (a, b) if trans == OP_N else (T(a), T(b))
        al = self._val(alpha, p)
        be = self._scalar(beta, fmt) if herm else self._val(beta, p)
        prod = al * (opa @ T(opb)) + (np.conj(al) if herm else al) * (opb @ T(opa))
        c = self._mat(C, n, n, ldc, dt)
        upd = prod + (be * c.astype(WIDE[cplx]) if be != 0 else 0)
        idx = np.tril_indices(n) if uplo == LOWER else np.triu_indices(n)
        c[idx] = np.asarray(upd)[idx].astype(dt)
        if herm:
            c[np.diag_indices(n)] = c.diagonal().real
        return OK, []

    def _l3_trmm(self, p, h, side, uplo, trans, diag, m, n, alpha, A, lda, B, ldb, C, ldc):
        """cuBLAS's trmm is out of place: C = alpha op(A) B or alpha B op(A)."""
        self._mode(h, alpha)
        dt, _, cplx = TYPES[p]
        ka = m if side == LEFT else n
        t = _op(_tri(self._mat(A, ka, ka, lda, dt).astype(WIDE[cplx]), uplo, diag), trans)
        b = self._mat(B, m, n, ldb, dt).astype(WIDE[cplx])
        res = self._val(alpha, p) * (t @ b if side == LEFT else b @ t)
        self._mat(C, m, n, ldc, dt)[...] = res.astype(dt)
        return OK, []

    def _l3_trsm(self, p, h, side, uplo, trans, diag, m, n, alpha, A, lda, B, ldb):
        """op(A) X = alpha B (left) or X op(A) = alpha B (right); X over B."""
        self._mode(h, alpha)
        dt, _, cplx = TYPES[p]
        if side not in (LEFT, RIGHT) or uplo not in (LOWER, UPPER) or trans not in (OP_N, OP_T, OP_C):
            return INVALID, None
        ka = m if side == LEFT else n
        t = _op(_tri(self._mat(A, ka, ka, lda, dt).astype(WIDE[cplx]), uplo, diag), trans)
        b = self._mat(B, m, n, ldb, dt)
        rhs = self._val(alpha, p) * b.astype(WIDE[cplx])
        x = np.linalg.solve(t, rhs) if side == LEFT else np.linalg.solve(t.T, rhs.T).T
        b[...] = x.astype(dt)
        return OK, []

    # ---------------------------------------------------------- extensions
    def _x_geam(self, p, h, ta, tb, m, n, alpha, A, lda, beta, B, ldb, C, ldc):
        """C = alpha op(A) + beta op(B); in place (C is A or B) allowed."""
        self._mode(h, alpha, beta)
        dt, _, cplx = TYPES[p]
        al, be = self._val(alpha, p), self._val(beta, p)
        res = np.zeros((m, n), WIDE[cplx])
        if al != 0:
            res += al * _op(self._mat(A, m if ta == OP_N else n, n if ta == OP_N else m, lda, dt)
                            .astype(WIDE[cplx]), ta)
        if be != 0:
            res += be * _op(self._mat(B, m if tb == OP_N else n, n if tb == OP_N else m, ldb, dt)
                            .astype(WIDE[cplx]), tb)
        self._mat(C, m, n, ldc, dt)[...] = res.astype(dt)
        return OK, []

    def _x_dgmm(self, p, h, mode, m, n, A, lda, x, incx, C, ldc):
        """C = A diag(x) (CUBLAS_SIDE_RIGHT) or diag(x) A (LEFT)."""
        self._obj(h)
        dt, _, cplx = TYPES[p]
        a = self._mat(A, m, n, lda, dt).astype(WIDE[cplx])
        xv = self._vec(x, m if mode == LEFT else n, incx, dt).astype(WIDE[cplx])
        res = xv[:, None] * a if mode == LEFT else a * xv[None, :]
        self._mat(C, m, n, ldc, dt)[...] = res.astype(dt)
        return OK, []

    def _x_gemm_batched(self, p, h, ta, tb, m, n, k, alpha, Aa, lda, Ba, ldb, beta, Ca, ldc, count):
        self._mode(h, alpha, beta)
        for a, b, c in zip(self._ptrs(Aa, count), self._ptrs(Ba, count), self._ptrs(Ca, count)):
            code, _ = self._l3_gemm(p, h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
            if code:
                return code, None
        return OK, []

    def _x_gemm_strided(self, p, h, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, count):
        item = np.dtype(TYPES[p][0]).itemsize
        for i in range(count):
            code, _ = self._l3_gemm(p, h, ta, tb, m, n, k, alpha, A + item * i * sa, lda, B + item * i * sb, ldb,
                                    beta, C + item * i * sc, ldc)
            if code:
                return code, None
        return OK, []

    def _x_getrf_batched(self, p, h, n, Aa, lda, P, info, count):
        self._obj(h)
        dt, _, cplx = TYPES[p]
        infos = self.b.resolve(int(info), 4 * count).view(np.int32) if info else None
        for i, a in enumerate(self._ptrs(Aa, count)):
            mat = self._mat(a, n, n, lda, dt)
            w = mat.astype(WIDE[cplx])
            piv, inf = lu_factor(w, pivot=bool(P))
            mat[...] = w.astype(dt)
            if P:
                self.b.resolve(int(P) + 4 * n * i, 4 * max(n, 1)).view(np.int32)[:n] = piv
            if infos is not None:
                infos[i] = inf
        return OK, []

    def _piv(self, P, i, n):
        if not P:
            return np.arange(1, n + 1, dtype=np.int32)
        return self.b.resolve(int(P) + 4 * n * i, 4 * max(n, 1)).view(np.int32)[:n].copy()

    def _x_getri_batched(self, p, h, n, Aa, lda, P, Ca, ldc, info, count):
        """C = inverse of A from getrfBatched's LU factors and pivots."""
        self._obj(h)
        dt, _, cplx = TYPES[p]
        infos = self.b.resolve(int(info), 4 * count).view(np.int32) if info else None
        for i, (a, c) in enumerate(zip(self._ptrs(Aa, count), self._ptrs(Ca, count))):
            lu = self._mat(a, n, n, lda, dt).astype(WIDE[cplx])
            zero = [j + 1 for j in range(n) if lu[j, j] == 0]
            if infos is not None:
                infos[i] = zero[0] if zero else 0
            if zero:
                continue
            self._mat(c, n, n, ldc, dt)[...] = lu_solve(lu, self._piv(P, i, n), np.eye(n, dtype=WIDE[cplx]),
                                                        OP_N).astype(dt)
        return OK, []

    def _x_getrs_batched(self, p, h, trans, n, nrhs, Aa, lda, P, Ba, ldb, info, count):
        """info is a host value here (cuBLAS documentation, getrsBatched:
        "info host output"): the argument check's result, 0 when valid."""
        self._obj(h)
        dt, _, cplx = TYPES[p]
        if n < 0 or nrhs < 0 or trans not in (OP_N, OP_T, OP_C) or lda < max(1, n) or ldb < max(1, n) or count < 0:
            bad = -2 if trans not in (OP_N, OP_T, OP_C) else -3 if n < 0 else -4 if nrhs < 0 else \
                -6 if lda < max(1, n) else -9 if ldb < max(1, n) else -11
            return OK, [bad]
        for i, (a, b) in enumerate(zip(self._ptrs(Aa, count), self._ptrs(Ba, count))):
            lu = self._mat(a, n, n, lda, dt).astype(WIDE[cplx])
            bm = self._mat(b, n, nrhs, ldb, dt)
            bm[...] = lu_solve(lu, self._piv(P, i, n), bm.astype(WIDE[cplx]), trans).astype(dt)
        return OK, [0]

    def _x_matinv_batched(self, p, h, n, Aa, lda, Ia, ldi, info, count):
        self._obj(h)
        if n > 32:
            return INVALID, None        # cuBLAS: matinvBatched is for n <= 32
        dt, _, cplx = TYPES[p]
        infos = self.b.resolve(int(info), 4 * count).view(np.int32) if info else None
        for i, (a, c) in enumerate(zip(self._ptrs(Aa, count), self._ptrs(Ia, count))):
            w = self._mat(a, n, n, lda, dt).astype(WIDE[cplx])
            piv, inf = lu_factor(w)
            if infos is not None:
                infos[i] = inf
            if not inf:
                self._mat(c, n, n, ldi, dt)[...] = lu_solve(w, piv, np.eye(n, dtype=WIDE[cplx]), OP_N).astype(dt)
        return OK, []


def _bind(name, impl, *fixed):
    def f(self, *args):
        return impl(self, *fixed, *args)
    f.__name__ = "f_" + name
    setattr(BlasLevels, "f_" + name, f)


def _register():
    B = BlasLevels
    for p in "SDCZ":
        cplx = TYPES[p][2]
        for sfx in ("_v2", "_v2_64"):
            size = 4 if sfx == "_v2" else 8
            if cplx:
                _bind(f"cublas{p}dotu{sfx}", B._l1_dot, p, False)
                _bind(f"cublas{p}dotc{sfx}", B._l1_dot, p, True)
            else:
                _bind(f"cublas{p}dot{sfx}", B._l1_dot, p, False)
            low = p.lower()
            _bind(f"cublasI{low}amax{sfx}", B._l1_iam, p, True, size)
            _bind(f"cublasI{low}amin{sfx}", B._l1_iam, p, False, size)
            pre = {"S": "S", "D": "D", "C": "Sc", "Z": "Dz"}[p]
            _bind(f"cublas{pre}nrm2{sfx}", B._l1_nrm2, p)
            _bind(f"cublas{pre}asum{sfx}", B._l1_asum, p)
            _bind(f"cublas{p}axpy{sfx}", B._l1_axpy, p)
            _bind(f"cublas{p}scal{sfx}", B._l1_scal, p, p)
            _bind(f"cublas{p}copy{sfx}", B._l1_copy, p)
            _bind(f"cublas{p}swap{sfx}", B._l1_swap, p)
            _bind(f"cublas{p}rot{sfx}", B._l1_rot, p, p)
            if cplx:
                real = "S" if p == "C" else "D"
                _bind(f"cublas{p}{real.lower()}scal{sfx}", B._l1_scal, p, real)
                _bind(f"cublas{p}{real.lower()}rot{sfx}", B._l1_rot, p, real)
            _bind(f"cublas{p}gemv{sfx}", B._l2_gemv, p)
            _bind(f"cublas{p}symv{sfx}", B._l2_symv, p, False)
            _bind(f"cublas{p}syr{sfx}", B._l2_syr, p, False)
            _bind(f"cublas{p}trmv{sfx}", B._l2_trmv, p)
            _bind(f"cublas{p}trsv{sfx}", B._l2_trsv, p)
            if cplx:
                _bind(f"cublas{p}geru{sfx}", B._l2_ger, p, False)
                _bind(f"cublas{p}gerc{sfx}", B._l2_ger, p, True)
                _bind(f"cublas{p}hemv{sfx}", B._l2_symv, p, True)
                _bind(f"cublas{p}her{sfx}", B._l2_syr, p, True)
                _bind(f"cublas{p}herk{sfx}", B._l3_syrk, p, True)
                _bind(f"cublas{p}her2k{sfx}", B._l3_syr2k, p, True)
                _bind(f"cublas{p}hemm{sfx}", B._l3_symm, p, True)
            else:
                _bind(f"cublas{p}ger{sfx}", B._l2_ger, p, False)
            _bind(f"cublas{p}gemm{sfx}", B._l3_gemm, p)
            _bind(f"cublas{p}symm{sfx}", B._l3_symm, p, False)
            _bind(f"cublas{p}syrk{sfx}", B._l3_syrk, p, False)
            _bind(f"cublas{p}syr2k{sfx}", B._l3_syr2k, p, False)
            _bind(f"cublas{p}trmm{sfx}", B._l3_trmm, p)
            _bind(f"cublas{p}trsm{sfx}", B._l3_trsm, p)
        for sfx in ("", "_64"):
            _bind(f"cublas{p}geam{sfx}", B._x_geam, p)
            _bind(f"cublas{p}dgmm{sfx}", B._x_dgmm, p)
            _bind(f"cublas{p}gemmBatched{sfx}", B._x_gemm_batched, p)
            _bind(f"cublas{p}gemmStridedBatched{sfx}", B._x_gemm_strided, p)
            if cplx:
                # gemm3m computes the same product (Gauss's complex trick on the GPU)
                _bind(f"cublas{p}gemm3m{sfx}", B._l3_gemm, p)
        _bind(f"cublas{p}getrfBatched", B._x_getrf_batched, p)
        _bind(f"cublas{p}getriBatched", B._x_getri_batched, p)
        _bind(f"cublas{p}getrsBatched", B._x_getrs_batched, p)
        _bind(f"cublas{p}matinvBatched", B._x_matinv_batched, p)


_register()
