"""CUDA IPC between clients of one proxyd (issue 10, group 8;
docs/ipc.md): cuIpcGetMemHandle / cuIpcOpenMemHandle / cuIpcCloseMemHandle,
and event handles (cuIpcGetEventHandle / cuIpcOpenEventHandle).

Two clients are two sessions in two worker processes, so the opening worker
must map memory that belongs to the exporting worker. Every arena chunk is
created shareable as a POSIX file descriptor (VMM memory created with
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR on the GPU, a memfd on the emulated
backend). Exporting an allocation registers it in this worker's export table
and starts a small server on an abstract Unix socket; the 64-byte handle the
application receives names that socket, the export and a random secret. The
opening worker connects, proves the secret, and receives the chunk's file
descriptor by SCM_RIGHTS (the server checks that the peer runs as the same
user: SO_PEERCRED); it then imports the descriptor and maps the chunk into
free addresses of its own arena (cuMemImportFromShareableHandle + cuMemMap
on the GPU, mmap on the emulated backend).

Event handles need no help: each session's events are real driver events
in its own worker process, so the driver's own 64-byte handle, opened in
another worker, is the same event (on the emulated GPU an opened event is
complete: every operation there has run when it was issued). The shim makes
a record of such an event reach the GPU before cuEventRecord returns
(interceptor/ipc_event.c), as the other process may wait on it at once.

A session that exported or opened memory or events cannot be checkpointed: its pages
are shared with another process whose state would not be in the image. A
dump refuses it with a clear error (check_checkpointable).

Locking: handlers run on the worker's main loop; the export server runs on
a thread of its own and reads the export table under _lock.
"""
from __future__ import annotations

import logging
import os
import secrets
import socket
import struct
import threading

from ..core.kinds import Kind, Stage, register
from ..core.registry import CUDA_SUCCESS, handler
from ..core.session import CudaError

log = logging.getLogger("proxyd")

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_ERROR_MAP_FAILED = 205
CUDA_ERROR_ALREADY_MAPPED = 208

MAGIC = b"GPXIPC01"
# magic, exporter pid, export id, socket suffix, secret, offset in chunk, allocation size
_HANDLE = struct.Struct("<8sII8s16sQQ")
HANDLE_SIZE = 64

_lock = threading.Lock()
_exports: dict[int, tuple[bytes, int, int]] = {}    # export id -> (secret, fd, chunk size)
_server: tuple[socket.socket, bytes] | None = None   # listening socket, its name suffix
_next_id = 1


def _sock_name(pid: int, suffix: bytes) -> bytes:
    # abstract namespace: nothing on disk to clean up; access is checked per peer
    return b"\0gpuproxy-ipc-%d-%s" % (pid, suffix.hex().encode())


def _serve(sock: socket.socket):
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        with conn:
            try:
                conn.settimeout(5)
                cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
                _pid, uid, _gid = struct.unpack("3i", cred)
                req = conn.recv(64)
                if uid != os.getuid() or len(req) != 20:
                    conn.sendall(b"\0" * 16)
                    continue
                eid, = struct.unpack_from("<I", req)
                with _lock:
                    ent = _exports.get(eid)
                if ent is None or not secrets.compare_digest(ent[0], req[4:20]):
                    conn.sendall(b"\0" * 16)
                    continue
                socket.send_fds(conn, [struct.pack("<QQ", 1, ent[2])], [ent[1]])
            except OSError as e:
                log.info("IPC export server: %s", e)


def _ensure_server() -> bytes:
    global _server
    if _server is None:
        suffix = secrets.token_bytes(8)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        s.bind(_sock_name(os.getpid(), suffix))
        s.listen(16)
        threading.Thread(target=_serve, args=(s,), name="ipc-export", daemon=True).start()
        _server = (s, suffix)
    return _server[1]


def _fetch_fd(pid: int, suffix: bytes, eid: int, secret: bytes) -> tuple[int, int]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        s.settimeout(5)
        s.connect(_sock_name(pid, suffix))
        s.sendall(struct.pack("<I", eid) + secret)
        msg, fds, _flags, _addr = socket.recv_fds(s, 16, 1)
    finally:
        s.close()
    ok, size = struct.unpack("<QQ", msg) if len(msg) == 16 else (0, 0)
    if not ok or not fds:
        for fd in fds:
            os.close(fd)
        raise OSError("the exporting session refused the handle")
    return fds[0], size


