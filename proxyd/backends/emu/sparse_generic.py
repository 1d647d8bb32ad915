"""The emulated backend's cuSPARSE generic API beyond CSR SpMV/SpMM
(issue 26; docs/libraries.md): CSC and COO descriptors, the descriptors'
getters and setters, sparse vectors (SpVec: Gather, Scatter, SpVV),
dense<->sparse conversion, SpGEMM and SpSV, as CuPy
(cupyx.scipy.sparse) and PyTorch's sparse tensors call them. numpy only.

Semantics followed (cuSPARSE library guide, "Generic API"):
- a descriptor names device arrays; nothing is copied when it is made.
- cusparseDenseToSparse_analysis counts the dense matrix's non-zeros and
  sets the sparse descriptor's nnz (read back with cusparseSpMatGetSize);
  _convert fills the descriptor's arrays (CSR: row offsets, column indices
  in row order; CSC: column offsets, row indices in column order; COO: row
  and column indices in row-major order), index base as the descriptor says.
- cusparseSpGEMM: workEstimation and compute, each called first with a NULL
  buffer (the size is answered through bufferSize) and again with it;
  compute forms C = alpha op(A) op(B) and sets C's nnz; copy writes C's CSR
  arrays. beta other than 0 is not emulated (an explicit not-supported).
- cusparseSpSV: the triangle of A named by its CUSPARSE_SPMAT_FILL_MODE
  attribute (default lower), unit diagonal per CUSPARSE_SPMAT_DIAG_TYPE;
  solve computes y with op(T) y = alpha x.
- preprocess calls change no result: accepted after their arguments are
  checked.

Locking: the worker's main loop only (like mathlibs.py).
"""
from __future__ import annotations

import struct

import numpy as np

from gpuproxy.proxyd.core.session import CudaError

from .mathlibs import _INDEX, SP_INVALID, SP_OK, EmuCusparse, _dtype

# cusparse.h: cusparseFormat_t, cusparseSpMatAttribute_t, fill mode, diagonal type
FMT_CSR, FMT_CSC, FMT_COO = 1, 2, 3
ATTR_FILL_MODE, ATTR_DIAG_TYPE = 0, 1
FILL_LOWER, FILL_UPPER = 0, 1
DIAG_NON_UNIT, DIAG_UNIT = 0, 1
OP_N, OP_T, OP_C = 0, 1, 2
_FORMAT = {"csr": FMT_CSR, "csc": FMT_CSC, "coo": FMT_COO}
# a buffer size answered for the calls that need one (any size > 0 works:
# the emulation keeps its state in the descriptor, not the buffer)
_BUFFER = 256


# what _dn names in its refusal, by the descriptor kinds it checks
_DESC_NAMES = {"dnmat": "dense matrix", "dnvec": "dense vector", "spvec": "sparse vector",
               "spgemm": "SpGEMM descriptor", "spsv": "SpSV descriptor", "spsm": "SpSM descriptor"}


