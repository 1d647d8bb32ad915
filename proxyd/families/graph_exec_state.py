"""The state graph_exec_nodes.py keeps on an executable graph that
graphs.py reads when it launches, writes and reads back a graph
(info["disabled"]: node ids disabled by cuGraphNodeSetEnabled). Apart from
graph_exec_nodes.py so that graphs.py can use it without an import cycle
(tests/layering.py).

Locking: the worker's main loop only (dispatch.py).
"""
from __future__ import annotations

from ..core.session import CudaError

CUDA_ERROR_INVALID_VALUE = 1


def skipped_positions(e) -> frozenset:
    """The op positions a launch of executable graph e skips."""
    off = e.info.get("disabled")
    if not off:
        return frozenset()
    index = e.info.get("index", {})
    return frozenset(k for i in off for k in index.get(i, ()))


def rebuild_disabled(info: dict, ids, what: str) -> None:
    """"disabled" from an image: node ids the exec's index knows."""
    ids = [int(x) for x in ids or []]
    if any(i not in info.get("index", {}) for i in ids):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: a disabled node the executable graph lacks")
    if ids:
        info["disabled"] = sorted(set(ids))
