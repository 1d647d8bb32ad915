"""Conditional nodes added to a graph while a stream is captured into it,
and cuStreamUpdateCaptureDependencies (cuda.h, CUDA 12.3+).

CUDA's way of putting a conditional node into a stream capture (the CUDA
programming guide's "conditional nodes" with stream capture): ask
cuStreamGetCaptureInfo_v3 for the capture's graph and dependency set, add
the node to that graph with cuGraphAddNode on those dependencies, then make
the node the capture's dependency set with cuStreamUpdateCaptureDependencies
(CU_STREAM_SET_CAPTURE_DEPENDENCIES), so the work captured after it follows
it. The body graphs (phGraph_out) are filled as anywhere else.

Here a capture is the ordered list of its operations (graphs.py), and the
shim answers the dependency set empty (interceptor/capture.c): the node is
added as an explicit node of the graph (graph_nodes.py) marked
info["in_capture"], and the capture's list gets an op in its place,
[cuGraphAddNode's id, ctx, [node id]], which graph_nodes.flatten replaces
with the node's expansion (graph_cond.expand) at that place in capture
order. So the node runs after everything captured before it and before
everything captured after it, whatever dependency set the application
passes or sets: a stricter order than the driver's, never a looser one.
cuStreamUpdateCaptureDependencies is accepted (ADD or SET) for nodes of the
stream's capture graph; with the capture kept in order it changes nothing.
Edge data other than the default is refused (not supported, one line).

Checkpoint: the marks travel in graph_conds["captured"] (graph_cond.py).

Locking: the worker's main loop only (dispatch.py).
"""
from __future__ import annotations

import struct

from ..core import protocol as P
from ..core.registry import CUDA_SUCCESS, handler
from ..core.session import CudaError
from . import graph_nodes as GN
from . import graphs as G

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_ERROR_ILLEGAL_STATE = 401             # cuda.h: the stream is not capturing
ADD_DEPS, SET_DEPS = 0, 1               # CUstreamUpdateCaptureDependencies_flags
EDGE_DATA_SIZE = 8                      # CUgraphEdgeData: from_port, to_port, type, reserved[5]


def _nodes_of(sess, g, handles, what: str) -> list[int]:
    """Node ids for handles, each a node added to g during its capture."""
    out = []
    for h in handles:
        n = GN.node(sess, h)
        if n.info["graph"] != g.id or not n.info.get("in_capture"):
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: a dependency is not a node of the capture's graph")
        if n.id in out:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: duplicate dependency")
        out.append(n.id)
    return out


def add_info(sess, fn, args, g, ntype: int):
    """GN.add_node_info for a graph being captured ([out, graph, [deps],
    count, ...]): the dependencies are the capture's set (empty, as the
    shim answers it) or nodes added to it before."""
    deps = GN._ids(args[2], fn.name)
    if len(deps) != int(args[3] or 0):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {len(deps)} dependencies for numDependencies "
                                                  f"{args[3]}")
    return g, {"graph": g.id, "type": ntype, "ops": [], "deps": _nodes_of(sess, g, deps, fn.name),
               "in_capture": True}


def place(sess, g, n):
    """The node's op in the capture's list, where the capture stands now."""
    ctxh = P.make_handle(P.K_CONTEXT, n.ctx) if n.ctx else 0
    g.info["nodes"].append([GN._fid("cuGraphAddNode"), ctxh, [n.id]])


def captured_node(op):
    fid, _c, args = op[0], op[1], op[2]
    if fid == GN._fid("cuGraphAddNode") and isinstance(args, list) and len(args) == 1 and type(args[0]) is int:
        return args[0]
    return None


def _drop(sess, n):
    """cuGraphDestroyNode (or its graph's end) of a node added in a capture:
    its place in the capture's list goes too."""
    if not n.info.get("in_capture"):
        return
    g = sess.objects.get((P.K_GRAPH, n.info["graph"]))
    if g is not None:
        g.info["nodes"] = [op for op in g.info["nodes"] if captured_node(op) != n.id]


@handler("graph_capture_deps")
def h_update_deps(d, sess, fn, ctx, args, **kw):
    """cuStreamUpdateCaptureDependencies(_v2): [stream, node handles (u64
    each), (edge data,) count, flags]."""
    v2 = len(args) == 5
    st = G._stream_value(fn, int(args[0] or 0))
    raw, n, flags = args[1], int(args[-2] or 0), int(args[-1] or 0)
    if flags not in (ADD_DEPS, SET_DEPS):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: flags {flags:#x}")
    gid = sess.capture.get(st)
    g = sess.objects.get((P.K_GRAPH, gid)) if gid is not None else None
    if g is None:
        raise CudaError(CUDA_ERROR_ILLEGAL_STATE, f"{fn.name}: the stream is not capturing")
    raw = bytes(raw or b"")
    if len(raw) != 8 * n:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {len(raw)} bytes for {n} dependencies")
    if v2 and args[2] is not None and any(bytes(args[2])):
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name}: edge data other than the default is not supported "
                                                  "in a capture (docs/compatibility.md)")
    _nodes_of(sess, g, struct.unpack(f"<{n}Q", raw), fn.name)
    return CUDA_SUCCESS, []


GN.CAPTURED_NODE.append(captured_node)
GN.DROP_NODE.append(_drop)
