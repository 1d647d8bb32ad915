"""Conditional graph nodes (cuda.h, CUDA 12.3+: cuGraphConditionalHandleCreate,
CU_GRAPH_NODE_TYPE_CONDITIONAL with CUDA_CONDITIONAL_NODE_PARAMS through
cuGraphAddNode; cuda_device_runtime_api.h, cudaGraphSetConditional). XLA's
command buffers build `while` and `conditional` commands from them.

Handles. cuGraphConditionalHandleCreate(graph, ctx, default, flags) gives a
64-bit value that kernels pass to cudaGraphSetConditional on the device, so
the application must get the backend's own value, unchanged (never a proxyd
handle). A graph keeps its handles in info["conds"]: [value, default, flags,
context handle]. With CU_GRAPH_COND_ASSIGN_DEFAULT the default is written at
the start of every launch of the graph (cuda.h) and, for a handle made on a
body graph, at every start of that body.

Nodes. A conditional node is a graph node (graph_nodes.py) of type 13 with
info["cond"] = {"handle", "ctype", "size", "bodies": [graph ids]}; its body
graphs are graphs of the session made when the node is added (cuda.h: the
driver creates them and returns them in phGraph_out), each with
info["body_of"] = the node's id, which the application fills with the usual
add calls or a capture into them (graph_capture_into.py). cuda.h limits a
body to kernel, empty, child graph, memset, memcpy and conditional nodes;
other nodes in a body are refused (invalid value) when the graph is
instantiated. A graph with conditional nodes cannot be a child graph or be
cloned (cuda.h, CU_GRAPH_NODE_TYPE_CONDITIONAL): invalid value.
A conditional node may also be added to a graph while a stream is captured
into it (CUDA's pattern with cuStreamGetCaptureInfo and
cuStreamUpdateCaptureDependencies): graph_cond_capture.py puts it in its
place in capture order.

Launch. graph_nodes.flatten turns the node into one op, [cuGraphAddNode's
id, ctx, [handle, type, [snapshot graph ids]]]: each body copied at
instantiation into a graph only the executable graph names (info["snap"]:
the body's own handles' defaults), dropped with the executable graph
(expand, _sweep).

- Emulated backend: graphs.run_ops hands that op to run_cond, which reads
  the condition after the ops before it have run and runs the chosen body's
  ops (IF: body 0 when non-zero, body 1 when zero and size is 2; WHILE: body
  0 as long as it is non-zero, read again after each pass; SWITCH: body n
  when the value is n < size). Kernels set conditions with
  `k.set_conditional(handle, value)` (backends/emu/conditionals.py) and run
  to completion in order.
- GPU: the condition lives in driver storage that only a driver
  conditional node reads, written by a kernel only inside a driver graph
  launch; the worker cannot read it between two ops. So a graph's handles
  are made on a driver graph of its own (the values kernels get are the
  driver's), and the first launch of an executable graph with conditional
  nodes records its ops into that driver graph (stream capture of the same
  ops a launch would run, conditional nodes added between the captured
  pieces, bodies captured into the driver's body graphs:
  backends/cuda_cond.py), instantiates it and launches it; later launches
  launch it again. On the GPU such a graph may hold kernels, copies,
  memsets, captured math-library calls (run again under a capture into
  the driver graph, with their objects made from the snapshot taken when
  they were captured: graph_libcapture.py) and conditional nodes (what
  cuda.h allows in a body, and what XLA's command buffers hold); anything
  else there (host, event and memory nodes), and handles of body graphs
  (nested conditional nodes), answer CUDA_ERROR_NOT_SUPPORTED with one
  line.

Checkpoint (kind `graphs_cond`, after `graphs` at Stage.GRAPHS): the
handles of each graph (value, default, flags, context) and their current
values (emulated), each conditional node's parameters and bodies, each
body's node, each executable graph's defaults and each body snapshot's (the
snapshots' ops are graphs of the image: graphs.describe). A restore registers every handle again
under its recorded value (the kernels' parameters and device memory hold
it); a backend that would give another value fails the restore, naming it.

Locking: the worker's main loop only (dispatch.py).
"""
from __future__ import annotations

import os
import struct

