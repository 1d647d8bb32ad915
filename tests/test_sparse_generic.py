"""cuSPARSE's generic API as CuPy (cupyx.scipy.sparse) and PyTorch's sparse
tensors call it (issue 26), through the stand-in libcusparse.so.12 and the
emulated backend (proxyd/backends/emu/sparse_generic.py): dense->CSR/CSC/COO
(DenseToSparse bufferSize/analysis/convert, as cupyx.scipy.sparse.csr_matrix
(dense) does), sparse->dense, the descriptors' getters and setters, SpMV on
CSC and COO, SpMM with preprocess, SpGEMM (workEstimation/compute/copy with
the buffer-size protocol), SpSV (lower and upper, unit diagonal) -- each
result against numpy on the host; and a CSR matrix made by DenseToSparse
that keeps its nnz and pointers across a dump and a restore into a fresh
proxyd (the nnz the analysis set is part of the restored descriptor).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import client_env

PRELUDE = r"""
import ctypes, json, sys
import numpy as np
from ctypes import byref, c_int, c_int64, c_void_p, c_size_t, c_double

sp = ctypes.CDLL("libcusparse.so.12")
rt = ctypes.CDLL("libcudart.so.13")
P, I64, I32, SZ = c_void_p, c_int64, c_int, c_size_t
R64F, I32T, I64T = 1, 2, 3          # cudaDataType R_64F; cusparseIndexType_t _32I, _64I
sig = {
 "cusparseCreate": [P], "cusparseDestroy": [P],
 "cusparseCreateDnMat": [P, I64, I64, I64, P, I32, I32], "cusparseCreateDnVec": [P, I64, P, I32],
 "cusparseCreateConstDnVec": [P, I64, P, I32],
 "cusparseCreateCsr": [P, I64, I64, I64, P, P, P, I32, I32, I32, I32],
 "cusparseCreateCsc": [P, I64, I64, I64, P, P, P, I32, I32, I32, I32],
 "cusparseCreateCoo": [P, I64, I64, I64, P, P, P, I32, I32, I32],
 "cusparseCsrSetPointers": [P, P, P, P], "cusparseSpMatGetSize": [P, P, P, P],
 "cusparseSpMatGetFormat": [P, P], "cusparseSpMatGetIndexBase": [P, P],
 "cusparseCsrGet": [P, P, P, P, P, P, P, P, P, P, P], "cusparseDnMatGet": [P, P, P, P, P, P, P],
 "cusparseDnVecGetValues": [P, P], "cusparseSpMatSetAttribute": [P, I32, P, SZ],
 "cusparseSpMatGetAttribute": [P, I32, P, SZ],
 "cusparseDenseToSparse_bufferSize": [P, P, P, I32, P], "cusparseDenseToSparse_analysis": [P, P, P, I32, P],
 "cusparseDenseToSparse_convert": [P, P, P, I32, P], "cusparseSparseToDense_bufferSize": [P, P, P, I32, P],
 "cusparseSparseToDense": [P, P, P, I32, P],
 "cusparseSpMV_bufferSize": [P, I32, P, P, P, P, P, I32, I32, P], "cusparseSpMV": [P, I32, P, P, P, P, P, I32, I32, P],
 "cusparseSpMM_bufferSize": [P, I32, I32, P, P, P, P, P, I32, I32, P],
 "cusparseSpMM_preprocess": [P, I32, I32, P, P, P, P, P, I32, I32, P],
 "cusparseSpMM": [P, I32, I32, P, P, P, P, P, I32, I32, P],
 "cusparseSpGEMM_createDescr": [P], "cusparseSpGEMM_destroyDescr": [P],
 "cusparseSpGEMM_workEstimation": [P, I32, I32, P, P, P, P, P, I32, I32, P, P, P],
 "cusparseSpGEMM_compute": [P, I32, I32, P, P, P, P, P, I32, I32, P, P, P],
 "cusparseSpGEMM_copy": [P, I32, I32, P, P, P, P, P, I32, I32, P], "cusparseSpGEMM_getNumProducts": [P, P],
 "cusparseSpSV_createDescr": [P], "cusparseSpSV_destroyDescr": [P],
 "cusparseSpSV_bufferSize": [P, I32, P, P, P, P, I32, I32, P, P],
 "cusparseSpSV_analysis": [P, I32, P, P, P, P, I32, I32, P, P],
 "cusparseSpSV_solve": [P, I32, P, P, P, P, I32, I32, P],
 "cusparseDestroySpMat": [P], "cusparseDestroyDnMat": [P], "cusparseDestroyDnVec": [P],
}
for n, a in sig.items():
    getattr(sp, n).argtypes = a
rt.cudaMalloc.argtypes = [P, SZ]
rt.cudaMemcpy.argtypes = [P, P, SZ, I32]

def ok(st, what):
    if st != 0:
        print(json.dumps({"FAIL": f"{what}: status {st}"}))
        sys.exit(1)

def dev(arr):
    arr = np.ascontiguousarray(arr)
    p = c_void_p()
    ok(rt.cudaMalloc(byref(p), max(arr.nbytes, 8)), "cudaMalloc")
    ok(rt.cudaMemcpy(p, arr.ctypes.data, arr.nbytes, 1), "cudaMemcpy H2D")
    return p

