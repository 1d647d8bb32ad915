"""Frees of device memory that another family may own.

cuMemFree and cuMemFreeAsync take any device pointer; some of them are not
plain arena allocations: a graph allocation freed outside its graph
(graph_mem.py), a pointer imported from another process's memory pool
(mempool_ipc.py). Those families register a claim here, and the free
handlers (memory.py, mempool.py) ask the claims first; this keeps the free
handlers below the families that extend them (no import cycle,
docs/architecture.md "Folders").

A claim is called as claim(d, sess, fn, ctx, addr, stream, name) and returns
True when it freed addr (the handler then answers success), False when addr
is not its kind. name is the function name for messages. stream is None
for cuMemFree (the caller synchronised the context already).

Locking: filled at import time, read by handlers on the worker's loop.
"""
from __future__ import annotations

from typing import Callable

# (order, claim): asked in ascending order; graph allocations first (10),
# then imported pool pointers (20), as the handlers asked them before
_CLAIMS: list[tuple[int, Callable]] = []


def register_claim(order: int, claim: Callable) -> None:
    if any(c is claim for _o, c in _CLAIMS):
        return
    _CLAIMS.append((order, claim))
    _CLAIMS.sort(key=lambda x: x[0])


def claimed(d, sess, fn, ctx, addr: int, stream=None, name: str | None = None) -> bool:
    """True when a family freed addr (see the top)."""
    for _order, claim in _CLAIMS:
        if claim(d, sess, fn, ctx, addr, stream, name or fn.name):
            return True
    return False
