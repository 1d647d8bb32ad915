"""CUDA graphs from stream capture (CUDA Programming Guide, "CUDA Graphs",
"Creating a Graph Using Stream Capture"): cuStreamBeginCapture/EndCapture,
cuStreamIsCapturing, cuGraphInstantiate, cuGraphLaunch, cuGraphDestroy,
cuGraphExecDestroy.

A graph is a proxyd object of the session that holds the ops captured into
it, in capture order, as the shim sent them ([function id, context, args]).
While a stream captures, the worker records the ops whose stream is
capturing instead of running them (Dispatcher.run_ops asks `capture_op`);
an event recorded in a capturing stream and waited on by another stream
brings that stream into the same capture (fork), and the origin stream's
wait on an event of the joined stream ends the join. Instantiating copies
the node list into an executable graph; launching runs its ops in order on
the launch stream, which keeps every dependency of the captured DAG (the
graph may run less concurrently than natively, never out of order).

Graphs and executable graphs are checkpoint objects: the image records
their ops (`graphs`), and a restore recreates them under their handles, so
a restored program launches its instantiated graphs as before.

Copies with pageable host memory reach the worker already turned into a
copy through a page-locked bounce buffer plus a host function that moves
the bytes in the application (interceptor/capture_copy.c); a copy whose
host bytes travel with the call (inline, or in the staging segment) would
have nothing to read or write at launch and answers
CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, as do synchronising calls on a
capturing stream. cuMemAllocAsync / cuMemFreeAsync become graph memory
nodes (graph_mem.py).

Locking: the worker's main loop only (dispatch.py).
"""
from __future__ import annotations

import base64

from ..core import protocol as P
from ..core.kinds import Kind, Stage, register
from ..core.registry import CUDA_SUCCESS, handler
from .graph_libcapture import LibCapture
from .graph_nodes import frozen as _frozen      # an argument kept beyond its message
from ..core.session import CudaError

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900
CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901
CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908
CU_STREAM_CAPTURE_STATUS_NONE = 0
CU_STREAM_CAPTURE_STATUS_ACTIVE = 1
CU_EVENT_RECORD_EXTERNAL = 0x1          # cuda.h, CUevent_record_flags

# ops that may be captured, by handler (or by name for generic ones)
CAPTURABLE = {"launch_kernel", "launch_kernel_ex", "launch_cooperative", "memcpy_htod", "memcpy_dtoh",
              "memcpy_dtod", "memset", "memset2d", "host_func", "event_record", "graph_launch"}
CAPTURABLE_NAMES = {"cuStreamWaitEvent", "cuStreamWaitEvent_ptsz"}
# calls about the capture itself, which run while it is active
CAPTURE_CONTROL = {"graph_begin_capture", "graph_end_capture", "graph_is_capturing", "graph_capture_info",
                   "graph_capture_deps"}
# the stream-ordered allocator, captured as graph memory nodes (graph_mem.py)
GRAPH_MEMORY = {"mem_alloc_async", "mem_alloc_from_pool_async", "mem_free_async"}


def _stream_slot(fn, args) -> tuple[int, int | None]:
    """(index of the stream argument, index inside it) for op args; (-1, None)
    when the function takes no stream. cuLaunchKernelEx keeps the stream in
    its configuration list (launches.h_launch_ex)."""
    if fn.handler == "launch_kernel_ex":
        return 0, 7
    for i, (_n, role, kind, *_r) in enumerate(fn.params):
        if role == "handle" and kind == "stream":
            return i, None
    return -1, None


def _get_stream(args, slot):
    i, j = slot
    if i < 0 or i >= len(args):
        return None
    v = args[i] if j is None else (args[i][j] if isinstance(args[i], list) and len(args[i]) > j else None)
    return int(v or 0) if isinstance(v, int) or v is None else None


def _with_stream(args, slot, stream):
    i, j = slot
    out = list(args)
    if j is None:
        out[i] = stream
    else:
        cfg = list(out[i])
        cfg[j] = stream
        out[i] = cfg
    return out


def _stream_value(fn, handle: int) -> int:
    if fn.name.endswith("_ptsz") and handle == 0:
        return P.STREAM_PER_THREAD
    return handle


