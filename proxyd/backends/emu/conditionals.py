"""Conditional handles of the emulated GPU (cuda.h, cuGraphConditionalHandleCreate;
cuda_device_runtime_api.h, cudaGraphSetConditional).

On a GPU a handle names storage the driver keeps for a graph's conditional
node; a kernel writes it with cudaGraphSetConditional(handle, value) and the
conditional node reads it. Here the storage is this table, one per worker
process (one session): an emulated kernel writes it with
`k.set_conditional(handle, value)` and proxyd's launch of a conditional node
(proxyd/families/graph_cond.py) reads it. Handle values are opaque 64-bit
numbers handed to the application unchanged; a restore registers the
recorded values again (`restore`), so kernels that keep a handle in device
memory or in their parameters still name it.

Locking: the worker's main loop only (kernels run on it).
"""
from __future__ import annotations

# value -> current condition value
VALUES: dict[int, int] = {}
_BASE = 0xC0D0_0000_0000        # far from every address the emulated GPU hands out
_next = [1]


def create() -> int:
    h = _BASE + _next[0]
    _next[0] += 1
    VALUES[h] = 0
    return h


def restore(handle: int) -> None:
    """A handle of an image, under its recorded value."""
    handle = int(handle)
    VALUES[handle] = 0
    if handle >= _BASE:
        _next[0] = max(_next[0], handle - _BASE + 1)


def get(handle: int) -> int:
    return VALUES[int(handle)]


def set_value(handle: int, value: int) -> None:
    handle = int(handle)
    if handle not in VALUES:
        raise KeyError(handle)
    VALUES[handle] = int(value) & 0xFFFFFFFF


def drop(handle: int) -> None:
    VALUES.pop(int(handle), None)
