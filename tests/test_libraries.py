"""Library remoting (docs/libraries.md): the stand-ins libcublas.so.13,
libcublasLt.so.13, libnvidia-ml.so.1 and libcudnn.so.9, their specs, and
the worker side.

Runs on the emulated backend (CI). The cuBLAS corpus program
(tests/programs/cublas_gemm.cu) is run by test_corpus_emu.py and across
dump/restore by test_corpus_checkpoint.py; here: NVML as PyTorch and pynvml
use it (ctypes on the soname), unsupported calls, the asynchronous error
of a failed gemm, dlopen redirection, a worker without NVIDIA's library,
and parity with NVIDIA's headers and libraries where they are installed
($GPUPROXY_LIB_INCLUDE / $GPUPROXY_LIB_DIR, or nvidia/cu13 of this Python;
those tests skip, saying so, where they are not).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, call_profile, client_env

sys.path.insert(0, str(REPO / "autogen"))
import header as hdr  # noqa: E402
import libbootstrap  # noqa: E402
import specload  # noqa: E402

SPECS = specload.load_specs(REPO / "specs")
LIB_FILES = {sf.api: sf for sf in SPECS.files if sf.api in specload.LIBRARY_APIS}


def _run_py(daemon, code: str, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=client_env(daemon),
                          capture_output=True, text=True, timeout=timeout)


def _run_profiled(daemon, code: str, prof) -> tuple[subprocess.CompletedProcess, dict]:
    """code run as a client of daemon with its call profile written to prof;
    it must succeed: the run and the JSON it printed."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=client_env(daemon, {"GPUPROXY_PROFILE": str(prof)}))
    assert r.returncode == 0, r.stderr
    return r, json.loads(r.stdout)


def _lines_naming(stderr: str, name: str) -> list[str]:
    return [l for l in stderr.splitlines() if re.search(rf"\b{name}\b", l)]


# ------------------------------------------------------------------ NVML

NVML_SCRIPT = r"""
import ctypes, json
from ctypes import byref, c_uint, c_int, c_size_t, c_void_p, c_char_p, c_ulonglong, create_string_buffer

nv = ctypes.CDLL("libnvidia-ml.so.1")
# by absolute path, as some tools load it: the stand-in all the same
nv_abs = ctypes.CDLL("/opt/nowhere/nvidia/lib/libnvidia-ml.so.1")
cu = ctypes.CDLL("libcuda.so.1")
out = {}
out["init"] = nv.nvmlInit_v2()
n = c_uint(99)
out["count_rc"] = nv.nvmlDeviceGetCount_v2(byref(n))
out["count"] = n.value
n2 = c_uint(99)
out["count_abs_rc"] = nv_abs.nvmlDeviceGetCount_v2(byref(n2))
out["count_abs"] = n2.value
dev = c_void_p()
out["handle_rc"] = nv.nvmlDeviceGetHandleByIndex_v2(0, byref(dev))
name = create_string_buffer(96)
out["name_rc"] = nv.nvmlDeviceGetName(dev, name, 96)
out["name"] = name.value.decode()
small = create_string_buffer(2)
out["name_small_rc"] = nv.nvmlDeviceGetName(dev, small, 2)
uuid = create_string_buffer(96)
out["uuid_rc"] = nv.nvmlDeviceGetUUID(dev, uuid, 96)
out["uuid"] = uuid.value.decode()
class Memory(ctypes.Structure):
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]
mem = Memory()
out["mem_rc"] = nv.nvmlDeviceGetMemoryInfo(dev, byref(mem))
out["mem"] = [mem.total, mem.free, mem.used]
mj, mn = c_int(-1), c_int(-1)
out["cc_rc"] = nv.nvmlDeviceGetCudaComputeCapability(dev, byref(mj), byref(mn))
out["cc"] = [mj.value, mn.value]
idx = c_uint(99)
out["index_rc"] = nv.nvmlDeviceGetIndex(dev, byref(idx))
out["index"] = idx.value
# the same device by its PCI bus id (the driver's string, as XLA passes it)
# and by its UUID: handles that name index 0; an unknown bus id is not found
cu.cuInit(0)
bus = create_string_buffer(32)
out["busid_rc"] = cu.cuDeviceGetPCIBusId(bus, 32, 0)
out["busid"] = bus.value.decode()
by_bus, by_uuid, none = c_void_p(), c_void_p(), c_void_p()
out["by_bus_rc"] = nv.nvmlDeviceGetHandleByPciBusId_v2(bus.value, byref(by_bus))
out["by_uuid_rc"] = nv.nvmlDeviceGetHandleByUUID(uuid.value, byref(by_uuid))
out["by_bad_bus_rc"] = nv.nvmlDeviceGetHandleByPciBusId_v2(b"0000:7f:00.0", byref(none))
names = []
for h in (by_bus, by_uuid):
    i, nm = c_uint(99), create_string_buffer(96)
    names.append([nv.nvmlDeviceGetIndex(h, byref(i)), i.value, nv.nvmlDeviceGetName(h, nm, 96), nm.value.decode()])
out["found"] = names
# unsupported: the not-supported status, one stderr line naming it
t = c_uint()
out["temp_rc"] = nv.nvmlDeviceGetTemperature(dev, 0, byref(t))
nv.nvmlErrorString.restype = c_char_p
out["temp_str"] = nv.nvmlErrorString(out["temp_rc"]).decode()
out["shutdown"] = nv.nvmlShutdown()
# the same facts from the driver API
cu.cuInit(0)
c = c_int()
cu.cuDeviceGetCount(byref(c))
out["cu_count"] = c.value
b = create_string_buffer(256)
cu.cuDeviceGetName(b, 256, 0)
out["cu_name"] = b.value.decode()
tot = c_size_t()
cu.cuDeviceTotalMem_v2(byref(tot), 0)
out["cu_total"] = tot.value
u = create_string_buffer(16)
cu.cuDeviceGetUuid_v2(u, 0)
out["cu_uuid"] = u.raw.hex()
ma, mi = c_int(), c_int()
cu.cuDeviceGetAttribute(byref(ma), 75, 0)     # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
cu.cuDeviceGetAttribute(byref(mi), 76, 0)     # ..._MINOR
out["cu_cc"] = [ma.value, mi.value]
print(json.dumps(out))
"""


def test_nvml_answers_what_the_driver_says(emu_daemon):
    r = _run_py(emu_daemon, NVML_SCRIPT)
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout)
    assert o["init"] == 0 and o["count_rc"] == 0 and o["handle_rc"] == 0 and o["shutdown"] == 0
    assert o["count"] == o["cu_count"] >= 1
    assert o["count_abs_rc"] == 0 and o["count_abs"] == o["count"], "dlopen by path must give the stand-in"
    assert o["name_rc"] == 0 and o["name"] == o["cu_name"]
    assert o["name_small_rc"] == 7, "a too small buffer is NVML_ERROR_INSUFFICIENT_SIZE"
    # NVML's UUID is the CUDA device UUID as GPU-8-4-4-4-12 hex digits
    h = o["cu_uuid"]
    assert o["uuid_rc"] == 0 and o["uuid"] == f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    total, free, used = o["mem"]
    assert o["mem_rc"] == 0 and total == o["cu_total"] and free + used == total
    assert o["index_rc"] == 0 and o["index"] == 0
    assert o["cc_rc"] == 0 and o["cc"] == o["cu_cc"], (o["cc"], o["cu_cc"])
    assert o["busid_rc"] == 0 and o["by_bus_rc"] == 0 and o["by_uuid_rc"] == 0, o
    assert o["found"] == [[0, 0, 0, o["name"]]] * 2, o["found"]
    assert o["by_bad_bus_rc"] == 6, "an unknown bus id is NVML_ERROR_NOT_FOUND"
    assert o["temp_rc"] == 3 and o["temp_str"] == "Not Supported"
    assert len(_lines_naming(r.stderr, "nvmlDeviceGetTemperature")) == 1, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