def capture_op(d, sess, op) -> tuple[bool, int, str, list | None]:
    """Records op into a capture when its stream is capturing. Returns
    (captured, error code, message, outs); (False, 0, "", None) runs the op
    as usual. outs are the call's out values where capturing produces some
    (a captured cuMemAllocAsync returns its address), else None."""
    from .._generated import FUNCTIONS
    if not isinstance(op, list) or len(op) < 2 or type(op[0]) is not int:
        return False, 0, "", None
    fn = FUNCTIONS.get(op[0])
    if fn is None or fn.handler in CAPTURE_CONTROL:
        return False, 0, "", None
    args = op[2:]
    if fn.handler == "library":
        return _capture_library_op(d, sess, fn, op)
    slot = _stream_slot(fn, args)
    st = _get_stream(args, slot)
    if st is None:
        return False, 0, "", None
    st = _stream_value(fn, st)
    gid = sess.capture.get(st)
    if fn.name.startswith("cuStreamWaitEvent") and gid is None:
        # fork: a stream that waits on an event recorded in a capture joins it
        ev = int(args[1] or 0)
        g2 = sess.capture_events.get(ev)
        if g2 is not None and (P.K_GRAPH, g2) in sess.objects:
            sess.capture[st] = g2
            return True, 0, "", None
        return False, 0, "", None
    if gid is None:
        return False, 0, "", None
    g = sess.objects.get((P.K_GRAPH, gid))
    if g is None:
        return False, 0, "", None
    if fn.name.startswith("cuStreamDestroy") and g.info["origin"] != st:
        # a stream that joined the capture and is destroyed before it ends
        # (NVIDIA's graphMemoryNodes does this after joining it back): it
        # leaves the capture and is destroyed as usual
        del sess.capture[st]
        return False, 0, "", None
    if fn.handler in GRAPH_MEMORY:
        # graph memory nodes (graph_mem.py): an allocation made now, at its
        # fixed address, live from the node's run on
        from . import graph_mem
        ctx = sess.contexts.get(op[1] & 0xFFFFFFFF) if op[1] >> 32 == P.K_CONTEXT else None
        try:
            if fn.handler == "mem_free_async":
                graph_mem.capture_free(d, sess, fn, args, g, op[1])
                return True, 0, "", []
            pool_i = 2 if fn.handler == "mem_alloc_from_pool_async" else None
            return True, 0, "", graph_mem.capture_alloc(d, sess, fn, ctx, args, g, op[1], 1, pool_i)
        except CudaError as e:
            return True, e.code, e.message, None
    if fn.handler not in CAPTURABLE and fn.name not in CAPTURABLE_NAMES:
        return True, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, f"{fn.name} is not allowed on a capturing stream", None
    if fn.handler in ("memcpy_dtoh", "memcpy_htod"):
        # The shim captures pageable copies through a bounce buffer of their
        # own (interceptor/capture_copy.c); bytes in the message or in the
        # staging segment would be gone (or overwritten) at launch.
        host = args[0] if fn.handler == "memcpy_dtoh" else args[1]
        if not isinstance(host, P.ShmRef) or host.seg == sess.staging_seg:
            return True, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, \
                f"{fn.name}: this copy's host memory cannot be captured (its bytes travel with the call)", None
    if fn.name.startswith("cuStreamWaitEvent") and sess.capture_events.get(int(args[1] or 0)) == gid:
        return True, 0, "", None      # a dependency inside the capture: launch order keeps it
    if fn.handler == "event_record":
        sess.capture_events[int(args[0] or 0)] = gid
        if not (len(args) > 2 and int(args[2] or 0) & CU_EVENT_RECORD_EXTERNAL):
            # cuda.h, cuEventRecordWithFlags: only an external record becomes
            # a node; a plain record in a capture marks a dependency for
            # streams that join it (kept above) and does not run at launch,
            # so the app may destroy the event once captured (NVIDIA's
            # graphMemoryNodes sample does)
            return True, 0, "", None
    g.info["nodes"].append([op[0], op[1], _frozen(list(args))])
    return True, 0, "", None


def _capture_library_op(d, sess, fn, op) -> tuple[bool, int, str, None]:
    """A math-library call whose stream is capturing (graph_libcapture.py)."""
    from .graph_libcapture import capture, library_stream
    st = library_stream(sess, fn, op[2:])
    if st is None:
        return False, 0, "", None
    gid = sess.capture.get(_stream_value(fn, st))
    g = sess.objects.get((P.K_GRAPH, gid)) if gid is not None else None
    if g is None:
        return False, 0, "", None
    lc, code, msg = capture(d, sess, fn, op, st, _frozen(list(op[2:])))
    if lc is None:
        return True, code, msg, None
    g.info["nodes"].append([op[0], op[1], lc])
    return True, 0, "", None