def empty(n, dtype):
    return dev(np.zeros(max(n, 1), dtype))

def host(p, n, dtype):
    out = np.zeros(n, dtype)
    if n:
        ok(rt.cudaMemcpy(out.ctypes.data, p, out.nbytes, 2), "cudaMemcpy D2H")
    return out

ONE, ZERO = c_double(1.0), c_double(0.0)
h = c_void_p()
ok(sp.cusparseCreate(byref(h)), "cusparseCreate")
out = {}
"""

SCRIPT = PRELUDE + r"""
rng = np.random.default_rng(26)
m, n = 7, 5
A = rng.standard_normal((m, n)); A[rng.random((m, n)) < 0.6] = 0
A[0, 0] = 1.5
nnz_want = int(np.count_nonzero(A))

# dense -> CSR, as cupyx.scipy.sparse.csr_matrix(dense) does: a column-major
# dense descriptor, a CSR with no column/value arrays yet, analysis, nnz, arrays, convert
dA = dev(A.T.copy())                      # column-major
dnA = c_void_p(); ok(sp.cusparseCreateDnMat(byref(dnA), m, n, m, dA, R64F, 1), "CreateDnMat")
rp = empty(m + 1, np.int32)
csr = c_void_p(); ok(sp.cusparseCreateCsr(byref(csr), m, n, 0, rp, None, None, I32T, I32T, 0, R64F), "CreateCsr")
bs = c_size_t(); ok(sp.cusparseDenseToSparse_bufferSize(h, dnA, csr, 0, byref(bs)), "D2S bufferSize")
buf = empty(bs.value, np.uint8)
ok(sp.cusparseDenseToSparse_analysis(h, dnA, csr, 0, buf), "D2S analysis")
r, c, z = c_int64(), c_int64(), c_int64()
ok(sp.cusparseSpMatGetSize(csr, byref(r), byref(c), byref(z)), "SpMatGetSize")
out["size"] = [r.value, c.value, z.value]
ci, vals = empty(z.value, np.int32), empty(z.value, np.float64)
ok(sp.cusparseCsrSetPointers(csr, rp, ci, vals), "CsrSetPointers")
ok(sp.cusparseDenseToSparse_convert(h, dnA, csr, 0, buf), "D2S convert")
out["csr_rp"] = host(rp, m + 1, np.int32).tolist()
out["csr_ci"] = host(ci, z.value, np.int32).tolist()
out["csr_v"] = host(vals, z.value, np.float64).tolist()
# getters
got = [c_int64(), c_int64(), c_int64(), c_void_p(), c_void_p(), c_void_p(), c_int(), c_int(), c_int(), c_int()]
ok(sp.cusparseCsrGet(csr, *[byref(x) for x in got]), "CsrGet")
out["csrget"] = [got[0].value, got[1].value, got[2].value, got[3].value == rp.value, got[4].value == ci.value,
                 got[5].value == vals.value, got[6].value, got[7].value, got[8].value, got[9].value]
f = c_int(); ok(sp.cusparseSpMatGetFormat(csr, byref(f)), "GetFormat"); out["format"] = f.value
ib = c_int(-1); ok(sp.cusparseSpMatGetIndexBase(csr, byref(ib)), "GetIndexBase"); out["base"] = ib.value
dr, dc, dl, dv, dt, do = c_int64(), c_int64(), c_int64(), c_void_p(), c_int(), c_int()
ok(sp.cusparseDnMatGet(dnA, byref(dr), byref(dc), byref(dl), byref(dv), byref(dt), byref(do)), "DnMatGet")
out["dnmatget"] = [dr.value, dc.value, dl.value, dv.value == dA.value, dt.value, do.value]

# sparse -> dense (row-major this time)
dB = empty(m * n, np.float64)
dnB = c_void_p(); ok(sp.cusparseCreateDnMat(byref(dnB), m, n, n, dB, R64F, 2), "CreateDnMat row")
ok(sp.cusparseSparseToDense_bufferSize(h, csr, dnB, 0, byref(bs)), "S2D bufferSize")
ok(sp.cusparseSparseToDense(h, csr, dnB, 0, None), "S2D")
out["s2d"] = host(dB, m * n, np.float64).reshape(m, n).tolist()