from ..core import protocol as P
from ..core.kinds import Kind, Stage, register
from ..core.registry import CUDA_SUCCESS, handler
from ..core.session import CudaError
from . import graph_cond_capture as CC
from . import graph_nodes as GN
from . import graphs as G

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_ERROR_LAUNCH_FAILED = 719
T_CONDITIONAL = 13
COND_IF, COND_WHILE, COND_SWITCH = 0, 1, 2                 # CUgraphConditionalNodeType
ASSIGN_DEFAULT = 0x1                                      # CU_GRAPH_COND_ASSIGN_DEFAULT
# cuda.h, CUDA_CONDITIONAL_NODE_PARAMS "phGraph_out": what a body may hold
BODY_TYPES = {GN.T_KERNEL, GN.T_MEMCPY, GN.T_MEMSET, GN.T_GRAPH, GN.T_EMPTY, T_CONDITIONAL}
BODY_CAPTURED = {"launch_kernel", "launch_kernel_ex", "launch_cooperative", "memcpy_dtod", "memcpy_htod",
                 "memcpy_dtoh", "memset", "memset2d"}
# CUgraphNodeParams (cuda.h): type, reserved0[3], then the union; the
# conditional member: handle (u64), type (u32), size (u32), phGraph_out, ctx
_NP_HEAD = struct.Struct("<i12x")
_NP_COND = struct.Struct("<QIIQQ")
MAX_SWITCH = 1 << 16
# the worker's backend (one session per worker), which the checkpoint's
# describe reads the conditions from; set by the first handle or a restore
_BACKEND = [None]


def _backend_op(d, name: str):
    f = getattr(d.backend, name, None)
    if f is None:
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED,
                        "conditional graph nodes are not supported on this backend (the worker cannot read a "
                        "condition a kernel sets on the GPU; docs/compatibility.md)")
    return f


def _handles(g) -> list:
    return g.info.setdefault("conds", [])


def _ctx_arg(sess, v):
    if v:
        return sess.context(int(v))
    return None


@handler("graph_cond_handle")
def h_cond_handle(d, sess, fn, ctx, args, ctxh=0, **kw):
    """[out, graph, ctx, default, flags] -> [handle value]."""
    g = GN.graph(sess, args[1])
    c = _ctx_arg(sess, args[2]) or ctx
    flags = int(args[4] or 0)
    if flags & ~ASSIGN_DEFAULT:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: flags {flags:#x} (only "
                                                  "CU_GRAPH_COND_ASSIGN_DEFAULT is defined)")
    default = int(args[3] or 0) & 0xFFFFFFFF
    drv = _driver(d)
    if drv is not None:
        if "body_of" in g.info:
            raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name}: a handle of a conditional body graph (nested "
                                                      "conditional nodes) is not supported on the GPU backend")
        if c is None:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: no context")
        value = drv.handle_create(_driver_graph(drv, g.id), c.real, default, flags)
    else:
        value = int(_backend_op(d, "cond_create")(c, default, flags))
        d.backend.cond_set(value, default)      # cuda.h: the handle's initial value
    _BACKEND[0] = d.backend
    ch = int(args[2] or 0) or int(ctxh or 0)
    _handles(g).append([value, default, flags, ch])
    return CUDA_SUCCESS, [value if args[0] else None]


def _parent(sess, g):
    """The graph holding the conditional node whose body g is, or None."""
    nid = g.info.get("body_of")
    n = sess.objects.get((GN.K_GRAPH_NODE, nid)) if nid is not None else None
    return sess.objects.get((P.K_GRAPH, n.info["graph"])) if n is not None else None


def _owner(sess, g, handle: int):
    """The graph that made `handle` for a node in g: g itself or a graph g
    is a body of (cuda.h: the handle belongs to "a conditional node in this
    graph or one of its children"). Handle values are unique only within
    one graph and its bodies: the driver numbers each graph's handles from
    1 (driver 580, the corpus on the GPU), so two graphs hold equal
    values and a lookup by value alone found the wrong one."""
    seen = set()
    while g is not None and g.id not in seen:
        seen.add(g.id)
        if any(h[0] == handle for h in g.info.get("conds", ())):
            return g
        g = _parent(sess, g)
    return None