def _graph(sess, handle):
    return sess.get(P.K_GRAPH, int(handle or 0))


@handler("graph_begin_capture")
def h_begin_capture(d, sess, fn, ctx, args, fid=0, ctxh=0, **kw):
    st = _stream_value(fn, int(args[0] or 0))
    if st in (0, P.STREAM_LEGACY):
        # cuda.h: the legacy NULL stream cannot be captured
        raise CudaError(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, f"{fn.name}: the legacy stream cannot be captured")
    if st != P.STREAM_PER_THREAD:
        sess.get(P.K_STREAM, st)
    if st in sess.capture:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the stream is already capturing")
    g = sess.add(P.K_GRAPH, None, ctx.id if ctx else 0, {"nodes": [], "origin": st, "capturing": True})
    sess.capture[st] = g.id
    return CUDA_SUCCESS, []


@handler("graph_end_capture")
def h_end_capture(d, sess, fn, ctx, args, **kw):
    st = _stream_value(fn, int(args[0] or 0))
    gid = sess.capture.get(st)
    if gid is None:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the stream is not capturing")
    g = sess.objects.get((P.K_GRAPH, gid))
    if g is None or g.info["origin"] != st:
        raise CudaError(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD if g is None else CUDA_ERROR_INVALID_VALUE,
                        f"{fn.name}: not the stream that began the capture")
    for s, x in list(sess.capture.items()):
        if x == gid:
            del sess.capture[s]
    for e, x in list(sess.capture_events.items()):
        if x == gid:
            del sess.capture_events[e]
    g.info["capturing"] = False
    return CUDA_SUCCESS, [g.handle if args[1] else None]


@handler("graph_is_capturing")
def h_is_capturing(d, sess, fn, ctx, args, **kw):
    st = _stream_value(fn, int(args[0] or 0))
    status = CU_STREAM_CAPTURE_STATUS_ACTIVE if st in sess.capture else CU_STREAM_CAPTURE_STATUS_NONE
    return CUDA_SUCCESS, [status if args[1] else None]


@handler("graph_instantiate")
def h_instantiate(d, sess, fn, ctx, args, **kw):
    g = _graph(sess, args[1])
    if g.info["capturing"]:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the graph is still being captured")
    from .graph_nodes import instantiate_info
    # cuGraphInstantiateWithFlags' flags (the auto-free flag matters: graph_mem.py)
    flags = int(args[2] or 0) if fn.name.startswith("cuGraphInstantiateWithFlags") else 0
    e = sess.add(P.K_GRAPH_EXEC, None, g.ctx, instantiate_info(sess, g, flags))
    outs = [e.handle if args[0] else None]
    outs += [None] * (sum(1 for p in fn.params if p[1] in ("out_value", "out_buffer")) - 1)
    return CUDA_SUCCESS, outs


# Ops that a higher family runs itself at launch, by function name:
# (d, sess, api name, ctxh, args, stream) -> None (graph_cond.py: conditional
# nodes); what it does before a launch runs any op: (d, sess, exec, stream)
# -> True when it launched the graph itself (then no op runs here); and when
# an executable graph or a graph goes: (d, sess, obj) -> None.
LAUNCH_OPS: dict = {}
LAUNCH_START: list = []
EXEC_DESTROY: list = []
GRAPH_DESTROY: list = []


@handler("graph_launch")
def h_launch(d, sess, fn, ctx, args, **kw):
    """Runs the executable graph's ops in order on the launch stream."""
    e = sess.get(P.K_GRAPH_EXEC, int(args[0] or 0))
    stream = _stream_value(fn, int(args[1] or 0))
    from . import graph_mem
    graph_mem.before_launch(d, sess, fn.name, e, stream)
    from .graph_exec_state import skipped_positions
    skip = skipped_positions(e)     # nodes disabled by cuGraphNodeSetEnabled
    for hook in LAUNCH_START:
        if hook(d, sess, e, stream):
            return CUDA_SUCCESS, []
    run_ops(d, sess, fn.name, e.info["nodes"], stream, skip)
    return CUDA_SUCCESS, []


