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

Limits: a copy into pageable host memory cannot be captured (its bytes
would have nowhere to go at launch) and answers
CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, as do synchronising calls on a
capturing stream; a host-to-device copy from pageable memory captures the
bytes at capture time.

Locking: the worker's main loop only (dispatch.py).
"""
from __future__ import annotations

import base64

from . import protocol as P
from .dispatch import CUDA_SUCCESS, handler
from .session import CudaError

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900
CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901
CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908
CU_STREAM_CAPTURE_STATUS_NONE = 0
CU_STREAM_CAPTURE_STATUS_ACTIVE = 1

# ops that may be captured, by handler (or by name for generic ones)
CAPTURABLE = {"launch_kernel", "launch_kernel_ex", "launch_cooperative", "memcpy_htod", "memcpy_dtoh",
              "memcpy_dtod", "memset", "memset2d", "host_func", "event_record", "graph_launch"}
CAPTURABLE_NAMES = {"cuStreamWaitEvent", "cuStreamWaitEvent_ptsz"}
# calls about the capture itself, which run while it is active
CAPTURE_CONTROL = {"graph_begin_capture", "graph_end_capture", "graph_is_capturing", "graph_capture_info"}


def _stream_slot(fn, args) -> tuple[int, int | None]:
    """(index of the stream argument, index inside it) for op args; (-1, None)
    when the function takes no stream. cuLaunchKernelEx keeps the stream in
    its configuration list (handlers.h_launch_ex)."""
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


def _frozen(a):
    """An argument kept beyond its message (frames are reused)."""
    if isinstance(a, (memoryview, bytearray)):
        return bytes(a)
    if isinstance(a, list):
        return [_frozen(x) for x in a]
    return a


def _stream_value(fn, handle: int) -> int:
    if fn.name.endswith("_ptsz") and handle == 0:
        return P.STREAM_PER_THREAD
    return handle


def capture_op(d, sess, op) -> tuple[bool, int, str]:
    """Records op into a capture when its stream is capturing. Returns
    (captured, error code, message); (False, 0, "") runs the op as usual."""
    from ._generated import FUNCTIONS
    if not isinstance(op, list) or len(op) < 2 or type(op[0]) is not int:
        return False, 0, ""
    fn = FUNCTIONS.get(op[0])
    if fn is None or fn.handler in CAPTURE_CONTROL:
        return False, 0, ""
    args = op[2:]
    slot = _stream_slot(fn, args)
    st = _get_stream(args, slot)
    if st is None:
        return False, 0, ""
    st = _stream_value(fn, st)
    gid = sess.capture.get(st)
    if fn.name.startswith("cuStreamWaitEvent") and gid is None:
        # fork: a stream that waits on an event recorded in a capture joins it
        ev = int(args[1] or 0)
        g2 = sess.capture_events.get(ev)
        if g2 is not None and (P.K_GRAPH, g2) in sess.objects:
            sess.capture[st] = g2
            return True, 0, ""
        return False, 0, ""
    if gid is None:
        return False, 0, ""
    g = sess.objects.get((P.K_GRAPH, gid))
    if g is None:
        return False, 0, ""
    if fn.handler not in CAPTURABLE and fn.name not in CAPTURABLE_NAMES:
        return True, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, f"{fn.name} is not allowed on a capturing stream"
    if fn.handler == "memcpy_dtoh" and not isinstance(args[0], P.ShmRef):
        return True, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, \
            f"{fn.name}: a copy into pageable host memory cannot be captured (use page-locked memory)"
    if fn.name.startswith("cuStreamWaitEvent") and sess.capture_events.get(int(args[1] or 0)) == gid:
        return True, 0, ""      # a dependency inside the capture: launch order keeps it
    if fn.handler == "event_record":
        sess.capture_events[int(args[0] or 0)] = gid
    g.info["nodes"].append([op[0], op[1], _frozen(list(args))])
    return True, 0, ""


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
    e = sess.add(P.K_GRAPH_EXEC, None, g.ctx, instantiate_info(sess, g))
    outs = [e.handle if args[0] else None]
    outs += [None] * (sum(1 for p in fn.params if p[1] in ("out_value", "out_buffer")) - 1)
    return CUDA_SUCCESS, outs


@handler("graph_launch")
def h_launch(d, sess, fn, ctx, args, **kw):
    """Runs the executable graph's ops in order on the launch stream."""
    e = sess.get(P.K_GRAPH_EXEC, int(args[0] or 0))
    stream = _stream_value(fn, int(args[1] or 0))
    from ._generated import FUNCTIONS
    prev, sess.graph_replay = sess.graph_replay, True
    try:
        for fid, ctxh, nargs in e.info["nodes"]:
            nfn = FUNCTIONS[fid]
            slot = _stream_slot(nfn, nargs)
            op = [fid, ctxh] + (_with_stream(nargs, slot, stream) if slot[0] >= 0 else list(nargs))
            code, _outs, msg = d.run_op(sess, op)
            if code != CUDA_SUCCESS:
                raise CudaError(code, f"{fn.name}: node {nfn.name} failed: {msg}")
    finally:
        sess.graph_replay = prev
    return CUDA_SUCCESS, []


@handler("graph_destroy")
def h_destroy(d, sess, fn, ctx, args, **kw):
    g = _graph(sess, args[0])
    for s, x in list(sess.capture.items()):
        if x == g.id:
            del sess.capture[s]
    from .graph_nodes import drop_nodes
    drop_nodes(sess, g)
    sess.drop(g)
    return CUDA_SUCCESS, []


@handler("graph_exec_destroy")
def h_exec_destroy(d, sess, fn, ctx, args, **kw):
    sess.remove(P.K_GRAPH_EXEC, int(args[0] or 0))
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
    out = []
    for kind, name in ((P.K_GRAPH, "graph"), (P.K_GRAPH_EXEC, "exec")):
        for o in sess.of_kind(kind):
            d = {"id": o.id, "kind": name, "ctx": o.ctx,
                 "nodes": [[fid, ctxh, _enc(list(a))] for fid, ctxh, a in o.info["nodes"]]}
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
            out.append(d)
    return out


def rebuild(sess, graphs: list, capture: dict, capture_events: dict):
    from ._generated import FUNCTIONS
    for g in graphs:
        nodes = []
        for fid, ctxh, a in g["nodes"]:
            if int(fid) not in FUNCTIONS:
                raise CudaError(CUDA_ERROR_INVALID_VALUE, f"graph {g['id']}: function id {fid} unknown")
            nodes.append([int(fid), int(ctxh), _dec(a)])
        if g["kind"] == "graph":
            o = sess.add(P.K_GRAPH, None, int(g.get("ctx", 0)), {"nodes": nodes, "origin": int(g.get("origin", 0)),
                                                                 "capturing": bool(g.get("capturing"))},
                         ident=int(g["id"]))
            if g.get("xnodes"):
                from .graph_nodes import rebuild_nodes
                rebuild_nodes(sess, o, g["xnodes"], _dec)
        else:
            info = {"nodes": nodes, "graph": int(g.get("graph", 0))}
            if "index" in g:
                info["index"] = {int(k): [int(x) for x in v] for k, v in g["index"]}
                info["node_order"] = [int(x) for x in g.get("node_order", [])]
                info["sig"] = g.get("sig")
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
