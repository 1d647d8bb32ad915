"""Edge data of graphs built explicitly (cuda.h CUgraphEdgeData: cuGraphAddNode_v2
with dependencyData, cuGraphAddDependencies_v2, cuGraphRemoveDependencies_v2,
cuGraphGetEdges_v2, cuGraphNodeGetDependencies(_v2),
cuGraphNodeGetDependentNodes(_v2); proxyd/families/graph_edges.py), through
the shim on the emulated backend: a programmatic edge between two kernel
nodes is kept, reported and run as a dependency; the driver's rules refuse
bad edges (reserved bytes, to_port, programmatic edges off kernel nodes)
without changing the graph; a query without an edge-data array fails as
lossy; and the graph with its edge data (and a node disabled in its
executable graph) survives a dump and a restore.

The expected values are cuda.h's (return codes, the data the caller gave),
and the kernel results the order the edges impose (p = p * 10 + a per
kernel), not anything proxyd computes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

APP = r'''
import ctypes, json, struct, sys
from ctypes import byref, c_int, c_size_t, c_uint, c_uint64, c_void_p
cu = ctypes.CDLL("libcuda.so.1")
P = c_void_p
assert cu.cuInit(0) == 0
ctx = P()
assert cu.cuDevicePrimaryCtxRetain(byref(ctx), 0) == 0
assert cu.cuCtxSetCurrent(ctx) == 0
ptx = (b".version 7.8\n.target sm_75\n.address_size 64\n"
       b".visible .entry gp_edge_step(.param .u64 p, .param .u32 n, .param .u32 a)\n{\n    ret;\n}\n\0")
mod, fn = P(), P()
assert cu.cuModuleLoadData(byref(mod), ptx) == 0
assert cu.cuModuleGetFunction(byref(fn), mod, b"gp_edge_step") == 0
N = 64
d = c_uint64()
assert cu.cuMemAlloc_v2(byref(d), 4 * N) == 0
assert cu.cuMemsetD32_v2(d, 1, N) == 0
out = {}

def kernel_params(args):
    """CUgraphNodeParams (256 bytes) of a kernel node: type 0, the
    CUDA_KERNEL_NODE_PARAMS_v3 at offset 16 (cuda.h)."""
    b = ctypes.create_string_buffer(256)
    struct.pack_into("<i", b, 0, 0)
    struct.pack_into("<Q6IIxxxxQ", b, 16, fn.value, 1, 1, 1, N, 1, 1, 0, ctypes.addressof(args))
    return b

def edge(f=0, t=0, ty=0, reserved=b"\0" * 5):
    return struct.pack("<BBB5s", f, t, ty, reserved)

def add_kernel(g, deps, data, a):
    pv, nv, av = c_uint64(d.value), c_uint(N), c_int(a)
    args = (P * 3)(ctypes.cast(byref(pv), P), ctypes.cast(byref(nv), P), ctypes.cast(byref(av), P))
    np_ = kernel_params(args)
    node = P()
    dep_arr = (P * max(1, len(deps)))(*deps)
    ed = ctypes.create_string_buffer(b"".join(data), max(1, 8 * len(data))) if data else None
    rc = cu.cuGraphAddNode_v2(byref(node), g, dep_arr if deps else None, ed, c_size_t(len(deps)), np_)
    return rc, node.value

def edges(g, with_data=True):
    n = c_size_t(0)
    rc0 = cu.cuGraphGetEdges_v2(g, None, None, None, byref(n))
    cap = n.value
    fr, to = (P * max(cap, 1))(), (P * max(cap, 1))()
    ed = ctypes.create_string_buffer(8 * max(cap, 1))
    m = c_size_t(cap)
    rc = cu.cuGraphGetEdges_v2(g, fr, to, ed if with_data else None, byref(m))
    rows = [[fr[i], to[i], list(ed.raw[8 * i:8 * i + 3])] for i in range(m.value)] if rc == 0 else []
    return [rc0, rc, rows]

def read():
    buf = (c_int * N)()
    assert cu.cuMemcpyDtoH_v2(buf, d, 4 * N) == 0
    return sorted(set(buf))

g = P()
assert cu.cuGraphCreate(byref(g), 0) == 0
rc1, k1 = add_kernel(g, [], [], 2)
# k2 after k1 over a programmatic edge from k1's programmatic port
rc2, k2 = add_kernel(g, [k1], [edge(1, 0, 1)], 3)
out["add"] = [rc1, rc2]
e = P()
assert cu.cuGraphAddEmptyNode(byref(e), g, None, c_size_t(0)) == 0
bad = {}
n_before = c_size_t(0)
cu.cuGraphGetNodes(g, None, byref(n_before))
# a programmatic edge from an empty node, through cuGraphAddNode_v2: refused, no node left behind
bad["programmatic_from_empty"] = add_kernel(g, [e.value], [edge(1, 0, 1)], 5)[0]
n_after = c_size_t(0)
cu.cuGraphGetNodes(g, None, byref(n_after))
out["nodes_unchanged"] = n_before.value == n_after.value
def add_dep(a, b, data):
    fa, tb = (P * 1)(a), (P * 1)(b)
    return cu.cuGraphAddDependencies_v2(g, fa, tb, data, c_size_t(1))
bad["reserved"] = add_dep(k2, e.value, edge(0, 0, 0, b"\1\0\0\0\0"))
bad["to_port"] = add_dep(k2, e.value, edge(0, 1, 0))
bad["programmatic_to_empty"] = add_dep(k2, e.value, edge(1, 0, 1))
bad["port_without_type"] = add_dep(k2, e.value, edge(1, 0, 0))
bad["port_on_empty"] = add_dep(e.value, k2, edge(2, 0, 0))
out["bad"] = bad
# a launch-order edge (default type) from k2 to the empty node is fine
out["launch_order"] = add_dep(k2, e.value, edge(2, 0, 0))
out["edges"] = edges(g)
out["lossy"] = edges(g, with_data=False)[1]
deps, ed, nd = (P * 4)(), ctypes.create_string_buffer(32), c_size_t(4)
out["deps_v2"] = [cu.cuGraphNodeGetDependencies_v2(P(k2), deps, ed, byref(nd)), nd.value, deps[0] == k1,
                  list(ed.raw[:3])]
nd = c_size_t(4)
out["dependents_v1_lossy"] = cu.cuGraphNodeGetDependentNodes(P(k1), deps, byref(nd))
nd = c_size_t(0)
out["dependents_count"] = [cu.cuGraphNodeGetDependentNodes(P(k1), None, byref(nd)), nd.value]
ge = P()
assert cu.cuGraphInstantiateWithFlags(byref(ge), g, c_uint64(0)) == 0
st = P()
assert cu.cuStreamCreate(byref(st), 0) == 0
assert cu.cuGraphLaunch(ge, st) == 0 and cu.cuStreamSynchronize(st) == 0
out["run1"] = read()                 # (1 * 10 + 2) * 10 + 3
out["k"] = [k1, k2, e.value]
out["disable"] = cu.cuGraphNodeSetEnabled(ge, P(k2), c_uint(0))     # kept across the restore too
print(json.dumps(out), flush=True)
sys.stdin.readline()                 # the test dumps and restores here
after = {"edges": edges(g)}
assert cu.cuMemsetD32_v2(d, 1, N) == 0
assert cu.cuGraphLaunch(ge, st) == 0 and cu.cuStreamSynchronize(st) == 0
after["run2"] = read()                # k2 disabled
en = c_uint(7)
after["enabled"] = [cu.cuGraphNodeGetEnabled(ge, P(k2), byref(en)), en.value]
assert cu.cuGraphNodeSetEnabled(ge, P(k2), c_uint(1)) == 0
assert cu.cuMemsetD32_v2(d, 1, N) == 0
assert cu.cuGraphLaunch(ge, st) == 0 and cu.cuStreamSynchronize(st) == 0
after["run3"] = read()
fa, tb = (P * 1)(k1), (P * 1)(k2)
after["remove_default"] = cu.cuGraphRemoveDependencies_v2(g, fa, tb, None, c_size_t(1))
after["remove_matching"] = cu.cuGraphRemoveDependencies_v2(g, fa, tb, edge(1, 0, 1), c_size_t(1))
after["edges_left"] = edges(g)[2]
print(json.dumps(after), flush=True)
'''


def ctl(d, cmd, **args):
    from gpuproxy.proxyd.client import ControlClient
    return ControlClient(d.endpoint, timeout_s=60).call(cmd, args)


def test_edge_data_kept_checked_run_and_restored(shim_installed, fresh_daemon, tmp_path):
    from conftest import client_env
    d = fresh_daemon(emu_kernels=[str(Path(__file__).parent / "data" / "graph_edges_emu.py")])
    app = subprocess.Popen([sys.executable, "-c", APP], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=client_env(d))
    try:
        line = app.stdout.readline()
        assert line, app.stderr.read()
        o = json.loads(line)
        k1, k2, e = o["k"]
        assert o["add"] == [0, 0]
        # every refusal is CUDA_ERROR_INVALID_VALUE (cuda.h) and leaves the graph as it was
        assert o["bad"] == {"programmatic_from_empty": 1, "reserved": 1, "to_port": 1,
                            "programmatic_to_empty": 1, "port_without_type": 1, "port_on_empty": 1}, o["bad"]
        assert o["nodes_unchanged"]
        assert o["launch_order"] == 0
        rc0, rc, rows = o["edges"]
        assert rc0 == 0 and rc == 0
        assert sorted(map(tuple, (tuple([a, b, tuple(x)]) for a, b, x in rows))) == \
            sorted([(k1, k2, (1, 0, 1)), (k2, e, (2, 0, 0))])
        assert o["lossy"] == 402, "CUDA_ERROR_LOSSY_QUERY without an edge-data array"
        assert o["deps_v2"] == [0, 1, True, [1, 0, 1]]
        assert o["dependents_v1_lossy"] == 402
        assert o["dependents_count"] == [0, 1]
        assert o["run1"] == [(1 * 10 + 2) * 10 + 3] and o["disable"] == 0
        st = ctl(d, "dump", pid=app.pid, dir=str(tmp_path / "img"))
        assert st["released"]
        from gpuproxy.proxyd.checkpoint.image import Image
        img = Image.open(str(tmp_path / "img"))
        kept = [n.get("edata") for gr in img.session["graphs"] for n in gr.get("xnodes", []) if n.get("edata")]
        img.close()
        assert sorted(kept) == sorted([[[k1 & 0xFFFFFFFF, 1, 0, 1]], [[k2 & 0xFFFFFFFF, 2, 0, 0]]]), kept
        ctl(d, "restore", dir=str(tmp_path / "img"))
        out, err = app.communicate("go\n", timeout=60)
        assert app.returncode == 0, err
        a = json.loads(out.strip().splitlines()[-1])
        assert a["edges"] == o["edges"], "the edges and their data after the restore"
        assert a["enabled"] == [0, 0] and a["run2"] == [1 * 10 + 2], "k2 stays disabled (graph_exec_nodes.py)"
        assert a["run3"] == [(1 * 10 + 2) * 10 + 3]
        # cuda.h: an edge is removed only with data matching its own
        assert a["remove_default"] == 1 and a["remove_matching"] == 0
        assert [(x, y, z) for x, y, z in a["edges_left"]] == [(k2, e, [2, 0, 0])]
        assert "not supported" not in err
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()


def test_image_edge_data_is_checked(tmp_path):
    """Edge data read back from an image obeys the same rules: one naming a
    node that is no dependency, or a programmatic edge between nodes that
    are not kernels, is refused before the graph exists."""
    from gpuproxy.proxyd.core.session import CudaError
    from gpuproxy.proxyd.families import graph_edges

    info = {"deps": [7], "type": 5}
    with pytest.raises(CudaError):
        graph_edges.rebuild(info, [[8, 1, 0, 1]], "graph 1")
    graph_edges.rebuild(info, [[7, 1, 0, 1]], "graph 1")

    up = type("Node", (), {})()
    up.info = {"type": 5, "deps": []}
    down = type("Node", (), {})()
    down.info = info
    with pytest.raises(CudaError):
        graph_edges.check_rebuilt({7: up, 8: down}, "graph 1")