# dense -> CSC and COO (64-bit indices, one-based COO), SpMV with each
x = rng.standard_normal(n)
dx = dev(x); vx = c_void_p(); ok(sp.cusparseCreateConstDnVec(byref(vx), n, dx, R64F), "CreateConstDnVec")
res = {}
for fmt in ("csc", "coo"):
    mat = c_void_p()
    if fmt == "csc":
        cp = empty(n + 1, np.int64)
        ok(sp.cusparseCreateCsc(byref(mat), m, n, 0, cp, None, None, I64T, I64T, 0, R64F), "CreateCsc")
    else:
        ok(sp.cusparseCreateCoo(byref(mat), m, n, 0, None, None, None, I64T, 1, R64F), "CreateCoo")
    ok(sp.cusparseDenseToSparse_analysis(h, dnA, mat, 0, buf), f"D2S analysis {fmt}")
    ok(sp.cusparseSpMatGetSize(mat, byref(r), byref(c), byref(z)), "SpMatGetSize")
    idx, v2 = empty(z.value, np.int64), empty(z.value, np.float64)
    if fmt == "csc":
        ok(sp.cusparseCscSetPointers(mat, cp, idx, v2), "CscSetPointers")
    else:
        rows = empty(z.value, np.int64)
        ok(sp.cusparseCooSetPointers(mat, rows, idx, v2), "CooSetPointers")
    ok(sp.cusparseDenseToSparse_convert(h, dnA, mat, 0, buf), f"D2S convert {fmt}")
    if fmt == "csc":
        res["csc_cp"] = host(cp, n + 1, np.int64).tolist(); res["csc_ri"] = host(idx, z.value, np.int64).tolist()
    else:
        res["coo_r"] = host(rows, z.value, np.int64).tolist(); res["coo_c"] = host(idx, z.value, np.int64).tolist()
    y = empty(m, np.float64); vy = c_void_p(); ok(sp.cusparseCreateDnVec(byref(vy), m, y, R64F), "CreateDnVec")
    ok(sp.cusparseSpMV_bufferSize(h, 0, byref(ONE), mat, vx, byref(ZERO), vy, R64F, 0, byref(bs)), "SpMV bs")
    ok(sp.cusparseSpMV(h, 0, byref(ONE), mat, vx, byref(ZERO), vy, R64F, 0, buf), "SpMV")
    ok(rt.cudaDeviceSynchronize(), "sync")
    res[f"spmv_{fmt}"] = host(y, m, np.float64).tolist()
out.update(res)

# SpMM with preprocess: C = 2 A B
B = rng.standard_normal((n, 3)); dBm = dev(B.T.copy())
dnBm = c_void_p(); ok(sp.cusparseCreateDnMat(byref(dnBm), n, 3, n, dBm, R64F, 1), "DnMat B")
dC = empty(m * 3, np.float64); dnC = c_void_p(); ok(sp.cusparseCreateDnMat(byref(dnC), m, 3, m, dC, R64F, 1), "DnMat C")
TWO = c_double(2.0)
ok(sp.cusparseSpMM_bufferSize(h, 0, 0, byref(TWO), csr, dnBm, byref(ZERO), dnC, R64F, 0, byref(bs)), "SpMM bs")
ok(sp.cusparseSpMM_preprocess(h, 0, 0, byref(TWO), csr, dnBm, byref(ZERO), dnC, R64F, 0, buf), "SpMM preprocess")
ok(sp.cusparseSpMM(h, 0, 0, byref(TWO), csr, dnBm, byref(ZERO), dnC, R64F, 0, buf), "SpMM")
ok(rt.cudaDeviceSynchronize(), "sync")
out["spmm"] = host(dC, m * 3, np.float64).reshape(3, m).T.tolist()

# SpGEMM: G = A @ A^T as CSR, the buffer-size protocol of the guide
Bt = A.T.copy()
dBt = dev(Bt.T.copy()); dnBt = c_void_p(); ok(sp.cusparseCreateDnMat(byref(dnBt), n, m, n, dBt, R64F, 1), "DnMat At")
rpb = empty(n + 1, np.int32); csrB = c_void_p()
ok(sp.cusparseCreateCsr(byref(csrB), n, m, 0, rpb, None, None, I32T, I32T, 0, R64F), "CreateCsr B")
ok(sp.cusparseDenseToSparse_analysis(h, dnBt, csrB, 0, buf), "D2S B")
ok(sp.cusparseSpMatGetSize(csrB, byref(r), byref(c), byref(z)), "size B")
ok(sp.cusparseCsrSetPointers(csrB, rpb, empty(z.value, np.int32), empty(z.value, np.float64)), "ptrs B")
ok(sp.cusparseDenseToSparse_convert(h, dnBt, csrB, 0, buf), "convert B")
rpc = empty(m + 1, np.int32); csrC = c_void_p()
ok(sp.cusparseCreateCsr(byref(csrC), m, m, 0, rpc, None, None, I32T, I32T, 0, R64F), "CreateCsr C")
g = c_void_p(); ok(sp.cusparseSpGEMM_createDescr(byref(g)), "SpGEMM_createDescr")
b1 = c_size_t(0)
ok(sp.cusparseSpGEMM_workEstimation(h, 0, 0, byref(ONE), csr, csrB, byref(ZERO), csrC, R64F, 0, g, byref(b1), None), "work est 1")
out["b1_positive"] = b1.value > 0
w1 = empty(b1.value, np.uint8)
ok(sp.cusparseSpGEMM_workEstimation(h, 0, 0, byref(ONE), csr, csrB, byref(ZERO), csrC, R64F, 0, g, byref(b1), w1), "work est 2")
b2 = c_size_t(0)
ok(sp.cusparseSpGEMM_compute(h, 0, 0, byref(ONE), csr, csrB, byref(ZERO), csrC, R64F, 0, g, byref(b2), None), "compute 1")
w2 = empty(b2.value, np.uint8)
ok(sp.cusparseSpGEMM_compute(h, 0, 0, byref(ONE), csr, csrB, byref(ZERO), csrC, R64F, 0, g, byref(b2), w2), "compute 2")
ok(sp.cusparseSpMatGetSize(csrC, byref(r), byref(c), byref(z)), "size C")
nnzc = z.value
cic, vc = empty(nnzc, np.int32), empty(nnzc, np.float64)
ok(sp.cusparseCsrSetPointers(csrC, rpc, cic, vc), "ptrs C")
ok(sp.cusparseSpGEMM_copy(h, 0, 0, byref(ONE), csr, csrB, byref(ZERO), csrC, R64F, 0, g), "copy")
prods = c_int64(); ok(sp.cusparseSpGEMM_getNumProducts(g, byref(prods)), "getNumProducts")
ok(sp.cusparseSpGEMM_destroyDescr(g), "SpGEMM_destroyDescr")
out["spgemm"] = {"nnz": nnzc, "rp": host(rpc, m + 1, np.int32).tolist(), "ci": host(cic, nnzc, np.int32).tolist(),
                 "v": host(vc, nnzc, np.float64).tolist(), "products": prods.value}