# Further ways a session shares memory with another process, each a
# function sess -> None that raises RuntimeError (mempool_ipc.py registers
# the exportable pools' check): asked by check_checkpointable, between the
# events and the exports, so each speaks in its own words.
_SHARING_CHECKS: list = []


def register_sharing_check(check) -> None:
    if check not in _SHARING_CHECKS:
        _SHARING_CHECKS.append(check)


def check_checkpointable(sess) -> None:
    """Raises when the session shares device memory or events with another process."""
    ex, im = getattr(sess, "ipc_exports", None), getattr(sess, "ipc_imports", None)
    if getattr(sess, "ipc_events", None):
        raise RuntimeError(f"session of pid {sess.pid} has shared an event through CUDA IPC "
                           f"(cudaIpcGetEventHandle/cudaIpcOpenEventHandle): another process records or waits "
                           f"on it, which the image could not bring back; checkpointing one side of an IPC pair "
                           f"is not supported")
    for check in _SHARING_CHECKS:
        check(sess)     # exported or imported memory pools say so in their own words (mempool_ipc.py)
    if ex or im:
        what = "exported" if ex else "opened"
        raise RuntimeError(f"session of pid {sess.pid} has {what} device memory through CUDA IPC "
                           f"(cudaIpcGetMemHandle/cudaIpcOpenMemHandle): its pages are shared with another "
                           f"process whose state would not be in the image; checkpointing one side of an IPC "
                           f"pair is not supported")


def imported_range(sess, addr: int, n: int) -> bool:
    for base, (size, _tok) in (getattr(sess, "ipc_imports", None) or {}).items():
        if base <= addr and addr + n <= base + size:
            return True
    return False


def export_allocation(d, sess, fn, dptr: int) -> tuple[int, bytes, bytes, int, int]:
    """Registers the chunk that holds dptr for opening by another worker:
    (export id, socket suffix, secret, offset of dptr in the chunk, bytes
    from dptr to the allocation's end). Also used by pool pointer exports
    (proxyd/families/mempool_ipc.py)."""
    global _next_id
    hit = sess.arena.find(dptr)
    if hit is None:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {dptr:#x} is not inside a device allocation of this "
                                                  f"session")
    alloc, off = hit
    chunk = alloc.chunk
    fd = d.backend.chunk_export_fd(chunk.backing)      # CudaError(not supported) where it cannot
    suffix = _ensure_server()
    secret = secrets.token_bytes(16)
    with _lock:
        eid = _next_id
        _next_id += 1
        _exports[eid] = (secret, fd, chunk.size)
    if not hasattr(sess, "ipc_exports"):
        sess.ipc_exports = {}
    sess.ipc_exports[eid] = dptr
    return eid, suffix, secret, alloc.addr - chunk.start + off, alloc.size - off


@handler("ipc_get_mem_handle")
def h_ipc_get_mem_handle(d, sess, fn, ctx, args, **kw):
    eid, suffix, secret, off, size = export_allocation(d, sess, fn, int(args[1]))
    h = _HANDLE.pack(MAGIC, os.getpid(), eid, suffix, secret, off, size)
    return CUDA_SUCCESS, [h.ljust(HANDLE_SIZE, b"\0")]