FAKE_NVML = r"""
#include <string.h>
typedef void *nvmlDevice_t;
static int devs[2];
int nvmlInit_v2(void) { return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d) { if (i > 1) return 2; *d = &devs[i]; return 0; }
int nvmlDeviceGetHandleByPciBusId_v2(const char *b, nvmlDevice_t *d)
{ if (strcmp(b, "00000000:02:00.0")) return 6; *d = &devs[1]; return 0; }
int nvmlDeviceGetIndex(nvmlDevice_t d, unsigned *i) { *i = (unsigned)((int *)d - devs); return 0; }
"""


def test_real_nvml_handle_by_bus_id_names_its_index(tmp_path, monkeypatch):
    """The worker's path through NVIDIA's NVML (families/libraries.py,
    RealLibrary.nvml_index), on a stand-in library of four functions: a
    handle the library gave by bus id (call() answers it as an integer) is
    named by NVML's index, and nvml_device gives that device's handle back."""
    import shutil
    if not shutil.which("gcc"):
        pytest.skip("no gcc to build the stand-in NVML")
    (tmp_path / "fake.c").write_text(FAKE_NVML)
    so = tmp_path / "libnvidia-ml.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(tmp_path / "fake.c")], check=True)
    monkeypatch.setenv("GPUPROXY_NVML_LIBRARY", str(so))
    from gpuproxy.proxyd.families.libraries import RealLibrary
    lib = RealLibrary("nvml")
    assert lib.path == str(so)
    p = lib.ffi.new("void *[1]")
    assert lib.lib.nvmlDeviceGetHandleByPciBusId_v2(b"00000000:02:00.0", lib.ffi.cast("void *", p)) == 0
    by_bus = int(lib.ffi.cast("uintptr_t", p[0]))
    assert lib.nvml_index(by_bus) == 1
    assert int(lib.ffi.cast("uintptr_t", lib.nvml_device(1))) == by_bus
    assert int(lib.ffi.cast("uintptr_t", lib.nvml_device(0))) != by_bus


# ------------------------------------------------------------------ cuBLAS

CUBLAS_SCRIPT = r"""
import ctypes, json
from ctypes import byref, c_int, c_float, c_void_p, c_char_p
cb = ctypes.CDLL("/somewhere/site-packages/nvidia/cu13/lib/libcublas.so.13")   # as CuPy loads it
rt = ctypes.CDLL("libcudart.so.13")
out = {}
h = c_void_p()
out["create"] = cb.cublasCreate_v2(byref(h))
d = c_void_p()
out["malloc"] = rt.cudaMalloc(byref(d), 4096)
one = c_float(1.0)
# lda (4) < m (8): cuBLAS rejects it; the call is asynchronous under the
# proxy, so the failure comes at the next synchronising call
out["gemm"] = cb.cublasSgemm_v2(h, 0, 0, 8, 8, 8, byref(one), d, 4, d, 8, byref(one), d, 8)
out["sync"] = rt.cudaDeviceSynchronize()
out["sync_again"] = rt.cudaDeviceSynchronize()
# a good gemm after it works
out["gemm_ok"] = cb.cublasSgemm_v2(h, 0, 0, 8, 8, 8, byref(one), d, 8, d, 8, byref(one), d, 8)
out["sync_ok"] = rt.cudaDeviceSynchronize()
# unsupported: CUBLAS_STATUS_NOT_SUPPORTED and one stderr line
out["rotg"] = cb.cublasSrotg_v2(h, d, d, d, d)
cb.cublasGetStatusName.restype = c_char_p
out["name15"] = cb.cublasGetStatusName(15).decode()
out["destroy"] = cb.cublasDestroy_v2(h)
out["bad_handle"] = cb.cublasSetMathMode(h, 0)
print(json.dumps(out))
"""


def test_cublas_async_error_unsupported_and_status_names(emu_daemon):
    r = _run_py(emu_daemon, CUBLAS_SCRIPT)
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout)
    assert o["create"] == 0 and o["malloc"] == 0
    assert o["gemm"] == 0, "gemm calls are asynchronous: queued, answered later"
    assert o["sync"] == 719, "the failed gemm surfaces as cudaErrorLaunchFailure at the next sync"
    assert o["sync_again"] == 0 and o["gemm_ok"] == 0 and o["sync_ok"] == 0
    assert _lines_naming(r.stderr, "cublasSgemm_v2"), f"the failure names the function:\n{r.stderr}"
    assert o["rotg"] == 15 and len(_lines_naming(r.stderr, "cublasSrotg_v2")) == 1, r.stderr
    assert o["name15"] == "CUBLAS_STATUS_NOT_SUPPORTED"
    assert o["destroy"] == 0
    assert o["bad_handle"] == 1, "a destroyed handle is CUBLAS_STATUS_NOT_INITIALIZED"


MATHLIBS_SCRIPT = r"""
import ctypes, json
from ctypes import byref, c_int, c_void_p, c_size_t, c_float, c_ulonglong

# by absolute paths, as CuPy loads them: the stand-ins all the same
fft = ctypes.CDLL("/opt/nowhere/nvidia/cu13/lib/libcufft.so.12")
rnd = ctypes.CDLL("/opt/nowhere/lib/libcurand.so.10")
sp = ctypes.CDLL("libcusparse.so.12")
so = ctypes.CDLL("/x/libcusolver.so.12")
rt = ctypes.CDLL("libcudart.so.13")
out = {}
v = c_int()
out["fft_version"] = [fft.cufftGetVersion(byref(v)), v.value]
plan = c_int(-1)
out["plan1d"] = fft.cufftPlan1d(byref(plan), 8, 0x29, 1)
out["plan"] = plan.value
buf = c_void_p()
rt.cudaMalloc(byref(buf), ctypes.c_size_t(8 * 8 * 2))
# a bad direction: asynchronous, so reported at the next synchronisation
out["exec_bad"] = fft.cufftExecC2C(plan, buf, buf, 7)
out["sync"] = rt.cudaDeviceSynchronize()
out["sync_again"] = rt.cudaDeviceSynchronize()
out["exec_ok"] = fft.cufftExecC2C(plan, buf, buf, -1)
out["destroy"] = fft.cufftDestroy(plan)
out["exec_destroyed"] = fft.cufftExecC2C(plan, buf, buf, -1)
out["sync_destroyed"] = rt.cudaDeviceSynchronize()
out["fft_unsupported"] = fft.cufftEstimate1d(8, 0x29, 1, byref(c_size_t()))
# cuRAND: the same seed, the same numbers; an offset positions the sequence
g1, g2 = c_void_p(), c_void_p()
out["gen"] = [rnd.curandCreateGenerator(byref(g1), 100), rnd.curandCreateGenerator(byref(g2), 100)]
rnd.curandSetPseudoRandomGeneratorSeed(g1, c_ulonglong(7))
rnd.curandSetPseudoRandomGeneratorSeed(g2, c_ulonglong(7))
d = c_void_p()
rt.cudaMalloc(byref(d), ctypes.c_size_t(4 * 64))
vals = (c_float * 64)()
rnd.curandGenerateUniform(g1, d, c_size_t(64))
rt.cudaMemcpy(vals, d, ctypes.c_size_t(4 * 64), 2)
out["u"] = list(vals)
rnd.curandGenerateUniform(g2, d, c_size_t(32))
rnd.curandGenerateUniform(g2, d, c_size_t(32))
rt.cudaMemcpy(vals, d, ctypes.c_size_t(4 * 32), 2)
out["u_second_half"] = list(vals)[:32]
rnd.curandSetGeneratorOffset(g2, c_ulonglong(16))
rnd.curandGenerateUniform(g2, d, c_size_t(8))
rt.cudaMemcpy(vals, d, ctypes.c_size_t(4 * 8), 2)
out["u_at_16"] = list(vals)[:8]
out["normal_odd"] = rnd.curandGenerateNormal(g1, d, c_size_t(3), c_float(0), c_float(1))
out["sync_normal"] = rt.cudaDeviceSynchronize()
rnd.curandCreatePoissonDistribution.argtypes = [ctypes.c_double, ctypes.c_void_p]
out["rand_unsupported"] = rnd.curandCreatePoissonDistribution(1.0, byref(c_void_p()))
h = c_void_p()
out["sp_create"] = sp.cusparseCreate(byref(h))
out["sp_unsupported"] = sp.cusparseCreateColorInfo(byref(c_void_p()))
sp.cusparseGetErrorName.restype = ctypes.c_char_p
out["sp_name10"] = sp.cusparseGetErrorName(10).decode()
s = c_void_p()
out["so_create"] = so.cusolverDnCreate(byref(s))
out["so_unsupported"] = so.cusolverDnSpotri(s, 0, 4, None, 4, None, 0, None)
print(json.dumps(out))
"""


