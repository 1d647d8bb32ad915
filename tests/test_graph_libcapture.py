"""Math-library calls issued on a capturing stream (proxyd/families/graph_libcapture.py):
captured into the graph with a snapshot of the objects they name, run at
each launch, kept across a GPU-only dump and a restore into a fresh proxyd.
Emulated backend in CI; `GPUPROXY_TEST_BACKEND=cuda` runs the same on the
GPU (NVIDIA's cuBLAS in the worker, real stream capture there)."""
from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import client_env
from proxy import Daemon

BACKEND = os.environ.get("GPUPROXY_TEST_BACKEND", "emu")
pytestmark = [pytest.mark.gpu] if BACKEND == "cuda" else []


@pytest.fixture
def tmp():
    d = Path(f"/tmp/gpx-lc-{os.getpid()}-{time.monotonic_ns() % 10**9}")   # ipc paths stay short
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


CAPTURE_SCRIPT = r"""
import ctypes, json, sys
from ctypes import byref, c_float, c_void_p
cb = ctypes.CDLL("libcublas.so.13")
rt = ctypes.CDLL("libcudart.so.13")
out = {}
h, st, g, e = c_void_p(), c_void_p(), c_void_p(), c_void_p()
A, B, C = c_void_p(), c_void_p(), c_void_p()
out["create"] = cb.cublasCreate_v2(byref(h))
rt.cudaStreamCreate(byref(st))
for p in (A, B, C):
    rt.cudaMalloc(byref(p), 16)
def put(p, vals):
    buf = (c_float * 4)(*vals)
    rt.cudaMemcpy(p, buf, 16, 1)
def get(p):
    buf = (c_float * 4)()
    rt.cudaMemcpy(buf, p, 16, 2)
    return list(buf)
put(A, [1, 2, 3, 4]); put(B, [5, 6, 7, 8]); put(C, [0, 0, 0, 0])
one, zero, two = c_float(1.0), c_float(0.0), c_float(2.0)
out["set_stream"] = cb.cublasSetStream_v2(h, st)
out["begin"] = rt.cudaStreamBeginCapture(st, 0)          # cudaStreamCaptureModeGlobal
out["gemm"] = cb.cublasSgemm_v2(h, 0, 0, 2, 2, 2, byref(one), A, 2, B, 2, byref(zero), C, 2)
out["end"] = rt.cudaStreamEndCapture(st, byref(g))
out["after_capture"] = get(C)                             # capturing runs nothing
out["inst"] = rt.cudaGraphInstantiateWithFlags(byref(e), g, ctypes.c_ulonglong(0))
# what the handle says after the capture does not change the captured call
out["transpose_later"] = cb.cublasSgemm_v2(h, 1, 0, 2, 2, 2, byref(two), A, 2, B, 2, byref(zero), C, 2)
out["launch1"] = rt.cudaGraphLaunch(e, st)
rt.cudaStreamSynchronize(st)
out["c1"] = get(C)
put(A, [2, 0, 0, 2])                                      # the graph reads A when launched
out["launch2"] = rt.cudaGraphLaunch(e, st)
rt.cudaStreamSynchronize(st)
out["c2"] = get(C)
out["destroy_handle"] = cb.cublasDestroy_v2(h)            # the graph keeps what it captured
print(json.dumps(out), flush=True)
print("waiting", flush=True)
sys.stdin.readline()
put(A, [0, 1, 1, 0])
put(C, [0, 0, 0, 0])
out2 = {"launch3": rt.cudaGraphLaunch(e, st), "sync": rt.cudaStreamSynchronize(st)}
out2["c3"] = get(C)
out2["exec_destroy"] = rt.cudaGraphExecDestroy(e)
out2["graph_destroy"] = rt.cudaGraphDestroy(g)
print(json.dumps(out2), flush=True)
"""


class _Lines:
    """The app's stdout read by a thread, so that a hung app fails the test
    within a bound, with both proxyds' logs, instead of blocking pytest."""

    def __init__(self, proc):
        self.proc, self.q = proc, queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.q.put(line)
        self.q.put("")

    def get(self, what, timeout, *daemons):
        try:
            return self.q.get(timeout=timeout)
        except queue.Empty:
            self.proc.kill()
            logs = "".join(f"\n--- {d.log_path} ---\n" + d.log()[-3000:] for d in daemons if d is not None)
            pytest.fail(f"the app printed nothing for {timeout} s while waiting for {what}; "
                        f"app stderr: {self.proc.stderr.read()[-2000:]}{logs}")


def _colmajor_mm(a, b):
    """2x2 column-major product, the reference cuBLAS's convention defines."""
    return [sum(a[i + 2 * k] * b[k + 2 * j] for k in range(2)) for j in range(2) for i in range(2)]


