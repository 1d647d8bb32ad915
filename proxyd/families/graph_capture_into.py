"""cuStreamBeginCaptureToGraph (cuda.h, CUDA 12.3+): a stream capture that
records into a graph the application made, instead of a new one. XLA's
command buffers trace library calls (cuBLAS, cuDNN, custom calls) this way
into a graph of their own, which they then add as a child node
(xla/stream_executor/cuda/cuda_command_buffer.cc, Trace).

Model (graphs.py): a captured operation goes to the graph's captured list
("nodes"), which runs before the graph's explicit nodes (graph_nodes.py).
That order is the graph's order exactly when the capture depends on none of
the graph's nodes, as XLA's (no dependencies) does, and nothing can depend on
a captured operation but later captured ones (cuStreamGetCaptureInfo names
no nodes: interceptor/capture.c). A capture given dependencies is refused
with CUDA_ERROR_NOT_SUPPORTED and one line. cuStreamEndCapture hands back
the same graph (cuda.h).

Checkpoint: as any capture (graphs.describe: the graph's ops, whether it is
capturing, the stream's capture).

Locking: the worker's main loop only (dispatch.py).
"""
from __future__ import annotations

from ..core import protocol as P
from ..core.registry import CUDA_SUCCESS, handler
from ..core.session import CudaError
from .graphs import CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, _graph, _stream_value

CUDA_ERROR_NOT_SUPPORTED = 801


@handler("graph_begin_capture_to_graph")
def h_begin_capture_to_graph(d, sess, fn, ctx, args, **kw):
    """[stream, graph, dependencies, dependency data, count, mode]."""
    st = _stream_value(fn, int(args[0] or 0))
    if st in (0, P.STREAM_LEGACY):
        raise CudaError(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, f"{fn.name}: the legacy stream cannot be captured")
    if st != P.STREAM_PER_THREAD:
        sess.get(P.K_STREAM, st)
    g = _graph(sess, args[1])
    if int(args[4] or 0):
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name}: a capture that depends on nodes of the graph "
                                                  "is not supported")
    if st in sess.capture:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the stream is already capturing")
    if g.info.get("capturing"):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the graph is being captured already")
    from .graph_nodes import has_memory_nodes
    if has_memory_nodes(sess, g):
        # graph allocations made by a capture (graph_mem.py) belong to a graph the capture made
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name}: capturing into a graph with memory nodes "
                                                  "is not supported")
    g.info["origin"] = st
    g.info["capturing"] = True
    sess.capture[st] = g.id
    return CUDA_SUCCESS, []
