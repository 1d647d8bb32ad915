"""cuBLAS level-1 results and the batched/solver calls through the shim's
stand-ins to an emulated worker (docs/libraries.md): a result pointer that
is host or device memory by the handle's pointer mode (spec role
scalar_out), a host `info` (cublasDgetrsBatched), cuSOLVER's Jacobi params
objects in a checkpoint image. References are computed in the test from the
same host data, independently of the emulated library."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import client_env

SCRIPT = r"""
import ctypes, json, math, struct
from ctypes import byref, c_int, c_int64, c_float, c_double, c_void_p
cb = ctypes.CDLL("/opt/elsewhere/nvidia/cu13/lib/libcublas.so.13")   # by path, as CuPy loads it
so = ctypes.CDLL("libcusolver.so.12")
rt = ctypes.CDLL("libcudart.so.13")
out = {}
h = c_void_p()
out["create"] = cb.cublasCreate_v2(byref(h))
n = 37
x = [((i * 7) % 11 - 5) / 4.0 for i in range(n)]
y = [((i * 5) % 13 - 6) / 8.0 for i in range(n)]
def dev(vals, fmt):
    raw = struct.pack(fmt * len(vals), *vals)
    p = c_void_p()
    rt.cudaMalloc(byref(p), len(raw))
    rt.cudaMemcpy(p, raw, len(raw), 1)
    return p