LT_ASYNC_SCRIPT = r"""
import ctypes, json, sys
from ctypes import byref, c_int, c_int32, c_uint64, c_int64, c_void_p, create_string_buffer, sizeof
lt = ctypes.CDLL("libcublasLt.so.13")
rt = ctypes.CDLL("libcudart.so.13")
out = {}
h = c_void_p()
out["create"] = lt.cublasLtCreate(byref(h))
lt.cublasLtMatmulDescCreate.argtypes = [ctypes.POINTER(c_void_p), c_int, c_int]
lt.cublasLtMatrixLayoutCreate.argtypes = [ctypes.POINTER(c_void_p), c_int, c_uint64, c_uint64, c_int64]
lt.cublasLtMatmulAlgoGetHeuristic.argtypes = [c_void_p] * 7 + [c_int, c_void_p, ctypes.POINTER(c_int)]

def descs(k=16):
    d, a, b, c, p = c_void_p(), c_void_p(), c_void_p(), c_void_p(), c_void_p()
    rc = [lt.cublasLtMatmulDescCreate(byref(d), 68, 0)]          # CUBLAS_COMPUTE_32F, CUDA_R_32F
    for x, (r, cc) in ((a, (8, k)), (b, (k, 8)), (c, (8, 8))):
        rc.append(lt.cublasLtMatrixLayoutCreate(byref(x), 0, r, cc, r))
    rc.append(lt.cublasLtMatmulPreferenceCreate(byref(p)))
    ws = c_uint64(1 << 20)
    rc.append(lt.cublasLtMatmulPreferenceSetAttribute(p, 1, byref(ws), 8))  # MAX_WORKSPACE_BYTES
    return rc, (d, a, b, c, p)

def heur(ds):
    d, a, b, c, p = ds
    res = create_string_buffer(96 * 2)
    n = c_int(-1)
    rc = lt.cublasLtMatmulAlgoGetHeuristic(h, d, a, b, c, c, p, 2, res, byref(n))
    return rc, n.value, res.raw[:96 * max(n.value, 0)]

def destroy(ds):
    d, a, b, c, p = ds
    return [lt.cublasLtMatmulDescDestroy(d), lt.cublasLtMatrixLayoutDestroy(a), lt.cublasLtMatrixLayoutDestroy(b),
            lt.cublasLtMatrixLayoutDestroy(c), lt.cublasLtMatmulPreferenceDestroy(p)]

rc, ds = descs()
out["creates"] = rc
out["handles"] = [x.value for x in ds]
first = heur(ds)
second = heur(ds)                      # same question: from the shim's cache
out["heur"] = [first[0], first[1], second[0], second[1], first[2] == second[2]]
out["destroy"] = destroy(ds)
rc, ds2 = descs()                      # same contents under reused handles: a hit
out["reused"] = sorted(x.value & 0xFFFFFFFF for x in ds2) == sorted(x & 0xFFFFFFFF for x in out["handles"])
third = heur(ds2)
out["third_same"] = third[2] == first[2] and third[1] == first[1]
rc, ds3 = descs(k=32)                  # another shape: a new question
fourth = heur(ds3)
out["fourth"] = [fourth[0], fourth[1]]
# an attribute set on a destroyed descriptor: the shim knows it is gone
destroy(ds3)
one = c_int32(1)
out["late_set"] = lt.cublasLtMatmulDescSetAttribute(ds3[0], 3, byref(one), 4)   # TRANSA
# an attribute id NVIDIA's library does not know: judged when proxyd's copy
# is made (by the heuristic question), reported at the next synchronising call
rc, ds4 = descs(k=64)
bad = c_int32(0)
out["bad_attr_set"] = lt.cublasLtMatmulDescSetAttribute(ds4[0], 9999, byref(bad), 4)
heur(ds4)
out["bad_attr_sync"] = rt.cudaDeviceSynchronize()
out["null_buf"] = lt.cublasLtMatmulDescSetAttribute(ds2[0], 3, None, 4)
out["null_out"] = lt.cublasLtMatrixLayoutCreate(None, 0, 8, 8, 8)
print(json.dumps(out))
"""


def test_math_libraries_handles_async_errors_and_unsupported(emu_daemon):
    """cuFFT, cuRAND, cuSPARSE and cuSOLVER as ctypes (like CuPy) load them:
    an int cufftHandle, an asynchronous failure surfacing at the next
    synchronisation, a destroyed plan, the emulated generator's sequence and
    offset, and one stderr line with each library's not-supported status."""
    r = _run_py(emu_daemon, MATHLIBS_SCRIPT)
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout)
    assert o["fft_version"] == [0, 12500]       # CUFFT_VERSION of cufft.h 12.5.0 (proxyd/backends/emu/versions.py)
    assert o["plan1d"] == 0 and 0 < o["plan"] < 1 << 31, "a cufftHandle is a small int"
    assert o["exec_bad"] == 0 and o["sync"] == 719, "a failed cufftExec* is reported at the next sync"
    assert _lines_naming(r.stderr, "cufftExecC2C"), r.stderr
    assert o["sync_again"] == 0 and o["exec_ok"] == 0 and o["destroy"] == 0
    assert o["exec_destroyed"] == 0 and o["sync_destroyed"] == 719, "a destroyed plan fails at the sync"
    assert o["fft_unsupported"] == 16 and len(_lines_naming(r.stderr, "cufftEstimate1d")) == 1, r.stderr
    assert o["gen"] == [0, 0]
    u = o["u"]
    assert all(0.0 < x <= 1.0 for x in u) and len(set(u)) > 60
    assert o["u_second_half"] == u[32:], "two calls continue one sequence"
    assert o["u_at_16"] == u[16:24], "curandSetGeneratorOffset positions the sequence absolutely"
    assert o["normal_odd"] == 0 and o["sync_normal"] == 719, "an odd count of normals fails (curand.h)"
    assert o["rand_unsupported"] == 204 and len(_lines_naming(r.stderr, "curandCreatePoissonDistribution")) == 1
    assert o["sp_create"] == 0 and o["sp_unsupported"] == 10
    assert len(_lines_naming(r.stderr, "cusparseCreateColorInfo")) == 1
    assert o["sp_name10"] == "CUSPARSE_STATUS_NOT_SUPPORTED"
    assert o["so_create"] == 0 and o["so_unsupported"] == 9
    assert len(_lines_naming(r.stderr, "cusolverDnSpotri")) == 1


