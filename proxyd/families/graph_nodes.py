"""CUDA graphs built explicitly (CUDA Programming Guide, "CUDA Graphs",
"Creating a Graph Using Graph APIs"; cuda.h, "Graph Management"):
cuGraphCreate, cuGraphAdd{Kernel,Memcpy,Memset,Host,ChildGraph,Empty,
EventRecord,EventWait}Node, dependencies, topology queries, node and
executable-node parameter updates, cuGraphClone, cuGraphExecUpdate.

Model. A node is a session object (kind graph_node, so its handle keeps its
value across a restore) whose info is
  {"graph": graph id, "type": CUgraphNodeType, "ops": [[fid, ctx, args]...],
   "deps": [node ids], "child": [ops] (child-graph nodes)}.
"ops" are the stream operations the node stands for (one, none for an
empty node, two for a copy with pageable host memory: the copy through a
page-locked bounce buffer and the host function that moves the bytes
between it and the application's memory, in the application), exactly as the shim would
send it for the equivalent stream call (cuLaunchKernel, cuMemcpy*Async,
cuMemsetD*Async, cuLaunchHostFunc, cuEventRecord, cuStreamWaitEvent), with
stream 0: the shim builds it with the same marshalling as the call
(interceptor/graph_build.c), so a kernel node's parameters are packed by
the function's layout like a launch's. A graph built this way lists its
nodes in creation order under "xnodes" (graphs.py keeps the ops of a
captured graph under "nodes"; a graph may have both, captured ops first).

Memory nodes (cuGraphAddMemAllocNode, cuGraphAddMemFreeNode) carry one
marker op each, which graphs.h_launch hands to graph_mem.py instead of
dispatching it; a graph with memory nodes cannot be cloned, be a child
graph, or lose nodes (cuda.h).

A child-graph node holds the child's ops, flattened when the node is added:
cuGraphAddChildGraphNode clones the child (cuda.h: "The node executes an
embedded child graph. The child graph is cloned in this call"), so later
changes to the child do not reach the parent.

Instantiation (graphs.h_instantiate) flattens the graph into one op list in
a topological order (Kahn's algorithm, ties broken by creation order) and
keeps, per node, the positions of its ops ("index"), which the exec-node
setters and cuGraphExecUpdate rewrite. A launch runs the list in order on
the launch stream (graphs.h_launch), on the GPU and emulated alike: every
edge is kept; independent branches run one after the other.

Checkpoint: graphs.describe writes the nodes of each graph and the index of
each executable graph; graphs.rebuild restores them under their ids.

Locking: the worker's main loop only (dispatch.py).
"""
from __future__ import annotations

import heapq
import struct

from ..core import protocol as P
from ..core.registry import CUDA_SUCCESS, bad_argument, handler
from ..core.session import CudaError
from . import graph_edges

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910

K_GRAPH_NODE = P.K_GRAPH_NODE

# CUgraphNodeType (cuda.h)
T_KERNEL, T_MEMCPY, T_MEMSET, T_HOST, T_GRAPH, T_EMPTY, T_WAIT_EVENT, T_EVENT_RECORD = range(8)
T_MEM_ALLOC, T_MEM_FREE = 10, 11
# CUgraphExecUpdateResult (cuda.h)
UPDATE_SUCCESS, UPDATE_ERROR, UPDATE_TOPOLOGY_CHANGED, UPDATE_NODE_TYPE_CHANGED = 0, 1, 2, 3
UPDATE_FUNCTION_CHANGED, UPDATE_PARAMETERS_CHANGED, UPDATE_NOT_SUPPORTED = 4, 5, 6

# the node type each add function creates (the shim sends the payload op)
ADD_TYPES = {
    "cuGraphAddKernelNode_v2": T_KERNEL, "cuGraphAddMemcpyNode": T_MEMCPY, "cuGraphAddMemsetNode": T_MEMSET,
    "cuGraphAddHostNode": T_HOST, "cuGraphAddChildGraphNode": T_GRAPH, "cuGraphAddEmptyNode": T_EMPTY,
    "cuGraphAddEventRecordNode": T_EVENT_RECORD, "cuGraphAddEventWaitNode": T_WAIT_EVENT,
    "cuGraphAddMemFreeNode": T_MEM_FREE,
}
# which stream operations may stand for a node of each type (by handler, or name for generic ones)
OP_HANDLERS = {
    T_KERNEL: {"launch_kernel"},
    T_MEMCPY: {"memcpy_htod", "memcpy_dtoh", "memcpy_dtod"},
    T_MEMSET: {"memset", "memset2d"},
    T_HOST: {"host_func"},
}
WAIT_NAMES = {"cuStreamWaitEvent"}