def open_allocation(d, sess, fn, ctx, pid: int, suffix: bytes, eid: int, secret: bytes, off: int,
                    size: int) -> int:
    """Fetches an exported chunk from worker pid and maps it at free
    addresses of this session's arena; returns the allocation's address
    there. Also used by pool pointer imports (proxyd/families/mempool_ipc.py)."""
    if pid == os.getpid():
        # natively too: a process cannot open its own handle (cudaErrorDeviceUninitialized / invalid context)
        raise CudaError(CUDA_ERROR_INVALID_CONTEXT, f"{fn.name}: the handle was exported by this same process")
    try:
        fd, chunk_size = _fetch_fd(pid, suffix, eid, secret)
    except OSError as e:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: cannot reach the exporting session ({e})") from None
    try:
        if off + size > chunk_size:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: handle outside its memory")
        from ..core.arena import GRANULARITY, round_up
        extent = round_up(chunk_size, GRANULARITY)
        base = sess.arena._va.take(extent, GRANULARITY)
        if base is None:
            raise CudaError(CUDA_ERROR_OUT_OF_MEMORY, f"{fn.name}: session address space exhausted")
        dev = ctx.device if ctx is not None else 0
        try:
            tok = d.backend.import_fd_at(dev, base, chunk_size, fd)
        except Exception:
            sess.arena._va.give(base, base + extent)
            raise
    finally:
        os.close(fd)
    if not hasattr(sess, "ipc_imports"):
        sess.ipc_imports = {}
    sess.ipc_imports[base] = (extent, tok)
    sess.ipc_opened = getattr(sess, "ipc_opened", {})
    sess.ipc_opened[base + off] = base
    return base + off


def close_allocation(d, sess, fn, ctx, dptr: int) -> None:
    """Unmaps what open_allocation mapped at dptr, after the context's work."""
    base = getattr(sess, "ipc_opened", {}).pop(dptr, None)
    if base is None:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {dptr:#x} was not returned by cuIpcOpenMemHandle")
    if ctx is not None:
        d.backend.ctx_sync(ctx.real)
    extent, tok = sess.ipc_imports.pop(base)
    d.backend.unimport(tok)
    sess.arena._va.give(base, base + extent)


@handler("ipc_open_mem_handle")
def h_ipc_open_mem_handle(d, sess, fn, ctx, args, **kw):
    raw = bytes(args[1]) if isinstance(args[1], (bytes, bytearray, memoryview)) else b""
    if len(raw) != HANDLE_SIZE or raw[:8] != MAGIC:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: not a memory handle of this proxyd")
    _m, pid, eid, suffix, secret, off, size = _HANDLE.unpack_from(raw)
    return CUDA_SUCCESS, [open_allocation(d, sess, fn, ctx, pid, suffix, eid, secret, off, size)]


@handler("ipc_close_mem_handle")
def h_ipc_close_mem_handle(d, sess, fn, ctx, args, **kw):
    close_allocation(d, sess, fn, ctx, int(args[0]))
    return CUDA_SUCCESS, []


def release(d, sess) -> None:
    """Session end: unmaps what it opened, withdraws what it exported."""
    for base, (extent, tok) in list((getattr(sess, "ipc_imports", None) or {}).items()):
        try:
            d.backend.unimport(tok)
        except Exception as e:
            log.warning("session %s: unmapping IPC memory at %#x: %s", sess.token, base, e)
    for eid in list((getattr(sess, "ipc_exports", None) or {})):
        with _lock:
            ent = _exports.pop(eid, None)
        if ent is not None:
            os.close(ent[1])


CU_EVENT_INTERPROCESS = 0x4


@handler("ipc_get_event_handle")
def h_ipc_get_event_handle(d, sess, fn, ctx, args, **kw):
    from ..core import protocol as P
    ev = sess.get(P.K_EVENT, int(args[1] or 0))
    raw = d.backend.ipc_event_handle(ev.real)
    sess.ipc_events = getattr(sess, "ipc_events", set()) | {ev.id}
    return CUDA_SUCCESS, [raw]


@handler("ipc_open_event_handle")
def h_ipc_open_event_handle(d, sess, fn, ctx, args, **kw):
    from ..core import protocol as P
    if ctx is None:
        raise CudaError(CUDA_ERROR_INVALID_CONTEXT, f"{fn.name}: no current context on the calling thread")
    raw = bytes(args[1]) if isinstance(args[1], (bytes, bytearray, memoryview)) else b""
    if len(raw) != HANDLE_SIZE:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: an event handle is {HANDLE_SIZE} bytes")
    real = d.backend.ipc_event_open(raw)
    o = sess.add(P.K_EVENT, real, ctx.id, {"ipc": True, "flags": CU_EVENT_INTERPROCESS})
    sess.ipc_events = getattr(sess, "ipc_events", set()) | {o.id}
    return CUDA_SUCCESS, [o.handle]


register(Kind("ipc", Stage.NONE, check=check_checkpointable, owner=__name__))     # open exports refuse a dump