def test_lt_descriptors_are_async_and_heuristics_cached(emu_daemon, tmp_path, proxy_cli):
    """cuBLASLt descriptors under handles the shim names (interceptor/lib_ids.c)
    and the heuristic cache (lt_heuristic.c): the round trips a PyTorch
    matmul pays, counted by the shim's own call profile."""
    prof = tmp_path / "calls.prof"
    r, o = _run_profiled(emu_daemon, LT_ASYNC_SCRIPT, prof)
    assert o["create"] == 0 and o["creates"] == [0] * 6
    assert all(h >> 32 in (34, 35, 36) and h & 0x80000000 for h in o["handles"]), "shim-chosen handles"
    assert len(set(o["handles"])) == 5
    assert o["heur"][0] == 0 and o["heur"][1] >= 1 and o["heur"][2] == 0 and o["heur"][3] == o["heur"][1]
    assert o["heur"][4], "the cached answer is the worker's answer"
    assert o["destroy"] == [0] * 5 and o["reused"] and o["third_same"]
    assert o["fourth"][0] == 0 and o["fourth"][1] >= 1
    assert o["late_set"] == 7, "a destroyed descriptor: CUBLAS_STATUS_INVALID_VALUE at once"
    assert o["bad_attr_set"] == 0 and o["bad_attr_sync"] == 719, "an unknown attribute surfaces at the next sync"
    assert _lines_naming(r.stderr, "cublasLtMatmulDescSetAttribute"), r.stderr
    assert o["null_buf"] == 7 and o["null_out"] == 7, "what the shim can judge fails at once"
    rows = call_profile(prof)
    ids = {f.name: f.id for f in SPECS.libraries}
    heur = rows[ids["cublasLtMatmulAlgoGetHeuristic"]]
    assert heur == (3, 3), f"5 questions, 3 distinct: 3 reach proxyd ({heur})"
    # the app made 4 sets of descriptors; proxyd got copies by content only:
    # one matmul descriptor (+1 for the bad attribute), layouts 8x16, 16x8,
    # 8x8, 8x32, 32x8, 8x64, 64x8, one preference; nothing destroyed there
    for name, n in (("cublasLtMatrixLayoutCreate", 7), ("cublasLtMatmulDescCreate", 2),
                    ("cublasLtMatmulPreferenceCreate", 1)):
        assert rows[ids[name]] == (n, 0), f"{name}: {rows[ids[name]]} (calls, waits), expected ({n}, 0)"
    assert ids["cublasLtMatrixLayoutDestroy"] not in rows
    # proxy-cli profile names them
    pr = subprocess.run([*proxy_cli, "profile", str(prof)], capture_output=True, text=True, timeout=60)
    assert pr.returncode == 0 and "cublasLtMatmulAlgoGetHeuristic" in pr.stdout, pr.stdout + pr.stderr


COALESCE_SCRIPT = r"""
import ctypes, json
from ctypes import byref, c_int, c_float, c_void_p
cb = ctypes.CDLL("libcublas.so.13")
rt = ctypes.CDLL("libcudart.so.13")
out = {}
h, d, ws, st = c_void_p(), c_void_p(), c_void_p(), c_void_p()
out["create"] = cb.cublasCreate_v2(byref(h))
rt.cudaMalloc(byref(d), 4096)
rt.cudaMalloc(byref(ws), 1 << 20)
rt.cudaStreamCreate(byref(st))
one = c_float(1.0)
rc = []
for i in range(50):                    # what PyTorch does before every gemm
    rc += [cb.cublasSetStream_v2(h, st), cb.cublasSetWorkspace_v2(h, ws, 1 << 20), cb.cublasSetMathMode(h, 0)]
    rc.append(cb.cublasSgemm_v2(h, 0, 0, 8, 8, 8, byref(one), d, 8, d, 8, byref(one), d, 8))
out["rc"] = sorted(set(rc))
got = c_void_p()
out["get_stream"] = [cb.cublasGetStream_v2(h, byref(got)), got.value == st.value]
m = c_int(-1)
cb.cublasSetMathMode(h, 3)             # CUBLAS_TF32_TENSOR_OP_MATH
out["get_math"] = [cb.cublasGetMathMode(h, byref(m)), m.value]
out["sync"] = rt.cudaDeviceSynchronize()
out["destroy"] = cb.cublasDestroy_v2(h)
out["after"] = [cb.cublasSetStream_v2(h, st), cb.cublasGetStream_v2(h, byref(got))]
print(json.dumps(out))
"""


def test_cublas_settings_are_coalesced(emu_daemon, tmp_path):
    """Stream, workspace and math mode set before every gemm reach proxyd
    only when they change (interceptor/lib_cublas.c)."""
    prof = tmp_path / "c.prof"
    r, o = _run_profiled(emu_daemon, COALESCE_SCRIPT, prof)
    assert o["create"] == 0 and o["rc"] == [0] and o["sync"] == 0 and o["destroy"] == 0
    assert o["get_stream"] == [0, True] and o["get_math"] == [0, 3]
    assert o["after"][0] == 1, "a destroyed handle: CUBLAS_STATUS_NOT_INITIALIZED"
    assert o["after"][1] != 0
    ids = {f.name: f.id for f in SPECS.libraries}
    rows = {fid: calls for fid, (calls, _sync) in call_profile(prof).items()}
    assert rows[ids["cublasSgemm_v2"]] == 50
    assert rows[ids["cublasSetStream_v2"]] == 1 and rows[ids["cublasSetWorkspace_v2"]] == 1, rows
    # math mode 0 is the default, never sent; 3 goes out once, flushed by the destroy
    assert rows.get(ids["cublasSetMathMode"], 0) == 1, rows
    # answered in the shim, but for the destroyed handle's, which is proxyd's to refuse
    assert rows[ids["cublasGetStream_v2"]] == 1 and ids["cublasGetMathMode"] not in rows


def test_shim_chosen_kind_codes_match_the_protocol():
    from gpuproxy.autogen import gen_lib
    from gpuproxy.proxyd.families import libraries
    for kind, code in gen_lib.SHIM_ID_KINDS.items():
        assert libraries.LIB_KINDS[kind] == code, kind


def test_worker_without_nvidias_library_answers_not_supported(monkeypatch):
    """The cuda backend's worker loads NVIDIA's library itself; where it is
    missing every call answers the not-supported status with a reason."""
    from gpuproxy.proxyd._generated import FUNCTIONS
    from gpuproxy.proxyd.families.libraries import LibraryCalls, LibraryUnavailable, RealLibrary
    monkeypatch.setenv("GPUPROXY_CUBLAS_LIBRARY", "/nonexistent/libcublas.so.13")
    with pytest.raises(LibraryUnavailable, match="GPUPROXY_CUBLAS_LIBRARY"):
        RealLibrary("cublas")

    class Backend:          # a cuda-like backend: no emulated library
        pass

    class Dispatcher:
        backend = Backend()

    calls = LibraryCalls(Dispatcher())
    fid = SPECS.by_name["cublasCreate_v2"].id
    code, outs, msg = calls.run_op(None, FUNCTIONS[fid], fid, 0, [True])
    assert code == 15 and outs is None and "libcublas.so.13 not found" in msg
    # the same answer, without a second search, for the next call
    code, _, msg2 = calls.run_op(None, FUNCTIONS[fid], fid, 0, [True])
    assert code == 15 and msg2 == msg


# ------------------------------------------------------------------ cuDNN

CUDNN_SCRIPT = r"""
import ctypes, json
from ctypes import byref, c_int64, c_void_p, c_char_p, c_size_t
dn = ctypes.CDLL("/somewhere/site-packages/nvidia/cudnn/lib/libcudnn.so.9")   # by path: the stand-in
dn.cudnnGetErrorString.restype = c_char_p
dn.cudnnGetVersion.restype = c_size_t
out = {}
out["version"] = dn.cudnnGetVersion()
h = c_void_p()
out["create"] = dn.cudnnCreate(byref(h))
# an unknown descriptor type: the create is asynchronous and answers success;
# cuDNN's status comes with the next synchronous call on the descriptor
bad = c_void_p()
out["bad_create"] = dn.cudnnBackendCreateDescriptor(999, byref(bad))
out["bad_finalize"] = dn.cudnnBackendFinalize(bad)
# a tensor descriptor: a set after finalize fails (natively at once), its
# status is answered by the next synchronous call on it
t = c_void_p()
out["t_create"] = dn.cudnnBackendCreateDescriptor(17, byref(t))
dims = (c_int64 * 4)(1, 2, 3, 4)
strides = (c_int64 * 4)(24, 12, 4, 1)
one = c_int64(1)
dt = ctypes.c_int(0)
out["set"] = [dn.cudnnBackendSetAttribute(t, 901, 1, c_int64(1), byref(dt)),
              dn.cudnnBackendSetAttribute(t, 902, 3, c_int64(4), dims),
              dn.cudnnBackendSetAttribute(t, 903, 3, c_int64(4), strides),
              dn.cudnnBackendSetAttribute(t, 906, 3, c_int64(1), byref(one))]
out["finalize"] = dn.cudnnBackendFinalize(t)
got = (c_int64 * 8)()
n = c_int64(-1)
out["get"] = dn.cudnnBackendGetAttribute(t, 902, 3, c_int64(8), byref(n), got)
out["dims"] = [got[i] for i in range(n.value)]
out["set_after"] = dn.cudnnBackendSetAttribute(t, 906, 3, c_int64(1), byref(one))
out["get_after"] = dn.cudnnBackendGetAttribute(t, 902, 3, c_int64(8), byref(n), got)
# an unknown attribute type is refused in the application, at once
out["bad_type"] = dn.cudnnBackendSetAttribute(t, 902, 777, c_int64(1), dims)
out["destroy"] = dn.cudnnBackendDestroyDescriptor(t)
# a variant pack's finalize is asynchronous (one per PyTorch convolution):
# finalized without its attributes, it fails the execution that uses it,
# at the next synchronising CUDA call
vp = c_void_p()
out["vp_create"] = dn.cudnnBackendCreateDescriptor(16, byref(vp))
out["vp_finalize"] = dn.cudnnBackendFinalize(vp)
out["execute"] = dn.cudnnBackendExecute(h, vp, vp)
rt = ctypes.CDLL("libcudart.so.13")
out["sync"] = rt.cudaDeviceSynchronize()
out["sync_again"] = rt.cudaDeviceSynchronize()
# unsupported: CUDNN_STATUS_NOT_SUPPORTED and one stderr line
out["unsupported"] = dn.cudnnConvolutionForward(h, None, None, None, None, None, None, 0, None, 0, None, None, None)
out["name"] = dn.cudnnGetErrorString(3000).decode()
out["destroy_handle"] = dn.cudnnDestroy(h)
print(json.dumps(out))
"""