dx, dy = dev(x, "f"), dev(y, "f")
r = c_float(-1.0)
out["sdot_rc"] = cb.cublasSdot_v2(h, n, dx, 1, dy, 1, byref(r))
out["sdot"] = r.value
out["sdot_want"] = sum(a * b for a, b in zip(x, y))
nr = c_float(-1.0)
out["snrm2_rc"] = cb.cublasSnrm2_v2(h, 19, dx, 2, byref(nr))     # x[0], x[2], ..., x[36]
out["snrm2"] = nr.value
out["snrm2_want"] = math.sqrt(sum(v * v for v in x[::2]))
out["snrm2_null"] = cb.cublasSnrm2_v2(h, n, dx, 1, None)
i64 = c_int64(-1)
out["isamax64_rc"] = cb.cublasIsamax_v2_64(h, c_int64(n), dx, c_int64(1), byref(i64))
out["isamax64"] = i64.value
out["isamax_want"] = 1 + max(range(n), key=lambda i: (abs(x[i]), -i))
# complex, 16-byte result
z = [complex((i % 5) - 2, (i % 3) - 1) for i in range(9)]
w = [complex((i % 4) - 1.5, (i % 7) - 3) for i in range(9)]
dz = dev([c for v in z for c in (v.real, v.imag)], "d")
dw = dev([c for v in w for c in (v.real, v.imag)], "d")
zr = (c_double * 2)(-1, -1)
out["zdotc_rc"] = cb.cublasZdotc_v2(h, 9, dz, 1, dw, 1, zr)
want = sum(a.conjugate() * b for a, b in zip(z, w))
out["zdotc"] = [zr[0], zr[1]]
out["zdotc_want"] = [want.real, want.imag]
# device pointer mode: the result goes to device memory; nothing is written to the host
out["mode_rc"] = cb.cublasSetPointerMode_v2(h, 1)
dres = c_void_p()
rt.cudaMalloc(byref(dres), 8)
out["sdot_dev_rc"] = cb.cublasSdot_v2(h, n, dx, 1, dy, 1, dres)
out["sync"] = rt.cudaDeviceSynchronize()
back = c_float(0.0)
rt.cudaMemcpy(byref(back), dres, 4, 2)
out["sdot_dev"] = back.value
out["mode_back"] = cb.cublasSetPointerMode_v2(h, 0)
# cublasDgetrsBatched: `info` is a host int (cuBLAS documentation), answered at once
nn = 3
A = [4.0, 1.0, 0.5, 1.0, 5.0, 1.0, 0.5, 1.0, 6.0]       # column-major, diagonally dominant
B = [1.0, 2.0, 3.0]
dA, dB = dev(A, "d"), dev(B, "d")
arrA, arrB = dev([dA.value], "Q"), dev([dB.value], "Q")
piv, dinfo = c_void_p(), c_void_p()
rt.cudaMalloc(byref(piv), 4 * nn)
rt.cudaMalloc(byref(dinfo), 4)
out["getrf_rc"] = cb.cublasDgetrfBatched(h, nn, arrA, nn, piv, dinfo, 1)
info = c_int(-99)
out["getrs_rc"] = cb.cublasDgetrsBatched(h, 0, nn, 1, arrA, nn, piv, arrB, nn, byref(info), 1)
out["getrs_info"] = info.value
bad = c_int(-99)
out["getrs_bad_rc"] = cb.cublasDgetrsBatched(h, 0, nn, 1, arrA, 1, piv, arrB, nn, byref(bad), 1)
out["getrs_bad_info"] = bad.value
xs = (c_double * nn)()
rt.cudaMemcpy(xs, dB, 8 * nn, 2)
out["ax"] = [sum(A[i + j * nn] * xs[j] for j in range(nn)) for i in range(nn)]
out["b"] = B
# cuSOLVER Jacobi params: a session object with settings
p = c_void_p()
out["syevj_create"] = so.cusolverDnCreateSyevjInfo(byref(p))
out["syevj_tol"] = so.cusolverDnXsyevjSetTolerance(p, c_double(1e-9))
out["syevj_destroy"] = so.cusolverDnDestroySyevjInfo(p)
# still unsupported: in-out host scalars (rotg), one stderr line
out["rotg"] = cb.cublasSrotg_v2(h, dx, dx, dx, dx)
out["destroy"] = cb.cublasDestroy_v2(h)
print(json.dumps(out))
"""


def test_level1_results_batched_info_and_params_through_the_shim(emu_daemon):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT)], env=client_env(emu_daemon),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout)
    assert o["create"] == 0
    assert o["sdot_rc"] == 0 and o["sdot"] == pytest.approx(o["sdot_want"], rel=1e-6)
    assert o["snrm2_rc"] == 0 and o["snrm2"] == pytest.approx(o["snrm2_want"], rel=1e-6)
    assert o["snrm2_null"] == 7, "a NULL result is CUBLAS_STATUS_INVALID_VALUE"
    assert o["isamax64_rc"] == 0 and o["isamax64"] == o["isamax_want"]
    assert o["zdotc_rc"] == 0 and o["zdotc"] == pytest.approx(o["zdotc_want"], rel=1e-12)
    assert o["mode_rc"] == 0 and o["sdot_dev_rc"] == 0 and o["sync"] == 0 and o["mode_back"] == 0
    assert o["sdot_dev"] == pytest.approx(o["sdot_want"], rel=1e-6), "device pointer mode: written on the device"
    assert o["getrf_rc"] == 0 and o["getrs_rc"] == 0 and o["getrs_info"] == 0
    assert o["getrs_bad_rc"] == 0 and o["getrs_bad_info"] == -6, "lda < n: info names argument 6 (host)"
    assert o["ax"] == pytest.approx(o["b"], rel=1e-12)
    assert o["syevj_create"] == 0 and o["syevj_tol"] == 0 and o["syevj_destroy"] == 0
    assert o["rotg"] == 15 and "cublasSrotg_v2" in r.stderr
    assert o["destroy"] == 0


def test_linalg_handles_and_jacobi_params_are_in_the_image_and_come_back(tmp_path):
    """linalg paced to iteration 1, dumped: the image lists both cuBLAS
    handles (one with its device pointer mode), the cuSOLVER handle and the
    syevjInfo_t with its tolerance and sweep limit; restored into a fresh
    proxyd, the program finishes with its expected output (its syevj call
    needs the params object back)."""
    from test_libraries import library_objects_across_restore

    def check(libs, names):
        kinds = sorted(o["kind"] for o in libs)
        assert kinds == sorted(["cublas_handle"] * 2 + ["cusolver_dn_handle", "cusolver_syevj_info"]), kinds
        info = next(o for o in libs if o["kind"] == "cusolver_syevj_info")
        assert names(info) == ["cusolverDnXsyevjSetMaxSweeps", "cusolverDnXsyevjSetTolerance"]
        modes = [names(o) for o in libs if o["kind"] == "cublas_handle"]
        assert sum("cublasSetPointerMode_v2" in m for m in modes) == 1, modes
    library_objects_across_restore(tmp_path, "linalg", check)


def test_nvidias_cusolver_takes_the_jacobi_info_calls_as_declared(monkeypatch):
    """The worker's cffi declarations of the Jacobi info calls against
    NVIDIA's real libcusolver.so.12 (no GPU needed for these): create, the
    three setters, destroy. Skips where the library is absent (set
    GPUPROXY_LIB_DIR, e.g. to nvidia/cu13/lib of a PyTorch install)."""
    import os
    from gpuproxy.autogen import libbootstrap
    d = libbootstrap.find_file(libbootstrap.default_lib_dirs() + [os.environ.get("GPUPROXY_NVIDIA_LIB_DIR", "")],
                               "libcusolver.so.12")
    if d is None:
        pytest.skip("NVIDIA's libcusolver.so.12 not installed here (set GPUPROXY_LIB_DIR)")
    monkeypatch.setenv("GPUPROXY_NVIDIA_LIB_DIR", os.path.dirname(d))
    from gpuproxy.proxyd.families.libraries import RealLibrary
    from gpuproxy.proxyd._generated import FUNCTIONS
    by = {f.name: f for f in FUNCTIONS.values()}
    so = RealLibrary("cusolver")
    for kind in ("Syevj", "Gesvdj"):
        code, (info,) = so.call(by[f"cusolverDnCreate{kind}Info"], [True])
        assert code == 0 and info
        x = kind.lower()
        assert so.call(by[f"cusolverDnX{x}SetTolerance"], [info, 1e-9]) == (0, [])
        assert so.call(by[f"cusolverDnX{x}SetMaxSweeps"], [info, 40]) == (0, [])
        assert so.call(by[f"cusolverDnX{x}SetSortEig"], [info, 0]) == (0, [])
        assert so.call(by[f"cusolverDnDestroy{kind}Info"], [info]) == (0, [])