# SpSV: lower (default) and upper triangles of a square matrix, unit diagonal
S = rng.standard_normal((6, 6)) + 6 * np.eye(6)
dS = dev(S.T.copy()); dnS = c_void_p(); ok(sp.cusparseCreateDnMat(byref(dnS), 6, 6, 6, dS, R64F, 1), "DnMat S")
rps = empty(7, np.int32); csrS = c_void_p()
ok(sp.cusparseCreateCsr(byref(csrS), 6, 6, 0, rps, None, None, I32T, I32T, 0, R64F), "CreateCsr S")
ok(sp.cusparseDenseToSparse_analysis(h, dnS, csrS, 0, buf), "D2S S")
ok(sp.cusparseSpMatGetSize(csrS, byref(r), byref(c), byref(z)), "size S")
ok(sp.cusparseCsrSetPointers(csrS, rps, empty(z.value, np.int32), empty(z.value, np.float64)), "ptrs S")
ok(sp.cusparseDenseToSparse_convert(h, dnS, csrS, 0, buf), "convert S")
rhs = rng.standard_normal(6)
drhs = dev(rhs); vr = c_void_p(); ok(sp.cusparseCreateDnVec(byref(vr), 6, drhs, R64F), "DnVec rhs")
sol = empty(6, np.float64); vs = c_void_p(); ok(sp.cusparseCreateDnVec(byref(vs), 6, sol, R64F), "DnVec sol")
THREE = c_double(3.0)
for name, fill, diag, op in (("lower", 0, 0, 0), ("upper_unit_T", 1, 1, 1)):
    ok(sp.cusparseSpMatSetAttribute(csrS, 0, byref(c_int(fill)), 4), "SetAttribute fill")
    ok(sp.cusparseSpMatSetAttribute(csrS, 1, byref(c_int(diag)), 4), "SetAttribute diag")
    a_ = c_int(-1); ok(sp.cusparseSpMatGetAttribute(csrS, 0, byref(a_), 4), "GetAttribute"); out[f"fill_{name}"] = a_.value
    d = c_void_p(); ok(sp.cusparseSpSV_createDescr(byref(d)), "SpSV_createDescr")
    ok(sp.cusparseSpSV_bufferSize(h, op, byref(THREE), csrS, vr, vs, R64F, 0, d, byref(bs)), "SpSV bs")
    sb = empty(bs.value, np.uint8)
    ok(sp.cusparseSpSV_analysis(h, op, byref(THREE), csrS, vr, vs, R64F, 0, d, sb), "SpSV analysis")
    ok(sp.cusparseSpSV_solve(h, op, byref(THREE), csrS, vr, vs, R64F, 0, d), "SpSV solve")
    ok(sp.cusparseSpSV_destroyDescr(d), "SpSV destroy")
    out[f"spsv_{name}"] = host(sol, 6, np.float64).tolist()
# CSR -> CSC (csr2cscEx2, as cupyx's tocsc) and CSR <-> COO row indices
sig2 = {"cusparseCsr2cscEx2_bufferSize": [P, I32, I32, I32, P, P, P, P, P, P, I32, I32, I32, I32, P],
        "cusparseCsr2cscEx2": [P, I32, I32, I32, P, P, P, P, P, P, I32, I32, I32, I32, P],
        "cusparseXcsr2coo": [P, P, I32, I32, P, I32], "cusparseXcoo2csr": [P, P, I32, I32, P, I32]}
for k, a in sig2.items():
    getattr(sp, k).argtypes = a
nz_ = len(out["csr_ci"])
cscv, cscp, cscr = empty(nz_, np.float64), empty(n + 1, np.int32), empty(nz_, np.int32)
ok(sp.cusparseCsr2cscEx2_bufferSize(h, m, n, nz_, vals, rp, ci, cscv, cscp, cscr, R64F, 1, 0, 1, byref(bs)), "c2c bs")
ok(sp.cusparseCsr2cscEx2(h, m, n, nz_, vals, rp, ci, cscv, cscp, cscr, R64F, 1, 0, 1, empty(bs.value, np.uint8)), "csr2csc")
out["csr2csc"] = [host(cscp, n + 1, np.int32).tolist(), host(cscr, nz_, np.int32).tolist(),
                  host(cscv, nz_, np.float64).tolist()]