# Node types a higher family turns into one op when a graph is flattened:
# type -> (sess, node) -> op (graph_cond.py: a conditional node with its
# bodies as they are now); and what it adds to an executable graph's info:
# (sess, graph) -> dict.
EXPAND: dict = {}
INSTANTIATE: list = []
# (sess, graph) -> None, raising CudaError: checks before anything of the
# executable graph is made (graph_cond.py: handles no node uses)
INSTANTIATE_CHECK: list = []
# (sess, node) -> None when a node goes; (sess, graph, what) -> None, raising
# CudaError, for a graph about to be a child graph or cloned
DROP_NODE: list = []
NO_CHILD: list = []
# (sess, exec, node) -> (op list, positions) for a node an executable graph
# holds outside its own list (graph_cond.py: nodes of conditional bodies), or None
EXEC_NODE_AT: list = []
# op -> node id where a captured op stands for a node added to the graph
# while it was captured (graph_cond_capture.py: conditional nodes), else None
CAPTURED_NODE: list = []


def _fid(name: str) -> int:
    from .._generated import NAMES
    for k, v in NAMES.items():
        if v == name:
            return k
    raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{name} is not known to proxyd")


def is_marker(fid: int) -> bool:
    """An op that stands for a graph memory node (graph_mem.py)."""
    from .._generated import NAMES
    return NAMES.get(fid) in ("cuGraphAddMemAllocNode", "cuGraphAddMemFreeNode")


def alloc_marker(ctxh: int, addr: int, size: int) -> list:
    return [_fid("cuGraphAddMemAllocNode"), ctxh, [addr, size]]


def free_marker(ctxh: int, addr: int) -> list:
    return [_fid("cuGraphAddMemFreeNode"), ctxh, [addr]]


def frozen(a):
    """An argument kept beyond its message (frames are reused)."""
    if isinstance(a, (memoryview, bytearray)):
        return bytes(a)
    if isinstance(a, list):
        return [frozen(x) for x in a]
    return a


def _ids(v, what: str) -> list[int]:
    """A list of node handles sent by the shim as a msgpack array."""
    if v is None:
        return []
    if not isinstance(v, list) or any(type(x) is not int for x in v):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: node handles must be a list of integers")
    return v


def node(sess, handle):
    return sess.get(K_GRAPH_NODE, int(handle or 0))


def graph(sess, handle):
    return sess.get(P.K_GRAPH, int(handle or 0))


def _check_ops(sess, ntype: int, raw, what: str) -> list:
    """The ops of a node: one op, or for a memcpy node with pageable host
    memory [host function, copy] / [copy, host function] (interceptor/
    graph_build.c, bounce buffers)."""
    if isinstance(raw, list) and raw and isinstance(raw[0], list):
        if ntype != T_MEMCPY or len(raw) != 2:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: malformed node operations")
        from .._generated import FUNCTIONS
        kinds = [getattr(FUNCTIONS.get(r[0] if r and type(r[0]) is int else -1), "handler", None) for r in raw]
        if kinds not in (["host_func", "memcpy_htod"], ["memcpy_dtoh", "host_func"]):
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: a bounced copy is a host function and a copy")
        return [_check_op(sess, T_HOST if k == "host_func" else T_MEMCPY, r, what) for k, r in zip(kinds, raw)]
    return [_check_op(sess, ntype, raw, what)]