def _family(sess, g) -> tuple[set, list]:
    """g and every body graph below it (ids), and their conditional nodes
    (each graph's own nodes, "xnodes": a conditional node, added in a
    capture too, is committed there)."""
    ids, nodes, todo = set(), [], [g.id]
    while todo:
        gid = todo.pop()
        b = sess.objects.get((P.K_GRAPH, gid))
        if gid in ids or b is None:
            continue
        ids.add(gid)
        for i in b.info.get("xnodes", ()):
            n = sess.objects[(GN.K_GRAPH_NODE, i)]
            if "cond" in n.info:
                nodes.append(n)
                todo.extend(n.info["cond"]["bodies"])
    return ids, nodes


def _unused_handles(sess, g) -> list:
    """Handles made on g or its bodies that no conditional node there uses.
    cuda.h (cuGraphConditionalHandleCreate): such handles "may cause graph
    instantiation to fail"; driver 580 refuses the instantiation
    (CUDA_GRAPH_INSTANTIATE_CONDITIONAL_HANDLE_UNUSED, invalid value), so
    the proxy refuses it the same way on every backend."""
    ids, nodes = _family(sess, g)
    used = set()
    for n in nodes:
        h = n.info["cond"]["handle"]
        owner = _owner(sess, sess.objects[(P.K_GRAPH, n.info["graph"])], h)
        if owner is not None:
            used.add((owner.id, h))
    return [h[0] for gid in sorted(ids) for h in sess.objects[(P.K_GRAPH, gid)].info.get("conds", ())
            if (gid, h[0]) not in used]


@handler("graph_add_conditional")
def h_add_conditional(d, sess, fn, ctx, args, **kw):
    """cuGraphAddNode of a conditional node: [out, graph, [deps], count,
    CUgraphNodeParams bytes] -> [node, body graph handles (u64 each)]
    (interceptor/graph_cond.c; the shim hands every other type to its own add
    call)."""
    raw = args[4]
    if not isinstance(raw, (bytes, bytearray, memoryview)) or len(raw) < _NP_HEAD.size + _NP_COND.size:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: malformed node parameters")
    raw = bytes(raw)
    (ntype,) = _NP_HEAD.unpack_from(raw, 0)
    if ntype != T_CONDITIONAL:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: node type {ntype} is added by its own call")
    handle, ctype, size, _out, cctx = _NP_COND.unpack_from(raw, _NP_HEAD.size)
    g = GN.graph(sess, args[1])
    if g.info.get("capturing"):
        # CUDA's way of putting a conditional node into a stream capture
        # (cuStreamGetCaptureInfo's graph, then cuStreamUpdateCaptureDependencies)
        g, info = CC.add_info(sess, fn, args, g, T_CONDITIONAL)
    else:
        g, info = GN.add_node_info(sess, fn, args, T_CONDITIONAL)
    if _owner(sess, g, handle) is None:
        # cuda.h, cuGraphConditionalHandleCreate: hGraph is the "graph which
        # will contain the conditional node using this handle" (or a graph
        # it is the body of)
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: conditional handle {handle:#x} was not made "
                                                  "for this graph")
    ok = {COND_IF: size in (1, 2), COND_WHILE: size == 1, COND_SWITCH: 1 <= size <= MAX_SWITCH}
    if not ok.get(ctype, False):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: conditional type {ctype} with size {size}")
    _ctx_arg(sess, cctx)
    info["cond"] = {"handle": int(handle), "ctype": int(ctype), "size": int(size), "bodies": []}
    n = GN.commit_node(sess, g, info)
    if info.get("in_capture"):
        CC.place(sess, g, n)
    for _ in range(size):
        b = sess.add(P.K_GRAPH, None, g.ctx, {"nodes": [], "origin": 0, "capturing": False, "xnodes": [],
                                              "body_of": n.id})
        info["cond"]["bodies"].append(b.id)
    bodies = [P.make_handle(P.K_GRAPH, i) for i in info["cond"]["bodies"]]
    return CUDA_SUCCESS, [n.handle if args[0] else None, struct.pack(f"<{len(bodies)}Q", *bodies)]


def has_conditionals(sess, g) -> bool:
    return any(sess.objects[(GN.K_GRAPH_NODE, i)].info["type"] == T_CONDITIONAL
               for i in g.info.get("xnodes", ()))


