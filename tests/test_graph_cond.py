"""Conditional graph nodes (proxyd/families/graph_cond.py).

On the wire, emulated backend: what cuda.h refuses is refused (flags, a
handle of another graph, sizes, a graph with conditional nodes as a child
graph or cloned), body graphs are graphs of the session, and an IF node
runs its bodies by the value a memset-free graph leaves (the handle's
default). The whole feature through the shim, with kernels setting
conditions, and across a checkpoint is the corpus program graph_conditional
(tests/programs/graph_conditional.cu).

GPU path without a GPU: the order of driver calls that records a graph with
conditional nodes into a driver graph (stream capture of the plain ops,
conditional nodes added after what the capture recorded, bodies captured
into the body graphs), against a stand-in for backends/cuda_cond.py."""
from __future__ import annotations

import os
import struct

import pytest

from test_graph_nodes import client, new_event, ok  # noqa: F401 (client: a fixture)
from wire import FID, WireClient

BACKEND = os.environ.get("GPUPROXY_TEST_BACKEND", "emu")
# the tests through the shim run on the GPU too (scripts/gpu-check's pytest step: -m gpu)
GPU_TOO = pytest.mark.gpu if BACKEND == "cuda" else (lambda f: f)

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_SUPPORTED = 801
T_CONDITIONAL = 13
IF, WHILE, SWITCH = 0, 1, 2


def node_params(handle, ctype, size, ctx=0):
    """CUgraphNodeParams (cuda.h) of a conditional node, 256 bytes."""
    b = bytearray(256)
    struct.pack_into("<i", b, 0, T_CONDITIONAL)
    struct.pack_into("<QIIQQ", b, 16, handle, ctype, size, 0, ctx)
    return bytes(b)


def add_cond(c, g, deps, handle, ctype, size):
    return c.call("cuGraphAddNode", True, g, list(deps), len(deps), node_params(handle, ctype, size, c.ctx),
                  ctx=c.ctx)


def memset_op(c, dst, value, n):
    return [FID["cuMemsetD8Async"], c.ctx, dst, value, n, 0]