def test_cudnn_backend_calls_errors_and_unsupported(emu_daemon):
    r = _run_py(emu_daemon, CUDNN_SCRIPT)
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout)
    assert o["version"] // 10000 == 9
    assert o["create"] == 0
    assert o["bad_create"] == 0, "descriptor creation is asynchronous"
    assert o["bad_finalize"] == 3000, "the failed creation's status comes with the next synchronous call"
    assert o["t_create"] == 0 and o["set"] == [0, 0, 0, 0] and o["finalize"] == 0
    assert o["get"] == 0 and o["dims"] == [1, 2, 3, 4], "attribute values come back as set"
    assert o["set_after"] == 0 and o["get_after"] == 2000, "a failed set's status comes with the next query"
    assert o["bad_type"] == 2010, "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE"
    assert o["destroy"] == 0
    assert o["vp_create"] == 0 and o["vp_finalize"] == 0 and o["execute"] == 0
    assert o["sync"] == 719 and o["sync_again"] == 0, "the failed pack fails its execution, reported at the sync"
    assert _lines_naming(r.stderr, "cudnnBackendExecute"), r.stderr
    assert o["unsupported"] == 3000 and len(_lines_naming(r.stderr, "cudnnConvolutionForward")) == 1, r.stderr
    assert len(r.stderr.strip().splitlines()) == 2, r.stderr
    assert o["name"] == "CUDNN_STATUS_NOT_SUPPORTED"
    assert o["destroy_handle"] == 0


BN_SCRIPT = r"""
import ctypes, json, struct
from ctypes import byref, c_void_p, c_float, c_double, c_size_t
dn = ctypes.CDLL("libcudnn.so.9")
rt = ctypes.CDLL("libcudart.so.13")
h = c_void_p()
assert dn.cudnnCreate(byref(h)) == 0
N, C, HW = 2, 3, 4
x = [((i * 5) % 11 - 5) / 4.0 for i in range(N * C * HW)]
def dev(vals):
    p = c_void_p()
    assert rt.cudaMalloc(byref(p), 4 * len(vals)) == 0
    buf = struct.pack(f"<{len(vals)}f", *vals)
    assert rt.cudaMemcpy(p, buf, len(buf), 1) == 0
    return p
def host(p, n):
    buf = ctypes.create_string_buffer(4 * n)
    assert rt.cudaMemcpy(buf, p, 4 * n, 2) == 0
    return list(struct.unpack(f"<{n}f", buf.raw))
def tdesc(dims):
    t = c_void_p()
    assert dn.cudnnCreateTensorDescriptor(byref(t)) == 0
    st = [1] * 4
    for i in (2, 1, 0):
        st[i] = st[i + 1] * dims[i + 1]
    assert dn.cudnnSetTensorNdDescriptor(t, 0, 4, (ctypes.c_int * 4)(*dims), (ctypes.c_int * 4)(*st)) == 0
    return t
xd, pd = tdesc([N, C, 2, 2]), tdesc([1, C, 1, 1])
dx, dy = dev(x), dev([0.0] * len(x))
g, b = dev([1.0, 2.0, 0.5]), dev([0.0, 1.0, -1.0])
rm, rv, sm, si = dev([0.0] * C), dev([1.0] * C), dev([0.0] * C), dev([0.0] * C)
one, zero = c_float(1.0), c_float(0.0)
ws = c_size_t(99)
out = {"ws_rc": dn.cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(h, 1, 0, xd, None, xd, pd, None, byref(ws))}
out["fwd"] = dn.cudnnBatchNormalizationForwardTrainingEx(h, 1, 0, byref(one), byref(zero), xd, dx, None, None, xd, dy,
    pd, g, b, c_double(0.5), rm, rv, c_double(1e-5), sm, si, None, None, c_size_t(0), None, c_size_t(0))
out["sync"] = rt.cudaDeviceSynchronize()
out["x"], out["y"], out["rm"], out["rv"] = x, host(dy, len(x)), host(rm, C), host(rv, C)
out["destroy"] = [dn.cudnnDestroyTensorDescriptor(xd), dn.cudnnDestroyTensorDescriptor(pd)]
print(json.dumps(out))
"""


def test_cudnn_batch_norm_forward_training(emu_daemon):
    """The legacy calls PyTorch's BatchNorm2d makes: tensor descriptors
    (asynchronous settings, the data type tracked for alpha/beta) and
    cudnnBatchNormalizationForwardTrainingEx, against the formulas."""
    r = _run_py(emu_daemon, BN_SCRIPT)
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout)
    assert o["ws_rc"] == 0 and o["fwd"] == 0 and o["sync"] == 0 and o["destroy"] == [0, 0], o
    N, C, HW = 2, 3, 4
    g, b = [1.0, 2.0, 0.5], [0.0, 1.0, -1.0]
    for c in range(C):
        vals = [o["x"][(n * C + c) * HW + i] for n in range(N) for i in range(HW)]
        mean = sum(vals) / len(vals)
        var = sum((v - mean) ** 2 for v in vals) / len(vals)
        for n in range(N):
            for i in range(HW):
                k = (n * C + c) * HW + i
                want = (o["x"][k] - mean) / (var + 1e-5) ** 0.5 * g[c] + b[c]
                assert abs(o["y"][k] - want) < 1e-5, (k, o["y"][k], want)
        assert abs(o["rm"][c] - 0.5 * mean) < 1e-6
        assert abs(o["rv"][c] - (0.5 + 0.5 * var * len(vals) / (len(vals) - 1))) < 1e-5