def _defaults(g) -> list:
    return [[h[0], h[1]] for h in g.info.get("conds", ()) if h[2] & ASSIGN_DEFAULT]


def _check_body(sess, b, depth: int):
    for op in b.info.get("nodes", ()):
        from .._generated import FUNCTIONS
        f = FUNCTIONS.get(op[0])
        # a library call captured into a body is kernels, memsets and copies
        # natively (graph_libcapture.py keeps it as one op)
        if f is None or (f.handler not in BODY_CAPTURED and f.handler != "library"):
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"conditional body graph {b.id}: "
                                                      f"{getattr(f, 'name', op[0])} cannot be in a body (cuda.h)")
    for i in b.info.get("xnodes", ()):
        t = sess.objects[(GN.K_GRAPH_NODE, i)].info["type"]
        if t not in BODY_TYPES:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"conditional body graph {b.id}: a node of type {t} "
                                                      "cannot be in a body (cuda.h)")
    if depth > 64:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, "conditional nodes nested more than 64 deep")


def expand(sess, n, depth: int = 0) -> list:
    """The op that stands for conditional node n in a flattened graph:
    [cuGraphAddNode's id, ctx, [handle, type, [snapshot graph ids]]]. Each
    body is copied, as it is now, into a graph of the session that only
    the executable graph names ("snap": its defaults), holding the body's
    ops flattened, so that later changes to the body do not reach the
    executable graph (as instantiation copies natively) and the image keeps
    it like any graph (captured library calls included: graphs.describe)."""
    c = n.info["cond"]
    snaps = []
    for gid in c["bodies"]:
        b = sess.objects.get((P.K_GRAPH, gid))
        if b is None:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"conditional node {n.id}: its body graph {gid} is gone")
        if b.info.get("capturing"):
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"conditional body graph {gid} is still being captured")
        _check_body(sess, b, depth)
        ops, index = GN.flatten(sess, b)
        # index: where each body node's ops are, for the exec-node setters (exec_node_at)
        snap = sess.add(P.K_GRAPH, None, b.ctx, {"nodes": ops, "origin": 0, "capturing": False,
                                                 "snap": _defaults(b), "snap_index": index})
        snaps.append(snap.id)
    ctxh = P.make_handle(P.K_CONTEXT, n.ctx) if n.ctx else 0
    return [GN._fid("cuGraphAddNode"), ctxh, [c["handle"], c["ctype"], snaps]]


def _snap(sess, gid):
    g = sess.objects.get((P.K_GRAPH, int(gid)))
    if g is None or "snap" not in g.info:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"conditional body {gid} of an executable graph is gone")
    return g


def _snaps_of(sess, ops) -> list:
    """The snapshot graphs the conditional ops of `ops` name, nested ones too."""
    out = []
    for fid, _c, args in ops:
        if _is_cond(fid) and isinstance(args, list):
            for gid in args[2]:
                g = sess.objects.get((P.K_GRAPH, int(gid)))
                if g is not None and "snap" in g.info:
                    out.append(g)
                    out += _snaps_of(sess, g.info["nodes"])
    return out


def exec_node_at(sess, e, n):
    """cuGraphExec*NodeSetParams of a node inside a conditional body (XLA
    updates the kernels of its loop bodies so): the op list of the body
    snapshot of e that holds it, and its positions there."""
    for g in _snaps_of(sess, e.info.get("nodes", ())):
        pos = g.info.get("snap_index", {}).get(n.id)
        if pos is not None:
            return g.info["nodes"], pos
    return None


def _apply(d, defaults):
    for h, v in defaults:
        d.backend.cond_set(int(h), int(v))


def run_cond(d, sess, api, ctxh, args, stream):
    """A conditional node at launch (graphs.run_ops)."""
    handle, ctype, bodies = int(args[0]), int(args[1]), args[2]
    get = _backend_op(d, "cond_get")

    def body(k):
        b = _snap(sess, bodies[k])
        _apply(d, b.info["snap"])
        G.run_ops(d, sess, api, b.info["nodes"], stream)
    if ctype == COND_WHILE:
        # a loop whose condition never clears hangs a GPU; the emulation
        # fails the launch instead, after GPUPROXY_EMU_WHILE_MAX passes
        cap, n = int(os.environ.get("GPUPROXY_EMU_WHILE_MAX", str(1 << 24))), 0
        while get(handle):
            n += 1
            if n > cap:
                raise CudaError(CUDA_ERROR_LAUNCH_FAILED, f"{api}: a conditional WHILE node ran {cap} passes "
                                                          "(GPUPROXY_EMU_WHILE_MAX); its condition never cleared")
            body(0)
    elif ctype == COND_IF:
        if get(handle):
            body(0)
        elif len(bodies) > 1:
            body(1)
    else:
        v = get(handle)
        if v < len(bodies):
            body(v)


