"""The worker's side of the shared host pool (proxyd/supervisor/host_pool.py
holds it; the messages: core/host_pool_wire.py): staging memory for dumps
that is page-locked already, lent by the supervisor, so a worker's first
dump does not page-lock memory of its own.

lease(backend, size) asks the supervisor for the pool of this worker's
session user; if there is none yet (or it is too small) and the supervisor
has room, the worker makes one and gives its descriptor to the supervisor,
which holds it for the next worker of the same user. It returns a
SharedPool, which has the interface of pinned_pool.PinnedPool (all of it
pinned from the start), or None: the pool is off, refused, lent to another
worker of the user, or could not be made; the caller then uses a
PinnedPool of its own, as before.

Memory: on the cuda backend, cuMemCreate with CU_MEM_LOCATION_TYPE_HOST_NUMA
(node 0) and a POSIX file descriptor handle, mapped with cuMemMap and made
accessible to every device and the CPU (cuMemSetAccess): cuda.h, "Virtual
Memory Management"; the figures are in docs/benchmarks.md. On the emulated
backend a memfd mapped with mmap (the same descriptor passing, ownership
and clean-up, without a GPU).

Locking: used by the checkpoint engine under its lock (one caller at a
time); the channel to the supervisor carries one exchange at a time.
Ownership: a SharedPool's mapping belongs to this worker until free(),
which unmaps it and tells the supervisor the lease is over; the worker's
exit ends the lease too.
"""
from __future__ import annotations

import logging
import mmap
import os
import select
import socket
import stat
import struct
import time

from ..core import host_pool_wire as W

log = logging.getLogger("proxyd")

ANSWER_S = 5.0           # the supervisor answers at once; more means it is gone or stuck
_chan: socket.socket | None = None
_warned: set[str] = set()


def adopt_channel() -> None:
    """Takes the channel the supervisor passed ($GPUPROXY_HOST_POOL_FD) at
    the worker's start, before anything else of the worker opens a
    descriptor, and removes the variable, so that no child inherits it.

    The number is trusted only if its descriptor is what the supervisor
    passes: an AF_UNIX SOCK_SEQPACKET socket whose peer is the supervisor
    ($GPUPROXY_SUPERVISOR_PID, SO_PEERCRED: socketpair(2) records the
    creator). A variable inherited from elsewhere names a descriptor that
    is closed here, or worse another of this worker's sockets: a pool
    request written into an emulated collective's connection once stopped
    a two-rank job (CI, test_nccl_cut after test_host_pool had left the
    variable in the test runner's environment). Such a number is left
    alone (never closed: it is not ours) and the pool is off."""
    global _chan
    fd = os.environ.pop(W.ENV_FD, None)
    if not fd:
        return
    try:
        n = int(fd)
        if not stat.S_ISSOCK(os.fstat(n).st_mode):
            raise ValueError("not a socket")
        s = socket.socket(fileno=n)
    except (OSError, ValueError) as e:
        log.info("host pool channel %r unusable (%s); staging memory of this worker's own", fd, e)
        return
    why = None
    if s.family != socket.AF_UNIX or s.type != socket.SOCK_SEQPACKET:
        why = "not the supervisor's kind of socket"
    else:
        want = os.environ.get("GPUPROXY_SUPERVISOR_PID", "")
        pid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        if want.isdigit() and pid != int(want):
            why = f"its peer is pid {pid}, not the supervisor"
    if why:
        s.detach()                 # another part of this process owns the descriptor
        log.info("host pool channel %r refused: %s; staging memory of this worker's own", fd, why)
        return
    os.set_inheritable(n, False)
    _chan = s


def _channel() -> socket.socket | None:
    """The channel adopt_channel took, or None (the pool is off)."""
    return _chan