def run_ops(d, sess, api: str, ops, stream, skip=()):
    """Runs ops (an executable graph's, or a conditional body's) in order on
    stream; raises CudaError naming the failed node."""
    from .._generated import FUNCTIONS
    from . import graph_mem
    prev, sess.graph_replay = sess.graph_replay, True
    try:
        for k, (fid, ctxh, nargs) in enumerate(ops):
            if k in skip:
                continue
            if graph_mem.is_marker(fid):
                graph_mem.run_marker(d, sess, api, (fid, ctxh, nargs), stream)
                continue
            nfn = FUNCTIONS[fid]
            if isinstance(nargs, LibCapture):
                nargs.launch(sess, stream)      # library work captured as a graph of its own
                continue
            own = LAUNCH_OPS.get(nfn.name)
            if own is not None:
                own(d, sess, api, ctxh, nargs, stream)
                continue
            slot = _stream_slot(nfn, nargs)
            op = [fid, ctxh] + (_with_stream(nargs, slot, stream) if slot[0] >= 0 else list(nargs))
            code, _outs, msg = d.run_op(sess, op)
            if code != CUDA_SUCCESS:
                raise CudaError(code, f"{api}: node {nfn.name} failed: {msg}")
    finally:
        sess.graph_replay = prev


@handler("graph_destroy")
def h_destroy(d, sess, fn, ctx, args, **kw):
    g = _graph(sess, args[0])
    for s, x in list(sess.capture.items()):
        if x == g.id:
            del sess.capture[s]
    for hook in GRAPH_DESTROY:
        hook(d, sess, g)
    from .graph_nodes import drop_nodes
    drop_nodes(sess, g)
    sess.drop(g)
    from .graph_mem import release_unused
    release_unused(d, sess, g.info.get("mem", ()))
    return CUDA_SUCCESS, []


@handler("graph_exec_destroy")
def h_exec_destroy(d, sess, fn, ctx, args, **kw):
    e = sess.remove(P.K_GRAPH_EXEC, int(args[0] or 0))
    for hook in EXEC_DESTROY:
        hook(d, sess, e)
    from .graph_mem import release_unused
    release_unused(d, sess, e.info.get("mem", ()))
    return CUDA_SUCCESS, []


# ------------------------------------------------------------ checkpoints

def _enc(a):
    if isinstance(a, (bytes, bytearray, memoryview)):
        return {"bytes": base64.b64encode(bytes(a)).decode()}
    if isinstance(a, P.ShmRef):
        return {"shm": [a.seg, a.offset, a.length]}
    if isinstance(a, list):
        return [_enc(x) for x in a]
    return a


def _dec(a):
    if isinstance(a, dict) and "bytes" in a:
        return base64.b64decode(a["bytes"])
    if isinstance(a, dict) and "shm" in a:
        return P.ShmRef(*[int(x) for x in a["shm"]])
    if isinstance(a, list):
        return [_dec(x) for x in a]
    return a


def describe(sess) -> list:
    """Graphs (not while capturing: a dump synchronises first, but a capture
    may be open; it is recorded and continues after a restore) and
    executable graphs, with their ops."""
    from .graph_libcapture import describe_check, describe_node
    describe_check(sess)
    out = []
    for kind, name in ((P.K_GRAPH, "graph"), (P.K_GRAPH_EXEC, "exec")):
        for o in sess.of_kind(kind):
            nodes = o.info["nodes"]
            d = {"id": o.id, "kind": name, "ctx": o.ctx,
                 "nodes": [[fid, ctxh, _enc(list(a.args) if isinstance(a, LibCapture) else list(a))]
                           for fid, ctxh, a in nodes]}
            libs = [[i, describe_node(a)] for i, (_f, _c, a) in enumerate(nodes) if isinstance(a, LibCapture)]
            if libs:
                # math-library calls captured with snapshots of their objects (graph_libcapture.py)
                d["libcaptures"] = libs
            if o.info.get("mem"):
                d["mem"] = list(o.info["mem"])      # graph allocations it holds (graph_mem.py)
            if o.info.get("flags"):
                d["flags"] = int(o.info["flags"])
            if name == "graph":
                d["origin"] = o.info["origin"]
                d["capturing"] = bool(o.info["capturing"])
                if o.info.get("xnodes"):
                    # nodes of a graph built explicitly (graph_nodes.py)
                    from .graph_nodes import describe_nodes
                    d["xnodes"] = describe_nodes(sess, o, _enc)
            else:
                d["graph"] = o.info["graph"]
                if "index" in o.info:
                    d["index"] = [[k, list(v)] for k, v in sorted(o.info["index"].items())]
                    d["node_order"] = list(o.info["node_order"])
                    d["sig"] = o.info["sig"]
                if o.info.get("disabled"):
                    d["disabled"] = list(o.info["disabled"])    # graph_exec_state.py
            out.append(d)
    return out