def _sweep(sess, e) -> bool:
    """Whether executable graph e has conditional nodes, worked out once per
    op list (a launch of any graph asks; the answer is cached on e). When
    cuGraphExecUpdate gave e new ops (graph_nodes.h_exec_update), with new
    body snapshots, the snapshots it no longer names go."""
    ref = e.info.get("cond_ref")
    if ref is not None and ref[0] is e.info["nodes"]:
        return ref[2]
    has = any(_is_cond(op[0]) for op in e.info["nodes"])
    now = {g.id for g in _snaps_of(sess, e.info["nodes"])} if has else set()
    for gid in (ref[1] if ref is not None else ()):
        g = sess.objects.get((P.K_GRAPH, gid))
        if gid not in now and g is not None and "snap" in g.info:
            sess.drop(g)
    e.info["cond_ref"] = (e.info["nodes"], sorted(now), has)
    return has


def at_launch(d, sess, e, stream) -> bool:
    """Before an executable graph's ops run (graphs.h_launch): the handles'
    defaults; on the GPU, a graph with conditional nodes is launched as a
    driver graph instead (True)."""
    has = _sweep(sess, e)
    drv = _driver(d)
    if drv is None:
        if e.info.get("cond_defaults"):
            _apply(d, e.info["cond_defaults"])
        return False
    if not has:
        return False
    gid = e.info["graph"]
    ctx = sess.contexts.get(e.ctx)
    if ctx is not None:
        d.backend.make_current(ctx.real)
    built = _BUILT.get(gid)
    if built is None or built[0] != e.id or built[2] != _fingerprint(sess, e):
        _build(d, sess, drv, e, ctx)
    real = d.backend.stream(stream) if stream < 3 else sess.get(P.K_STREAM, stream).real
    drv.launch(_BUILT[gid][1], real)
    return True


# ------------------------------------------------- the GPU: driver graphs

# One session per worker: graph id -> the driver graph its handles belong
# to (backends/cuda_cond.py), and graph id -> (executable graph id, driver
# executable graph) recorded into it (cuda.h: one instantiation at a time).
_DG: dict = {}
_BUILT: dict = {}


def _driver(d):
    f = getattr(d.backend, "cond_driver", None)
    return f() if f is not None else None


def _driver_graph(drv, gid: int) -> int:
    if gid not in _DG:
        _DG[gid] = drv.graph_create()
    return _DG[gid]


_COND_FID: list = []


def _is_cond(fid) -> bool:
    if not _COND_FID:
        _COND_FID.append(GN._fid("cuGraphAddNode"))
    return fid == _COND_FID[0]


def _build(d, sess, drv, e, ctx):
    """Records executable graph e into its graph's driver graph
    (backends/cuda_cond.py) and instantiates it."""
    from .graph_exec_state import skipped_positions
    gid = e.info["graph"]
    dg = _DG.get(gid)
    if dg is None:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"executable graph {e.id}: its conditional handles are gone")
    old = _BUILT.pop(gid, None)
    if old is not None:
        drv.exec_destroy(old[1])
    drv.clear(dg)
    s = drv.stream_create()
    so = sess.add(P.K_STREAM, s, e.ctx, {"flags": 1, "cond_build": True})
    try:
        _record(d, sess, drv, dg, [], e.info["nodes"], so, s, ctx.real if ctx else 0, skipped_positions(e))
        _BUILT[gid] = (e.id, drv.instantiate(dg), _fingerprint(sess, e))
    finally:
        sess.drop(so)
        drv.stream_destroy(s)