def _check_op(sess, ntype: int, raw, what: str) -> list:
    """The stream operation of a node of type ntype, checked like an op of
    the wire (function, argument count and types, object handles) and kept
    beyond its message."""
    from .._generated import FUNCTIONS
    if not isinstance(raw, list) or len(raw) < 2 or type(raw[0]) is not int or type(raw[1]) is not int:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: malformed node operation")
    fn = FUNCTIONS.get(raw[0])
    if fn is None:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: unknown node operation {raw[0]}")
    ok = fn.name in WAIT_NAMES if ntype == T_WAIT_EVENT else fn.handler in OP_HANDLERS.get(ntype, ())
    if not ok:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: {fn.name} cannot be a node of type {ntype}")
    args = raw[2:]
    if len(args) != len(fn.params):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: {fn.name} with {len(args)} arguments")
    bad = bad_argument(fn, args)
    if bad:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: {bad}")
    for (name, role, kind, *_r), a in zip(fn.params, args):
        if role == "handle" and kind not in ("stream", "memory", "device", None) and a:
            code = P.KIND_CODES.get(kind)
            if code is not None:
                sess.get(code, int(a))
    if fn.handler == "memcpy_dtoh" and not isinstance(args[0], P.ShmRef):
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{what}: a copy node into pageable host memory is not supported")
    if fn.handler == "memcpy_htod" and not isinstance(args[1], P.ShmRef):
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{what}: a copy node from pageable host memory is not supported")
    if raw[1]:
        sess.context(raw[1])
    return [raw[0], raw[1], frozen(list(args))]


def flatten(sess, g) -> tuple[list, dict]:
    """The ops of graph g in a topological order, and per explicit node the
    positions of its ops. Captured ops (graphs.py) come first, in capture
    order."""
    ops: list = []
    index: dict[int, list[int]] = {}
    for op in g.info.get("nodes", []):
        nid = next((x for x in (f(op) for f in CAPTURED_NODE) if x is not None), None)
        if nid is not None:     # a node added during the capture, in its place in capture order
            n = node(sess, P.make_handle(K_GRAPH_NODE, nid))
            index[nid] = [len(ops)]
            ops.append(EXPAND[n.info["type"]](sess, n))
            continue
        ops.append(list(op))
    xs = [node(sess, P.make_handle(K_GRAPH_NODE, i)) for i in g.info.get("xnodes", [])]
    if not xs:
        return ops, index
    order = {n.id: k for k, n in enumerate(xs)}
    indeg = {n.id: len(n.info["deps"]) for n in xs}
    succ: dict[int, list[int]] = {n.id: [] for n in xs}
    for n in xs:
        for d in n.info["deps"]:
            succ[d].append(n.id)
    # Kahn's algorithm; the ready node created first goes first
    ready = [(order[i], i) for i, k in indeg.items() if k == 0]
    heapq.heapify(ready)
    byid = {n.id: n for n in xs}
    done = 0
    while ready:
        _, i = heapq.heappop(ready)
        done += 1
        n = byid[i]
        pos = []
        if i in index:
            pos = index[i]      # placed with the captured ops
        elif n.info["type"] in EXPAND:
            pos.append(len(ops))
            ops.append(EXPAND[n.info["type"]](sess, n))
        elif n.info["type"] == T_GRAPH:
            for op in n.info["child"]:
                pos.append(len(ops))
                ops.append(list(op))
        else:
            for op in n.info["ops"]:
                pos.append(len(ops))
                ops.append(list(op))
        index[i] = pos
        for s in succ[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, (order[s], s))
    if done != len(xs):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, "the graph has a cycle")
    return ops, index


def _xnodes(g) -> list:
    return g.info.setdefault("xnodes", [])


@handler("graph_create")
def h_create(d, sess, fn, ctx, args, **kw):
    if int(args[1] or 0) != 0:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: flags must be 0")
    g = sess.add(P.K_GRAPH, None, ctx.id if ctx else 0, {"nodes": [], "origin": 0, "capturing": False,
                                                         "xnodes": []})
    return CUDA_SUCCESS, [g.handle if args[0] else None]


def add_node_info(sess, fn, args, ntype: int):
    """The checks every add call makes ([out, graph, [dependency handles],
    count, ...]); returns the graph and the new node's info, without ops."""
    g = graph(sess, args[1])
    if g.info.get("capturing"):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the graph is being captured")
    deps = _ids(args[2], fn.name)
    if len(deps) != int(args[3] or 0):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {len(deps)} dependencies for numDependencies "
                                                  f"{args[3]}")
    dep_ids = []
    for h in deps:
        n = node(sess, h)
        if n.info["graph"] != g.id:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: a dependency belongs to another graph")
        if n.id in dep_ids:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: duplicate dependency")
        dep_ids.append(n.id)
    return g, {"graph": g.id, "type": ntype, "ops": [], "deps": dep_ids}


