"""What XLA's command buffers do to graphs between launches, on the wire
(emulated backend): capture a stream into a graph of their own
(cuStreamBeginCaptureToGraph, proxyd/families/graph_capture_into.py), give
a child-graph node of an executable graph another graph of the same shape
(cuGraphExecChildGraphNodeSetParams) and disable/enable nodes
(cuGraphNodeSetEnabled/GetEnabled, proxyd/families/graph_exec_nodes.py).
Expected values: the bytes the memsets leave (what cuda.h says the launch
does) and cuda.h's error codes."""
from __future__ import annotations

import pytest

from test_graph_nodes import CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED, add, client, memset_op, ok  # noqa: F401,E501 (client: a fixture)


def read(c, buf, n=64):
    ok(c, "cuCtxSynchronize")
    return ok(c, "cuMemcpyDtoH_v2", None, buf, n)[0]


def test_capture_into_an_existing_graph(client):
    c = client
    buf = ok(c, "cuMemAlloc_v2", True, 64)[0]
    st = ok(c, "cuStreamCreate", True, 0)[0]
    g = ok(c, "cuGraphCreate", True, 0)[0]
    ok(c, "cuStreamBeginCaptureToGraph", st, g, None, None, 0, 0)
    assert ok(c, "cuStreamIsCapturing", st, True)[0] == 1        # CU_STREAM_CAPTURE_STATUS_ACTIVE
    ok(c, "cuMemsetD8Async", buf, 7, 64, st)
    assert ok(c, "cuStreamEndCapture", st, True)[0] == g, "the capture ends in the application's graph"
    assert read(c, buf) != b"\x07" * 64, "captured, not run"
    e = ok(c, "cuGraphInstantiateWithFlags", True, g, 0)[0]
    ok(c, "cuGraphLaunch", e, 0)
    assert read(c, buf) == b"\x07" * 64
    # a capture that depends on nodes of the graph: refused, one line, nothing begun
    n = add(c, "cuGraphAddEmptyNode", g, [])
    code, _, msg = c.call("cuStreamBeginCaptureToGraph", st, g, n.to_bytes(8, "little"), None, 1, 0, ctx=c.ctx)
    assert code == CUDA_ERROR_NOT_SUPPORTED and "depends on nodes" in msg, (code, msg)
    assert ok(c, "cuStreamIsCapturing", st, True)[0] == 0


def child_graph(c, buf, *values):
    g = ok(c, "cuGraphCreate", True, 0)[0]
    prev = []
    for v in values:
        prev = [add(c, "cuGraphAddMemsetNode", g, prev, memset_op(c, buf, v, 64), None)]
    return g


