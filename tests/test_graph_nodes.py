"""proxyd's model of graphs built explicitly (proxyd/graph_nodes.py), on the
wire: execution order follows the edges, not creation order; bad graphs
and node operations are refused with a clear error; cuGraphExecUpdate
refuses another topology; destroying a graph takes its nodes along.
The whole feature, through the shim and across a checkpoint, is the corpus
program graph_explicit (tests/programs/graph_explicit.cu)."""
from __future__ import annotations

import pytest

from wire import FID, WireClient

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_NOT_SUPPORTED = 801
CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED = 2


@pytest.fixture
def client(emu_daemon):
    with WireClient(emu_daemon.endpoint) as c:
        c.hello()
        c.ctx = c.context()
        yield c
        c.bye()


def ok(c, name, *args):
    code, outs, msg = c.call(name, *args, ctx=c.ctx)
    assert code == 0, (name, code, msg)
    return outs


def memset_op(c, dst, value, n):
    """The op a memset node carries (interceptor/graph_build.c): cuMemsetD8Async on stream 0."""
    return [FID["cuMemsetD8Async"], c.ctx, dst, value, n, 0]


def add(c, name, graph, deps, *payload):
    return ok(c, name, True, graph, list(deps), len(deps), *payload)[0]


def test_launch_follows_edges_not_creation_order(client):
    c = client
    buf = ok(c, "cuMemAlloc_v2", True, 64)[0]
    g = ok(c, "cuGraphCreate", True, 0)[0]
    a = add(c, "cuGraphAddMemsetNode", g, [], memset_op(c, buf, 1, 64), None)
    b = add(c, "cuGraphAddMemsetNode", g, [], memset_op(c, buf, 2, 64), None)
    # b -> a: a (created first) must run last
    ok(c, "cuGraphAddDependencies_v2", g, [b], [a], None, 1)
    e = ok(c, "cuGraphInstantiateWithFlags", True, g, 0)[0]
    ok(c, "cuGraphLaunch", e, 0)
    ok(c, "cuCtxSynchronize")
    assert ok(c, "cuMemcpyDtoH_v2", None, buf, 64)[0] == b"\x01" * 64
    # the other way round
    ok(c, "cuGraphRemoveDependencies_v2", g, [b], [a], None, 1)
    ok(c, "cuGraphAddDependencies_v2", g, [a], [b], None, 1)
    e2 = ok(c, "cuGraphInstantiateWithFlags", True, g, 0)[0]
    ok(c, "cuGraphLaunch", e2, 0)
    ok(c, "cuCtxSynchronize")
    assert ok(c, "cuMemcpyDtoH_v2", None, buf, 64)[0] == b"\x02" * 64