def commit_node(sess, g, info):
    n = sess.add(K_GRAPH_NODE, None, g.ctx, info)
    _xnodes(g).append(n.id)
    return n


def has_memory_nodes(sess, g) -> bool:
    """cuda.h (cuGraphAddMemAllocNode): a graph with memory allocation or
    free nodes cannot be cloned or be a child graph, and its nodes and
    edges cannot be deleted."""
    if g.info.get("mem"):
        return True
    for op in g.info.get("nodes", []):
        if is_marker(op[0]):
            return True
    return any(sess.objects[(K_GRAPH_NODE, i)].info["type"] in (T_MEM_ALLOC, T_MEM_FREE) for i in _xnodes(g))


def _refuse_memory_nodes(sess, g, fn, what: str):
    if has_memory_nodes(sess, g):
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name}: a graph with memory nodes {what} (cuda.h)")


@handler("graph_add_node")
def h_add_node(d, sess, fn, ctx, args, **kw):
    """[out, graph, [dependency handles], count, payload...]: the payload is
    the node's op (kernel, memcpy, memset, host), an event handle, a child
    graph handle, a graph allocation's address (free node), or nothing
    (empty)."""
    ntype = ADD_TYPES[fn.name]
    g, info = add_node_info(sess, fn, args, ntype)
    ctxh = kw.get("ctxh", 0)
    if ntype in OP_HANDLERS:
        info["ops"] = _check_ops(sess, ntype, args[4], fn.name)
    elif ntype == T_EVENT_RECORD:
        # the record of the launch stream at this point of the graph
        ev = sess.get(P.K_EVENT, int(args[4] or 0))
        info["ops"] = [[_fid("cuEventRecord"), ctxh, [ev.handle, 0]]]
    elif ntype == T_WAIT_EVENT:
        # the launch stream waits for the event's last record (flags 0)
        ev = sess.get(P.K_EVENT, int(args[4] or 0))
        info["ops"] = [[_fid("cuStreamWaitEvent"), ctxh, [0, ev.handle, 0]]]
    elif ntype == T_GRAPH:
        child = graph(sess, args[4])
        if child.id == g.id:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: a graph cannot contain itself")
        _refuse_memory_nodes(sess, child, fn, "cannot be a child graph")
        for hook in NO_CHILD:
            hook(sess, child, f"{fn.name}: cannot be a child graph")
        info["child"], _ = flatten(sess, child)
    elif ntype == T_MEM_FREE:
        addr = sess.translate(int(args[4] or 0))
        if addr not in sess.graph_mem:
            # cuda.h: CUDA_ERROR_INVALID_VALUE "if dptr was not returned by a
            # graph allocation" (memory of cuMemAlloc is freed by cuMemFree)
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {addr:#x} is not a graph allocation")
        for i in _xnodes(g):
            o = sess.objects[(K_GRAPH_NODE, i)]
            if o.info["type"] == T_MEM_FREE and int(o.info["ops"][0][2][0]) == addr:
                raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the graph frees {addr:#x} already")
        info["ops"] = [free_marker(ctxh, addr)]
    n = commit_node(sess, g, info)
    return CUDA_SUCCESS, [n.handle if args[0] else None]


@handler("graph_node_set_params")
def h_node_set_params(d, sess, fn, ctx, args, **kw):
    """cuGraph{Kernel,Memcpy,Memset,Host}NodeSetParams: [node, op, ...]."""
    n = node(sess, args[0])
    if n.info["type"] not in OP_HANDLERS:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: not a node of that type")
    want = {"Kernel": T_KERNEL, "Memcpy": T_MEMCPY, "Memset": T_MEMSET, "Host": T_HOST}
    for k, t in want.items():
        if f"Graph{k}Node" in fn.name and n.info["type"] != t:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the node is not a {k.lower()} node")
    n.info["ops"] = _check_ops(sess, n.info["type"], args[1], fn.name)
    return CUDA_SUCCESS, []


@handler("graph_exec_set_params")
def h_exec_set_params(d, sess, fn, ctx, args, **kw):
    """cuGraphExec{Kernel,Memcpy,Memset,Host}NodeSetParams: [exec, node, op,
    ...]: the instantiated copy of the node changes, the graph's does not
    (cuda.h: "Modifying the parameters of an executable graph node does not
    affect the node in the graph it was instantiated from")."""
    e = sess.get(P.K_GRAPH_EXEC, int(args[0] or 0))
    n = node(sess, args[1])
    pos = e.info.get("index", {}).get(n.id)
    target = e.info["nodes"]
    for hook in EXEC_NODE_AT if pos is None else ():
        found = hook(sess, e, n)
        if found is not None:
            target, pos = found
            break
    if pos is None or n.info["type"] not in OP_HANDLERS:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the node is not one of the executable graph's")
    ops = _check_ops(sess, n.info["type"], args[2], fn.name)
    if len(ops) != len(pos):
        # a copy that changes between page-locked and pageable host memory
        # changes the node's op count, which the instantiated list cannot take
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name}: the new parameters change between page-locked and "
                                                  "pageable host memory; update the graph and instantiate it again")
    for k, op in zip(pos, ops):
        target[k] = op
    return CUDA_SUCCESS, []