coo = empty(nz_, np.int32)
ok(sp.cusparseXcsr2coo(h, rp, nz_, m, coo, 0), "csr2coo")
out["csr2coo"] = host(coo, nz_, np.int32).tolist()
rp2 = empty(m + 1, np.int32)
ok(sp.cusparseXcoo2csr(h, coo, nz_, m, rp2, 0), "coo2csr")
out["coo2csr"] = host(rp2, m + 1, np.int32).tolist()
# identity permutation and COO sorts (cupyx's sum_duplicates, tocsr)
sig3 = {"cusparseCreateIdentityPermutation": [P, I32, P], "cusparseXcoosort_bufferSizeExt": [P, I32, I32, I32, P, P, P],
        "cusparseXcoosortByRow": [P, I32, I32, I32, P, P, P, P], "cusparseXcoosortByColumn": [P, I32, I32, I32, P, P, P, P],
        "cusparseSpSM_createDescr": [P], "cusparseSpSM_destroyDescr": [P],
        "cusparseSpSM_bufferSize": [P, I32, I32, P, P, P, P, I32, I32, P, P],
        "cusparseSpSM_analysis": [P, I32, I32, P, P, P, P, I32, I32, P, P],
        "cusparseSpSM_solve": [P, I32, I32, P, P, P, P, I32, I32, P]}
for k, a in sig3.items():
    getattr(sp, k).argtypes = a
ur = np.array([2, 0, 1, 0, 2], np.int32); uc = np.array([1, 3, 0, 1, 0], np.int32)
dr, dc, dp_ = dev(ur), dev(uc), empty(5, np.int32)
ok(sp.cusparseCreateIdentityPermutation(h, 5, dp_), "identity")
ok(sp.cusparseXcoosort_bufferSizeExt(h, 3, 4, 5, dr, dc, byref(bs)), "coosort bs")
ok(sp.cusparseXcoosortByRow(h, 3, 4, 5, dr, dc, dp_, empty(bs.value, np.uint8)), "coosortByRow")
out["coosort_row"] = [host(dr, 5, np.int32).tolist(), host(dc, 5, np.int32).tolist(), host(dp_, 5, np.int32).tolist()]
ok(sp.cusparseXcoosortByColumn(h, 3, 4, 5, dr, dc, dp_, empty(bs.value, np.uint8)), "coosortByColumn")
out["coosort_col"] = [host(dr, 5, np.int32).tolist(), host(dc, 5, np.int32).tolist(), host(dp_, 5, np.int32).tolist()]
out["coo_input"] = [ur.tolist(), uc.tolist()]
# CSR sort with a legacy matrix descriptor (one-based), as cupyx's sort_indices
for k, a in {"cusparseXcsrsort_bufferSizeExt": [P, I32, I32, I32, P, P, P], "cusparseCreateMatDescr": [P],
             "cusparseSetMatIndexBase": [P, I32], "cusparseXcsrsort": [P, I32, I32, I32, P, P, P, P, P]}.items():
    getattr(sp, k).argtypes = a
md = c_void_p(); ok(sp.cusparseCreateMatDescr(byref(md)), "CreateMatDescr"); ok(sp.cusparseSetMatIndexBase(md, 1), "base 1")
srp = dev(np.array([1, 3, 6], np.int32)); sci = dev(np.array([4, 2, 3, 1, 2], np.int32)); sp_ = empty(5, np.int32)
ok(sp.cusparseCreateIdentityPermutation(h, 5, sp_), "identity")
ok(sp.cusparseXcsrsort_bufferSizeExt(h, 2, 4, 5, srp, sci, byref(bs)), "csrsort bs")
ok(sp.cusparseXcsrsort(h, 2, 4, 5, md, srp, sci, sp_, empty(bs.value, np.uint8)), "csrsort")
out["csrsort"] = [host(sci, 5, np.int32).tolist(), host(sp_, 5, np.int32).tolist()]
# csrgeam2 (cupyx's A + B): the CSR matrix of A (zero-based) plus 2 x the sorted one above (one-based)
for k, a in {"cusparseXcsrgeam2Nnz": [P, I32, I32, P, I32, P, P, P, I32, P, P, P, P, P, P],
             "cusparseDcsrgeam2_bufferSizeExt": [P, I32, I32, P, P, I32, P, P, P, P, P, I32, P, P, P, P, P, P, P, P],
             "cusparseDcsrgeam2": [P, I32, I32, P, P, I32, P, P, P, P, P, I32, P, P, P, P, P, P, P, P]}.items():
    getattr(sp, k).argtypes = a
