"""Host memory the GPU reaches directly (issue 10, group 1;
docs/host-memory.md): bad input and the shared-memory requirement, through
the driver API called from Python (ctypes) under the shim; and the corpus
program tests/programs/hostmem.cu checkpointed with its whole process
(CRIU) in the middle of its run, proxyd killed and restored.

The program's own results are checked by tests/test_corpus_emu.py, and its
GPU-only dump/restore by tests/test_corpus_checkpoint.py (both also on the
GPU: scripts/gpu-check).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import corpus  # noqa: E402
from conftest import client_env  # noqa: E402
from wholeproc import (BACKEND, _stop_daemons, cli, daemon, kill, ok, reference, require_park,  # noqa: E402,F401
                       start, tmp, wait_calls, wait_gone)
from gpuproxy.proxyd.checkpoint import criu  # noqa: E402

_DRIVER_CALLS = r'''
import ctypes, json, mmap, sys
cu = ctypes.CDLL("libcuda.so.1")
P, U, I = ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_uint
out = {}
def rc(name, *args):
    out[name] = getattr(cu, name)(*args)
assert cu.cuInit(0) == 0
ctx = P()
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cu.cuCtxSetCurrent(ctx) == 0
buf = mmap.mmap(-1, 1 << 16)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
class Loc(ctypes.Structure):          # CUmemLocation
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]
dp = U()
if sys.argv[1] == "shm":
    gone = mmap.mmap(-1, 1 << 20)          # mapped, then unmapped: an address with nothing behind it
    gone_addr = ctypes.addressof(ctypes.c_char.from_buffer(gone))
    gone.close()
    rc("register_unreadable", P(gone_addr), ctypes.c_size_t(4096), I(0))
    rc("register_iomemory", P(addr), ctypes.c_size_t(4096), I(4))
    rc("register_bad_flags", P(addr), ctypes.c_size_t(4096), I(0x80))
    rc("unregister_unknown", P(addr))
    rc("register", P(addr + 100), ctypes.c_size_t(5000), I(2))
    rc("register_overlap", P(addr + 4096), ctypes.c_size_t(10), I(0))
    rc("dev_ptr_registered", ctypes.byref(dp), P(addr + 100), I(0))
    out["dev_ptr_equal"] = dp.value == addr + 100
    rc("unregister_inside", P(addr + 4096))
    rc("unregister", P(addr + 100))
    rc("dev_ptr_unregistered", ctypes.byref(dp), P(addr + 100), I(0))
    rc("managed_bad_flags", ctypes.byref(dp), ctypes.c_size_t(4096), I(7))
    d = U()
    rc("alloc", ctypes.byref(d), ctypes.c_size_t(4096))
    loc = Loc(1, 0)                   # CU_MEM_LOCATION_TYPE_DEVICE, device 0
    rc("prefetch_device_memory", U(d.value), ctypes.c_size_t(4096), loc, I(0), P(0))
    m = U()
    rc("managed", ctypes.byref(m), ctypes.c_size_t(4096), I(1))
    rc("prefetch_managed", U(m.value), ctypes.c_size_t(4096), loc, I(0), P(0))
    rc("prefetch_past_end", U(m.value), ctypes.c_size_t(8192), loc, I(0), P(0))
    rc("dev_ptr_managed", ctypes.byref(dp), P(m.value), I(0))
    rc("free_managed_inside", U(m.value + 16))
    rc("free_managed", U(m.value))
    h = P()
    rc("host_alloc", ctypes.byref(h), ctypes.c_size_t(100), I(0))
    rc("dev_ptr_host_alloc", ctypes.byref(dp), h, I(0))
    out["host_alloc_equal"] = dp.value == h.value
    rc("dev_ptr_bad_flags", ctypes.byref(dp), h, I(1))
    rc("free_host", h)
else:
    m = U()
    rc("managed_no_shm", ctypes.byref(m), ctypes.c_size_t(4096), I(1))
    h = P()
    rc("host_alloc_no_shm", ctypes.byref(h), ctypes.c_size_t(4096), I(0))
    rc("mapped_no_shm", ctypes.byref(h), ctypes.c_size_t(4096), I(2))
    rc("register_no_shm", P(addr), ctypes.c_size_t(4096), I(0))
print(json.dumps(out))
'''

# what each name above calls
_FUNCS = {"register": "cuMemHostRegister_v2", "unregister": "cuMemHostUnregister", "dev_ptr": "cuMemHostGetDevicePointer_v2",
          "managed": "cuMemAllocManaged", "alloc": "cuMemAlloc_v2", "prefetch": "cuMemPrefetchAsync_v2",
          "free_managed": "cuMemFree_v2", "host_alloc": "cuMemHostAlloc", "free_host": "cuMemFreeHost",
          "mapped": "cuMemHostAlloc"}


def _script():
    # map each test name to its driver function by prefix
    src = _DRIVER_CALLS.replace('out[name] = getattr(cu, name)(*args)',
                                'out[name] = getattr(cu, FUNCS[max((k for k in FUNCS if name.startswith(k)), key=len)])(*args)')
    return f"FUNCS = {_FUNCS!r}\n" + src


def _run(env, mode):
    r = subprocess.run([sys.executable, "-c", _script(), mode], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1]), r.stderr


gpu_when_cuda = [pytest.mark.gpu] if BACKEND == "cuda" else []


def _backend_daemon(fresh_daemon):
    # GPUPROXY_TEST_BACKEND=cuda (scripts/gpu-check): the driver's answers, on the GPU
    return fresh_daemon(backend=BACKEND, **({} if BACKEND == "emu" else {"emu_kernels": ()}))


@pytest.mark.parametrize("variant", [pytest.param("shm", marks=gpu_when_cuda)])
def test_bad_input_and_limits(variant, shim_installed, fresh_daemon):
    got, err = _run(client_env(_backend_daemon(fresh_daemon)), "shm")
    want = {
        "register_unreadable": 1,            # CUDA_ERROR_INVALID_VALUE: not mapped
        "register_iomemory": 801,            # CUDA_ERROR_NOT_SUPPORTED
        "register_bad_flags": 1,
        "unregister_unknown": 713,           # CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
        "register": 0,
        "register_overlap": 712,             # CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
        "dev_ptr_registered": 0, "dev_ptr_equal": True,
        "unregister_inside": 713,            # only the pointer that was registered
        "unregister": 0,
        "dev_ptr_unregistered": 1,
        "managed_bad_flags": 1,
        "alloc": 0,
        "prefetch_device_memory": 1,         # not managed memory
        "managed": 0, "prefetch_managed": 0, "prefetch_past_end": 1,
        "dev_ptr_managed": 1,
        "free_managed_inside": 1, "free_managed": 0,
        "host_alloc": 0, "dev_ptr_host_alloc": 0, "host_alloc_equal": True, "dev_ptr_bad_flags": 1,
        "free_host": 0,
    }
    assert got == want
    lines = [x for x in err.splitlines() if x.strip()]
    assert lines == ["gpuproxy: cuMemHostRegister with CU_MEMHOSTREGISTER_IOMEMORY is not supported"], err


@pytest.mark.parametrize("variant", [pytest.param("noshm", marks=gpu_when_cuda)])
def test_needs_shared_memory(variant, shim_installed, fresh_daemon):
    got, err = _run(client_env(_backend_daemon(fresh_daemon), {"GPUPROXY_SHM": "0"}), "noshm")
    assert got == {"managed_no_shm": 801, "host_alloc_no_shm": 0, "mapped_no_shm": 801, "register_no_shm": 801}
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 3 and all("needs proxyd on the same host" in x for x in lines), err
    assert "cuMemAllocManaged" in lines[0] and "CU_MEMHOSTALLOC_DEVICEMAP" in lines[1] and "cuMemHostRegister" in lines[2]


HOSTMEM_ITERS = "2000"     # long enough to dump mid-run


@pytest.mark.parametrize("variant", [pytest.param("dump", marks=gpu_when_cuda)])
def test_hostmem_whole_process_dump_restore(variant, usable_criu, proxy_cli, tmp, nvcc):
    """Mapped, registered and managed memory in the middle of the run: the
    app is parked (its segments become private memory), CRIU dumps it,
    proxyd is killed, a fresh one restores the GPU state and the process;
    the segments are shared again at their addresses, the new worker maps
    and registers them there, and the program's own checks pass with the
    output of an uninterrupted run."""
    b = corpus.build(corpus.get_program("hostmem"), corpus.default_build_dir())
    d = daemon(tmp, "ref")
    require_park(d)
    want = reference(b, d, tmp, [HOSTMEM_ITERS])
    assert want.endswith("PASS hostmem\n"), want[-500:]
    d.cleanup()
    d = daemon(tmp, "first")
    out = tmp / "run.out"
    app = start(b.argv() + [HOSTMEM_ITERS], d, out)
    pid = app.pid
    try:
        wait_calls(d, pid, 300)
        ok(cli(proxy_cli, d, "--dump", "--pid", pid, "--dir", tmp / "img"))
        app.wait(30)
        assert not criu.pid_alive(pid)
        assert "PASS" not in out.read_text(), "the program ended before the dump"
        d.kill()
        d = daemon(tmp, "second")
        ok(cli(proxy_cli, d, "--restore", "--dir", tmp / "img"))
        wait_gone(pid)
        assert out.read_text() == want, (tmp / "run.out.err").read_text()
    finally:
        kill(pid)
        d.cleanup()