@handler("graph_node_type")
def h_node_type(d, sess, fn, ctx, args, **kw):
    n = node(sess, args[0])
    return CUDA_SUCCESS, [n.info["type"] if args[1] else None]


def _pack(handles: list[int]) -> bytes:
    return struct.pack(f"<{len(handles)}Q", *handles)


@handler("graph_get_nodes")
def h_get_nodes(d, sess, fn, ctx, args, **kw):
    """cuGraphGetNodes / cuGraphGetRootNodes: [graph] -> the node handles
    (little-endian u64 each, creation order); the shim copies at most the
    caller's count and reports the total (cuda.h)."""
    g = graph(sess, args[0])
    hs = []
    for i in _xnodes(g):
        n = sess.objects[(K_GRAPH_NODE, i)]
        if "Root" not in fn.name or not n.info["deps"]:
            hs.append(n.handle)
    return CUDA_SUCCESS, [_pack(hs), len(hs)]


@handler("graph_get_edges")
def h_get_edges(d, sess, fn, ctx, args, **kw):
    """cuGraphGetEdges_v2: [graph] -> from handles, to handles, count."""
    g = graph(sess, args[0])
    fr, to, ed = [], [], []
    for i in _xnodes(g):
        n = sess.objects[(K_GRAPH_NODE, i)]
        for dep in n.info["deps"]:
            fr.append(P.make_handle(K_GRAPH_NODE, dep))
            to.append(n.handle)
            ed.append(graph_edges.get(n, dep))
    # the edge data goes back as an array of CUgraphEdgeData (graph_edges.py)
    return CUDA_SUCCESS, [_pack(fr), _pack(to), graph_edges.pack(ed), len(fr)]


@handler("graph_dependencies")
def h_dependencies(d, sess, fn, ctx, args, **kw):
    """cuGraphAddDependencies_v2 / cuGraphRemoveDependencies_v2:
    [graph, [from], [to], edge data, count]."""
    g = graph(sess, args[0])
    fr, to = _ids(args[1], fn.name), _ids(args[2], fn.name)
    if len(fr) != len(to) or len(fr) != int(args[4] or 0):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: from/to counts differ from numDependencies")
    edges = graph_edges.parse(args[3], len(fr), fn.name)
    pairs = []
    for a, b in zip(fr, to):
        na, nb = node(sess, a), node(sess, b)
        if na.info["graph"] != g.id or nb.info["graph"] != g.id or na.id == nb.id:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the nodes must be two nodes of the graph")
        pairs.append((na, nb))
    add = "Add" in fn.name
    for (na, nb), e in zip(pairs, edges):
        have = na.id in nb.info["deps"]
        if add and have:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the dependency exists already")
        if add:
            graph_edges.check(e, na.info["type"], nb.info["type"], fn.name)
        # cuda.h: an edge is removed only with matching data (NULL: the default)
        if not add and (not have or graph_edges.get(nb, na.id) != e):
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: no such dependency")
    for (na, nb), e in zip(pairs, edges):
        if add:
            nb.info["deps"].append(na.id)
            graph_edges.put(nb, na.id, e)
        else:
            nb.info["deps"].remove(na.id)
            graph_edges.drop(nb, na.id)
    return CUDA_SUCCESS, []