class EmuCusparseGeneric(EmuCusparse):
    # ------------------------------------------------------ descriptors
    def _check_idx(self, *types):
        if any(t not in _INDEX for t in types):
            raise CudaError(1, f"index type {types} (32- and 64-bit indices are emulated)")

    def f_cusparseCreateConstCsr(self, out, rows, cols, nnz, rp, ci, vals, rpt, cit, base, vt):
        return self.f_cusparseCreateCsr(out, rows, cols, nnz, rp, ci, vals, rpt, cit, base, vt)

    def f_cusparseCreateCsc(self, out, rows, cols, nnz, cp, ri, vals, cpt, rit, base, vt):
        if base not in (0, 1) or min(rows, cols, nnz) < 0:
            return SP_INVALID, None
        self._check_idx(cpt, rit)
        _dtype(vt)
        return SP_OK, [self._new(kind="csc", rows=rows, cols=cols, nnz=nnz, cp=cp, ri=ri, vals=vals, cpt=cpt,
                                 rit=rit, base=base, vt=vt)]

    f_cusparseCreateConstCsc = f_cusparseCreateCsc

    def f_cusparseCreateCoo(self, out, rows, cols, nnz, ri, ci, vals, it, base, vt):
        if base not in (0, 1) or min(rows, cols, nnz) < 0:
            return SP_INVALID, None
        self._check_idx(it)
        _dtype(vt)
        return SP_OK, [self._new(kind="coo", rows=rows, cols=cols, nnz=nnz, ri=ri, ci=ci, vals=vals, it=it,
                                 base=base, vt=vt)]

    f_cusparseCreateConstCoo = f_cusparseCreateCoo

    def f_cusparseCreateConstDnMat(self, out, rows, cols, ld, vals, vt, order):
        return self.f_cusparseCreateDnMat(out, rows, cols, ld, vals, vt, order)

    def f_cusparseCreateConstDnVec(self, out, size, vals, vt):
        return self.f_cusparseCreateDnVec(out, size, vals, vt)

    def _sp(self, m, kind=None):
        o = self._obj(m)
        if o.get("kind") not in _FORMAT or (kind and o["kind"] != kind):
            raise CudaError(1, f"descriptor {m} is not a {kind or 'sparse'} matrix")
        return o

    def f_cusparseCscSetPointers(self, m, cp, ri, vals):
        self._sp(m, "csc").update(cp=cp, ri=ri, vals=vals)
        return SP_OK, []

    def f_cusparseCooSetPointers(self, m, ri, ci, vals):
        self._sp(m, "coo").update(ri=ri, ci=ci, vals=vals)
        return SP_OK, []

    def f_cusparseSpMatGetSize(self, m, r, c, n):
        o = self._sp(m)
        return SP_OK, [o["rows"], o["cols"], o["nnz"]]

    def f_cusparseSpMatGetFormat(self, m, out):
        return SP_OK, [_FORMAT[self._sp(m)["kind"]]]

    def f_cusparseSpMatGetIndexBase(self, m, out):
        return SP_OK, [self._sp(m)["base"]]

    def f_cusparseCsrGet(self, m, *outs):
        o = self._sp(m, "csr")
        return SP_OK, [o["rows"], o["cols"], o["nnz"], o["rp"], o["ci"], o["vals"], o["rpt"], o["cit"], o["base"],
                       o["vt"]]

    f_cusparseConstCsrGet = f_cusparseCsrGet

    def f_cusparseCscGet(self, m, *outs):
        o = self._sp(m, "csc")
        return SP_OK, [o["rows"], o["cols"], o["nnz"], o["cp"], o["ri"], o["vals"], o["cpt"], o["rit"], o["base"],
                       o["vt"]]

    f_cusparseConstCscGet = f_cusparseCscGet

    def f_cusparseCooGet(self, m, *outs):
        o = self._sp(m, "coo")
        return SP_OK, [o["rows"], o["cols"], o["nnz"], o["ri"], o["ci"], o["vals"], o["it"], o["base"], o["vt"]]

    f_cusparseConstCooGet = f_cusparseCooGet

    def f_cusparseSpMatGetValues(self, m, out):
        return SP_OK, [self._sp(m)["vals"]]

    f_cusparseConstSpMatGetValues = f_cusparseSpMatGetValues

    def f_cusparseSpMatSetValues(self, m, vals):
        self._sp(m)["vals"] = vals
        return SP_OK, []

    def f_cusparseSpMatGetAttribute(self, m, attr, data, size):
        o = self._sp(m)
        if attr not in (ATTR_FILL_MODE, ATTR_DIAG_TYPE) or not data or size < 4:
            return SP_INVALID, None
        v = o.get("fill", FILL_LOWER) if attr == ATTR_FILL_MODE else o.get("diag", DIAG_NON_UNIT)
        return SP_OK, [struct.pack("<i", v).ljust(int(size), b"\0")]

    def f_cusparseSpMatSetAttribute(self, m, attr, data, size):
        o = self._sp(m)
        raw = bytes(data or b"")
        if attr not in (ATTR_FILL_MODE, ATTR_DIAG_TYPE) or len(raw) < 4:
            return SP_INVALID, []
        v = struct.unpack_from("<i", raw)[0]
        if v not in (0, 1):
            return SP_INVALID, []
        o["fill" if attr == ATTR_FILL_MODE else "diag"] = v
        return SP_OK, []

    def _dn(self, m, kind):
        """m's descriptor, which must be of `kind` (_DESC_NAMES)."""
        o = self._obj(m)
        if o.get("kind") != kind:
            raise CudaError(1, f"descriptor {m} is not a {_DESC_NAMES.get(kind, kind)}")
        return o

    def f_cusparseDnMatGet(self, m, *outs):
        o = self._dn(m, "dnmat")
        return SP_OK, [o["rows"], o["cols"], o["ld"], o["vals"], o["vt"], o["order"]]

    f_cusparseConstDnMatGet = f_cusparseDnMatGet

    def f_cusparseDnMatGetValues(self, m, out):
        return SP_OK, [self._dn(m, "dnmat")["vals"]]

    f_cusparseConstDnMatGetValues = f_cusparseDnMatGetValues

    def f_cusparseDnMatSetValues(self, m, vals):
        self._dn(m, "dnmat")["vals"] = vals
        return SP_OK, []

    def f_cusparseDnVecGet(self, v, *outs):
        o = self._dn(v, "dnvec")
        return SP_OK, [o["size"], o["vals"], o["vt"]]

    f_cusparseConstDnVecGet = f_cusparseDnVecGet

    def f_cusparseDnVecGetValues(self, v, out):
        return SP_OK, [self._dn(v, "dnvec")["vals"]]

    f_cusparseConstDnVecGetValues = f_cusparseDnVecGetValues

    # ----------------------------------------------------- sparse vectors
    # cusparse.h, "SPARSE VECTOR DESCRIPTOR": size entries, nnz of them stored
    # (indices and values in device memory, index base as the descriptor
    # says); CuPy's csrsort/cscsort/coosort gather through one when the
    # legacy cusparse<t>gthr is gone (CUDA 12).
    def f_cusparseCreateSpVec(self, out, size, nnz, idx, vals, it, base, vt):
        if base not in (0, 1) or size < 0 or not 0 <= nnz <= size:
            return SP_INVALID, None
        self._check_idx(it)
        _dtype(vt)
        return SP_OK, [self._new(kind="spvec", size=size, nnz=nnz, idx=idx, vals=vals, it=it, base=base, vt=vt)]

    f_cusparseCreateConstSpVec = f_cusparseCreateSpVec

    def f_cusparseDestroySpVec(self, v):
        self._dn(v, "spvec")
        del self.objs[v]
        return SP_OK, []

    def f_cusparseSpVecGet(self, v, *outs):
        o = self._dn(v, "spvec")
        return SP_OK, [o["size"], o["nnz"], o["idx"], o["vals"], o["it"], o["base"], o["vt"]]

    f_cusparseConstSpVecGet = f_cusparseSpVecGet

    def f_cusparseSpVecGetIndexBase(self, v, out):
        return SP_OK, [self._dn(v, "spvec")["base"]]

    def f_cusparseSpVecGetValues(self, v, out):
        return SP_OK, [self._dn(v, "spvec")["vals"]]

    f_cusparseConstSpVecGetValues = f_cusparseSpVecGetValues

    def f_cusparseSpVecSetValues(self, v, vals):
        self._dn(v, "spvec")["vals"] = vals
        return SP_OK, []

    def _spvec(self, x, y):
        """(indices zero-based, values, dense values) of a sparse vector x
        and a dense vector y of the same size (views into device memory)."""
        xo, yo = self._dn(x, "spvec"), self._dn(y, "dnvec")
        if xo["size"] != yo["size"]:
            raise CudaError(1, f"sparse vector of size {xo['size']}, dense vector of size {yo['size']}")
        nnz = xo["nnz"]
        ind = self._ints(xo["idx"], nnz, xo["it"]).astype(np.int64) - xo["base"]
        if nnz and (ind.min() < 0 or ind.max() >= xo["size"]):
            raise CudaError(1, "sparse vector indices outside its size")
        return ind, self._values(xo["vals"], nnz, xo["vt"]), self._values(yo["vals"], yo["size"], yo["vt"])

    def f_cusparseGather(self, h, y, x):
        """x.values[i] = y[x.indices[i]] (cusparse.h, cusparseGather)."""
        self._obj(h)
        ind, xv, yv = self._spvec(x, y)
        xv[:] = yv[ind].astype(xv.dtype)
        return SP_OK, []

    def f_cusparseScatter(self, h, x, y):
        """y[x.indices[i]] = x.values[i], the other entries of y untouched."""
        self._obj(h)
        ind, xv, yv = self._spvec(x, y)
        yv[ind] = xv.astype(yv.dtype)
        return SP_OK, []

    def f_cusparseSpVV_bufferSize(self, h, op, x, y, result, ct, out):
        self._obj(h)
        self._spvec(x, y), _dtype(ct)
        return SP_OK, [_BUFFER]

    def f_cusparseSpVV(self, h, op, x, y, result, ct, buf):
        """result = sum op(x.values[i]) * y[x.indices[i]], op N or C
        (conjugate), in the compute type; written by the handle's pointer
        mode (host: answered, device: at the address)."""
        hobj = self._obj(h)
        if op not in (OP_N, OP_C):
            return SP_INVALID, None
        ind, xv, yv = self._spvec(x, y)
        dt = np.dtype(_dtype(ct))
        xs = np.conj(xv) if op == OP_C else xv
        val = dt.type(np.sum(xs.astype(np.complex128 if dt.kind == "c" else np.float64) * yv[ind]))
        raw = np.array([val], dt).tobytes()
        if result is None:
            return SP_INVALID, None
        self._check_mode(hobj["pointer_mode"] == 1, result)
        if isinstance(result, int):
            self.b.resolve(int(result), len(raw))[:] = np.frombuffer(raw, np.uint8)
            return SP_OK, [None]
        return SP_OK, [raw]

    # ---------------------------------------------------- array plumbing
    def _ints(self, addr, n, t):
        it = _INDEX[t]
        return self.b.resolve(int(addr), max(n, 1) * np.dtype(it).itemsize).view(it)[:n]

    def _values(self, addr, n, vt):
        dt = _dtype(vt)
        return self.b.resolve(int(addr), max(n, 1) * np.dtype(dt).itemsize).view(dt)[:n]

    def _csr(self, m):
        """The dense matrix of a CSR, CSC or COO descriptor (float64/complex128)."""
        o = self._sp(m)
        if o["kind"] == "csr":
            return super()._csr(m)
        nnz, base = o["nnz"], o["base"]
        v = self._values(o["vals"], nnz, o["vt"])
        dense = np.zeros((o["rows"], o["cols"]), np.complex128 if np.iscomplexobj(v) else np.float64)
        if o["kind"] == "csc":
            cp = self._ints(o["cp"], o["cols"] + 1, o["cpt"]).astype(np.int64) - base
            ri = self._ints(o["ri"], nnz, o["rit"]).astype(np.int64) - base
            if cp[0] != 0 or cp[-1] != nnz or np.any(np.diff(cp) < 0) or (nnz and (ri.min() < 0 or
                                                                                   ri.max() >= o["rows"])):
                raise CudaError(1, "CSC arrays are inconsistent with the descriptor's sizes")
            cols = np.repeat(np.arange(o["cols"]), np.diff(cp))
            np.add.at(dense, (ri, cols), v)
        else:
            ri = self._ints(o["ri"], nnz, o["it"]).astype(np.int64) - base
            ci = self._ints(o["ci"], nnz, o["it"]).astype(np.int64) - base
            if nnz and (ri.min() < 0 or ri.max() >= o["rows"] or ci.min() < 0 or ci.max() >= o["cols"]):
                raise CudaError(1, "COO indices outside the descriptor's sizes")
            np.add.at(dense, (ri, ci), v)
        return dense

    def _write_sparse(self, o, dense):
        """Fills a descriptor's arrays from a dense matrix with o['nnz'] non-zeros."""
        base, nnz = o["base"], o["nnz"]
        if o["kind"] == "csc":
            cols, rows = np.nonzero(dense.T)          # column-major order
        else:
            rows, cols = np.nonzero(dense)            # row-major order
        if rows.size != nnz:
            raise CudaError(1, f"the matrix has {rows.size} non-zeros, the descriptor {nnz}")
        vals = self._values(o["vals"], nnz, o["vt"])
        vals[:] = dense[rows, cols].astype(vals.dtype)
        if o["kind"] == "csr":
            rp = self._ints(o["rp"], o["rows"] + 1, o["rpt"])
            rp[:] = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=o["rows"]))]) + base
            self._ints(o["ci"], nnz, o["cit"])[:] = cols + base
        elif o["kind"] == "csc":
            cp = self._ints(o["cp"], o["cols"] + 1, o["cpt"])
            cp[:] = np.concatenate([[0], np.cumsum(np.bincount(cols, minlength=o["cols"]))]) + base
            self._ints(o["ri"], nnz, o["rit"])[:] = rows + base
        else:
            self._ints(o["ri"], nnz, o["it"])[:] = rows + base
            self._ints(o["ci"], nnz, o["it"])[:] = cols + base

    # ---------------------------------------------------- conversions
    def f_cusparseDenseToSparse_bufferSize(self, h, A, B, alg, out):
        self._obj(h), self._dn(A, "dnmat"), self._sp(B)
        return SP_OK, [_BUFFER]

    def f_cusparseDenseToSparse_analysis(self, h, A, B, alg, buf):
        self._obj(h)
        a, o = self._dnmat(A), self._sp(B)
        if a.shape != (o["rows"], o["cols"]):
            return SP_INVALID, []
        o["nnz"] = int(np.count_nonzero(a))
        return SP_OK, []

    def f_cusparseDenseToSparse_convert(self, h, A, B, alg, buf):
        self._obj(h)
        a, o = self._dnmat(A), self._sp(B)
        if a.shape != (o["rows"], o["cols"]):
            return SP_INVALID, []
        self._write_sparse(o, np.array(a))
        return SP_OK, []

    def f_cusparseSparseToDense_bufferSize(self, h, A, B, alg, out):
        self._obj(h), self._sp(A), self._dn(B, "dnmat")
        return SP_OK, [_BUFFER]

    def f_cusparseSparseToDense(self, h, A, B, alg, buf):
        self._obj(h)
        a, b = self._csr(A), self._dnmat(B)
        if a.shape != b.shape:
            return SP_INVALID, []
        b[...] = a.astype(b.dtype)
        return SP_OK, []

    def f_cusparseSpMM_preprocess(self, h, opa, opb, alpha, A, B, beta, C, ct, alg, buf):
        self._scalars(h, alpha, beta, ct)
        self._sp(A), self._dn(B, "dnmat"), self._dn(C, "dnmat")
        return SP_OK, []

    def f_cusparseSpMV_preprocess(self, h, op, alpha, A, x, beta, y, ct, alg, buf):
        self._scalars(h, alpha, beta, ct)
        self._sp(A), self._dn(x, "dnvec"), self._dn(y, "dnvec")
        return SP_OK, []

    # ---------------------------------------------------------- SpGEMM
    def f_cusparseSpGEMM_createDescr(self, out):
        return SP_OK, [self._new(kind="spgemm", stage=0)]

    def f_cusparseSpGEMM_destroyDescr(self, d):
        self._dn(d, "spgemm")
        del self.objs[d]
        return SP_OK, []

    def _gemm_operands(self, h, opa, opb, alpha, A, B, beta, C, ct):
        al, be = self._scalars(h, alpha, beta, ct)
        if be != 0:
            raise CudaError(801, "cusparseSpGEMM with beta != 0 is not emulated")
        a, b = self._op(self._csr(A), opa), self._op(self._csr(B), opb)
        c = self._sp(C, "csr")
        if a.shape[1] != b.shape[0] or (c["rows"], c["cols"]) != (a.shape[0], b.shape[1]):
            raise CudaError(1, "SpGEMM operands' sizes do not match")
        return al, a, b, c

    def f_cusparseSpGEMM_workEstimation(self, h, opa, opb, alpha, A, B, beta, C, ct, alg, d, size, buf):
        self._gemm_operands(h, opa, opb, alpha, A, B, beta, C, ct)
        g = self._dn(d, "spgemm")
        if size is None:
            return SP_INVALID, None
        if not buf:
            return SP_OK, [_BUFFER]
        g["stage"] = 1
        return SP_OK, [size]

    def f_cusparseSpGEMM_compute(self, h, opa, opb, alpha, A, B, beta, C, ct, alg, d, size, buf):
        al, a, b, c = self._gemm_operands(h, opa, opb, alpha, A, B, beta, C, ct)
        g = self._dn(d, "spgemm")
        if g["stage"] < 1 or size is None:
            return SP_INVALID, None
        if not buf:
            return SP_OK, [_BUFFER]
        res = al * (a @ b)
        g.update(stage=2, result=res, products=int(np.sum((a != 0).sum(axis=0) * (b != 0).sum(axis=1))))
        c["nnz"] = int(np.count_nonzero(res))
        return SP_OK, [size]

    def f_cusparseSpGEMM_copy(self, h, opa, opb, alpha, A, B, beta, C, ct, alg, d):
        self._gemm_operands(h, opa, opb, alpha, A, B, beta, C, ct)
        g = self._dn(d, "spgemm")
        if g["stage"] < 2:
            return SP_INVALID, []
        c = self._sp(C, "csr")
        c["nnz"] = int(np.count_nonzero(g["result"]))
        self._write_sparse(c, g["result"])
        return SP_OK, []

    def f_cusparseSpGEMM_getNumProducts(self, d, out):
        g = self._dn(d, "spgemm")
        if g["stage"] < 2:
            return SP_INVALID, None
        return SP_OK, [g["products"]]

    # ------------------------------------------------------------ SpSV
    def f_cusparseSpSV_createDescr(self, out):
        return SP_OK, [self._new(kind="spsv", analysed=False)]

    def f_cusparseSpSV_destroyDescr(self, d):
        self._dn(d, "spsv")
        del self.objs[d]
        return SP_OK, []

    def _triangle(self, A, op):
        o = self._sp(A)
        a = self._csr(A)
        if a.shape[0] != a.shape[1]:
            raise CudaError(1, "SpSV needs a square matrix")
        t = np.tril(a) if o.get("fill", FILL_LOWER) == FILL_LOWER else np.triu(a)
        if o.get("diag", DIAG_NON_UNIT) == DIAG_UNIT:
            np.fill_diagonal(t, 1)
        return self._op(t, op)

    def f_cusparseSpSV_bufferSize(self, h, op, alpha, A, x, y, ct, alg, d, out):
        self._scalars(h, alpha, alpha, ct)
        self._triangle(A, op), self._dn(x, "dnvec"), self._dn(y, "dnvec"), self._dn(d, "spsv")
        return SP_OK, [_BUFFER]

    def f_cusparseSpSV_analysis(self, h, op, alpha, A, x, y, ct, alg, d, buf):
        self._scalars(h, alpha, alpha, ct)
        self._triangle(A, op)
        self._dn(d, "spsv").update(analysed=True, A=A, op=op)
        return SP_OK, []

    def f_cusparseSpSV_solve(self, h, op, alpha, A, x, y, ct, alg, d):
        al, _ = self._scalars(h, alpha, alpha, ct)
        s = self._dn(d, "spsv")
        if not s["analysed"]:
            return SP_INVALID, []
        t = self._triangle(A, op)
        xo, yo = self._dn(x, "dnvec"), self._dn(y, "dnvec")
        n = t.shape[0]
        if xo["size"] != n or yo["size"] != n:
            return SP_INVALID, []
        xv = self._values(xo["vals"], n, xo["vt"])
        yv = self._values(yo["vals"], n, yo["vt"])
        if np.any(np.diagonal(t) == 0):
            raise CudaError(1, "SpSV: a zero on the diagonal (singular triangle)")
        yv[:] = np.linalg.solve(t, al * xv.astype(t.dtype)).astype(yv.dtype)
        return SP_OK, []

    # --------------------------------- format conversions (CuPy's tocsc/tocoo)
    def _csr_arrays(self, m, nnz, rp, ci, base):
        rpv = self._ints(rp, m + 1, 2).astype(np.int64) - base
        civ = self._ints(ci, nnz, 2).astype(np.int64) - base
        if rpv[0] != 0 or rpv[-1] != nnz or np.any(np.diff(rpv) < 0):
            raise CudaError(1, "CSR row offsets are inconsistent with nnz")
        return rpv, civ

    def f_cusparseCsr2cscEx2_bufferSize(self, h, m, n, nnz, val, rp, ci, cval, cp, ri, vt, copy, base, alg, out):
        self._obj(h)
        if min(m, n, nnz) < 0 or base not in (0, 1):
            return SP_INVALID, None
        return SP_OK, [_BUFFER]

    def f_cusparseCsr2cscEx2(self, h, m, n, nnz, val, rp, ci, cval, cp, ri, vt, copy, base, alg, buf):
        """cusparse.h: the CSC form of an m x n CSR matrix (its transpose's
        CSR); copyValues CUSPARSE_ACTION_NUMERIC (1) also moves the values.
        Within a column, entries keep their row order (a stable sort)."""
        self._obj(h)
        if min(m, n, nnz) < 0 or base not in (0, 1):
            return SP_INVALID, []
        rpv, civ = self._csr_arrays(m, nnz, rp, ci, base)
        rows = np.repeat(np.arange(m), np.diff(rpv))
        if nnz and (civ.min() < 0 or civ.max() >= n):
            return SP_INVALID, []
        order = np.lexsort((rows, civ))            # by column, then row
        self._ints(cp, n + 1, 2)[:] = np.concatenate([[0], np.cumsum(np.bincount(civ, minlength=n))]) + base
        self._ints(ri, nnz, 2)[:] = rows[order] + base
        if copy == 1 and nnz:
            self._values(cval, nnz, vt)[:] = self._values(val, nnz, vt)[order]
        return SP_OK, []

    def f_cusparseXcoo2csr(self, h, cri, nnz, m, rp, base):
        """Row offsets of sorted COO row indices (cusparse.h)."""
        self._obj(h)
        r = self._ints(cri, nnz, 2).astype(np.int64) - base
        if nnz and (r.min() < 0 or r.max() >= m or np.any(np.diff(r) < 0)):
            return SP_INVALID, []
        self._ints(rp, m + 1, 2)[:] = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=m))]) + base
        return SP_OK, []

    def f_cusparseXcsr2coo(self, h, rp, nnz, m, cri, base):
        self._obj(h)
        rpv = self._ints(rp, m + 1, 2).astype(np.int64) - base
        if rpv[0] != 0 or rpv[-1] != nnz or np.any(np.diff(rpv) < 0):
            return SP_INVALID, []
        self._ints(cri, nnz, 2)[:] = np.repeat(np.arange(m), np.diff(rpv)) + base
        return SP_OK, []

    def f_cusparseCreateIdentityPermutation(self, h, n, p):
        self._obj(h)
        if n < 0:
            return SP_INVALID, []
        if n:
            self._ints(p, n, 2)[:] = np.arange(n)
        return SP_OK, []

    def f_cusparseXcoosort_bufferSizeExt(self, h, m, n, nnz, r, c, out):
        self._obj(h)
        return (SP_OK, [_BUFFER]) if min(m, n, nnz) >= 0 else (SP_INVALID, None)

    def _coosort(self, h, m, n, nnz, r, c, p, by_row):
        """cusparse.h, cusparseXcoosortByRow/ByColumn: the index arrays sorted
        in place (stably), P permuted alongside (P[k] = the old position of
        entry k when P was the identity)."""
        self._obj(h)
        if min(m, n, nnz) < 0:
            return SP_INVALID, []
        if not nnz:
            return SP_OK, []
        rv, cv, pv = self._ints(r, nnz, 2), self._ints(c, nnz, 2), self._ints(p, nnz, 2)
        order = np.lexsort((cv, rv)) if by_row else np.lexsort((rv, cv))
        rv[:], cv[:], pv[:] = rv[order].copy(), cv[order].copy(), pv[order].copy()
        return SP_OK, []

    def f_cusparseXcoosortByRow(self, h, m, n, nnz, r, c, p, buf):
        return self._coosort(h, m, n, nnz, r, c, p, True)

    def f_cusparseXcoosortByColumn(self, h, m, n, nnz, r, c, p, buf):
        return self._coosort(h, m, n, nnz, r, c, p, False)

    # ------------------------------------------------------------ SpSM
    def f_cusparseSpSM_createDescr(self, out):
        return SP_OK, [self._new(kind="spsm", analysed=False)]

    def f_cusparseSpSM_destroyDescr(self, d):
        self._dn(d, "spsm")
        del self.objs[d]
        return SP_OK, []

    def f_cusparseSpSM_bufferSize(self, h, opa, opb, alpha, A, B, C, ct, alg, d, out):
        self._scalars(h, alpha, alpha, ct)
        self._triangle(A, opa), self._dn(B, "dnmat"), self._dn(C, "dnmat"), self._dn(d, "spsm")
        return SP_OK, [_BUFFER]

    def f_cusparseSpSM_analysis(self, h, opa, opb, alpha, A, B, C, ct, alg, d, buf):
        self._scalars(h, alpha, alpha, ct)
        self._triangle(A, opa)
        self._dn(d, "spsm")["analysed"] = True
        return SP_OK, []

    def f_cusparseSpSM_solve(self, h, opa, opb, alpha, A, B, C, ct, alg, d):
        """op(T) C = alpha op(B) (cusparse.h, cusparseSpSM_solve)."""
        al, _ = self._scalars(h, alpha, alpha, ct)
        if not self._dn(d, "spsm")["analysed"]:
            return SP_INVALID, []
        t = self._triangle(A, opa)
        b = self._op(self._dnmat(B), opb)
        c = self._dnmat(C)
        if b.shape[0] != t.shape[0] or c.shape != b.shape:
            return SP_INVALID, []
        if np.any(np.diagonal(t) == 0):
            raise CudaError(1, "SpSM: a zero on the diagonal (singular triangle)")
        c[...] = np.linalg.solve(t, al * b.astype(t.dtype)).astype(c.dtype)
        return SP_OK, []

    def f_cusparseXcsrsort_bufferSizeExt(self, h, m, n, nnz, rp, ci, out):
        self._obj(h)
        return (SP_OK, [_BUFFER]) if min(m, n, nnz) >= 0 else (SP_INVALID, None)

    f_cusparseXcscsort_bufferSizeExt = f_cusparseXcsrsort_bufferSizeExt

    def _segsort(self, h, outer, nnz, descr, ptr, ind, p):
        """Indices sorted within each row (CSR) or column (CSC), P permuted
        alongside (cusparse.h, cusparseXcsrsort/Xcscsort)."""
        self._obj(h)
        base = int(descr[3])
        pv = self._ints(ptr, outer + 1, 2).astype(np.int64) - base
        if pv[0] != 0 or pv[-1] != nnz or np.any(np.diff(pv) < 0):
            return SP_INVALID, []
        if not nnz:
            return SP_OK, []
        iv, perm = self._ints(ind, nnz, 2), self._ints(p, nnz, 2)
        seg = np.repeat(np.arange(outer), np.diff(pv))
        order = np.lexsort((iv, seg))
        iv[:], perm[:] = iv[order].copy(), perm[order].copy()
        return SP_OK, []

    def f_cusparseXcsrsort(self, h, m, n, nnz, descr, rp, ci, p, buf):
        return self._segsort(h, m, nnz, descr, rp, ci, p)

    def f_cusparseXcscsort(self, h, m, n, nnz, descr, cp, ri, p, buf):
        return self._segsort(h, n, nnz, descr, cp, ri, p)

    # ------------------------------------- csrgeam2: C = alpha A + beta B (CSR)
    def _pattern(self, m, n, nnz, descr, rp, ci):
        """(rows, cols) of a CSR matrix's stored entries (zero-based)."""
        base = int(descr[3])
        rpv, civ = self._csr_arrays(m, nnz, rp, ci, base)
        if nnz and (civ.min() < 0 or civ.max() >= n):
            raise CudaError(1, "CSR column indices outside the matrix")
        return np.repeat(np.arange(m), np.diff(rpv)), civ

    def _union(self, m, n, a, b):
        """The union of two patterns, sorted by row then column
        (cusparse.h, csrgeam2: C's pattern is A's and B's together)."""
        key = np.unique(np.concatenate([a[0] * n + a[1], b[0] * n + b[1]]).astype(np.int64))
        return key // n, key % n

    def f_cusparseXcsrgeam2Nnz(self, h, m, n, da, nnza, rpa, cia, db, nnzb, rpb, cib, dc, rpc, total, ws):
        self._obj(h)
        r, c = self._union(m, n, self._pattern(m, n, nnza, da, rpa, cia), self._pattern(m, n, nnzb, db, rpb, cib))
        basec = int(dc[3])
        self._ints(rpc, m + 1, 2)[:] = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=m))]) + basec
        nnzc = int(r.size)
        if total is None:
            return SP_OK, [None]
        if isinstance(total, int):                 # device pointer mode
            self._ints(total, 1, 2)[:] = nnzc
            return SP_OK, [None]
        return SP_OK, [struct.pack("<i", nnzc)]

    def _geam(self, dt, h, m, n, alpha, da, nnza, va, rpa, cia, beta, db, nnzb, vb, rpb, cib, dc, vc, rpc, cic):
        self._obj(h)
        self._check_mode(self._obj(h)["pointer_mode"] == 1, alpha, beta)
        npdt = np.dtype(_dtype(dt))

        def val(v):
            raw = bytes(v) if not isinstance(v, int) else bytes(self.b.resolve(v, npdt.itemsize))
            return np.frombuffer(raw[:npdt.itemsize], npdt)[0]
        al, be = val(alpha), val(beta)
        pa, pb = self._pattern(m, n, nnza, da, rpa, cia), self._pattern(m, n, nnzb, db, rpb, cib)
        r, c = self._union(m, n, pa, pb)
        dense = np.zeros((m, n), np.complex128 if npdt.kind == "c" else np.float64)
        np.add.at(dense, pa, al * self._values(va, nnza, dt))
        np.add.at(dense, pb, be * self._values(vb, nnzb, dt))
        basec = int(dc[3])
        rpcv = self._ints(rpc, m + 1, 2).astype(np.int64) - basec
        if rpcv[-1] != r.size:
            raise CudaError(1, f"csrgeam2: C's row offsets hold {rpcv[-1]} entries, the sum has {r.size}")
        self._ints(cic, r.size, 2)[:] = c + basec
        self._values(vc, r.size, dt)[:] = dense[r, c].astype(npdt)
        return SP_OK, []

    def _geam_buffer_size(self, h, m, n, alpha, da, nnza, va, rpa, cia, beta, db, nnzb, vb, rpb, cib, dc, vc, rpc,
                          cic, out):
        self._obj(h)
        return (SP_OK, [_BUFFER]) if min(m, n, nnza, nnzb) >= 0 else (SP_INVALID, None)


def _typed_geam(dt: int):
    def geam(self, h, m, n, alpha, da, nnza, va, rpa, cia, beta, db, nnzb, vb, rpb, cib, dc, vc, rpc, cic, buf):
        return self._geam(dt, h, m, n, alpha, da, nnza, va, rpa, cia, beta, db, nnzb, vb, rpb, cib, dc, vc, rpc, cic)
    return geam


# cusparse{S,D,C,Z}csrgeam2 and their _bufferSizeExt: one implementation each,
# the letter fixing the value type (cudaDataType_t: R_32F 0, R_64F 1, C_32F 4, C_64F 5)
for _t, _dt in (("S", 0), ("D", 1), ("C", 4), ("Z", 5)):
    setattr(EmuCusparseGeneric, f"f_cusparse{_t}csrgeam2_bufferSizeExt", EmuCusparseGeneric._geam_buffer_size)
    setattr(EmuCusparseGeneric, f"f_cusparse{_t}csrgeam2", _typed_geam(_dt))