def _record(d, sess, drv, graph, deps, ops, so, s, ctx, skip) -> list:
    """Records ops into driver graph `graph` after nodes `deps`; returns the
    nodes recorded last."""
    from .._generated import FUNCTIONS
    seg: list = []

    def flush(deps):
        if not seg:
            return deps
        drv.begin(s, graph, deps)
        try:
            G.run_ops(d, sess, "cuGraphLaunch", seg, so.handle)
            deps = drv.deps(s)
        finally:
            drv.end(s)
        seg.clear()
        return deps
    for k, op in enumerate(ops):
        if k in skip:
            continue
        fid, _ctxh, args = op
        if _is_cond(fid):
            deps = flush(deps)
            handle, ctype, bodies = int(args[0]), int(args[1]), args[2]
            node, dbodies = drv.add_conditional(graph, deps, handle, ctype, len(bodies), ctx)
            for gid, db in zip(bodies, dbodies):
                _record(d, sess, drv, db, [], _snap(sess, gid).info["nodes"], so, s, ctx, ())
            deps = [node]
            continue
        f = FUNCTIONS.get(fid)
        if f is not None and f.handler == "library" and not isinstance(args, list):
            deps = _record_library(d, sess, drv, graph, flush(deps), f, args)
            continue
        if f is None or f.handler not in BODY_CAPTURED or not isinstance(args, list):
            raise CudaError(CUDA_ERROR_NOT_SUPPORTED,
                            f"cuGraphLaunch: {getattr(f, 'name', fid)} in a graph with conditional nodes is not "
                            "supported on the GPU backend (kernels, copies, memsets, library calls and "
                            "conditional nodes are)")
        seg.append(op)
    return flush(deps)


def _record_library(d, sess, drv, graph, deps, fn, lc) -> list:
    """A captured math-library call (graph_libcapture.LibCapture) recorded
    into driver graph `graph` after `deps`: the call runs again under a
    capture of its own stream into that graph, with temporary copies of the
    library objects it named, made from the snapshot taken when it was
    captured (as a restore makes it again: graph_libcapture.realize_pending);
    its kernels become the graph's nodes, as natively."""
    from .graph_libcapture import _destroy_temps, _real_stream, materialize
    if lc.objects is None:
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"cuGraphLaunch: {fn.name} in a graph with conditional nodes: "
                                                  "its library objects cannot be made again (cuDNN backend plans)")
    run_args, temps = materialize(d, sess, lc.objects, lc.args)
    st = _real_stream(d, sess, lc.stream)
    try:
        drv.begin(st, graph, deps)
        try:
            code, _outs, msg = d.libs.run_op(sess, fn, lc.fid, lc.ctxh, list(run_args))
            deps = drv.deps(st)
        finally:
            drv.end(st)
    finally:
        _destroy_temps(d, sess, temps)
    if code:
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"cuGraphLaunch: recording {fn.name} into a graph with "
                                                  f"conditional nodes failed: {msg or code}")
    return deps


def _fingerprint(sess, e) -> tuple:
    """What changes when the executable graph's ops change (cuGraphExecUpdate
    gives it a new list, the exec-node setters new ops, in its list or in a
    body snapshot, enabling a node the disabled set): then the driver graph
    is recorded again."""
    snaps = tuple(id(op) for g in _snaps_of(sess, e.info["nodes"]) for op in g.info["nodes"])
    return (id(e.info["nodes"]), tuple(id(op) for op in e.info["nodes"]), snaps,
            tuple(sorted(e.info.get("disabled", ()))))


def _exec_gone(d, sess, e):
    for g in _snaps_of(sess, e.info.get("nodes", ())):
        sess.drop(g)        # its body snapshots (expand)
    gid = e.info.get("graph")
    b = _BUILT.get(gid)
    if b is not None and b[0] == e.id:
        del _BUILT[gid]
        drv = _driver(d)
        if drv is not None:
            drv.exec_destroy(b[1])


def _graph_gone(d, sess, g):
    dg = _DG.pop(g.id, None)
    drv = _driver(d)
    if dg is not None and drv is not None:
        drv.graph_destroy(dg)       # an executable graph made from it stays valid (cuda.h)


def check_instantiate(sess, g) -> None:
    unused = _unused_handles(sess, g) if "body_of" not in g.info else []
    if unused:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"graph {g.id}: conditional handle(s) "
                                                  f"{', '.join(f'{h:#x}' for h in unused)} used by no conditional "
                                                  "node (cuda.h: instantiation fails)")