@handler("graph_node_neighbours")
def h_node_neighbours(d, sess, fn, ctx, args, **kw):
    """cuGraphNodeGetDependencies(_v2) / cuGraphNodeGetDependentNodes(_v2):
    [node, ...] -> the neighbours' handles (little-endian u64 each, in the
    order the edges were made for dependencies, creation order for
    dependents), their edges' data (CUgraphEdgeData each), the count; the
    shim copies at most the caller's count (cuda.h)."""
    n = node(sess, args[0])
    hs, ed = [], []
    if "Dependent" in fn.name:
        g = sess.objects.get((P.K_GRAPH, n.info["graph"]))
        for i in (_xnodes(g) if g is not None else []):
            o = sess.objects[(K_GRAPH_NODE, i)]
            if n.id in o.info["deps"]:
                hs.append(o.handle)
                ed.append(graph_edges.get(o, n.id))
    else:
        for dep in n.info["deps"]:
            hs.append(P.make_handle(K_GRAPH_NODE, dep))
            ed.append(graph_edges.get(n, dep))
    return CUDA_SUCCESS, [_pack(hs), graph_edges.pack(ed), len(hs)]


@handler("graph_destroy_node")
def h_destroy_node(d, sess, fn, ctx, args, **kw):
    """cuGraphDestroyNode: removes the node and every edge to or from it."""
    n = node(sess, args[0])
    g = sess.objects.get((P.K_GRAPH, n.info["graph"]))
    if g is not None:
        _refuse_memory_nodes(sess, g, fn, "keeps its nodes")
        _xnodes(g).remove(n.id)
        for i in _xnodes(g):
            deps = sess.objects[(K_GRAPH_NODE, i)].info["deps"]
            if n.id in deps:
                deps.remove(n.id)
                graph_edges.drop(sess.objects[(K_GRAPH_NODE, i)], n.id)
    for hook in DROP_NODE:
        hook(sess, n)
    sess.drop(n)
    return CUDA_SUCCESS, []


def drop_nodes(sess, g):
    """Called when graph g is destroyed: its nodes go with it."""
    for i in list(g.info.get("xnodes", [])):
        n = sess.objects.get((K_GRAPH_NODE, i))
        if n is not None:
            for hook in DROP_NODE:
                hook(sess, n)
            sess.drop(n)


@handler("graph_clone")
def h_clone(d, sess, fn, ctx, args, **kw):
    """cuGraphClone: a new graph with copies of the nodes and edges."""
    src = graph(sess, args[1])
    if src.info.get("capturing"):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the graph is being captured")
    _refuse_memory_nodes(sess, src, fn, "cannot be cloned")
    for hook in NO_CHILD:
        hook(sess, src, f"{fn.name}: cannot be cloned")
    g = sess.add(P.K_GRAPH, None, src.ctx, {"nodes": [list(n) for n in src.info["nodes"]], "origin": 0,
                                            "capturing": False, "xnodes": []})
    new_id = {}
    for i in _xnodes(src):
        o = sess.objects[(K_GRAPH_NODE, i)]
        info = dict(o.info)
        info["graph"] = g.id
        info["deps"] = [new_id[x] for x in o.info["deps"]]
        if "edata" in o.info:
            info["edata"] = {new_id[k]: v for k, v in o.info["edata"].items()}
        info["ops"] = [list(x) for x in o.info["ops"]]
        if "child" in o.info:
            info["child"] = [list(x) for x in o.info["child"]]
        n = sess.add(K_GRAPH_NODE, None, o.ctx, info)
        new_id[o.id] = n.id
        g.info["xnodes"].append(n.id)
    return CUDA_SUCCESS, [g.handle if args[0] else None]


def _signature(sess, g) -> list:
    """What cuGraphExecUpdate compares: the captured ops' functions, then per
    explicit node (in creation order, which is how nodes pair: cuda.h,
    cuGraphExecUpdate) its type and dependencies by position."""
    xs = _xnodes(g)
    pos = {i: k for k, i in enumerate(xs)}
    sig = [("captured", op[0]) for op in g.info.get("nodes", [])]
    for i in xs:
        n = sess.objects[(K_GRAPH_NODE, i)]
        sig.append((n.info["type"], tuple(sorted(pos[x] for x in n.info["deps"])),
                    len(n.info.get("child", ())) if n.info["type"] == T_GRAPH else 0))
    return sig


