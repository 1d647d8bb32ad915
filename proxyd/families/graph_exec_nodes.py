"""Per-node changes to an executable graph that XLA's command buffers make
between launches (cuda.h, "Graph Management"; xla/stream_executor/cuda/
cuda_command_buffer.cc): cuGraphExecChildGraphNodeSetParams (a child-graph
node takes another graph of the same topology) and cuGraphNodeSetEnabled /
cuGraphNodeGetEnabled (a kernel, memset or memcpy node is skipped by
launches while disabled).

Model (graph_nodes.py): an executable graph is one list of ops, info
"index" giving each node's positions in it. A child node's positions take
the new child's ops, flattened; the driver requires the child's topology
and node order to be those of the graph the node holds, so the op count is
the same (checked). Disabled nodes are kept as info["disabled"] (node ids);
graphs.h_launch skips their positions (graph_exec_state.py, which graphs.py
imports without importing this module: no import cycle).

Checkpoint: the exec's ops are written as they are (graphs.describe), and
"disabled" with them (manifest_schema: graphs[].disabled).

Locking: the worker's main loop only (dispatch.py).
"""
from __future__ import annotations

from ..core import protocol as P
from ..core.registry import CUDA_SUCCESS, handler
from ..core.session import CudaError
from .graph_nodes import T_GRAPH, T_KERNEL, T_MEMCPY, T_MEMSET, _refuse_memory_nodes, flatten, graph, node

CUDA_ERROR_INVALID_VALUE = 1
# cuda.h, cuGraphNodeSetEnabled: "Only kernel, memset and memcpy nodes are supported"
ENABLE_TYPES = (T_KERNEL, T_MEMSET, T_MEMCPY)


def _exec_node(sess, fn, eh, nh):
    e = sess.get(P.K_GRAPH_EXEC, int(eh or 0))
    n = node(sess, nh)
    pos = e.info.get("index", {}).get(n.id)
    if pos is None:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the node is not one of the executable graph's")
    return e, n, pos


@handler("graph_exec_child_set_params")
def h_exec_child_set_params(d, sess, fn, ctx, args, **kw):
    """cuGraphExecChildGraphNodeSetParams: [exec, node, child graph]."""
    e, n, pos = _exec_node(sess, fn, args[0], args[1])
    if n.info["type"] != T_GRAPH:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the node is not a child-graph node")
    child = graph(sess, args[2])
    if child.info.get("capturing"):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the graph is being captured")
    _refuse_memory_nodes(sess, child, fn, "cannot be a child graph")
    ops, _index = flatten(sess, child)
    if len(ops) != len(pos) or [op[0] for op in ops] != [e.info["nodes"][k][0] for k in pos]:
        # cuda.h: "The topology of childGraph, as well as the node insertion
        # order, must match that of the graph contained in hNode"
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the graph's topology differs from the node's")
    for k, op in zip(pos, ops):
        e.info["nodes"][k] = list(op)
    return CUDA_SUCCESS, []


@handler("graph_node_enabled")
def h_node_enabled(d, sess, fn, ctx, args, **kw):
    """cuGraphNodeSetEnabled: [exec, node, isEnabled];
    cuGraphNodeGetEnabled: [exec, node, out]."""
    e, n, _pos = _exec_node(sess, fn, args[0], args[1])
    if n.info["type"] not in ENABLE_TYPES:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: only kernel, memset and memcpy nodes")
    off = set(e.info.get("disabled", ()))
    if "Get" in fn.name:
        return CUDA_SUCCESS, [0 if n.id in off else 1]
    if int(args[2] or 0):
        off.discard(n.id)
    else:
        off.add(n.id)
    if off:
        e.info["disabled"] = sorted(off)
    else:
        e.info.pop("disabled", None)
    return CUDA_SUCCESS, []