def on_instantiate(sess, g) -> dict:
    return {"cond_defaults": _defaults(g)} if g.info.get("conds") else {}


def refuse_in(sess, g, what: str):
    """A graph with conditional nodes as a child graph or a clone (cuda.h)."""
    if has_conditionals(sess, g):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"a graph with conditional nodes {what} (cuda.h)")


def on_drop_node(sess, n):
    """A conditional node's bodies go with it (they are the driver's, cuda.h)."""
    c = n.info.get("cond")
    for gid in (c or {}).get("bodies", ()):
        b = sess.objects.get((P.K_GRAPH, gid))
        if b is not None:
            GN.drop_nodes(sess, b)
            sess.drop(b)


# ------------------------------------------------------------ checkpoints

def describe(sess, backend) -> dict:
    graphs, nodes, bodies, execs, values, snaps = [], [], [], [], [], []
    get = getattr(backend, "cond_get", None)
    for g in sess.of_kind(P.K_GRAPH):
        if g.info.get("conds"):
            graphs.append([g.id, [list(h) for h in g.info["conds"]]])
            for h in g.info["conds"]:
                if get is not None:
                    values.append([h[0], int(get(h[0]))])
        if "body_of" in g.info:
            bodies.append([g.id, g.info["body_of"]])
        if "snap" in g.info:
            snaps.append([g.id, [list(x) for x in g.info["snap"]],
                          [[k, list(v)] for k, v in sorted(g.info.get("snap_index", {}).items())]])
    captured = []
    for n in sess.of_kind(GN.K_GRAPH_NODE):
        if "cond" in n.info:
            c = n.info["cond"]
            nodes.append([n.id, c["handle"], c["ctype"], c["size"], list(c["bodies"])])
            if n.info.get("in_capture"):
                captured.append(n.id)       # graph_cond_capture.py
    for e in sess.of_kind(P.K_GRAPH_EXEC):
        if e.info.get("cond_defaults"):
            execs.append([e.id, [list(x) for x in e.info["cond_defaults"]]])
    return {"graph_conds": {"graphs": graphs, "nodes": nodes, "bodies": bodies, "execs": execs,
                            "values": values, "snaps": snaps, "captured": captured}}


def _bad(msg: str):
    raise CudaError(CUDA_ERROR_INVALID_VALUE, f"image: conditional nodes: {msg}")