@handler("graph_exec_update")
def h_exec_update(d, sess, fn, ctx, args, **kw):
    """cuGraphExecUpdate_v2: [exec, graph, result out] -> [result, error
    node]. The executable graph takes the graph's parameters when the
    topology is the same; its node handles stay those of the graph it was
    instantiated from (paired by creation order)."""
    e = sess.get(P.K_GRAPH_EXEC, int(args[0] or 0))
    g = graph(sess, args[1])
    old_sig = e.info.get("sig")
    new_sig = _signature(sess, g)
    if old_sig is None or old_sig != _jsonable_sig(new_sig):
        # the shim turns a result other than success into
        # CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE (interceptor/graph_build.c)
        same_shape = old_sig is not None and len(old_sig) == len(new_sig) and \
            all(a[1:] == b[1:] for a, b in zip(old_sig, _jsonable_sig(new_sig)))
        return CUDA_SUCCESS, [UPDATE_NODE_TYPE_CHANGED if same_shape else UPDATE_TOPOLOGY_CHANGED, None]
    ops, index = flatten(sess, g)
    if [op for op in ops if is_marker(op[0])] != [op for op in e.info["nodes"] if is_marker(op[0])]:
        # graph allocations have their addresses for the executable graph's
        # life: memory nodes cannot change in an update
        return CUDA_SUCCESS, [UPDATE_NOT_SUPPORTED, None]
    # the exec's node ids are those of the graph it came from: pair by creation order
    keys = e.info.get("node_order", [])
    new_order = _xnodes(g)
    e.info["nodes"] = ops
    e.info["index"] = {keys[k]: index[new_order[k]] for k in range(len(keys))}
    return CUDA_SUCCESS, [UPDATE_SUCCESS, None]


def _jsonable_sig(sig) -> list:
    return [[x[0], list(x[1]), x[2]] if len(x) == 3 else [x[0], x[1]] for x in sig]


def instantiate_info(sess, g, flags: int = 0) -> dict:
    """The executable graph's info for graph g (graphs.h_instantiate); it
    holds the graph's allocations ("mem", graph_mem.py) too."""
    for check in INSTANTIATE_CHECK:
        check(sess, g)
    ops, index = flatten(sess, g)
    info = {"nodes": ops, "graph": g.id, "index": index, "node_order": list(_xnodes(g)),
            "sig": _jsonable_sig(_signature(sess, g)), "mem": list(g.info.get("mem", [])), "flags": flags}
    for hook in INSTANTIATE:
        info.update(hook(sess, g))
    return info


# ------------------------------------------------------------ checkpoints

def describe_nodes(sess, g, enc) -> list:
    out = []
    for i in _xnodes(g):
        n = sess.objects[(K_GRAPH_NODE, i)]
        d = {"id": n.id, "type": n.info["type"], "deps": list(n.info["deps"])}
        if n.info["ops"]:
            d["ops"] = [[fid, ctxh, enc(list(a))] for fid, ctxh, a in n.info["ops"]]
        if "child" in n.info:
            d["child"] = [[fid, ctxh, enc(list(a))] for fid, ctxh, a in n.info["child"]]
        if n.info.get("edata"):
            d["edata"] = graph_edges.describe(n)
        out.append(d)
    return out


def rebuild_nodes(sess, g, nodes: list, dec):
    from .._generated import FUNCTIONS

    def op(x):
        fid, ctxh, a = x
        if int(fid) not in FUNCTIONS:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"graph {g.id}: function id {fid} unknown")
        return [int(fid), int(ctxh), dec(a)]
    g.info["xnodes"] = []
    for nd in nodes:
        info = {"graph": g.id, "type": int(nd["type"]), "deps": [int(x) for x in nd.get("deps", [])],
                "ops": [op(x) for x in nd.get("ops", [])]}
        if "child" in nd:
            info["child"] = [op(x) for x in nd["child"]]
        graph_edges.rebuild(info, nd.get("edata"), f"graph {g.id}")
        sess.add(K_GRAPH_NODE, None, g.ctx, info, ident=int(nd["id"]))
        g.info["xnodes"].append(int(nd["id"]))
    byid = {i: sess.objects[(K_GRAPH_NODE, i)] for i in g.info["xnodes"]}
    if any(d not in byid for n in byid.values() for d in n.info.get("edata", {})):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"graph {g.id}: edge data from a node of another graph")
    graph_edges.check_rebuilt(byid, f"graph {g.id}")