GA = np.zeros((2, 4)); GA[0, 1], GA[1, 3] = 1.5, -2.0
ga_rp, ga_ci, ga_v = dev(np.array([0, 1, 2], np.int32)), dev(np.array([1, 3], np.int32)), dev(np.array([1.5, -2.0]))
mdz = c_void_p(); ok(sp.cusparseCreateMatDescr(byref(mdz)), "descr zero-based")
gb_v = dev(np.array([10.0, 20.0, 30.0, 40.0, 50.0]))     # on the sorted one-based pattern: (0,1) (0,3) (1,0) (1,1) (1,2)
gc_rp = empty(3, np.int32); tot = c_int(-1)
ok(sp.cusparseXcsrgeam2Nnz(h, 2, 4, mdz, 2, ga_rp, ga_ci, md, 5, srp, sci, mdz, gc_rp, byref(tot), buf), "geam2Nnz")
gc_ci, gc_v = empty(tot.value, np.int32), empty(tot.value, np.float64)
ok(sp.cusparseDcsrgeam2_bufferSizeExt(h, 2, 4, byref(ONE), mdz, 2, ga_v, ga_rp, ga_ci, byref(TWO), md, 5, gb_v, srp, sci,
                                      mdz, gc_v, gc_rp, gc_ci, byref(bs)), "geam2 bs")
ok(sp.cusparseDcsrgeam2(h, 2, 4, byref(ONE), mdz, 2, ga_v, ga_rp, ga_ci, byref(TWO), md, 5, gb_v, srp, sci,
                        mdz, gc_v, gc_rp, gc_ci, buf), "geam2")
out["geam2"] = [tot.value, host(gc_rp, 3, np.int32).tolist(), host(gc_ci, tot.value, np.int32).tolist(),
                host(gc_v, tot.value, np.float64).tolist()]
