"""proxyd's model of graphs built explicitly (proxyd/families/graph_nodes.py), on the
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


def new_event(c, flags=0):
    """cuEventCreate as the shim sends it (spec `ids: shim`,
    interceptor/ipc_event.c): the handle chosen by the client, nothing
    answered; a synchronous call on the event shows the create ran."""
    _shim_event_ids[0] += 1
    ev = (5 << 32) | 0x80000000 | _shim_event_ids[0]
    ok(c, "cuEventCreate", ev, flags)
    ok(c, "cuEventQuery", ev)
    return ev


_shim_event_ids = [0]


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


# ------------------------------------------------------------ graph memory nodes (proxyd/families/graph_mem.py)

CUDA_ERROR_NOT_FOUND = 500


def alloc_params(size, handle_types=0):
    """CUDA_MEM_ALLOC_NODE_PARAMS as the shim sends it (interceptor/graph_mem.c):
    [bytesize, allocType pinned, handleTypes, location type device, device 0]."""
    return [size, 1, handle_types, 1, 0]


def call_or_async(c, name, *args):
    """(code, message) of a call, where the failure of an asynchronous op
    (a launch) counts too: it comes back as the reply's async code, with
    this reply or the next (docs/protocol.md, "Reply")."""
    from wire import P
    rep = c.request(P.MSG_CALL, [[FID[name], c.ctx, *args]])
    msg = rep[5] if len(rep) > 5 else ""
    return (rep[1] or (rep[3] if len(rep) > 3 else 0) or 0), msg


def sync_code(c):
    """The code of the next synchronous reply, with an asynchronous launch's
    failure."""
    return call_or_async(c, "cuCtxSynchronize")


def test_graph_allocation_lives_from_launch_until_freed(client):
    c = client
    g = ok(c, "cuGraphCreate", True, 0)[0]
    node, addr = ok(c, "cuGraphAddMemAllocNode", True, g, [], 0, alloc_params(4096))
    assert addr, "no address for the alloc node"
    assert ok(c, "cuGraphMemAllocNodeGetParams", node, True) == [addr, 4096, 0]
    assert ok(c, "cuGraphNodeGetType", node, True) == [10]          # CU_GRAPH_NODE_TYPE_MEM_ALLOC
    add(c, "cuGraphAddMemsetNode", g, [node], memset_op(c, addr, 7, 4096), None)
    e = ok(c, "cuGraphInstantiateWithFlags", True, g, 0)[0]
    ok(c, "cuGraphDestroy", g)                  # the executable graph keeps the allocation
    ok(c, "cuGraphLaunch", e, 0)
    ok(c, "cuCtxSynchronize")
    assert ok(c, "cuMemcpyDtoH_v2", None, addr, 4096)[0] == b"\x07" * 4096   # live after the launch
    # cuda.h (cuGraphLaunch): a launch while the allocation is live fails
    code, msg = call_or_async(c, "cuGraphLaunch", e, 0)
    if code == 0:
        code, msg = sync_code(c)
    assert code == CUDA_ERROR_INVALID_VALUE and "not been freed" in msg, (code, msg)
    ok(c, "cuMemFree_v2", addr)                 # freed outside the graph
    code, _, msg = c.call("cuMemFree_v2", addr, ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE and "not allocated" in msg, (code, msg)
    ok(c, "cuGraphLaunch", e, 0)                # allowed again, same address
    ok(c, "cuMemFreeAsync", addr, 0)
    ok(c, "cuGraphExecDestroy", e)              # no graph holds it and it is free: back to the arena
    code, _, _ = c.call("cuMemGetAddressRange_v2", True, True, addr, ctx=c.ctx)
    assert code == CUDA_ERROR_NOT_FOUND


def test_auto_free_on_launch_and_a_free_node_of_another_graph(client):
    c = client
    g = ok(c, "cuGraphCreate", True, 0)[0]
    _node, addr = ok(c, "cuGraphAddMemAllocNode", True, g, [], 0, alloc_params(256))
    e = ok(c, "cuGraphInstantiateWithFlags", True, g, 1)[0]     # CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH
    ok(c, "cuGraphLaunch", e, 0)
    ok(c, "cuGraphLaunch", e, 0)                # frees first, then allocates again
    assert sync_code(c)[0] == 0
    gf = ok(c, "cuGraphCreate", True, 0)[0]
    fnode = add(c, "cuGraphAddMemFreeNode", gf, [], addr)
    assert ok(c, "cuGraphMemFreeNodeGetParams", fnode, True) == [addr]
    ef = ok(c, "cuGraphInstantiateWithFlags", True, gf, 0)[0]
    ok(c, "cuGraphLaunch", ef, 0)
    assert sync_code(c)[0] == 0
    code, msg = call_or_async(c, "cuGraphLaunch", ef, 0)     # frees it a second time: refused
    if code == 0:
        code, msg = sync_code(c)
    assert code == CUDA_ERROR_INVALID_VALUE and "not an allocated graph allocation" in msg, (code, msg)


def test_memory_node_rules(client):
    c = client
    plain = ok(c, "cuMemAlloc_v2", True, 256)[0]
    g = ok(c, "cuGraphCreate", True, 0)[0]
    code, _, msg = c.call("cuGraphAddMemFreeNode", True, g, [], 0, plain, ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE and "not a graph allocation" in msg, msg
    code, _, msg = c.call("cuGraphAddMemAllocNode", True, g, [], 0, alloc_params(256, handle_types=1), ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE and "exported" in msg, msg
    node, addr = ok(c, "cuGraphAddMemAllocNode", True, g, [], 0, alloc_params(256))
    add(c, "cuGraphAddMemFreeNode", g, [node], addr)
    code, _, msg = c.call("cuGraphAddMemFreeNode", True, g, [node], 1, addr, ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE and "frees" in msg, msg
    # cuda.h: such a graph cannot be cloned, be a child graph, or lose nodes
    code, _, msg = c.call("cuGraphClone", True, g, ctx=c.ctx)
    assert code == CUDA_ERROR_NOT_SUPPORTED and "cloned" in msg, msg
    parent = ok(c, "cuGraphCreate", True, 0)[0]
    code, _, msg = c.call("cuGraphAddChildGraphNode", True, parent, [], 0, g, ctx=c.ctx)
    assert code == CUDA_ERROR_NOT_SUPPORTED and "child" in msg, msg
    code, _, msg = c.call("cuGraphDestroyNode", node, ctx=c.ctx)
    assert code == CUDA_ERROR_NOT_SUPPORTED, msg
    # attributes: every graph allocation that exists is counted
    assert ok(c, "cuDeviceGetGraphMemAttribute", 0, 0, 8) == [256]      # USED_MEM_CURRENT
    code, _, msg = c.call("cuDeviceSetGraphMemAttribute", 0, 1, (5).to_bytes(8, "little"), ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE, msg
    ok(c, "cuDeviceSetGraphMemAttribute", 0, 1, bytes(8))
    ok(c, "cuDeviceGraphMemTrim", 0)
    ok(c, "cuGraphDestroy", g)                  # never instantiated: its memory goes with it
    assert ok(c, "cuDeviceGetGraphMemAttribute", 0, 0, 8) == [0]


def test_stream_ordered_allocation_captured(client):
    c = client
    s = ok(c, "cuStreamCreate", True, 1)[0]
    plain = ok(c, "cuMemAlloc_v2", True, 256)[0]
    ok(c, "cuStreamBeginCapture_v2", s, 0)
    a = ok(c, "cuMemAllocAsync", True, 512, s)[0]
    assert a, "a captured cuMemAllocAsync returns its address at once"
    ok(c, "cuMemsetD8Async", a, 3, 512, s)
    code, _, msg = c.call("cuMemFreeAsync", plain, s, ctx=c.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE and "not a graph allocation" in msg, msg
    ok(c, "cuMemcpyDtoDAsync_v2", plain, a, 256, s)
    ok(c, "cuMemFreeAsync", a, s)
    g = ok(c, "cuStreamEndCapture", s, True)[0]
    e = ok(c, "cuGraphInstantiateWithFlags", True, g, 0)[0]
    ok(c, "cuGraphLaunch", e, s)
    ok(c, "cuGraphLaunch", e, s)                # freed inside the graph: relaunching is fine
    assert sync_code(c)[0] == 0
    assert ok(c, "cuMemcpyDtoH_v2", None, plain, 256)[0] == b"\x03" * 256


def test_event_records_in_a_capture_are_dependencies_not_nodes(client):
    """cuda.h, cuEventRecordWithFlags: only an external record becomes a
    node of the captured graph; a plain record marks a dependency for
    streams that join the capture. So the app may destroy the event after
    the capture (NVIDIA's graphMemoryNodes sample does) and the graph still
    launches, and the fork/join through it still captures the joined
    stream's work."""
    c = client
    s1 = ok(c, "cuStreamCreate", True, 1)[0]
    s2 = ok(c, "cuStreamCreate", True, 1)[0]
    fork = new_event(c)
    join = new_event(c)
    ext = new_event(c)
    buf = ok(c, "cuMemAlloc_v2", True, 64)[0]
    ok(c, "cuStreamBeginCapture_v2", s1, 0)
    ok(c, "cuEventRecord", fork, s1)
    ok(c, "cuStreamWaitEvent", s2, fork, 0)           # s2 joins the capture
    ok(c, "cuMemsetD8Async", buf, 7, 32, s2)
    ok(c, "cuEventRecord", join, s2)
    ok(c, "cuStreamWaitEvent", s1, join, 0)           # and joins back
    ok(c, "cuMemsetD8Async", buf + 32, 9, 32, s1)
    ok(c, "cuEventRecordWithFlags", ext, s1, 1)       # CU_EVENT_RECORD_EXTERNAL: stays a node
    g = ok(c, "cuStreamEndCapture", s1, True)[0]
    e = ok(c, "cuGraphInstantiateWithFlags", True, g, 0)[0]
    ok(c, "cuEventDestroy_v2", fork)
    ok(c, "cuEventDestroy_v2", join)
    ok(c, "cuGraphLaunch", e, s1)
    assert sync_code(c)[0] == 0, "the graph launches although its plain events are gone"
    assert ok(c, "cuMemcpyDtoH_v2", None, buf, 64)[0] == b"\x07" * 32 + b"\x09" * 32
    ok(c, "cuEventDestroy_v2", ext)