def test_real_cudnn_builds_a_graph_from_the_wire_layout(monkeypatch):
    """The worker's path to NVIDIA's cuDNN (libraries.RealCudnn) with
    attribute arrays laid out as the shim sends them and descriptor elements
    as cuDNN's pointers: tensors, a convolution, the convolution-forward
    operation and an operation graph finalize, and values read back are
    what was set. cuDNN builds these without a GPU; skipped where
    libcudnn.so.9 is not installed (GPUPROXY_LIB_DIR, nvidia/cudnn/lib)."""
    import struct
    path = libbootstrap.find_file(_lib_dirs() + [os.path.join(p, "nvidia", "cudnn", "lib") for p in sys.path],
                                  "libcudnn.so.9")
    if path is None:
        pytest.skip("NVIDIA's libcudnn.so.9 not installed here (set GPUPROXY_LIB_DIR)")
    monkeypatch.setenv("GPUPROXY_CUDNN_LIBRARY", path)
    from gpuproxy.proxyd.families.libraries import RealCudnn
    L = RealCudnn("cudnn")

    def make(dtype, attrs):
        st, d = L.bk_create(dtype)
        assert st == 0 and d
        for name, atype, fmt, vals in attrs:
            assert L.bk_set(d, name, atype, len(vals), struct.pack("<" + fmt * len(vals), *vals)) == 0, name
        assert L.bk_finalize(d) == 0, dtype
        return d

    def tensor(uid, dims):
        strides = [1] * 4
        for i in (2, 1, 0):
            strides[i] = strides[i + 1] * dims[i + 1]
        return make(17, [(901, 1, "i", [0]), (902, 3, "q", dims), (903, 3, "q", strides), (906, 3, "q", [uid]),
                         (900, 3, "q", [16])])

    x, w, y = tensor(1, [2, 4, 9, 9]), tensor(2, [6, 4, 3, 3]), tensor(3, [2, 6, 5, 5])
    conv = make(1, [(106, 3, "q", [2]), (100, 1, "i", [0]), (101, 7, "i", [1]), (105, 3, "q", [1, 1]),
                    (104, 3, "q", [1, 1]), (103, 3, "q", [2, 2]), (102, 3, "q", [1, 1])])
    op = make(10, [(704, 15, "Q", [x]), (703, 15, "Q", [w]), (705, 15, "Q", [y]), (702, 15, "Q", [conv]),
                   (700, 4, "f", [1.0]), (701, 4, "f", [0.0])])
    make(15, [(801, 15, "Q", [op])])
    st, n, raw = L.bk_get(w, 902, 3, 4, 32)
    assert st == 0 and n == 4 and struct.unpack("<4q", raw) == (6, 4, 3, 3)
    st, n, raw = L.bk_get(op, 700, 4, 1, 4)
    assert st == 0 and n == 1 and struct.unpack("<f", raw) == (1.0,)


def test_cudnn_backend_log_keeps_what_live_descriptors_need():
    """proxyd/families/cudnn.py BackendLog: a destroyed descriptor's calls stay while
    a live descriptor's call names it, and go with the last such one."""
    from gpuproxy.proxyd.families.cudnn import BackendLog
    lg = BackendLog()
    a, b, c, t1, t2 = 1, 2, 3, 4, 5
    for h in (a, b, c, t1, t2):
        lg.types[h] = 0
        lg.add(100, 0, [0, h], [h])                  # creates
    lg.add(101, 0, ["b names a"], [b], [a])           # b's attribute names a
    lg.add(102, 0, ["fill t1, t2 from c"], [t1, t2], [c])
    lg.destroyed(a)
    assert a in lg.dead and len(lg.ops) == 7, "a is still named by b's attribute"
    lg.destroyed(c)
    lg.destroyed(t2)
    assert {c, t2} <= lg.dead or t2 not in lg.subj
    assert any(op[2] == ["fill t1, t2 from c"] for op in lg.ops.values()), "t1 still needs the fill"
    lg.destroyed(b)
    assert a not in lg.subj and b not in lg.subj, "b gone: a's and b's calls go"
    lg.destroyed(t1)
    assert not lg.ops and not lg.dead and not lg.subj, lg.ops


def test_cudnn_plan_is_in_the_image_and_comes_back(tmp_path):
    """cudnn_conv paced to iteration 1, dumped: the image holds its cuDNN
    handle with its stream and the backend log (every live descriptor's
    creation, the heuristics' fill of the chosen engine config, the plan's
    finalize; the destroyed heuristics descriptor, which the fill needs,
    listed to be destroyed again); restored into a fresh proxyd, the plan is
    built again and the program finishes (it checks every convolution)."""
    from paced import PacedRun
    from test_checkpoint import ctl, daemon, restart
    import corpus
    if not corpus.nvcc_path():
        pytest.skip("nvcc not found")
    b = corpus.build(corpus.get_program("cudnn_conv"), corpus.default_build_dir())
    d = daemon(tmp_path)
    try:
        with PacedRun(b, d) as run:
            run.step_to(1)
            st = ctl(d, "dump", pid=run.pid, dir=str(tmp_path / "img"))
            assert st["released"]
            from gpuproxy.proxyd.checkpoint.image import Image
            from gpuproxy.proxyd._generated import FUNCTIONS
            sess = Image.open(str(tmp_path / "img")).session
            libs = sess["libraries"]
            assert [o["kind"] for o in libs] == ["cudnn_handle"]
            assert [FUNCTIONS[f].name for f, _ in libs[0]["settings"]] == ["cudnnSetStream"]
            *ops, (_, _, dead) = sess["cudnn_backend"]
            names = [FUNCTIONS[f].name for f, _, _ in ops]
            # tensors x3, conv, op, graph, heuristics, engine config, plan, variant pack
            assert names.count("cudnnBackendCreateDescriptor") == 10, names
            assert names.count("cudnnBackendFinalize") == 9, names   # all but the filled engine config
            assert names.count("cudnnBackendGetAttribute") == 1, names
            heur = [a[1] for f, _, a in ops if FUNCTIONS[f].name == "cudnnBackendCreateDescriptor" and a[0] == 4]
            assert dead == heur, (dead, heur)
            d = restart(d, tmp_path, "fresh")
            ctl(d, "restore", dir=str(tmp_path / "img"))
            out = run.finish()
            assert out == b.program.expected_output, run.stderr()
    finally:
        d.cleanup()


# ------------------------------------------------------------------ specs

def test_library_specs_are_complete_and_consistent():
    for api in specload.LIBRARY_APIS:
        sf = LIB_FILES[api]
        lo, hi = specload.ID_RANGES[api]
        assert all(lo <= f.id <= hi for f in sf.functions)
        for f in sf.functions:
            if f.supported:
                assert f.restore is not None, f.name
                for p in f.params:
                    if p.role == "scalar_ptr":
                        assert p.mode and p.size and p.size != "?", f.name
    # what CI's emulated backend implements is supported in the specs
    from gpuproxy.emu.blas import EmuLibrary
    from gpuproxy.emu.blas_levels import EMU_PENDING
    from gpuproxy.emu.cudnn import EmuCudnn
    from gpuproxy.emu.library_classes import CLASSES      # mathlibs.py's, extended
    from gpuproxy.proxyd.families.cudnn import SPECIAL
    from gpuproxy.emu.collectives import EmuNccl
    from gpuproxy.proxyd.families.nccl import COLLECTIVES, HANDLED, SHIM_ONLY
    for f in SPECS.libraries:
        if f.api == "nccl":
            # proxyd/families/nccl.py runs every NCCL op on either backend's engine;
            # the emulated engine runs each collective (proxyd/backends/emu/collectives.py)
            if f.supported and f.restore.rule != "client" and f.name not in SHIM_ONLY:
                assert f.name in HANDLED, f"{f.name} is supported but proxyd/families/nccl.py does not run it"
                if f.name in COLLECTIVES:
                    assert hasattr(EmuNccl, "_" + f.name), f"{f.name} is supported but not emulated"
            continue
        if f.api == "cudnn":
            emu = EmuCudnn
            wanted = f.supported and f.shim != "override" and f.name not in SPECIAL
        else:
            emu = CLASSES.get(f.api, EmuLibrary)
            # overrides of the math libraries send their op too (cufftCreate, ...)
            wanted = f.supported and (f.shim != "override" or f.api in CLASSES) and f.restore.rule != "client"
        if wanted and EMU_PENDING.match(f.name):
            # supported, run by NVIDIA's library on the GPU, not emulated
            # (blas_levels.EMU_PENDING): never both
            assert not hasattr(emu, "f_" + f.name), f"{f.name} is emulated but listed as pending"
        elif wanted:
            assert hasattr(emu, "f_" + f.name), f"{f.name} is supported but not emulated"
    # what PyTorch 2.11 calls first
    for name in ("cublasCreate_v2", "cublasSetStream_v2", "cublasSetWorkspace_v2", "cublasSetMathMode",
                 "cublasGemmEx", "cublasSgemm_v2", "cublasSgemmStridedBatched", "cublasGemmStridedBatchedEx",
                 "cublasLtMatmul", "cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmulDescSetAttribute"):
        assert SPECS.by_name[name].supported, name
    # what PyTorch 2.11 (torch.fft, torch.linalg.cholesky) and CuPy 14
    # (cupy.fft, cupy.random, cupyx.scipy.sparse, cupy.linalg.solve) call first
    for name in ("cufftCreate", "cufftSetAutoAllocation", "cufftSetStream", "cufftSetWorkArea",
                 "cufftXtMakePlanMany", "cufftXtExec", "cufftPlanMany", "cufftExecC2C", "cufftExecR2C",
                 "cufftExecC2R", "cufftExecZ2Z", "curandCreateGenerator", "curandSetPseudoRandomGeneratorSeed",
                 "curandSetGeneratorOffset", "curandSetStream", "curandGenerateUniform", "curandGenerateNormal",
                 "curandGenerate", "cusparseCreate", "cusparseSetStream", "cusparseCreateCsr", "cusparseCreateDnVec",
                 "cusparseSpMV_bufferSize", "cusparseSpMV", "cusparseSpMM", "cusolverDnCreate",
                 "cusolverDnSetStream", "cusolverDnCreateParams", "cusolverDnXpotrf", "cusolverDnXpotrf_bufferSize",
                 "cusolverDnXpotrs", "cusolverDnSgetrf", "cusolverDnDgetrf", "cusolverDnDgetrs",
                 "cusolverDnSpotrf", "cusolverDnDpotrs"):
        assert SPECS.by_name[name].supported, name
    # execution calls are asynchronous; calls that answer host values are not
    for name in ("cufftExecC2C", "cufftXtExec", "curandGenerateUniform", "cusparseSpMV", "cusolverDnSpotrf",
                 "cusolverDnXpotrf"):
        assert not SPECS.by_name[name].sync, name
    for name in ("cufftMakePlan1d", "cusparseSpMV_bufferSize", "cusolverDnSpotrf_bufferSize"):
        assert SPECS.by_name[name].sync, name


