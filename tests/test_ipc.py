"""CUDA IPC between two clients of one proxyd (issue 10, group 8;
docs/ipc.md), beyond tests/programs/ipc.cu (run by tests/test_corpus_emu.py
and scripts/gpu-check): a dump of either side of an IPC pair is refused
with a clear error and leaves both running; bad handles are refused.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import client_env  # noqa: E402

# GPUPROXY_TEST_BACKEND=cuda (scripts/gpu-check): the same on the GPU
BACKEND = os.environ.get("GPUPROXY_TEST_BACKEND", "emu")
pytestmark = [pytest.mark.gpu] if BACKEND == "cuda" else []

_SIDE = r'''
import ctypes, sys
cu = ctypes.CDLL("libcuda.so.1")
P, U, I = ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_uint
class H(ctypes.Structure):
    _fields_ = [("b", ctypes.c_char * 64)]
cu.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(U), H, I]
assert cu.cuInit(0) == 0
ctx = P()
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cu.cuCtxSetCurrent(ctx) == 0
if sys.argv[1] == "export":
    d = U()
    assert cu.cuMemAlloc_v2(ctypes.byref(d), ctypes.c_size_t(4096)) == 0
    assert cu.cuMemsetD32_v2(U(d.value), I(7), ctypes.c_size_t(1024)) == 0
    h = H()
    assert cu.cuIpcGetMemHandle(ctypes.byref(h), U(d.value)) == 0
    own = U()
    print("own", cu.cuIpcOpenMemHandle_v2(ctypes.byref(own), h, I(1)), flush=True)
    print("handle", ctypes.string_at(ctypes.byref(h), 64).hex(), flush=True)
else:
    h = H()
    ctypes.memmove(ctypes.byref(h), bytes.fromhex(sys.stdin.readline().split()[1]), 64)
    d = U()
    bad = H()
    print("bad", cu.cuIpcOpenMemHandle_v2(ctypes.byref(d), bad, I(1)), flush=True)
    assert cu.cuIpcOpenMemHandle_v2(ctypes.byref(d), h, I(1)) == 0
    v = (ctypes.c_uint * 1024)()
    assert cu.cuMemcpyDtoH_v2(v, U(d.value), ctypes.c_size_t(4096)) == 0
    print("read", v[0], v[1023], flush=True)
    print("opened", flush=True)
sys.stdin.readline()          # until the test is done
if sys.argv[1] == "import":
    print("close", cu.cuIpcCloseMemHandle(U(d.value)), cu.cuIpcCloseMemHandle(U(d.value)), flush=True)
'''


def test_dump_of_an_ipc_pair_is_refused(shim_installed, fresh_daemon, tmp_path):
    from gpuproxy.proxyd.client import ControlClient, ControlError
    d = fresh_daemon(backend=BACKEND, **({} if BACKEND == "emu" else {"emu_kernels": ()}))
    env = client_env(d)
    a = subprocess.Popen([sys.executable, "-c", _SIDE, "export"], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    b = subprocess.Popen([sys.executable, "-c", _SIDE, "import"], env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # opening one's own handle fails, as natively (invalid context)
        assert a.stdout.readline().split() == ["own", "201"]
        line = a.stdout.readline()
        assert line.startswith("handle "), line
        b.stdin.write(line)
        b.stdin.flush()
        assert b.stdout.readline().split() == ["bad", "1"]
        assert b.stdout.readline().split() == ["read", "7", "7"]
        assert b.stdout.readline().strip() == "opened"
        for pid in (a.pid, b.pid):
            with pytest.raises(ControlError) as e:
                ControlClient(d.endpoint, timeout_s=60).call("dump", {"pid": pid, "dir": str(tmp_path / f"img{pid}"),
                                                                       "leave_running": True})
            assert "CUDA IPC" in str(e.value) and "not supported" in str(e.value), str(e.value)
        # both sides still work
        b.stdin.write("\n")
        b.stdin.flush()
        assert b.stdout.readline().split() == ["close", "0", "1"]
        a.stdin.write("\n")
        a.stdin.flush()
        assert a.wait(30) == 0 and b.wait(30) == 0, (a.stderr.read(), b.stderr.read())
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
                p.wait()


# Exportable memory pools (proxyd/families/mempool_ipc.py): the exporter sends its
# pool's descriptor over a Unix socket (SCM_RIGHTS) with a pointer's export
# data, as NVIDIA's streamOrderedAllocationIPC does.
_POOL_SIDE = r'''
import ctypes, os, socket, struct, sys
cu = ctypes.CDLL("libcuda.so.1")
P, U, I, S = ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_uint, ctypes.c_size_t
assert cu.cuInit(0) == 0
ctx = P()
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cu.cuCtxSetCurrent(ctx) == 0
sock = socket.socket(fileno=int(sys.argv[2]))
if sys.argv[1] == "export":
    # CUmemPoolProps: allocType pinned, handleTypes POSIX fd, location device 0, rest zero
    props = ctypes.create_string_buffer(struct.pack("<iiii", 1, 1, 1, 0), 88)
    pool = P()
    assert cu.cuMemPoolCreate(ctypes.byref(pool), props) == 0
    d = U()
    assert cu.cuMemAllocFromPoolAsync(ctypes.byref(d), S(4096), pool, P()) == 0
    assert cu.cuMemsetD32_v2(U(d.value), I(7), S(1024)) == 0
    assert cu.cuStreamSynchronize(P()) == 0
    fd = ctypes.c_int(-1)
    print("win32", cu.cuMemPoolExportToShareableHandle(ctypes.byref(fd), pool, I(2), U(0)), flush=True)
    assert cu.cuMemPoolExportToShareableHandle(ctypes.byref(fd), pool, I(1), U(0)) == 0
    data = ctypes.create_string_buffer(64)
    assert cu.cuMemPoolExportPointer(data, U(d.value)) == 0
    socket.send_fds(sock, [data.raw], [fd.value])
    os.close(fd.value)
    print("exported", flush=True)
else:
    raw, fds, _f, _a = socket.recv_fds(sock, 64, 1)
    pool = P()
    junk = os.memfd_create("junk")
    os.write(junk, bytes(64))
    print("bad", cu.cuMemPoolImportFromShareableHandle(ctypes.byref(pool), P(junk), I(1), U(0)),
          cu.cuMemPoolImportFromShareableHandle(ctypes.byref(pool), P(fds[0]), I(2), U(0)), flush=True)
    assert cu.cuMemPoolImportFromShareableHandle(ctypes.byref(pool), P(fds[0]), I(1), U(0)) == 0
    os.close(fds[0])
    d = U()
    print("badptr", cu.cuMemPoolImportPointer(ctypes.byref(d), pool, ctypes.create_string_buffer(64)), flush=True)
    assert cu.cuMemPoolImportPointer(ctypes.byref(d), pool, ctypes.create_string_buffer(raw, 64)) == 0
    v = (ctypes.c_uint * 1024)()
    assert cu.cuMemcpyDtoH_v2(v, U(d.value), S(4096)) == 0
    print("read", v[0], v[1023], flush=True)
sys.stdin.readline()          # until the test is done
if sys.argv[1] == "import":
    print("free", cu.cuMemFree_v2(U(d.value)), flush=True)
'''


def test_exportable_pools_between_two_clients(shim_installed, fresh_daemon, tmp_path):
    import socket
    from gpuproxy.proxyd.client import ControlClient, ControlError
    d = fresh_daemon(backend=BACKEND, **({} if BACKEND == "emu" else {"emu_kernels": ()}))
    env = client_env(d)
    s1, s2 = socket.socketpair()
    a = subprocess.Popen([sys.executable, "-c", _POOL_SIDE, "export", str(s1.fileno())], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         pass_fds=[s1.fileno()])
    b = subprocess.Popen([sys.executable, "-c", _POOL_SIDE, "import", str(s2.fileno())], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         pass_fds=[s2.fileno()])
    s1.close()
    s2.close()
    try:
        # a handle type other than POSIX descriptors: not supported (801)
        assert a.stdout.readline().split() == ["win32", "801"]
        assert a.stdout.readline().strip() == "exported"
        # a descriptor that is not a pool's, and a wrong handle type, are refused
        assert b.stdout.readline().split() == ["bad", "1", "801"]
        assert b.stdout.readline().split() == ["badptr", "1"]
        assert b.stdout.readline().split() == ["read", "7", "7"]
        for pid in (a.pid, b.pid):
            with pytest.raises(ControlError) as e:
                ControlClient(d.endpoint, timeout_s=60).call("dump", {"pid": pid, "dir": str(tmp_path / f"img{pid}"),
                                                                       "leave_running": True})
            assert "memory pool" in str(e.value) and "not supported" in str(e.value), str(e.value)
        # both sides still work; the importer frees its import
        b.stdin.write("\n")
        b.stdin.flush()
        assert b.stdout.readline().split() == ["free", "0"]
        a.stdin.write("\n")
        a.stdin.flush()
        assert a.wait(30) == 0 and b.wait(30) == 0, (a.stderr.read(), b.stderr.read())
        assert "cuMemPoolExportToShareableHandle (handle type 2" in a.stderr.read()
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
                p.wait()
