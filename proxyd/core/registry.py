"""The handler registry and what every handler shares: the `handler`
decorator that API families use to claim a spec'd function (spec:
`handler:`), the CUresult codes the dispatcher answers with, and the
argument-type rules of the wire (docs/protocol.md, "Messages").

It lives at the bottom (proxyd.core) so that a family registers its
handlers without importing the dispatcher above it; the dispatcher
(worker/dispatch.py) imports proxyd.families, whose modules register on
import, and looks handlers up here.

Locking: HANDLERS is filled at import time and only read afterwards.
"""
from __future__ import annotations

from typing import Callable

from . import protocol as P
from .session import CudaError

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_ERROR_CONTEXT_IS_DESTROYED = 709
# An exception inside proxyd while executing a call (a bug, or input it did
# not foresee) answers CUDA_ERROR_UNKNOWN (cudaErrorUnknown in the runtime),
# with the message "<function>: internal error in proxyd: ..." (docs/protocol.md,
# "Errors"); the traceback is logged once per place (ratelog.py).
CUDA_ERROR_UNKNOWN = 999

HANDLERS: dict[str, Callable] = {}
# function ids from here on belong to the library families (autogen/specload.py)
LIBRARY_IDS = 20000

# What each argument role may be on the wire (docs/protocol.md, "Messages");
# hand-written handlers use the same slots, sometimes with a shared-memory
# reference where a size would be (out buffers filled by DMA into client
# memory). Anything else is type confusion: invalid value, before any handler
# sees it.
_BUF = (bytes, bytearray, memoryview, P.ShmRef, P.FrameRef)
_ROLE_TYPES = {
    "scalar": (int, float, bytes, bytearray, memoryview),
    "device_ptr": (int,),
    "handle": (int,),
    "in_buffer": _BUF,
    "out_buffer": (int, P.ShmRef),
    "out_value": (int, P.ShmRef),     # true (bool is an int) or a segment
}


class LibraryUnavailable(Exception):
    """A remoted library (cuBLAS, NCCL, ...) cannot be loaded in the worker:
    its calls answer not-supported (families/libraries.py, families/nccl.py)."""


def bad_argument(fn, args) -> str | None:
    """Why args cannot be fn's arguments (None when their types fit)."""
    for (name, role, _kind, _ctype, cls, _size, _sz), a in zip(fn.params, args):
        if a is None:
            continue
        ok = _ROLE_TYPES.get(role)
        if role == "in_buffer" and fn.shim == "override" and isinstance(a, list):
            continue     # a structure the shim sends decoded (its handler checks it), e.g. CUlaunchConfig
        if role == "in_buffer" and fn.handler == "module_load" and isinstance(a, P.ContentRef):
            continue     # a module image named by its digest (modules.h_module_load)
        if ok is not None and not isinstance(a, ok):
            return f"{fn.name}: argument {name} ({role}) has the wrong type ({type(a).__name__})"
        if role == "scalar" and cls in ("int", "uint") and not isinstance(a, int):
            return f"{fn.name}: argument {name} must be an integer, got {type(a).__name__}"
    return None


def handler(name: str):
    def deco(fn):
        HANDLERS[name] = fn
        return fn
    return deco


def norm_scalar(v, cls: str | None, size: int | None):
    """Brings a msgpack scalar into the C type's range (the shim sends signed
    64-bit values for all integers)."""
    if v is None:
        return 0
    if cls == "float":
        return float(v)
    if cls in ("int", "uint") and size:
        bits = 8 * size
        v = int(v) & ((1 << bits) - 1)
        if cls == "int" and v >= 1 << (bits - 1):
            v -= 1 << bits
        return v
    return v


def need_ctx(ctx, fn):
    """The call's current context, or CUDA_ERROR_INVALID_CONTEXT naming fn."""
    if ctx is None:
        raise CudaError(CUDA_ERROR_INVALID_CONTEXT, f"{fn.name}: no current context on the calling thread")
    return ctx


def stream_of(d, sess, v):
    """The backend's stream for the client's stream value v (0 and the
    special streams included)."""
    return d.resolve_handle(sess, "stream", v)