# SpSM: lower triangle of S against two right-hand sides at once
RB = rng.standard_normal((6, 2)); dRB = dev(RB.T.copy())
dnRB = c_void_p(); ok(sp.cusparseCreateDnMat(byref(dnRB), 6, 2, 6, dRB, R64F, 1), "DnMat RB")
dX = empty(12, np.float64); dnX = c_void_p(); ok(sp.cusparseCreateDnMat(byref(dnX), 6, 2, 6, dX, R64F, 1), "DnMat X")
ok(sp.cusparseSpMatSetAttribute(csrS, 0, byref(c_int(0)), 4), "fill lower")
ok(sp.cusparseSpMatSetAttribute(csrS, 1, byref(c_int(0)), 4), "non-unit")
sm = c_void_p(); ok(sp.cusparseSpSM_createDescr(byref(sm)), "SpSM_createDescr")
ok(sp.cusparseSpSM_bufferSize(h, 0, 0, byref(ONE), csrS, dnRB, dnX, R64F, 0, sm, byref(bs)), "SpSM bs")
ok(sp.cusparseSpSM_analysis(h, 0, 0, byref(ONE), csrS, dnRB, dnX, R64F, 0, sm, empty(bs.value, np.uint8)), "SpSM analysis")
ok(sp.cusparseSpSM_solve(h, 0, 0, byref(ONE), csrS, dnRB, dnX, R64F, 0, sm), "SpSM solve")
ok(sp.cusparseSpSM_destroyDescr(sm), "SpSM destroy")
out["spsm"] = host(dX, 12, np.float64).reshape(2, 6).T.tolist(); out["RB"] = RB.tolist()
ok(sp.cusparseDestroySpMat(csr), "DestroySpMat")
ok(sp.cusparseDestroy(h), "Destroy")
out["seed_matrix"] = A.tolist(); out["x"] = x.tolist(); out["B"] = B.tolist(); out["S"] = S.tolist()
out["rhs"] = rhs.tolist()
print(json.dumps(out))
"""


def _run(daemon, code, timeout=120):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=client_env(daemon),
                          capture_output=True, text=True, timeout=timeout)


def test_generic_api_against_numpy(emu_daemon):
    r = _run(emu_daemon, SCRIPT)
    assert r.returncode == 0, r.stdout + r.stderr
    o = json.loads(r.stdout)
    A, x, B, S, rhs = (np.array(o[k]) for k in ("seed_matrix", "x", "B", "S", "rhs"))
    m, n = A.shape
    nz = np.nonzero(A)
    assert o["size"] == [m, n, len(nz[0])]
    # CSR in row order
    assert o["csr_rp"] == np.concatenate([[0], np.cumsum((A != 0).sum(axis=1))]).tolist()
    assert o["csr_ci"] == nz[1].tolist() and np.allclose(o["csr_v"], A[nz])
    assert o["csrget"] == [m, n, len(nz[0]), True, True, True, 2, 2, 0, 1]
    assert o["format"] == 1 and o["base"] == 0                     # CUSPARSE_FORMAT_CSR, zero-based
    assert o["dnmatget"] == [m, n, m, True, 1, 1]                   # R_64F, CUSPARSE_ORDER_COL
    np.testing.assert_array_equal(np.array(o["s2d"]), A)
    # CSC in column order; COO one-based
    cz = np.nonzero(A.T)
    assert o["csc_cp"] == np.concatenate([[0], np.cumsum((A != 0).sum(axis=0))]).tolist()
    assert o["csc_ri"] == cz[1].tolist()
    assert o["coo_r"] == (nz[0] + 1).tolist() and o["coo_c"] == (nz[1] + 1).tolist()
    for fmt in ("csc", "coo"):
        np.testing.assert_allclose(o[f"spmv_{fmt}"], A @ x, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.array(o["spmm"]), 2 * A @ B, rtol=1e-12, atol=1e-12)
    # SpGEMM: A @ A^T
    G = A @ A.T
    gz = np.nonzero(G)
    assert o["b1_positive"]
    g = o["spgemm"]
    assert g["nnz"] == len(gz[0]) and g["ci"] == gz[1].tolist()
    assert g["rp"] == np.concatenate([[0], np.cumsum((G != 0).sum(axis=1))]).tolist()
    np.testing.assert_allclose(g["v"], G[gz], rtol=1e-12)
    assert g["products"] == int(sum((A[:, k] != 0).sum() * (A.T[k] != 0).sum() for k in range(n)))
    # SpSV: 3 * inv(op(T)) rhs
    lo = np.tril(S)
    np.testing.assert_allclose(o["spsv_lower"], np.linalg.solve(lo, 3 * rhs), rtol=1e-10)
    up = np.triu(S)
    np.fill_diagonal(up, 1)
    np.testing.assert_allclose(o["spsv_upper_unit_T"], np.linalg.solve(up.T, 3 * rhs), rtol=1e-10)
    assert o["fill_lower"] == 0 and o["fill_upper_unit_T"] == 1
    # csr2csc: column offsets, row indices in column order, values moved
    assert o["csr2csc"][0] == o["csc_cp"] and o["csr2csc"][1] == cz[1].tolist()
    np.testing.assert_allclose(o["csr2csc"][2], A.T[cz])
    assert o["csr2coo"] == nz[0].tolist() and o["coo2csr"] == o["csr_rp"]
    ur, uc = (np.array(x) for x in o["coo_input"])
    byrow = np.lexsort((uc, ur))
    assert o["coosort_row"] == [ur[byrow].tolist(), uc[byrow].tolist(), byrow.tolist()]
    bycol = np.lexsort((ur, uc))
    assert o["coosort_col"] == [ur[bycol].tolist(), uc[bycol].tolist(), bycol.tolist()]
    assert o["csrsort"] == [[2, 4, 1, 2, 3], [1, 0, 3, 4, 2]]
    # A + 2 B: A = {(0,1): 1.5, (1,3): -2}; B (one-based sorted) = {(0,1): 10, (0,3): 20, (1,0): 30, (1,1): 40, (1,2): 50}
    assert o["geam2"] == [6, [0, 2, 6], [1, 3, 0, 1, 2, 3], [21.5, 40.0, 60.0, 80.0, 100.0, -2.0]]
    np.testing.assert_allclose(np.array(o["spsm"]), np.linalg.solve(np.tril(S), np.array(o["RB"])), rtol=1e-10)
    assert "not supported" not in r.stderr.lower(), r.stderr


RESTORE_PART1 = PRELUDE + r"""
A = np.array([[0, 2.0, 0, 0], [1.0, 0, 0, 3.0], [0, 0, 0, 0], [4.0, 0, 5.0, 0]])
dA = dev(A.T.copy())
dnA = c_void_p(); ok(sp.cusparseCreateDnMat(byref(dnA), 4, 4, 4, dA, R64F, 1), "DnMat")
rp = empty(5, np.int32); csr = c_void_p()
ok(sp.cusparseCreateCsr(byref(csr), 4, 4, 0, rp, None, None, I32T, I32T, 0, R64F), "CreateCsr")
buf = empty(256, np.uint8)
ok(sp.cusparseDenseToSparse_analysis(h, dnA, csr, 0, buf), "analysis")
r, c, z = c_int64(), c_int64(), c_int64()
ok(sp.cusparseSpMatGetSize(csr, byref(r), byref(c), byref(z)), "size")
ci, vals = empty(z.value, np.int32), empty(z.value, np.float64)
ok(sp.cusparseCsrSetPointers(csr, rp, ci, vals), "ptrs")
ok(sp.cusparseDenseToSparse_convert(h, dnA, csr, 0, buf), "convert")
ok(sp.cusparseDestroyDnMat(dnA), "destroy dense")       # the dense input is gone before the dump
ok(rt.cudaDeviceSynchronize(), "sync")
print("ready", flush=True)
sys.stdin.readline()                                       # dump, restore into a fresh proxyd
ok(sp.cusparseSpMatGetSize(csr, byref(r), byref(c), byref(z)), "size after")
x = np.array([1.0, 2.0, 3.0, 4.0])
vx = c_void_p(); ok(sp.cusparseCreateDnVec(byref(vx), 4, dev(x), R64F), "x")
y = empty(4, np.float64); vy = c_void_p(); ok(sp.cusparseCreateDnVec(byref(vy), 4, y, R64F), "y")
ok(sp.cusparseSpMV(h, 0, byref(ONE), csr, vx, byref(ZERO), vy, R64F, 0, buf), "SpMV")
ok(rt.cudaDeviceSynchronize(), "sync")
print(json.dumps({"nnz": z.value, "y": host(y, 4, np.float64).tolist(), "want": (A @ x).tolist()}))
"""


def dump_and_restore(script: str, tmp_path, tag: str, check_image) -> dict:
    """Runs script (a client that prints "ready", then waits for a line) under
    a daemon, dumps its GPU state once it is ready (check_image asserts on the
    image's library objects), restores it into a fresh daemon and lets the
    client go on: returns the JSON of its last output line."""
    from test_checkpoint import ctl, daemon, restart
    from gpuproxy.proxyd.checkpoint.image import Image
    tmp = Path(f"/tmp/gpx-{tag}-{os.getpid()}")
    tmp.mkdir(exist_ok=True)
    d = daemon(tmp)
    p = None
    try:
        p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], env=client_env(d),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = p.stdout.readline().strip()
        assert line == "ready", line + (p.stderr.read() if p.poll() is not None else "")
        st = ctl(d, "dump", pid=p.pid, dir=str(tmp_path / "img"))
        assert st["released"]
        check_image(Image.open(str(tmp_path / "img")).session["libraries"])
        d = restart(d, tmp, "fresh")
        ctl(d, "restore", dir=str(tmp_path / "img"))
        outs, errs = p.communicate("go\n", timeout=120)
        assert p.returncode == 0, outs + errs
        return json.loads(outs.strip().splitlines()[-1])
    finally:
        if p is not None and p.poll() is None:
            p.kill()
        d.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.slow
def test_dense_to_sparse_descriptor_survives_a_restore(tmp_path):
    """The nnz DenseToSparse_analysis set comes back with the descriptor, and
    the restored CSR matrix multiplies as before (its dense input destroyed
    before the dump); the image names the analysis nowhere (its effect is in
    the descriptor's create)."""
    from gpuproxy.proxyd._generated import FUNCTIONS

    def check_image(libs):
        spmats = [o for o in libs if o["kind"] == "cusparse_spmat"]
        assert len(spmats) == 1 and FUNCTIONS[spmats[0]["create"][0]].name == "cusparseCreateCsr"
        assert spmats[0]["create"][2][3] == 5, "the analysis' nnz is in the recorded create"
    o = dump_and_restore(RESTORE_PART1, tmp_path, "sp", check_image)
    assert o["nnz"] == 5
    np.testing.assert_allclose(o["y"], o["want"])


RESTORE_SPSV = PRELUDE + r"""
S = np.array([[4.0, 0, 0], [1.0, 3.0, 0], [0, 2.0, 5.0]])
dS = dev(S.T.copy())
dnS = c_void_p(); ok(sp.cusparseCreateDnMat(byref(dnS), 3, 3, 3, dS, R64F, 1), "DnMat")
rp = empty(4, np.int32); csr = c_void_p()
ok(sp.cusparseCreateCsr(byref(csr), 3, 3, 0, rp, None, None, I32T, I32T, 0, R64F), "CreateCsr")
buf = empty(256, np.uint8)
ok(sp.cusparseDenseToSparse_analysis(h, dnS, csr, 0, buf), "analysis")
r, c, z = c_int64(), c_int64(), c_int64()
ok(sp.cusparseSpMatGetSize(csr, byref(r), byref(c), byref(z)), "size")
ok(sp.cusparseCsrSetPointers(csr, rp, empty(z.value, np.int32), empty(z.value, np.float64)), "ptrs")
ok(sp.cusparseDenseToSparse_convert(h, dnS, csr, 0, buf), "convert")
rhs = np.array([4.0, 7.0, 12.0])
vx = c_void_p(); ok(sp.cusparseCreateDnVec(byref(vx), 3, dev(rhs), R64F), "x")
y = empty(3, np.float64); vy = c_void_p(); ok(sp.cusparseCreateDnVec(byref(vy), 3, y, R64F), "y")
d = c_void_p(); ok(sp.cusparseSpSV_createDescr(byref(d)), "SpSV_createDescr")
bs = c_size_t(); ok(sp.cusparseSpSV_bufferSize(h, 0, byref(ONE), csr, vx, vy, R64F, 0, d, byref(bs)), "bs")
sb = empty(bs.value, np.uint8)
ok(sp.cusparseSpSV_analysis(h, 0, byref(ONE), csr, vx, vy, R64F, 0, d, sb), "SpSV analysis")
ok(rt.cudaDeviceSynchronize(), "sync")
print("ready", flush=True)
sys.stdin.readline()                        # dump, restore into a fresh proxyd: the analysis comes back
ok(sp.cusparseSpSV_solve(h, 0, byref(ONE), csr, vx, vy, R64F, 0, d), "SpSV solve after restore")
ok(rt.cudaDeviceSynchronize(), "sync")
print(json.dumps({"y": host(y, 3, np.float64).tolist(), "want": np.linalg.solve(S, rhs).tolist()}))
"""


@pytest.mark.slow
def test_spsv_analysis_survives_a_restore(tmp_path):
    """An SpSV descriptor analysed before the dump solves after the restore:
    the analysis is replayed as the descriptor's setting."""
    from gpuproxy.proxyd._generated import FUNCTIONS

    def check_image(libs):
        spsv = [o for o in libs if o["kind"] == "cusparse_spsv"]
        assert len(spsv) == 1
        assert [FUNCTIONS[f].name for f, _ in spsv[0]["settings"]] == ["cusparseSpSV_analysis"]
    o = dump_and_restore(RESTORE_SPSV, tmp_path, "spsv", check_image)
    np.testing.assert_allclose(o["y"], o["want"])