def test_cublas_call_in_a_stream_capture_runs_at_each_launch_and_across_restore(tmp, proxy_cli, shim_installed,
                                                                                 emu_kernel_files):
    """A cuBLAS call on a handle whose stream is capturing belongs to the
    graph (proxyd/families/graph_libcapture.py): nothing runs at capture, each launch
    computes with the data of the moment and with the handle as it was at
    capture (later calls and even destroying the handle change nothing), and
    a GPU-only dump, proxyd killed and a restore into a fresh proxyd keep
    the graph working."""
    ep = f"ipc://{tmp}/proxyd.sock"
    kernels = emu_kernel_files if BACKEND == "emu" else ()
    d = Daemon(backend=BACKEND, emu_kernels=kernels, endpoint=ep, log_path=str(tmp / "a.log")).start()
    d2 = None
    proc = subprocess.Popen([sys.executable, "-c", CAPTURE_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=client_env(d))
    env = {**os.environ, "GPUPROXY_ENDPOINT": ep}
    try:
        lines = _Lines(proc)
        line = lines.get("the capture's results", 120, d)
        assert line, proc.stderr.read() if proc.poll() is not None else "no output"
        o = json.loads(line)
        assert lines.get("'waiting'", 30, d) == "waiting\n"
        assert o["create"] == 0 and o["set_stream"] == 0 and o["begin"] == 0 and o["gemm"] == 0 and o["end"] == 0
        assert o["after_capture"] == [0, 0, 0, 0], "a captured gemm must not run at capture time"
        assert o["inst"] == 0 and o["transpose_later"] == 0 and o["launch1"] == 0 and o["launch2"] == 0
        assert o["c1"] == _colmajor_mm([1, 2, 3, 4], [5, 6, 7, 8])
        assert o["c2"] == _colmajor_mm([2, 0, 0, 2], [5, 6, 7, 8]), "the second launch reads A anew"
        assert o["destroy_handle"] == 0
        try:
            r = subprocess.run([*proxy_cli, "--dump", "--gpu-only", "--pid", str(proc.pid), "--dir", str(tmp / "img")],
                               capture_output=True, text=True, timeout=90, env=env)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"the dump did not finish in 90 s: {e.stdout} {e.stderr}\n--- proxyd log ---\n{d.log()[-4000:]}")
        assert r.returncode == 0, r.stdout + r.stderr + d.log()[-2000:]
        d.kill()
        d2 = Daemon(backend=BACKEND, emu_kernels=kernels, endpoint=ep, log_path=str(tmp / "b.log")).start()
        r = subprocess.run([*proxy_cli, "--restore", "--gpu-only", "--dir", str(tmp / "img")],
                           capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stdout + r.stderr + d2.log()[-2000:]
        proc.stdin.write("\n")
        proc.stdin.flush()
        o2 = json.loads(lines.get("the restored graph's results", 120, d, d2))
        assert o2["launch3"] == 0 and o2["sync"] == 0
        assert o2["c3"] == _colmajor_mm([0, 1, 1, 0], [5, 6, 7, 8]), "the restored graph runs the captured gemm"
        assert o2["exec_destroy"] == 0 and o2["graph_destroy"] == 0
        proc.wait(60)
        assert proc.returncode == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        d.cleanup()
        if d2 is not None:
            d2.cleanup()


def test_release_destroys_captured_library_graphs_before_their_context():
    """A GPU-only dump releases the session (handlers.destroy_context): the
    driver's executable graphs of captured library work must be destroyed
    while their context lives. On the H100 the garbage collector destroyed
    one after cuCtxDestroy and cuGraphExecDestroy never returned (the dump
    hung); here a stand-in backend records the order of the calls."""
    from types import SimpleNamespace

    from gpuproxy.proxyd.core import protocol as P
    from gpuproxy.proxyd.core.arena import Arena
    from gpuproxy.proxyd.families.graph_libcapture import LibCapture
    from gpuproxy.proxyd.families.contexts import destroy_context
    from gpuproxy.proxyd.core.session import Session

    calls = []

    class Backend:
        def ctx_sync(self, real):
            calls.append("ctx_sync")

        def lib_graph_destroy(self, ex):
            calls.append(("exec_destroy", ex))

        def ctx_destroy(self, real):
            calls.append("ctx_destroy")

    d = SimpleNamespace(backend=Backend())
    sess = Session("t", os.getpid(), "app", 0, Arena(1 << 40, 1 << 30, lambda dev, s, n: None, lambda b: None))
    c = sess.add_context(0, "real-ctx", True)
    lc = LibCapture(d, 1, c.id, [], 0, [], exec_="exec-1")
    sess.add(P.K_GRAPH, None, c.id, {"nodes": [[1, c.id, lc]]})
    sess.add(P.K_GRAPH_EXEC, None, c.id, {"nodes": [[1, c.id, lc]]})
    destroy_context(d, sess, c)
    assert ("exec_destroy", "exec-1") in calls, calls
    assert calls.index(("exec_destroy", "exec-1")) < calls.index("ctx_destroy"), calls
    assert calls.count(("exec_destroy", "exec-1")) == 1, "one executable graph, destroyed once"
    del lc