def test_cudnn_decls_header_matches_the_specs():
    """tests/programs/cudnn_decls.h (used where nvcc finds no cudnn.h)
    declares each function as the spec (from NVIDIA's cudnn_graph.h) does."""
    text = (REPO / "tests" / "programs" / "cudnn_decls.h").read_text()
    text = re.sub(r"^\s*#.*$", " ", re.sub(r"/\*.*?\*/", " ", text, flags=re.S), flags=re.M)
    text = text.replace('extern "C" {', "")
    decls = {n: (ret, [p.type for p in ps]) for n, ret, ps in hdr.function_decls(text) if n.startswith("cudnn")}
    assert len(decls) >= 12
    for name, (ret, types) in decls.items():
        f = SPECS.by_name[name]
        assert (ret, types) == (f.returns, [p.type for p in f.params]), name


def test_cudnn_descriptor_kind_agrees_between_shim_and_proxyd():
    """The shim picks backend descriptor handles (interceptor/lib_cudnn.c);
    proxyd must read the same kind out of them."""
    from gpuproxy.proxyd.core import protocol as P
    src = (REPO / "interceptor" / "lib_cudnn.c").read_text()
    m = re.search(r"#define GP_K_CUDNN_BACKEND_DESC (\d+)ull", src)
    assert m and int(m.group(1)) == P.K_CUDNN_BACKEND_DESC


@pytest.mark.parametrize("header,prefixes", [("cublas_decls.h", ("cublas",)),
                                             ("mathlibs_decls.h", ("cufft", "curand", "cusparse", "cusolver")),
                                             ("linalg_decls.h", ("cublas", "cusolver")),
                                             ("api_helpers_decls.h", ("cublas",))])
def test_decls_headers_match_the_specs(header, prefixes):
    """tests/programs/cublas_decls.h and mathlibs_decls.h (used where the
    toolkit has no headers of these libraries) declare each function as the
    spec (from NVIDIA's header) does."""
    text = (REPO / "tests" / "programs" / header).read_text()
    text = re.sub(r"^\s*#.*$", " ", re.sub(r"/\*.*?\*/", " ", text, flags=re.S), flags=re.M)
    text = text.replace('extern "C" {', "").replace("}\n", "}\n")
    decls = {n: (ret, [p.type for p in ps]) for n, ret, ps in hdr.function_decls(text) if n.startswith(prefixes)}
    assert len(decls) >= 20
    for name, (ret, types) in decls.items():
        f = SPECS.by_name[name]
        assert (ret, types) == (f.returns, [p.type for p in f.params]), name


# ------------------------------------------ parity with NVIDIA's files (where installed)

def _include_dirs():
    return libbootstrap.default_includes()


def _lib_dirs():
    return libbootstrap.default_lib_dirs()


def _versioned_exports(path: str) -> dict[str, str]:
    """{symbol: version node} of the defined functions ('' when unversioned)."""
    r = subprocess.run(["readelf", "--dyn-syms", "-W", path], capture_output=True, text=True, check=True)
    out = {}
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) >= 8 and f[3] == "FUNC" and f[6] != "UND":
            name, _, ver = f[7].partition("@")
            out[name] = ver.lstrip("@")
    return out


@pytest.mark.parametrize("api", specload.LIBRARY_APIS)
def test_spec_prototypes_match_nvidias_headers(api):
    cuda_inc = os.path.join(hdr.cuda_home(), "include")
    try:
        text, hdir = libbootstrap.preprocess(api, _include_dirs(), cuda_inc)
    except hdr.HeaderError as e:
        pytest.skip(f"{LIB_FILES[api].header} not installed (set GPUPROXY_LIB_INCLUDE): {e}")
    protos = libbootstrap.parse_decls(api, text)
    sf = LIB_FILES[api]
    by = {f.name: f for f in sf.functions}
    for name, p in protos.items():
        f = by.get(name)
        if f is None:
            continue        # declared but not exported (bootstrap reports it)
        assert f.declared
        assert (f.returns, [q.type for q in f.params]) == (p.returns, list(p.param_types)), name
    # the types of what the library exports (the bootstrap leaves out the
    # declared-but-not-exported ones, e.g. cusolverDnLogger*)
    protos = {n: p for n, p in protos.items() if n in by}
    types = libbootstrap.probe_types(api, libbootstrap.named_types(protos.values()), _include_dirs(), cuda_inc,
                                     hdir)
    assert types == sf.types, "the spec's types differ from the header's: run bootstrap.py --libraries"


@pytest.mark.parametrize("api", specload.LIBRARY_APIS)
def test_exports_match_nvidias_library_and_the_stand_in(api, shim_installed):
    sf = LIB_FILES[api]
    stand_in = os.path.join(shim_installed.lib_dir(), sf.soname)
    mine = _versioned_exports(stand_in)
    names = {f.name for f in sf.functions}
    assert set(mine) == names, f"stand-in {sf.soname} exports differ from the spec"
    assert set(mine.values()) == {sf.version_node or ""}, f"version nodes of the stand-in: {set(mine.values())}"
    real = libbootstrap.find_file(_lib_dirs(), sf.library)
    if real is None:
        pytest.skip(f"NVIDIA's {sf.library} not installed here (set GPUPROXY_LIB_DIR); stand-in checked against the spec")
    theirs = _versioned_exports(real)
    assert set(theirs) == names, (f"missing: {sorted(set(theirs) - names)[:10]}, "
                                  f"extra: {sorted(names - set(theirs))[:10]}")
    assert theirs == mine, "symbol versions differ from NVIDIA's library (torch binds name@version)"


def test_library_bootstrap_is_idempotent():
    inc = _include_dirs()
    if not any(libbootstrap.find_file(inc, c["header"]) for c in libbootstrap.LIBS.values()):
        pytest.skip("no cuBLAS/NVML headers installed (set GPUPROXY_LIB_INCLUDE)")
    args = [sys.executable, str(REPO / "autogen" / "bootstrap.py"), "--libraries", "--check", "-q"]
    for d in inc:
        args += ["--lib-include", d]
    for d in _lib_dirs():
        args += ["--lib-dir", d]
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# ------------------------------------------------------------------ checkpoint

