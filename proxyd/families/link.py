"""The JIT linker of a session: cuLinkCreate_v2, cuLinkAddData_v2,
cuLinkComplete, cuLinkDestroy as sent by the shim (interceptor/link.c).

The shim forwards value options as two byte arrays (u32 CUjit_option, u64
value) and keeps the application's log buffers itself; the worker links with
log buffers of its own, of the sizes the application asked for, and answers
their contents after every call (also after a failed one: the error log is
what tells a user why a link failed), so the outs of AddData are
[info log, error log] and those of Complete [image, info log, error log],
whatever the result code.

Link states live in `sess.links` (id -> backend state) for the length of one
compilation (milliseconds); they are not checkpoint objects: a dump while one
is open is refused with a clear error and changes nothing (retry a moment
later), so no image ever lacks a link state its application still holds.
Locking: the worker's loop thread, as every handler.
"""
from __future__ import annotations

import struct

from ..core.kinds import Kind, Stage, register
from ..core.registry import CUDA_SUCCESS, handler
from ..core.session import CudaError

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_HANDLE = 400

JIT_INFO_LOG_BUFFER = 3
JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4
JIT_ERROR_LOG_BUFFER = 5
JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
MAX_OPTIONS = 64
MAX_LOG = 1 << 20          # a log buffer larger than this is capped (the reply carries it)


def options(fn, n, opts, vals) -> list[tuple[int, int]]:
    """The [option, value] pairs of the shim's two arrays."""
    n = int(n)
    opts, vals = bytes(opts or b""), bytes(vals or b"")
    if not 0 <= n <= MAX_OPTIONS or len(opts) != 4 * n or len(vals) != 8 * n:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: malformed option arrays")
    return list(zip(struct.unpack(f"<{n}I", opts), struct.unpack(f"<{n}Q", vals)))


def _links(sess) -> dict:
    links = getattr(sess, "links", None)
    if links is None:
        links = sess.links = {"next": 1}
    return links


def _get(fn, sess, ident):
    st = _links(sess).get(int(ident)) if int(ident) else None
    if st is None:
        raise CudaError(CUDA_ERROR_INVALID_HANDLE, f"{fn.name}: unknown link state {int(ident)}")
    return st


def _need_ctx(ctx, fn):
    if ctx is None:
        raise CudaError(201, f"{fn.name}: no current context on the calling thread")
    return ctx


def check_no_open_link(sess) -> None:
    """Raises when the session is between cuLinkCreate and cuLinkDestroy."""
    links = getattr(sess, "links", None) or {}
    n = sum(1 for k in links if k != "next")
    if n:
        raise RuntimeError(f"session of pid {sess.pid} has {n} JIT link(s) open (cuLinkCreate without "
                           f"cuLinkDestroy yet): a link state is not kept in images; nothing was dumped, "
                           f"retry when the link is done")


@handler("link_create")
def h_link_create(d, sess, fn, ctx, args, **kw):
    _need_ctx(ctx, fn)
    pairs = options(fn, args[0], args[1], args[2])
    logs = {JIT_INFO_LOG_BUFFER_SIZE_BYTES: 0, JIT_ERROR_LOG_BUFFER_SIZE_BYTES: 0}
    plain = []
    for o, v in pairs:
        if o in logs:
            logs[o] = min(int(v), MAX_LOG)
        elif o in (JIT_INFO_LOG_BUFFER, JIT_ERROR_LOG_BUFFER):
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: a log buffer pointer cannot cross the wire")
        else:
            plain.append((o, v))
    st = d.backend.link_create(plain, logs[JIT_INFO_LOG_BUFFER_SIZE_BYTES], logs[JIT_ERROR_LOG_BUFFER_SIZE_BYTES])
    links = _links(sess)
    ident = links["next"]
    links["next"] += 1
    links[ident] = st
    return CUDA_SUCCESS, [ident]


@handler("link_add_data")
def h_link_add_data(d, sess, fn, ctx, args, **kw):
    _need_ctx(ctx, fn)
    st = _get(fn, sess, args[0])
    data = bytes(args[2] or b"")
    if not data or int(args[3]) != len(data):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {len(data)} bytes received for size {int(args[3])}")
    name = bytes(args[4] or b"\0").rstrip(b"\0").decode(errors="replace")
    pairs = options(fn, args[5], args[6], args[7])
    try:
        d.backend.link_add(st, int(args[1]), data, name, pairs)
        code = CUDA_SUCCESS
    except CudaError as e:
        code = e.code
    return code, list(d.backend.link_logs(st))


@handler("link_complete")
def h_link_complete(d, sess, fn, ctx, args, **kw):
    _need_ctx(ctx, fn)
    st = _get(fn, sess, args[0])
    try:
        image = d.backend.link_complete(st)
        code = CUDA_SUCCESS
    except CudaError as e:
        image, code = b"", e.code
    return code, [image, *d.backend.link_logs(st)]


@handler("link_destroy")
def h_link_destroy(d, sess, fn, ctx, args, **kw):
    links = _links(sess)
    st = links.pop(int(args[0]), None) if int(args[0]) else None
    if st is None:
        raise CudaError(CUDA_ERROR_INVALID_HANDLE, f"{fn.name}: unknown link state {int(args[0])}")
    d.backend.link_destroy(st)
    return CUDA_SUCCESS, []


register(Kind("link", Stage.NONE, check=check_no_open_link, owner=__name__))     # an open link state refuses a dump