def test_child_node_takes_another_graph_of_the_same_shape(client):
    c = client
    buf = ok(c, "cuMemAlloc_v2", True, 64)[0]
    parent = ok(c, "cuGraphCreate", True, 0)[0]
    child = add(c, "cuGraphAddChildGraphNode", parent, [], child_graph(c, buf, 1))
    e = ok(c, "cuGraphInstantiateWithFlags", True, parent, 0)[0]
    ok(c, "cuGraphLaunch", e, 0)
    assert read(c, buf) == b"\x01" * 64
    ok(c, "cuGraphExecChildGraphNodeSetParams", e, child, child_graph(c, buf, 2))
    ok(c, "cuGraphLaunch", e, 0)
    assert read(c, buf) == b"\x02" * 64
    code, _, msg = c.call("cuGraphExecChildGraphNodeSetParams", e, child, child_graph(c, buf, 3, 4), ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE and "topology" in msg, (code, msg)
    ok(c, "cuGraphLaunch", e, 0)
    assert read(c, buf) == b"\x02" * 64, "a refused update changes nothing"


def test_disabled_nodes_are_skipped(client):
    c = client
    buf = ok(c, "cuMemAlloc_v2", True, 64)[0]
    g = ok(c, "cuGraphCreate", True, 0)[0]
    a = add(c, "cuGraphAddMemsetNode", g, [], memset_op(c, buf, 5, 64), None)
    b = add(c, "cuGraphAddMemsetNode", g, [a], memset_op(c, buf, 6, 32), None)
    emp = add(c, "cuGraphAddEmptyNode", g, [b])
    e = ok(c, "cuGraphInstantiateWithFlags", True, g, 0)[0]
    assert ok(c, "cuGraphNodeGetEnabled", e, b, True)[0] == 1
    ok(c, "cuGraphNodeSetEnabled", e, b, 0)
    assert ok(c, "cuGraphNodeGetEnabled", e, b, True)[0] == 0
    ok(c, "cuGraphLaunch", e, 0)
    assert read(c, buf) == b"\x05" * 64
    ok(c, "cuGraphNodeSetEnabled", e, b, 1)
    ok(c, "cuGraphLaunch", e, 0)
    assert read(c, buf) == b"\x06" * 32 + b"\x05" * 32
    # cuda.h: only kernel, memset and memcpy nodes
    code, _, _ = c.call("cuGraphNodeSetEnabled", e, emp, 0, ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE


def test_disabled_nodes_in_an_image_must_be_the_execs():
    from gpuproxy.proxyd.core.session import CudaError
    from gpuproxy.proxyd.families.graph_exec_state import rebuild_disabled, skipped_positions
    info = {"index": {4: [0], 9: [1, 2]}}
    rebuild_disabled(info, [9], "executable graph 1")
    assert skipped_positions(type("E", (), {"info": info})()) == {1, 2}
    with pytest.raises(CudaError):
        rebuild_disabled({"index": {4: [0]}}, [5], "executable graph 1")


RUNTIME = r"""
import ctypes, json
from ctypes import byref, c_size_t, c_uint, c_void_p
rt = ctypes.CDLL("libcudart.so.13")
P = c_void_p
out = {}
buf, st, g, g2 = P(), P(), P(), P()
assert rt.cudaMalloc(byref(buf), 64) == 0 and rt.cudaStreamCreate(byref(st)) == 0
assert rt.cudaGraphCreate(byref(g), 0) == 0
out["begin"] = rt.cudaStreamBeginCaptureToGraph(st, g, None, None, c_size_t(0), 0)
rt.cudaMemsetAsync(buf, 9, c_size_t(64), st)
out["end"] = [rt.cudaStreamEndCapture(st, byref(g2)), g2.value == g.value]
a, b = P(), P()
assert rt.cudaGraphAddEmptyNode(byref(a), g, None, c_size_t(0)) == 0
assert rt.cudaGraphAddEmptyNode(byref(b), g, byref(a), c_size_t(1)) == 0
deps, ed, n = (P * 2)(), ctypes.create_string_buffer(16), c_size_t(2)
out["deps"] = [rt.cudaGraphNodeGetDependencies(b, deps, ed, byref(n)), n.value, deps[0] == a.value]
n = c_size_t(0)
out["dependents"] = [rt.cudaGraphNodeGetDependentNodes(a, None, None, byref(n)), n.value]
e = P()
assert rt.cudaGraphInstantiate(byref(e), g, ctypes.c_ulonglong(0)) == 0
en = c_uint(5)
out["enabled_empty"] = rt.cudaGraphNodeGetEnabled(e, a, byref(en))       # empty node: invalid value
assert rt.cudaGraphLaunch(e, st) == 0 and rt.cudaStreamSynchronize(st) == 0
host = ctypes.create_string_buffer(64)
rt.cudaMemcpy(host, buf, c_size_t(64), 2)
out["bytes"] = host.raw == b"\x09" * 64
print(json.dumps(out))
"""


def test_runtime_twins(emu_daemon):
    import json
    import subprocess
    import sys
    from conftest import client_env
    r = subprocess.run([sys.executable, "-c", RUNTIME], capture_output=True, text=True, timeout=60,
                       env=client_env(emu_daemon))
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout.strip().splitlines()[-1])
    assert o["begin"] == 0 and o["end"] == [0, True]
    assert o["deps"] == [0, 1, True] and o["dependents"] == [0, 1]
    assert o["enabled_empty"] == 1          # cudaErrorInvalidValue
    assert o["bytes"], "the captured memset ran at the launch"
    assert "not supported" not in r.stderr