def rebuild(r):
    desc = r.desc.get("graph_conds") or {}
    sess, be = r.sess, r.backend
    _BACKEND[0] = be
    drv = getattr(be, "cond_driver", None)
    drv = drv() if drv is not None else None
    restore = getattr(be, "cond_restore", None)
    if drv is not None:
        def restore(c, value, default, flags, gid):
            if c is None:
                _bad(f"handle {value:#x} has no context")
            return drv.handle_create(_driver_graph(drv, gid), c.real, default, flags)
    elif restore is not None:
        emu_restore = restore

        def restore(c, value, default, flags, gid):
            return emu_restore(c, value, default, flags)
    if desc.get("graphs") and restore is None:
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED, "the image has conditional graph nodes, which this backend "
                                                  "cannot run")
    seen = set()          # every handle value of the image (equal values may belong to two graphs)
    made = []
    for gid, conds in desc.get("graphs", []):
        g = sess.objects.get((P.K_GRAPH, int(gid))) or _bad(f"graph {gid} is not in the image")
        g.info["conds"] = []
        for value, default, flags, ch in conds:
            value, ch = int(value), int(ch)
            if any(h[0] == value for h in g.info["conds"]):
                _bad(f"handle {value:#x} twice in graph {gid}")
            seen.add(value)
            g.info["conds"].append([value, int(default) & 0xFFFFFFFF, int(flags), ch])
            made.append((value, g))
    # made again in the order of their values, which is the order they were
    # made in where the backend numbers them as it goes: the emulated one
    # across the process, driver 580 within each graph from 1 (each graph's
    # handles are made on a driver graph of its own, so their order within
    # a graph is what counts)
    for value, g in sorted(made, key=lambda x: (x[0], x[1].id)):
        _v, default, flags, ch = next(h for h in g.info["conds"] if h[0] == value)
        c = sess.context(ch) if ch else None
        got = int(restore(c, value, default, flags, g.id))
        if got != value:
            # kernels hold the old value (in their parameters, in device memory)
            raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"conditional handle {value:#x} came back as {got:#x}; "
                                                      "the image's kernels hold the old value")
    for nid, handle, ctype, size, bodies in desc.get("nodes", []):
        n = sess.objects.get((GN.K_GRAPH_NODE, int(nid))) or _bad(f"node {nid} is not in the image")
        if n.info["type"] != T_CONDITIONAL or int(handle) not in seen or len(bodies) != int(size):
            _bad(f"node {nid} does not match its graph")
        for b in bodies:
            if (P.K_GRAPH, int(b)) not in sess.objects:
                _bad(f"body graph {b} of node {nid} is not in the image")
        n.info["cond"] = {"handle": int(handle), "ctype": int(ctype), "size": int(size),
                          "bodies": [int(b) for b in bodies]}
    for gid, nid in desc.get("bodies", []):
        g = sess.objects.get((P.K_GRAPH, int(gid))) or _bad(f"body graph {gid} is not in the image")
        g.info["body_of"] = int(nid)
    for gid, defaults, index in desc.get("snaps", []):
        g = sess.objects.get((P.K_GRAPH, int(gid))) or _bad(f"body snapshot {gid} is not in the image")
        g.info["snap"] = [[int(h), int(v)] for h, v in defaults if int(h) in seen]
        g.info["snap_index"] = {int(k): [int(x) for x in v] for k, v in index}
        if any(x >= len(g.info["nodes"]) for v in g.info["snap_index"].values() for x in v):
            _bad(f"body snapshot {gid}: a node's position is out of range")
    snap_ids = {int(y[0]) for y in desc.get("snaps", [])}
    for nid in desc.get("captured", []):
        n = sess.objects.get((GN.K_GRAPH_NODE, int(nid)))
        if n is None or "cond" not in n.info:
            _bad(f"node {nid} added in a capture is not a conditional node of the image")
        n.info["in_capture"] = True
    for g in sess.of_kind(P.K_GRAPH) + sess.of_kind(P.K_GRAPH_EXEC):
        for op in g.info.get("nodes", ()):
            fid, _c, args = op
            if not _is_cond(fid):
                continue
            nid = CC.captured_node(op) if g.kind == P.K_GRAPH else None
            if nid is not None:
                n = sess.objects.get((GN.K_GRAPH_NODE, nid))
                if n is None or not n.info.get("in_capture") or n.info["graph"] != g.id:
                    _bad(f"graph {g.id}: a node added in its capture is not in the image")
                continue
            ok = isinstance(args, list) and len(args) == 3 and isinstance(args[2], list) and \
                all(type(x) is int and x in snap_ids for x in args[2])
            if not ok:
                _bad(f"graph {g.id}: a conditional node's bodies are not in the image")
    for eid, defaults in desc.get("execs", []):
        e = sess.objects.get((P.K_GRAPH_EXEC, int(eid))) or _bad(f"executable graph {eid} is not in the image")
        e.info["cond_defaults"] = [[int(h), int(v)] for h, v in defaults if int(h) in seen]
    for h, v in desc.get("values", []):
        if int(h) in seen and hasattr(be, "cond_set"):
            be.cond_set(int(h), int(v))
    for n in sess.of_kind(GN.K_GRAPH_NODE):
        if n.info["type"] == T_CONDITIONAL and "cond" not in n.info:
            _bad(f"node {n.id} has no parameters")


GN.EXPAND[T_CONDITIONAL] = expand
GN.INSTANTIATE.append(on_instantiate)
GN.INSTANTIATE_CHECK.append(check_instantiate)
GN.DROP_NODE.append(on_drop_node)
GN.NO_CHILD.append(refuse_in)
GN.EXEC_NODE_AT.append(exec_node_at)
G.LAUNCH_OPS["cuGraphAddNode"] = run_cond
G.LAUNCH_START.append(at_launch)
G.EXEC_DESTROY.append(_exec_gone)
G.GRAPH_DESTROY.append(_graph_gone)

register(Kind("graphs_cond", Stage.GRAPHS, ("graph_conds",),
              describe=lambda sess: describe(sess, _BACKEND[0]),
              rebuild=rebuild, owner=__name__))