def _once(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        log.info("%s", msg)


def _ask(msg: dict, fds=()) -> tuple[dict, list[int]]:
    s = _channel()
    W.send(s, msg, fds)
    r, _, _ = select.select([s], [], [], ANSWER_S)
    if not r:
        raise TimeoutError(f"the supervisor did not answer a host pool request within {ANSWER_S:g} s")
    reply, got = W.recv(s)
    if reply is None:
        raise ConnectionError("the supervisor closed the host pool channel")
    return reply, got


class SharedPool:
    """PinnedPool's interface over memory that is page-locked already."""

    def __init__(self, size: int, view: memoryview, unmap, how: str, took_s: float):
        self.size = size
        self.view = view
        self.segment = size
        self.nseg = 1
        self.failed = None
        self._unmap = unmap
        self.t0 = time.monotonic() - took_s
        self.t_done = time.monotonic()
        self.kept: dict | None = None     # a restore's lease: the note of the image it holds
        self._noted = False               # the supervisor has a keep note of this pool's contents
        self.stats = {"touch_s": 0.0, "register_s": 0.0, "register_max_s": 0.0, "segments": 1,
                      "segment_mb": size >> 20, "threads": 0, "shared": how, "map_s": round(took_s, 4)}

    def segment_end(self, off: int) -> int:
        return self.size

    def wait_pinned(self, off: int, n: int) -> float:
        return 0.0

    def wait_any(self, segments) -> set[int]:
        return set(segments)

    def run_when_ready(self, segments, fn) -> None:
        for k in sorted(set(segments)):
            fn(k)

    def all_pinned(self) -> bool:
        return True

    def note(self, keep: dict) -> bool:
        """Tells the supervisor this pool holds an image's memory (keep:
        host_pool_wire's note); True when it took it."""
        try:
            reply, fds = _ask({"op": "keep", "keep": keep})
            for fd in fds:
                os.close(fd)
        except Exception as e:
            _once(f"host pool: keep note not taken: {e}")
            return False
        self._noted = bool(reply.get("ok"))
        if not self._noted:
            _once(f"host pool: keep note refused: {reply.get('why')}")
        return self._noted

    def touch(self) -> None:
        """Called before anything writes to the pool: the supervisor's note
        (if any) goes first, so it never describes overwritten memory. Should
        the supervisor not answer, a stale note costs nothing but speed: the
        restore checks every chunk's hash on the device and reads the files
        for any that differ (checkpoint/memory_restore.py)."""
        if self._noted:
            self._noted = False
            try:
                _ask({"op": "keep", "keep": None})
            except Exception as e:
                _once(f"host pool: keep note not withdrawn: {e}")

    def free(self) -> None:
        try:
            self.view.release()
        except Exception:
            pass
        try:
            self._unmap()
        finally:
            try:
                _ask({"op": "return"})
            except Exception as e:        # the worker's exit ends the lease anyway
                _once(f"host pool: return not acknowledged: {e}")


# ------------------------------------------------------------ memfd (emulated backend)

def _memfd_make(size: int) -> int:
    fd = os.memfd_create("gpuproxy-host-pool", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
    except OSError:
        os.close(fd)
        raise
    return fd


def _memfd_map(fd: int, size: int):
    st = os.fstat(fd)
    if st.st_size < size:
        raise ValueError(f"the pool's descriptor has {st.st_size} bytes, not {size}")
    mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
    os.close(fd)                      # the mapping keeps the memory; the supervisor keeps its own descriptor

    def unmap():
        try:
            mm.close()
        except BufferError:
            pass
    return memoryview(mm), unmap


# ------------------------------------------------------------ cuda

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_LOCATION_TYPE_HOST_NUMA = 3
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3


def _cuda_prop(b):
    prop = b.ffi.new("CUmemAllocationProp *")
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA
    prop.location.id = 0
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    return prop


def cuda_round(b, size: int) -> int:
    g = b.ffi.new("size_t *")
    b.check(b.lib.cuMemGetAllocationGranularity(g, _cuda_prop(b), 0), "cuMemGetAllocationGranularity(host)")
    return -(-size // g[0]) * g[0]


def _cuda_make(b, size: int) -> int:
    b._set(b.mgmt[0])
    h = b.ffi.new("unsigned long long *")
    b.check(b.lib.cuMemCreate(h, size, _cuda_prop(b), 0), "cuMemCreate(host)")
    fd = b.ffi.new("int *")
    try:
        b.check(b.lib.cuMemExportToShareableHandle(fd, h[0], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                "cuMemExportToShareableHandle")
    finally:
        b.lib.cuMemRelease(h[0])      # the descriptor keeps the memory
    return int(fd[0])


def _cuda_map(b, fd: int, size: int):
    ffi, lib = b.ffi, b.lib
    b._set(b.mgmt[0])
    h = ffi.new("unsigned long long *")
    b.check(lib.cuMemImportFromShareableHandle(h, ffi.cast("void *", fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
            "cuMemImportFromShareableHandle")
    os.close(fd)
    va = ffi.new("unsigned long long *")
    try:
        b.check(lib.cuMemAddressReserve(va, size, 0, 0, 0), "cuMemAddressReserve(host pool)")
        try:
            b.check(lib.cuMemMap(va[0], size, 0, h[0], 0), "cuMemMap(host pool)")
            acc = ffi.new("CUmemAccessDesc[]", b.ndev + 1)
            for d in range(b.ndev):
                acc[d].location.type, acc[d].location.id = CU_MEM_LOCATION_TYPE_DEVICE, d
                acc[d].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            acc[b.ndev].location.type, acc[b.ndev].location.id = CU_MEM_LOCATION_TYPE_HOST_NUMA, 0
            acc[b.ndev].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            r = lib.cuMemSetAccess(va[0], size, acc, b.ndev + 1)
            if r:
                lib.cuMemUnmap(va[0], size)
                b.check(r, "cuMemSetAccess(host pool)")
        except Exception:
            lib.cuMemAddressFree(va[0], size)
            raise
    except Exception:
        lib.cuMemRelease(h[0])
        raise
    addr, handle = int(va[0]), int(h[0])
    view = memoryview(ffi.buffer(ffi.cast("char *", addr), size))

    def unmap():
        b._set(b.mgmt[0])
        lib.cuMemUnmap(addr, size)
        lib.cuMemAddressFree(addr, size)
        lib.cuMemRelease(handle)
    return view, unmap


# ------------------------------------------------------------ lease

def lease_kept(b, image: str) -> SharedPool | None:
    """The pool that holds image's memory, with its note in .kept, lent to
    this worker; None when there is none (or no pool at all). Never raises."""
    if _channel() is None:
        return None
    kind = "cuda" if getattr(b, "name", "") == "cuda" else "memfd"
    try:
        t0 = time.monotonic()
        reply, fds = _ask({"op": "lease", "kind": kind, "size": 1, "image": image})
        if not (reply.get("ok") and len(fds) == 1 and isinstance(reply.get("kept"), dict)):
            for fd in fds:
                os.close(fd)
            return None
        size = int(reply["size"])
        view, unmap = _cuda_map(b, fds[0], size) if kind == "cuda" else _memfd_map(fds[0], size)
        pool = SharedPool(size, view, unmap, "lent", time.monotonic() - t0)
        pool.stats["kept_image"] = True
        pool.kept = reply["kept"]
        return pool
    except Exception as e:
        log.warning("host pool: the memory kept of %s not used (%s: %s)", image, type(e).__name__, e)
        return None


def lease(b, size: int) -> SharedPool | None:
    """The shared pool for staging `size` bytes, or None (see the module
    comment). Never raises: a failure is one log line and None."""
    if _channel() is None:
        return None
    kind = "cuda" if getattr(b, "name", "") == "cuda" else "memfd"
    try:
        if kind == "cuda":
            size = cuda_round(b, size)
        else:
            size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        t0 = time.monotonic()
        reply, fds = _ask({"op": "lease", "kind": kind, "size": size})
        if reply.get("ok") and len(fds) == 1:
            size = int(reply["size"])
            view, unmap = _cuda_map(b, fds[0], size) if kind == "cuda" else _memfd_map(fds[0], size)
            return SharedPool(size, view, unmap, "lent", time.monotonic() - t0)
        for fd in fds:
            os.close(fd)
        if not reply.get("may_give"):
            _once(f"host pool: none for this session ({reply.get('why')}); staging memory of its own")
            return None
        fd = _cuda_make(b, size) if kind == "cuda" else _memfd_make(size)
        try:
            reply, _ = _ask({"op": "give", "kind": kind, "size": size}, (fd,))
        except Exception:
            os.close(fd)
            raise
        if not reply.get("ok"):
            os.close(fd)
            _once(f"host pool: the supervisor did not take the pool ({reply.get('why')}); staging memory of its own")
            return None
        view, unmap = _cuda_map(b, fd, size) if kind == "cuda" else _memfd_map(fd, size)
        return SharedPool(size, view, unmap, "made", time.monotonic() - t0)
    except Exception as e:
        log.warning("host pool: not used (%s: %s); staging memory of its own", type(e).__name__, e)
        return None