def test_a_cycle_is_refused_at_instantiation(client):
    c = client
    g = ok(c, "cuGraphCreate", True, 0)[0]
    a = add(c, "cuGraphAddEmptyNode", g, [])
    b = add(c, "cuGraphAddEmptyNode", g, [a])
    ok(c, "cuGraphAddDependencies_v2", g, [b], [a], None, 1)
    code, _, msg = c.call("cuGraphInstantiateWithFlags", True, g, 0, ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE and "cycle" in msg, (code, msg)


def test_bad_dependencies_are_refused(client):
    c = client
    g1 = ok(c, "cuGraphCreate", True, 0)[0]
    g2 = ok(c, "cuGraphCreate", True, 0)[0]
    n1 = add(c, "cuGraphAddEmptyNode", g1, [])
    code, _, msg = c.call("cuGraphAddEmptyNode", True, g2, [n1], 1, ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE and "another graph" in msg, msg
    code, _, msg = c.call("cuGraphAddEmptyNode", True, g1, [n1, n1], 2, ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE and "duplicate" in msg, msg
    code, _, msg = c.call("cuGraphAddEmptyNode", True, g1, [n1], 2, ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE, msg
    code, _, msg = c.call("cuGraphAddDependencies_v2", g1, [n1], [n1], None, 1, ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE, msg


def test_bad_node_operations_are_refused(client):
    c = client
    buf = ok(c, "cuMemAlloc_v2", True, 64)[0]
    g = ok(c, "cuGraphCreate", True, 0)[0]
    # a copy into pageable host memory has nowhere to put its bytes when the graph runs
    dtoh = [FID["cuMemcpyDtoHAsync_v2"], c.ctx, 64, buf, 64, 0]
    code, _, msg = c.call("cuGraphAddMemcpyNode", True, g, [], 0, dtoh, None, ctx=c.ctx)
    assert code == CUDA_ERROR_NOT_SUPPORTED and "pageable" in msg, (code, msg)
    htod = [FID["cuMemcpyHtoDAsync_v2"], c.ctx, buf, b"x" * 64, 64, 0]
    code, _, msg = c.call("cuGraphAddMemcpyNode", True, g, [], 0, htod, None, ctx=c.ctx)
    assert code == CUDA_ERROR_NOT_SUPPORTED and "pageable" in msg, (code, msg)
    # an op that is not what the node type runs
    code, _, msg = c.call("cuGraphAddMemsetNode", True, g, [], 0, [FID["cuMemAlloc_v2"], c.ctx, True, 64], None,
                          ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE and "cannot be a node" in msg, (code, msg)
    # malformed: wrong argument count, wrong types, unknown kernel
    code, _, msg = c.call("cuGraphAddMemsetNode", True, g, [], 0, memset_op(c, buf, 1, 64)[:-1], None, ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE, msg
    code, _, msg = c.call("cuGraphAddMemsetNode", True, g, [], 0, "nonsense", None, ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE, msg
    launch = [FID["cuLaunchKernel"], c.ctx, (3 << 32) | 999, 1, 1, 1, 1, 1, 1, 0, 0, b"", None]
    code, _, msg = c.call("cuGraphAddKernelNode_v2", True, g, [], 0, launch, ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_HANDLE, (code, msg)
    code, outs, _ = c.call("cuGraphGetNodes", g, True, True, ctx=c.ctx)
    assert code == 0 and outs[1] == 0, "a refused node was added"


def test_exec_update_refuses_another_topology(client):
    c = client
    g1 = ok(c, "cuGraphCreate", True, 0)[0]
    a = add(c, "cuGraphAddEmptyNode", g1, [])
    add(c, "cuGraphAddEmptyNode", g1, [a])
    e = ok(c, "cuGraphInstantiateWithFlags", True, g1, 0)[0]
    g2 = ok(c, "cuGraphCreate", True, 0)[0]
    add(c, "cuGraphAddEmptyNode", g2, [])
    add(c, "cuGraphAddEmptyNode", g2, [])       # same nodes, no edge
    assert ok(c, "cuGraphExecUpdate_v2", e, g2, True)[0] == CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED
    clone = ok(c, "cuGraphClone", True, g1)[0]
    assert ok(c, "cuGraphExecUpdate_v2", e, clone, True)[0] == 0


def test_destroying_a_graph_destroys_its_nodes(client):
    c = client
    g = ok(c, "cuGraphCreate", True, 0)[0]
    n = add(c, "cuGraphAddEmptyNode", g, [])
    assert ok(c, "cuGraphNodeGetType", n, True)[0] == 5       # CU_GRAPH_NODE_TYPE_EMPTY
    ok(c, "cuGraphDestroy", g)
    code, _, msg = c.call("cuGraphNodeGetType", n, True, ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_HANDLE, (code, msg)


def test_a_bounced_copy_is_a_host_function_and_a_copy_in_order(client):
    """A memcpy node with pageable memory carries [host function, copy to the
    device] or [copy to the host, host function] (interceptor/graph_build.c);
    any other pair is refused."""
    c = client
    buf = ok(c, "cuMemAlloc_v2", True, 64)[0]
    g = ok(c, "cuGraphCreate", True, 0)[0]
    dtod = [FID["cuMemcpyDtoDAsync_v2"], c.ctx, buf, buf, 64, 0]
    for pair in ([dtod, dtod], [memset_op(c, buf, 1, 64), dtod], [dtod]):
        code, _, msg = c.call("cuGraphAddMemcpyNode", True, g, [], 0, pair, None, ctx=c.ctx)
        assert code == CUDA_ERROR_INVALID_VALUE, (pair, code, msg)
    # a bounced copy is a memcpy node only
    code, _, msg = c.call("cuGraphAddMemsetNode", True, g, [], 0, [dtod, dtod], None, ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE, (code, msg)
