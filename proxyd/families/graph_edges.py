"""Edge data of graphs built explicitly (cuda.h, CUgraphEdgeData, CUDA 12.3+:
cuGraphAddNode_v2, cuGraphAddDependencies_v2, cuGraphRemoveDependencies_v2,
cuGraphGetEdges_v2, cuGraphNodeGetDependencies_v2,
cuGraphNodeGetDependentNodes_v2).

An edge's data says when the upstream node releases the downstream one
(from_port: 0 at completion; for a kernel node also
CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC, 1, or _LAUNCH_ORDER, 2) and how
(type: CU_GRAPH_DEPENDENCY_TYPE_DEFAULT 0 or _PROGRAMMATIC 1, the latter only
between kernel nodes and only from one of those two ports, cuda.h
CUgraphDependencyType). to_port has no value but 0 (cuda.h: "0 in all cases
means the entirety of the downstream node") and the five reserved bytes must
be zero.

How it runs. proxyd runs a graph's ops one after the other in a topological
order (graph_nodes.py): every edge, whatever its data, is a full dependency
there. That is one of the schedules the driver may choose: a programmatic
edge lets the downstream kernel start early, it never requires it to (the
kernel's cudaGridDependencySynchronize() returns at once when the upstream
kernel is complete). Results are those of the driver's schedule.

Model. An edge's data is kept on its downstream node, info["edata"] =
{upstream node id: (from_port, to_port, type)}, only for edges that are not
the default (all zero); describe/rebuild carry it in the checkpoint image
as [upstream id, from_port, to_port, type] rows, checked against the
node's dependencies when read back.

A query without an edge-data array over an edge with data fails with
CUDA_ERROR_LOSSY_QUERY (cuda.h, cuGraphGetEdges): the shim decides that, as
only it knows whether the caller passed the array (interceptor/
graph_build.c); proxyd always sends the data.

Locking: the worker's main loop only (dispatch.py).
"""
from __future__ import annotations

import struct

from ..core.session import CudaError

CUDA_ERROR_INVALID_VALUE = 1

PORT_DEFAULT, PORT_PROGRAMMATIC, PORT_LAUNCH_ORDER = 0, 1, 2
TYPE_DEFAULT, TYPE_PROGRAMMATIC = 0, 1
DEFAULT = (0, 0, 0)
T_KERNEL = 0            # CU_GRAPH_NODE_TYPE_KERNEL
_EDGE = struct.Struct("<BBB5s")     # CUgraphEdgeData: from_port, to_port, type, reserved[5]


def parse(raw, n: int, what: str) -> list[tuple[int, int, int]]:
    """n edges' data from the caller's array (bytes), or all default when
    the caller passed NULL (cuda.h: NULL means default data)."""
    if raw is None:
        return [DEFAULT] * n
    b = bytes(raw)
    if len(b) != _EDGE.size * n:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: {len(b)} bytes of edge data for {n} edges")
    out = []
    for i in range(n):
        f, t, ty, res = _EDGE.unpack_from(b, _EDGE.size * i)
        if any(res):
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: edge data's reserved bytes must be zero")
        out.append((f, t, ty))
    return out


def check(edge: tuple[int, int, int], from_type: int, to_type: int, what: str) -> None:
    """The rules of cuda.h (CUgraphEdgeData, CUgraphDependencyType,
    CU_GRAPH_KERNEL_NODE_PORT_*) for one edge between nodes of these types."""
    f, t, ty = edge
    if t != 0:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: to_port must be 0")
    if ty not in (TYPE_DEFAULT, TYPE_PROGRAMMATIC):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: unknown edge type {ty}")
    if f not in (PORT_DEFAULT, PORT_PROGRAMMATIC, PORT_LAUNCH_ORDER):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: unknown from_port {f}")
    if f != PORT_DEFAULT and from_type != T_KERNEL:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: from_port {f} exists on kernel nodes only")
    if f == PORT_PROGRAMMATIC and ty != TYPE_PROGRAMMATIC:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: the programmatic port needs a programmatic edge")
    if ty == TYPE_PROGRAMMATIC:
        if from_type != T_KERNEL or to_type != T_KERNEL:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: a programmatic edge joins two kernel nodes")
        if f == PORT_DEFAULT:
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"{what}: a programmatic edge leaves from the programmatic or launch-order port")


def get(node, dep_id: int) -> tuple[int, int, int]:
    return tuple(node.info.get("edata", {}).get(dep_id, DEFAULT))


def put(node, dep_id: int, edge: tuple[int, int, int]) -> None:
    ed = node.info.setdefault("edata", {})
    if tuple(edge) == DEFAULT:
        ed.pop(dep_id, None)
    else:
        ed[dep_id] = tuple(edge)
    if not ed:
        node.info.pop("edata", None)


def drop(node, dep_id: int) -> None:
    put(node, dep_id, DEFAULT)


def pack(edges) -> bytes:
    return b"".join(_EDGE.pack(f, t, ty, bytes(5)) for f, t, ty in edges)


def describe(node) -> list:
    return [[int(k), *map(int, v)] for k, v in sorted(node.info.get("edata", {}).items())]


def rebuild(info: dict, rows, what: str) -> None:
    """Edge data from an image: each row names one of the node's
    dependencies and carries data of known values (the types are checked
    once every node exists: check_rebuilt)."""
    for row in rows or []:
        dep, f, t, ty = (int(x) for x in row)
        if dep not in info["deps"]:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: edge data for a dependency the node lacks")
        if (f, t, ty) != DEFAULT:
            info.setdefault("edata", {})[dep] = (f, t, ty)


def check_rebuilt(nodes_by_id: dict, what: str) -> None:
    """After a rebuild: every kept edge obeys the rules between its nodes' types."""
    for n in nodes_by_id.values():
        for dep, e in n.info.get("edata", {}).items():
            check(e, nodes_by_id[dep].info["type"], n.info["type"], what)