def test_handles_and_nodes_are_checked(client):
    c = client
    g = ok(c, "cuGraphCreate", True, 0)[0]
    other = ok(c, "cuGraphCreate", True, 0)[0]
    code, _, msg = c.call("cuGraphConditionalHandleCreate", True, g, c.ctx, 0, 2, ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE and "flags" in msg, (code, msg)
    h = ok(c, "cuGraphConditionalHandleCreate", True, g, c.ctx, 1, 1)[0]
    h2 = ok(c, "cuGraphConditionalHandleCreate", True, g, c.ctx, 0, 0)[0]
    assert h and h2 and h != h2
    # cuda.h: the handle belongs to the graph that will hold its node
    code, _, msg = add_cond(c, other, [], h, IF, 1)
    assert code == CUDA_ERROR_INVALID_VALUE and "not made for this graph" in msg, (code, msg)
    # sizes: WHILE 1, IF 1 or 2, SWITCH at least 1; types 0..2
    for ctype, size in ((WHILE, 2), (IF, 3), (SWITCH, 0), (3, 1)):
        code, _, msg = add_cond(c, g, [], h, ctype, size)
        assert code == CUDA_ERROR_INVALID_VALUE, (ctype, size, code, msg)
    code, outs, msg = add_cond(c, g, [], h, SWITCH, 3)
    assert code == 0, msg
    bodies = struct.unpack("<3Q", outs[1])
    assert len(set(bodies)) == 3
    # the bodies are graphs of the session: nodes go in with the usual calls
    ok(c, "cuGraphAddEmptyNode", True, bodies[0], [], 0)
    code, outs2, _ = c.call("cuGraphGetNodes", bodies[0], True, True, ctx=c.ctx)
    assert code == 0 and outs2[1] == 1
    code, outs2, _ = c.call("cuGraphGetNodes", g, True, True, ctx=c.ctx)
    assert code == 0 and outs2[1] == 1
    # cuda.h: a graph with conditional nodes is never a child graph nor cloned
    parent = ok(c, "cuGraphCreate", True, 0)[0]
    code, _, msg = c.call("cuGraphAddChildGraphNode", True, parent, [], 0, g, ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE and "conditional" in msg, (code, msg)
    code, _, msg = c.call("cuGraphClone", True, g, ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE and "conditional" in msg, (code, msg)
    # a handle no node uses fails instantiation (cuda.h; driver 580 refuses it)
    code, _, msg = c.call("cuGraphInstantiateWithFlags", True, g, 0, ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE and f"{h2:#x} used by no conditional node" in msg, (code, msg)
    assert add_cond(c, g, [], h2, IF, 1)[0] == 0
    # a body holds what cuda.h allows: a host node there fails instantiation
    ev = new_event(c)
    ok(c, "cuGraphAddEventRecordNode", True, bodies[1], [], 0, ev)
    code, _, msg = c.call("cuGraphInstantiateWithFlags", True, g, 0, ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE and "cannot be in a body" in msg, (code, msg)
    ok(c, "cuGraphDestroy", g)


def test_equal_handle_values_belong_to_their_own_graphs():
    """Driver 580 numbers each graph's conditional handles from 1, so two
    graphs hold equal values (the corpus on the GPU: a second graph's
    handle 0x1 was taken for the first graph's); a node finds its handle
    in its own graph or a graph it is the body of (cuda.h)."""
    from types import SimpleNamespace as NS

    from gpuproxy.proxyd.core import protocol as P
    from gpuproxy.proxyd.families import graph_cond
    from gpuproxy.proxyd.families.graph_nodes import K_GRAPH_NODE
    a = NS(id=1, info={"conds": [[1, 0, 1, 0], [2, 0, 0, 0]], "xnodes": []})
    b = NS(id=2, info={"conds": [[1, 0, 1, 0]], "xnodes": [10]})
    node = NS(id=10, info={"graph": 2, "type": T_CONDITIONAL,
                           "cond": {"handle": 1, "ctype": IF, "size": 1, "bodies": [3]}})
    body = NS(id=3, info={"body_of": 10, "xnodes": []})
    objs = {(P.K_GRAPH, 1): a, (P.K_GRAPH, 2): b, (P.K_GRAPH, 3): body, (K_GRAPH_NODE, 10): node}
    sess = NS(objects=objs)
    assert graph_cond._owner(sess, b, 1) is b and graph_cond._owner(sess, a, 1) is a
    assert graph_cond._owner(sess, body, 1) is b        # a body's node may use its parent's handle
    assert graph_cond._owner(sess, b, 2) is None
    assert graph_cond._unused_handles(sess, b) == []
    assert graph_cond._unused_handles(sess, a) == [1, 2]


def test_if_else_and_switch_follow_the_default(client):
    """No kernel sets the conditions here: each launch starts from the
    handles' defaults (CU_GRAPH_COND_ASSIGN_DEFAULT), so the branches taken
    are the defaults' (the corpus program has kernels set them)."""
    c = client
    buf = ok(c, "cuMemAlloc_v2", True, 16)[0]
    g = ok(c, "cuGraphCreate", True, 0)[0]
    hi = ok(c, "cuGraphConditionalHandleCreate", True, g, c.ctx, 0, 1)[0]
    hs = ok(c, "cuGraphConditionalHandleCreate", True, g, c.ctx, 2, 1)[0]
    code, outs, msg = add_cond(c, g, [], hi, IF, 2)
    assert code == 0, msg
    n_if = outs[0]
    then_, else_ = struct.unpack("<2Q", outs[1])
    ok(c, "cuGraphAddMemsetNode", True, then_, [], 0, memset_op(c, buf, 1, 8), None)
    ok(c, "cuGraphAddMemsetNode", True, else_, [], 0, memset_op(c, buf, 2, 8), None)
    code, outs, msg = add_cond(c, g, [n_if], hs, SWITCH, 3)
    assert code == 0, msg
    sb = struct.unpack("<3Q", outs[1])
    for k, b in enumerate(sb):
        ok(c, "cuGraphAddMemsetNode", True, b, [], 0, memset_op(c, buf + 8, 10 + k, 8), None)
    e = ok(c, "cuGraphInstantiateWithFlags", True, g, 0)[0]
    ok(c, "cuGraphLaunch", e, 0)
    ok(c, "cuCtxSynchronize")
    got = ok(c, "cuMemcpyDtoH_v2", None, buf, 16)[0]
    assert got == b"\x02" * 8 + b"\x0c" * 8, got      # else (default 0), switch body 2 (default 2)
    ok(c, "cuGraphExecDestroy", e)
    ok(c, "cuGraphDestroy", g)


def test_executable_graph_keeps_its_bodies_and_takes_body_node_updates(client):
    """Instantiation copies the bodies: a node added to a body afterwards
    does not reach the executable graph; cuGraphExecMemsetNodeSetParams of a
    node inside a body changes the executable graph's copy (XLA updates its
    loop bodies' kernels so), not the graph's."""
    c = client
    buf = ok(c, "cuMemAlloc_v2", True, 8)[0]
    g = ok(c, "cuGraphCreate", True, 0)[0]
    h = ok(c, "cuGraphConditionalHandleCreate", True, g, c.ctx, 1, 1)[0]
    code, outs, msg = add_cond(c, g, [], h, IF, 1)
    assert code == 0, msg
    (body,) = struct.unpack("<Q", outs[1])
    m = ok(c, "cuGraphAddMemsetNode", True, body, [], 0, memset_op(c, buf, 3, 8), None)[0]
    e = ok(c, "cuGraphInstantiateWithFlags", True, g, 0)[0]
    ok(c, "cuGraphAddMemsetNode", True, body, [m], 1, memset_op(c, buf, 9, 8), None)   # after instantiation
    ok(c, "cuGraphLaunch", e, 0)
    ok(c, "cuCtxSynchronize")
    assert ok(c, "cuMemcpyDtoH_v2", None, buf, 8)[0] == b"\x03" * 8
    ok(c, "cuGraphExecMemsetNodeSetParams", e, m, memset_op(c, buf, 5, 8), None)
    ok(c, "cuGraphLaunch", e, 0)
    ok(c, "cuCtxSynchronize")
    assert ok(c, "cuMemcpyDtoH_v2", None, buf, 8)[0] == b"\x05" * 8
    # a fresh instantiation takes the graph as it is: both body nodes, the second last
    ok(c, "cuGraphExecDestroy", e)
    e2 = ok(c, "cuGraphInstantiateWithFlags", True, g, 0)[0]
    ok(c, "cuGraphLaunch", e2, 0)
    ok(c, "cuCtxSynchronize")
    assert ok(c, "cuMemcpyDtoH_v2", None, buf, 8)[0] == b"\x09" * 8


def test_an_endless_emulated_loop_fails_the_launch(tmp_path):
    """A WHILE whose condition never clears hangs a GPU; the emulated one
    fails with a line after GPUPROXY_EMU_WHILE_MAX passes (here 50)."""
    from proxy import Daemon
    d = Daemon(backend="emu", endpoint=f"ipc://{tmp_path}/p.sock", env={**os.environ, "GPUPROXY_EMU_WHILE_MAX": "50"}).start()
    try:
        with WireClient(d.endpoint) as c:
            c.hello()
            c.ctx = c.context()
            buf = ok(c, "cuMemAlloc_v2", True, 8)[0]
            g = ok(c, "cuGraphCreate", True, 0)[0]
            h = ok(c, "cuGraphConditionalHandleCreate", True, g, c.ctx, 1, 1)[0]
            code, outs, msg = add_cond(c, g, [], h, WHILE, 1)
            assert code == 0, msg
            (body,) = struct.unpack("<Q", outs[1])
            ok(c, "cuGraphAddMemsetNode", True, body, [], 0, memset_op(c, buf, 1, 8), None)
            e = ok(c, "cuGraphInstantiateWithFlags", True, g, 0)[0]
            # an asynchronous op's failure comes back with its message (the shim
            # reports it at the next synchronising call)
            _code, _, msg = c.call("cuGraphLaunch", e, 0, ctx=c.ctx)
            assert "GPUPROXY_EMU_WHILE_MAX" in msg, msg
            assert "condition never cleared" in d.log()
            c.bye()
    finally:
        d.cleanup()


# ---------------------------------------------- the GPU's recording, stand-in driver

class FakeDriver:
    """Records the calls graph_cond._record makes (backends/cuda_cond.py's API)."""

    def __init__(self):
        self.calls = []
        self.next = 100
        self.capturing = None

    def _new(self):
        self.next += 1
        return self.next

    def begin(self, stream, graph, deps):
        self.capturing = graph
        self.calls.append(("begin", graph, tuple(deps)))

    def deps(self, stream):
        return [self.last]

    def end(self, stream):
        self.calls.append(("end", self.capturing))
        self.capturing = None

    def add_conditional(self, graph, deps, handle, ctype, size, ctx):
        n = self._new()
        bodies = [self._new() for _ in range(size)]
        self.calls.append(("cond", graph, tuple(deps), handle, ctype, n, tuple(bodies)))
        return n, bodies


class FakeDispatcher:
    def __init__(self, drv):
        self.drv = drv

    def run_op(self, sess, op):
        n = self.drv._new()
        self.drv.last = n
        self.drv.calls.append(("op", self.drv.capturing, op[2][0], n))
        return 0, [], ""


class FakeSession:
    """Holds body snapshot graphs (graph_cond.expand) by id."""
    graph_replay = False

    def __init__(self, snaps=()):
        from types import SimpleNamespace

        from gpuproxy.proxyd.core import protocol as P
        self.objects = {(P.K_GRAPH, gid): SimpleNamespace(id=gid, info={"nodes": ops, "snap": []})
                        for gid, ops in snaps}


def test_gpu_recording_order(monkeypatch):
    from gpuproxy.proxyd._generated import NAMES
    from gpuproxy.proxyd.families import graph_cond, graphs
    fid = {v: k for k, v in NAMES.items()}
    memset = fid["cuMemsetD8Async"]
    cond = fid["cuGraphAddNode"]
    monkeypatch.setattr(graphs, "_stream_slot", lambda fn, args: (-1, None))

    def op(tag):
        return [memset, 0, [tag, 0, 8, 0]]
    # a; WHILE(h=7) { b; IF(h=7) { c } }; d -- bodies are snapshot graphs 51 and 52
    inner = [cond, 0, [7, IF, [52]]]
    ops = [op("a"), [cond, 0, [7, WHILE, [51]]], op("d")]
    sess = FakeSession([(51, [op("b"), inner]), (52, [op("c")])])
    drv = FakeDriver()
    last = graph_cond._record(FakeDispatcher(drv), sess, drv, 1, [], ops, type("S", (), {"handle": 5}), 5, 0, ())
    kinds = [c[0] for c in drv.calls]
    a = next(c for c in drv.calls if c[0] == "op" and c[2] == "a")
    w = next(c for c in drv.calls if c[0] == "cond" and c[4] == WHILE)
    b = next(c for c in drv.calls if c[0] == "op" and c[2] == "b")
    i = next(c for c in drv.calls if c[0] == "cond" and c[4] == IF)
    cc = next(c for c in drv.calls if c[0] == "op" and c[2] == "c")
    d = next(c for c in drv.calls if c[0] == "op" and c[2] == "d")
    assert a[1] == 1 and w[1] == 1 and w[2] == (a[3],)         # the loop follows a, in the top graph
    assert b[1] == w[6][0]                                      # b is captured into the loop's body
    assert i[1] == w[6][0] and i[2] == (b[3],)                  # the IF follows b, in the body
    assert cc[1] == i[6][0]                                     # c goes into the IF's body
    assert d[1] == 1 and ("begin", 1, (w[5],)) in drv.calls     # d is captured after the loop node
    assert last == [d[3]]
    assert drv.capturing is None and kinds.count("begin") == kinds.count("end")


def test_gpu_refuses_what_it_cannot_record():
    from gpuproxy.proxyd._generated import NAMES
    from gpuproxy.proxyd.core.session import CudaError
    from gpuproxy.proxyd.families import graph_cond
    fid = {v: k for k, v in NAMES.items()}
    drv = FakeDriver()
    host = [fid["cuLaunchHostFunc"], 0, [0, 1, 2]]
    with pytest.raises(CudaError) as ei:
        graph_cond._record(FakeDispatcher(drv), FakeSession(), drv, 1, [], [host], None, 5, 0, ())
    assert ei.value.code == CUDA_ERROR_NOT_SUPPORTED and "cuLaunchHostFunc" in ei.value.message


class _FakeBackend:
    """What backends/cuda_cond.py uses of CudaBackend, over a Python stand-in
    for libcuda's graph calls (real cffi types, so the casts are the real ones)."""

    def __init__(self, lib):
        FFI = pytest.importorskip("cffi").FFI
        self.ffi = FFI()
        self.lib = lib
        lib.ffi = self.ffi

    def check(self, r, what):
        assert r == 0, what

    def ptr(self, cdata):
        return int(self.ffi.cast("uintptr_t", cdata))

    def vp(self, v):
        return self.ffi.cast("void *", v or 0)


class _FakeLib:
    def __init__(self):
        self.seen = {}
        self.keep = []

    def cuGraphAddNode_v2(self, node, graph, deps, edata, n, params):
        raw = bytes(self.ffi.buffer(params, 256))
        self.seen = {"type": struct.unpack_from("<i", raw, 0)[0], "cond": struct.unpack_from("<QII", raw, 16),
                     "ctx": struct.unpack_from("<Q", raw, 40)[0], "graph": int(self.ffi.cast("uintptr_t", graph)),
                     "deps": [int(self.ffi.cast("uintptr_t", deps[i])) for i in range(n)], "edata": edata}
        size = self.seen["cond"][2]
        bodies = self.ffi.new("void *[]", [self.ffi.cast("void *", 0x500 + i) for i in range(size)])
        self.keep.append(bodies)
        self.ffi.buffer(params, 256)[32:40] = struct.pack("<Q", int(self.ffi.cast("uintptr_t", bodies)))
        node[0] = self.ffi.cast("void *", 0x77)
        return 0

    def cuStreamGetCaptureInfo_v3(self, stream, status, cid, graph, deps, edata, n):
        arr = self.ffi.new("void *[]", [self.ffi.cast("void *", 0x31), self.ffi.cast("void *", 0x32)])
        self.keep.append(arr)
        deps[0] = arr
        n[0] = 2
        return 0


def test_driver_conditional_node_layout():
    """cuda.h's CUgraphNodeParams: type at 0, the conditional parameters at
    16 (handle, type, size), phGraph_out at 32 (written by the driver), ctx
    at 40; 256 bytes."""
    from gpuproxy.proxyd.backends.cuda_cond import DriverConds
    lib = _FakeLib()
    drv = DriverConds(_FakeBackend(lib))
    node, bodies = drv.add_conditional(0x40, [0x11, 0x12], 0xABCDEF0123, SWITCH, 3, 0x9000)
    assert node == 0x77 and bodies == [0x500, 0x501, 0x502]
    s = lib.seen
    assert s["type"] == T_CONDITIONAL and s["cond"] == (0xABCDEF0123, SWITCH, 3) and s["ctx"] == 0x9000
    assert s["graph"] == 0x40 and s["deps"] == [0x11, 0x12]
    assert drv.deps(0x5) == [0x31, 0x32]


# ------------------------------- a library call in a body, through the shim, across a restore

COND_CUBLAS_SCRIPT = r"""
import ctypes, json, struct, sys
from ctypes import byref, c_float, c_void_p, c_ulonglong
cb = ctypes.CDLL("libcublas.so.13")
rt = ctypes.CDLL("libcudart.so.13")
out = {}
h, st, g, e, hnd = c_void_p(), c_void_p(), c_void_p(), c_void_p(), c_ulonglong()
A, B, C, D = c_void_p(), c_void_p(), c_void_p(), c_void_p()
out["create"] = cb.cublasCreate_v2(byref(h))
rt.cudaStreamCreate(byref(st))
for p in (A, B, C, D):
    rt.cudaMalloc(byref(p), 16)
def put(p, vals):
    buf = (c_float * 4)(*vals)
    rt.cudaMemcpy(p, buf, 16, 1)
def get(p):
    buf = (c_float * 4)()
    rt.cudaMemcpy(buf, p, 16, 2)
    return list(buf)
put(A, [1, 2, 3, 4]); put(B, [5, 6, 7, 8]); put(C, [0, 0, 0, 0]); put(D, [0, 0, 0, 0])
one, zero = c_float(1.0), c_float(0.0)
out["set_stream"] = cb.cublasSetStream_v2(h, st)
out["graph"] = rt.cudaGraphCreate(byref(g), 0)
# default 1, assigned at every launch (cudaGraphCondAssignDefault): the IF takes its then-body
out["handle"] = rt.cudaGraphConditionalHandleCreate(byref(hnd), g, 1, 1)
params = ctypes.create_string_buffer(256)                 # struct cudaGraphNodeParams (driver_types.h)
struct.pack_into("<i", params, 0, 13)                     # cudaGraphNodeTypeConditional
struct.pack_into("<QII", params, 16, hnd.value, 0, 2)     # handle, cudaGraphCondTypeIf, size 2
node = c_void_p()
rt.cudaGraphAddNode.argtypes = [c_void_p, c_void_p, c_void_p, c_void_p, ctypes.c_size_t, c_void_p]
out["add"] = rt.cudaGraphAddNode(byref(node), g, None, None, 0, params)
arr = struct.unpack_from("<Q", params, 32)[0]
bodies = [ctypes.c_void_p.from_address(arr + 8 * i).value for i in range(2)]
for body, dst in zip(bodies, (C, D)):
    rt.cudaStreamBeginCaptureToGraph.argtypes = [c_void_p, c_void_p, c_void_p, c_void_p, ctypes.c_size_t, ctypes.c_int]
    out.setdefault("begin", []).append(rt.cudaStreamBeginCaptureToGraph(st, body, None, None, 0, 0))
    out.setdefault("gemm", []).append(cb.cublasSgemm_v2(h, 0, 0, 2, 2, 2, byref(one), A, 2, B, 2, byref(zero), dst, 2))
    g2 = c_void_p()
    out.setdefault("end", []).append(rt.cudaStreamEndCapture(st, byref(g2)))
out["inst"] = rt.cudaGraphInstantiateWithFlags(byref(e), g, ctypes.c_ulonglong(0))
out["launch1"] = rt.cudaGraphLaunch(e, st)
out["sync1"] = rt.cudaStreamSynchronize(st)
out["c1"], out["d1"] = get(C), get(D)
print(json.dumps(out), flush=True)
print("waiting", flush=True)
sys.stdin.readline()
put(A, [2, 0, 0, 2])
out2 = {"launch2": rt.cudaGraphLaunch(e, st), "sync2": rt.cudaStreamSynchronize(st)}
out2["c2"], out2["d2"] = get(C), get(D)
out2["exec_destroy"] = rt.cudaGraphExecDestroy(e)
out2["graph_destroy"] = rt.cudaGraphDestroy(g)
print(json.dumps(out2), flush=True)
"""


@GPU_TOO
def test_cublas_in_a_conditional_body_across_restore(tmp_path, proxy_cli, shim_installed, emu_kernel_files):
    """cudaGraphConditionalHandleCreate and cudaGraphAddNode through the
    shim, a cuBLAS call captured into each body of an IF
    (cudaStreamBeginCaptureToGraph), the default value choosing the
    then-body at every launch; a GPU-only dump, proxyd killed and a restore
    into a fresh proxyd keep the graph and its handle working. Emulated in
    CI; GPUPROXY_TEST_BACKEND=cuda runs it on the GPU (the graph then runs as
    a driver graph, the cuBLAS call recorded into its body, and the handle
    must come back under its value)."""
    import json
    import subprocess
    import sys
    import time

    from conftest import client_env
    from proxy import Daemon
    from test_graph_libcapture import _colmajor_mm, _Lines
    tmp = __import__("pathlib").Path(f"/tmp/gpx-cd-{os.getpid()}-{time.monotonic_ns() % 10**9}")
    tmp.mkdir()
    ep = f"ipc://{tmp}/proxyd.sock"
    kernels = emu_kernel_files if BACKEND == "emu" else ()
    d = Daemon(backend=BACKEND, emu_kernels=kernels, endpoint=ep, log_path=str(tmp / "a.log")).start()
    d2 = None
    proc = subprocess.Popen([sys.executable, "-c", COND_CUBLAS_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=client_env(d))
    env = {**os.environ, "GPUPROXY_ENDPOINT": ep}
    try:
        lines = _Lines(proc)
        line = lines.get("the first launch's results", 120, d)
        assert line, proc.stderr.read() if proc.poll() is not None else "no output"
        o = json.loads(line)
        assert lines.get("'waiting'", 30, d) == "waiting\n"
        for k in ("create", "set_stream", "graph", "handle", "add", "inst", "launch1", "sync1"):
            assert o[k] == 0, (k, o, d.log()[-3000:])
        assert o["begin"] == [0, 0] and o["gemm"] == [0, 0] and o["end"] == [0, 0], o
        assert o["c1"] == _colmajor_mm([1, 2, 3, 4], [5, 6, 7, 8]), "the then-body's gemm"
        assert o["d1"] == [0, 0, 0, 0], "the else-body must not run"
        r = subprocess.run([*proxy_cli, "--dump", "--gpu-only", "--pid", str(proc.pid), "--dir", str(tmp / "img")],
                           capture_output=True, text=True, timeout=90, env=env)
        assert r.returncode == 0, r.stdout + r.stderr + d.log()[-2000:]
        d.kill()
        d2 = Daemon(backend=BACKEND, emu_kernels=kernels, endpoint=ep, log_path=str(tmp / "b.log")).start()
        r = subprocess.run([*proxy_cli, "--restore", "--gpu-only", "--dir", str(tmp / "img")],
                           capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stdout + r.stderr + d2.log()[-2000:]
        proc.stdin.write("\n")
        proc.stdin.flush()
        o2 = json.loads(lines.get("the restored graph's results", 120, d, d2))
        assert o2["launch2"] == 0 and o2["sync2"] == 0, (o2, d2.log()[-3000:])
        assert o2["c2"] == _colmajor_mm([2, 0, 0, 2], [5, 6, 7, 8]), "the restored graph reads A anew"
        assert o2["d2"] == [0, 0, 0, 0]
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
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


def test_body_arrays_are_freed_with_their_nodes_nested_too(corpus_built, emu_daemon):
    """phGraph_out (cuda.h: "CUDA-owned ... Valid for the lifetime of the
    conditional node") is the shim's to free: the corpus program
    graph_cond_churn, with nested IF nodes (a handle made on a body graph),
    destroys nodes and graphs 160 times; the shim's count of the arrays it
    holds (required here: CHURN_REQUIRE_COUNT) follows every add and destroy
    (the nested node's array goes with the graph that holds its parent) and
    the heap does not grow. The plain form runs in the corpus (natively
    too)."""
    import subprocess

    from conftest import client_env
    built = corpus_built["graph_cond_churn"]
    r = subprocess.run([str(built.binary), "nested"], capture_output=True, text=True, timeout=300,
                       env=client_env(emu_daemon, {"CHURN_REQUIRE_COUNT": "1"}))
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:], emu_daemon.log()[-2000:])
    assert r.stdout.splitlines()[0] == ("160 rounds of 4 conditional nodes (64 bodies each for SWITCH), "
                                        "nested IF: checked"), r.stdout
    assert r.stdout.endswith("PASS graph_cond_churn\n") and r.stderr == "", (r.stdout, r.stderr)


def test_conditional_nodes_added_in_a_capture_keep_capture_order(client):
    """CUDA's pattern (proxyd/families/graph_cond_capture.py): the capture's
    graph from cuStreamGetCaptureInfo_v3, a handle on it, cuGraphAddNode,
    cuStreamUpdateCaptureDependencies_v2 (SET). The node runs after what was
    captured before it and before what is captured after; a node destroyed
    before the capture ends leaves no trace; bad flags, another graph's node,
    edge data and a stream not capturing are refused."""
    c = client
    buf = ok(c, "cuMemAlloc_v2", True, 8)[0]
    s = ok(c, "cuStreamCreate", True, 1)[0]
    ok(c, "cuStreamBeginCapture_v2", s, 0)
    ok(c, "cuMemsetD8Async", buf, 1, 8, s)
    g = ok(c, "cuStreamGetCaptureInfo_v3", s, True, True, True, None, None, None)[2]
    h = ok(c, "cuGraphConditionalHandleCreate", True, g, c.ctx, 1, 1)[0]
    code, outs, msg = add_cond(c, g, [], h, IF, 1)
    assert code == 0, msg
    node, (body,) = outs[0], struct.unpack("<Q", outs[1])
    ok(c, "cuGraphAddMemsetNode", True, body, [], 0, memset_op(c, buf, 2, 8), None)
    one = struct.pack("<Q", node)
    ok(c, "cuStreamUpdateCaptureDependencies_v2", s, one, None, 1, 1)
    code, _, msg = c.call("cuStreamUpdateCaptureDependencies_v2", s, one, None, 1, 7, ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE and "flags" in msg, (code, msg)
    code, _, msg = c.call("cuStreamUpdateCaptureDependencies_v2", s, one, b"\x01" + bytes(7), 1, 1, ctx=c.ctx)
    assert code == CUDA_ERROR_NOT_SUPPORTED and "edge data" in msg, (code, msg)
    other = ok(c, "cuGraphCreate", True, 0)[0]
    oh = ok(c, "cuGraphConditionalHandleCreate", True, other, c.ctx, 0, 0)[0]
    onode = add_cond(c, other, [], oh, IF, 1)[1][0]
    code, _, msg = c.call("cuStreamUpdateCaptureDependencies_v2", s, struct.pack("<Q", onode), None, 1, 1,
                          ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE and "not a node of the capture" in msg, (code, msg)
    # a second node, destroyed before the capture ends: it must not run (it
    # shares the first's handle: a handle no node uses fails instantiation)
    code, outs, msg = add_cond(c, g, [node], h, IF, 1)
    assert code == 0, msg
    gone, (gbody,) = outs[0], struct.unpack("<Q", outs[1])
    ok(c, "cuGraphAddMemsetNode", True, gbody, [], 0, memset_op(c, buf, 9, 8), None)
    ok(c, "cuGraphDestroyNode", gone)
    ok(c, "cuMemsetD8Async", buf, 3, 4, s)          # captured after the IF: over its result
    assert ok(c, "cuStreamEndCapture", s, True)[0] == g, "the capture ends in the graph it named"
    code, _, msg = c.call("cuStreamUpdateCaptureDependencies_v2", s, one, None, 1, 1, ctx=c.ctx)
    assert code == 401 and "not capturing" in msg, (code, msg)     # CUDA_ERROR_ILLEGAL_STATE
    e = ok(c, "cuGraphInstantiateWithFlags", True, g, 0)[0]
    ok(c, "cuGraphLaunch", e, s)
    ok(c, "cuCtxSynchronize")
    assert ok(c, "cuMemcpyDtoH_v2", None, buf, 8)[0] == b"\x03" * 4 + b"\x02" * 4
    ok(c, "cuGraphExecDestroy", e)
    ok(c, "cuGraphDestroy", g)
    ok(c, "cuGraphDestroy", other)