def library_objects_across_restore(tmp_path, program: str, check):
    """The corpus program paced to iteration 1 and dumped (released);
    check(libs, names) asserts on the image's library objects (names(o): the
    sorted names of o's recorded settings); then proxyd is replaced by a
    fresh one, the image restored, and the program must finish with its
    expected output. Shared by the library checkpoint tests."""
    from paced import PacedRun
    from test_checkpoint import ctl, daemon, restart
    import corpus
    if not corpus.nvcc_path():
        pytest.skip("nvcc not found")
    from gpuproxy.proxyd.checkpoint.image import Image
    from gpuproxy.proxyd._generated import FUNCTIONS

    def names(o):
        return sorted(FUNCTIONS[fid].name for fid, _ in o["settings"])
    b = corpus.build(corpus.get_program(program), corpus.default_build_dir())
    d = daemon(tmp_path)
    try:
        with PacedRun(b, d) as run:
            run.step_to(1)
            st = ctl(d, "dump", pid=run.pid, dir=str(tmp_path / "img"))
            assert st["released"]
            check(Image.open(str(tmp_path / "img")).session["libraries"], names)
            d = restart(d, tmp_path, "fresh")
            ctl(d, "restore", dir=str(tmp_path / "img"))
            out = run.finish()
            assert out == b.program.expected_output, run.stderr()
    finally:
        d.cleanup()


def test_handles_and_settings_are_in_the_image_and_come_back(tmp_path):
    """cublas_gemm paced to iteration 1, dumped: the image lists its cuBLAS
    and cuBLASLt objects with their settings (the device handle's pointer
    mode among them); restored into a fresh proxyd, the program finishes with
    its expected output (it checks every setting and every product)."""
    def check(libs, names):
        kinds = sorted(o["kind"] for o in libs)
        assert kinds == sorted(["cublas_handle"] * 2 + ["cublaslt_handle"] + ["cublaslt_matmul_desc"] * 2
                               + ["cublaslt_layout"] * 3 + ["cublaslt_preference"]), kinds
        settings = {(o["kind"], o["id"]): names(o) for o in libs}
        handles = sorted(v for (k, _), v in settings.items() if k == "cublas_handle")
        assert handles == [["cublasSetAtomicsMode", "cublasSetMathMode", "cublasSetStream_v2",
                            "cublasSetWorkspace_v2"],
                           ["cublasSetPointerMode_v2", "cublasSetStream_v2"]], handles
        descs = sorted(v for (k, _), v in settings.items() if k == "cublaslt_matmul_desc")
        assert descs == [["cublasLtMatmulDescSetAttribute"], ["cublasLtMatmulDescSetAttribute"] * 2], descs
    library_objects_across_restore(tmp_path, "cublas_gemm", check)


def test_math_library_objects_are_in_the_image_and_come_back(tmp_path):
    """mathlibs paced to iteration 1, dumped: the image lists its cuFFT
    plans, cuRAND generator (with the count of numbers it generated),
    cuSPARSE handle and descriptors and cuSOLVER handle with their settings;
    restored into a fresh proxyd, the program finishes with its expected
    output (it checks every result, and that the generator continued its
    sequence exactly)."""
    def check(libs, names):
        kinds = sorted(o["kind"] for o in libs)
        assert kinds == sorted(["cufft_plan"] * 3 + ["curand_generator", "cusparse_handle", "cusparse_spmat"]
                               + ["cusparse_dnvec"] * 2 + ["cusolver_dn_handle"]), kinds
        settings = {(o["kind"], o["id"]): names(o) for o in libs}
        plans = sorted(v for (k, _), v in settings.items() if k == "cufft_plan")
        assert plans == [["cufftMakePlan1d", "cufftSetAutoAllocation", "cufftSetStream", "cufftSetWorkArea"],
                         ["cufftSetStream"], ["cufftSetStream"]], plans
        gen = [o for o in libs if o["kind"] == "curand_generator"][0]
        assert names(gen) == ["curandSetPseudoRandomGeneratorSeed", "curandSetStream"]
        assert gen["generated"] == 4096, "one iteration's CHUNK of numbers"
    library_objects_across_restore(tmp_path, "mathlibs", check)


def test_nvidias_math_libraries_answer_through_the_workers_declarations(monkeypatch):
    """The worker's cffi declarations (generated from the specs) against
    NVIDIA's real libraries, with the calls that need no GPU: versions and
    properties, cuSPARSE descriptors (int64 sizes, device pointers as values,
    an out handle), cuSOLVER params. Skips where the libraries are absent."""
    d = libbootstrap.find_file(_lib_dirs() + [os.environ.get("GPUPROXY_NVIDIA_LIB_DIR", "")], "libcusparse.so.12")
    if d is None:
        pytest.skip("NVIDIA's libcusparse.so.12 etc. not installed here (set GPUPROXY_LIB_DIR)")
    monkeypatch.setenv("GPUPROXY_NVIDIA_LIB_DIR", os.path.dirname(d))
    from gpuproxy.proxyd.families.libraries import RealLibrary
    from gpuproxy.proxyd._generated import FUNCTIONS
    by = {f.name: f for f in FUNCTIONS.values()}
    libs = {api: RealLibrary(api) for api in ("cufft", "curand", "cusparse", "cusolver")}
    for api, name in (("cufft", "cufftGetVersion"), ("curand", "curandGetVersion"), ("cusolver", "cusolverGetVersion")):
        code, outs = libs[api].call(by[name], [True])
        assert code == 0 and outs[0] >= 10000, (name, code, outs)
    code, outs = libs["cufft"].call(by["cufftGetProperty"], [0, True])      # MAJOR_VERSION
    assert code == 0 and outs == [12]
    sp = libs["cusparse"]
    code, (vec,) = sp.call(by["cusparseCreateDnVec"], [True, 16, 0x7F0000000000, 0])
    assert code == 0 and vec
    assert sp.call(by["cusparseDestroyDnVec"], [vec]) == (0, [])
    code, (mat,) = sp.call(by["cusparseCreateCsr"], [True, 4, 4, 2, 0x7F0000000000, 0x7F0000001000, 0x7F0000002000,
                                                     2, 2, 0, 0])
    assert code == 0 and mat
    assert sp.call(by["cusparseDestroySpMat"], [mat]) == (0, [])
    code, (params,) = libs["cusolver"].call(by["cusolverDnCreateParams"], [True])
    assert code == 0 and params
    assert libs["cusolver"].call(by["cusolverDnDestroyParams"], [params]) == (0, [])


MAT_DESCR_SCRIPT = r"""
import ctypes, json
from ctypes import byref, c_void_p
sp = ctypes.CDLL("libcusparse.so.12")
for f in ("cusparseGetMatType", "cusparseGetMatIndexBase", "cusparseGetMatFillMode", "cusparseGetMatDiagType"):
    getattr(sp, f).argtypes = [c_void_p]
d = c_void_p()
out = {"create": sp.cusparseCreateMatDescr(byref(d))}
out["defaults"] = [sp.cusparseGetMatType(d), sp.cusparseGetMatFillMode(d), sp.cusparseGetMatDiagType(d),
                   sp.cusparseGetMatIndexBase(d)]
out["set"] = [sp.cusparseSetMatType(d, 1), sp.cusparseSetMatIndexBase(d, 1), sp.cusparseSetMatFillMode(d, 1),
              sp.cusparseSetMatDiagType(d, 1)]
out["after"] = [sp.cusparseGetMatType(d), sp.cusparseGetMatFillMode(d), sp.cusparseGetMatDiagType(d),
                sp.cusparseGetMatIndexBase(d)]
out["null"] = sp.cusparseCreateMatDescr(None)
out["destroy"] = sp.cusparseDestroyMatDescr(d)
print(json.dumps(out))
"""


def test_cusparse_legacy_matrix_descriptor_lives_in_the_shim(emu_daemon, tmp_path):
    """cusparseMatDescr_t (CuPy makes one per sparse matrix): host fields,
    answered in the application (interceptor/lib_cusparse.c)."""
    prof = tmp_path / "m.prof"
    r, o = _run_profiled(emu_daemon, MAT_DESCR_SCRIPT, prof)
    assert o["create"] == 0 and o["defaults"] == [0, 0, 0, 0]
    assert o["set"] == [0, 0, 0, 0] and o["after"] == [1, 1, 1, 1]
    assert o["null"] == 3 and o["destroy"] == 0
    assert "not supported" not in r.stderr
    assert not any(fid in range(42016, 42026) for fid in call_profile(prof)), "no op reaches proxyd"