def rebuild(sess, graphs: list, capture: dict, capture_events: dict, d=None):
    from .._generated import FUNCTIONS
    from .graph_libcapture import from_image
    for g in graphs:
        nodes = []
        libs = {int(i): rec for i, rec in g.get("libcaptures", [])}
        for i, (fid, ctxh, a) in enumerate(g["nodes"]):
            if int(fid) not in FUNCTIONS:
                raise CudaError(CUDA_ERROR_INVALID_VALUE, f"graph {g['id']}: function id {fid} unknown")
            if i in libs:
                if d is None or FUNCTIONS[int(fid)].handler != "library":
                    raise CudaError(CUDA_ERROR_INVALID_VALUE, f"graph {g['id']}: node {i} is no library call")
                # made again once streams and library objects exist (engine: realize_pending)
                nodes.append([int(fid), int(ctxh), from_image(d, sess, int(fid), int(ctxh), _dec(a), libs[i])])
                continue
            nodes.append([int(fid), int(ctxh), _dec(a)])
        if g["kind"] == "graph":
            o = sess.add(P.K_GRAPH, None, int(g.get("ctx", 0)), {"nodes": nodes, "origin": int(g.get("origin", 0)),
                                                                 "capturing": bool(g.get("capturing")),
                                                                 "mem": [int(x) for x in g.get("mem", [])]},
                         ident=int(g["id"]))
            if g.get("xnodes"):
                from .graph_nodes import rebuild_nodes
                rebuild_nodes(sess, o, g["xnodes"], _dec)
        else:
            info = {"nodes": nodes, "graph": int(g.get("graph", 0)), "mem": [int(x) for x in g.get("mem", [])],
                    "flags": int(g.get("flags", 0))}
            if "index" in g:
                info["index"] = {int(k): [int(x) for x in v] for k, v in g["index"]}
                info["node_order"] = [int(x) for x in g.get("node_order", [])]
                info["sig"] = g.get("sig")
            if g.get("disabled"):
                from .graph_exec_state import rebuild_disabled
                rebuild_disabled(info, g["disabled"], f"executable graph {g['id']}")
            sess.add(P.K_GRAPH_EXEC, None, int(g.get("ctx", 0)), info, ident=int(g["id"]))
    sess.capture = {int(k): int(v) for k, v in capture.items()}
    sess.capture_events = {int(k): int(v) for k, v in capture_events.items()}


@handler("graph_capture_info")
def h_capture_info(d, sess, fn, ctx, args, **kw):
    """cuStreamGetCaptureInfo_v3: [status, capture id, graph] (the shim
    answers the dependency set itself: interceptor/capture.c). The id is the
    capture's graph id, unique within the session, as the driver's ids are
    unique per capture."""
    st = _stream_value(fn, int(args[0] or 0))
    gid = sess.capture.get(st)
    g = sess.objects.get((P.K_GRAPH, gid)) if gid is not None else None
    outs = [None] * 6
    if g is None:
        outs[0] = CU_STREAM_CAPTURE_STATUS_NONE if args[1] else None
    else:
        outs[0] = CU_STREAM_CAPTURE_STATUS_ACTIVE if args[1] else None
        outs[1] = g.id if args[2] else None
        outs[2] = g.handle if args[3] else None
    return CUDA_SUCCESS, outs


# with the graphs, the streams being captured into them and the events
# recorded in a capture ({stream or event value: graph id})
register(Kind("graphs", Stage.GRAPHS, ("graphs", "capture", "capture_events"),
              describe=lambda sess: {"graphs": describe(sess),
                                     "capture": {str(k): v for k, v in sess.capture.items()},
                                     "capture_events": {str(k): v for k, v in sess.capture_events.items()}},
              rebuild=lambda r: rebuild(r.sess, r.desc.get("graphs", []), r.desc.get("capture", {}),
                                        r.desc.get("capture_events", {}), r.dispatcher),
              owner=__name__))
