"""Host functions in stream order (cuLaunchHostFunc, cuStreamAddCallback):
the worker's side of interceptor/hostfn.c.

The application's function runs in the application's process. Where the
stream reaches it, the worker asks the shim to run it through a one-page
"gate" that both map (a client segment, proxyd/core/shm.py) and waits until the
shim says it returned; meanwhile the stream holds everything enqueued after
it, which is what the CUDA Driver API promises for cuLaunchHostFunc.

Gate layout (little-endian; interceptor/hostfn.c, struct gp_gate):
  0  u32 req   bumped by the worker: "run function `id`"
  4  u32 done  set to `req` by the shim once the function returned
  8  u64 id

Waits use shared futexes on the gate's words (Linux futex(2)); each wait
has a timeout, so the loop also notices a client that died (its
proof-of-life lock on the staging segment, interceptor/hostmem.c, is gone)
and a session that is closing.

Locking: `Gate.lock` serialises requests, so one gate holds at most one
request (the CUDA driver also runs a context's host functions one at a
time). Called on the driver's callback thread (cuda backend) or the main
loop (emu backend); touches nothing of the session but the gate and the
flags set at creation.
"""
from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import struct
import threading
import time

log = logging.getLogger("proxyd")

GATE_BYTES = 16
SYS_FUTEX = 202             # x86-64 (asm/unistd_64.h); aarch64 is 98
if os.uname().machine in ("aarch64", "arm64"):
    SYS_FUTEX = 98
FUTEX_WAIT, FUTEX_WAKE = 0, 1
WAIT_SLICE_S = 0.05
LIVENESS_EVERY_S = 0.5

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class Gate:
    def __init__(self, mm, offset: int, life_path: str | None):
        """mm: the client segment's mmap (kept referenced: its address must
        stay valid); offset of the gate inside it; life_path: the client's
        staging segment, on which it holds a shared flock while alive."""
        self.mm = mm
        self.offset = offset
        self.life_path = life_path
        self.lock = threading.Lock()
        self.closing = False
        self._req = ctypes.c_uint32.from_buffer(mm, offset)
        self._done = ctypes.c_uint32.from_buffer(mm, offset + 4)
        self._id = ctypes.c_uint64.from_buffer(mm, offset + 8)

    def release(self):
        """Lets the mmap be closed (drops the ctypes views)."""
        self.closing = True
        self._req = self._done = self._id = None

    def _futex(self, word, op, val, timeout_s=None):
        ts = None
        if timeout_s is not None:
            ts = ctypes.byref(_Timespec(int(timeout_s), int((timeout_s % 1) * 1e9)))
        return _libc.syscall(SYS_FUTEX, ctypes.byref(word), op, ctypes.c_uint32(val), ts, None, 0)

    def client_alive(self) -> bool:
        """The shim holds LOCK_SH on its staging segment for as long as it
        lives (hostmem.c, hold_life_lock); an exclusive lock we can take
        means nobody holds it any more."""
        if not self.life_path:
            return True
        try:
            fd = os.open(self.life_path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False            # the segment's name is gone: the client removed it at exit
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except OSError:
            return True             # held (EWOULDBLOCK), or we cannot tell: assume alive
        finally:
            os.close(fd)

    def run(self, fid: int) -> bool:
        """Has the client run host function `fid`; returns once it returned
        (True), or False when the client is gone or the session closes."""
        with self.lock:
            req, done, ident = self._req, self._done, self._id    # release() may drop the attributes
            if self.closing or req is None:
                return False
            n = (req.value + 1) & 0xFFFFFFFF
            ident.value = fid
            req.value = n                  # x86-64 stores are ordered: id is visible first
            self._futex(req, FUTEX_WAKE, 0x7FFFFFFF)
            next_check = time.monotonic() + LIVENESS_EVERY_S
            while True:
                d = done.value
                if d == n:
                    return True
                if self.closing:
                    return False
                self._futex(done, FUTEX_WAIT, d, WAIT_SLICE_S)
                now = time.monotonic()
                if now >= next_check:
                    next_check = now + LIVENESS_EVERY_S
                    if not self.client_alive():
                        log.warning("client gone while its host function %d was pending; the stream goes on", fid)
                        self.closing = True
                        return False


def gate_for(sess, ref) -> Gate:
    """The session's gate for shared-memory reference ref (one per client
    segment mapping: a client that parked and came back maps its segments
    anew, and the worker then maps the new file)."""
    mm = sess.shm.open(ref.seg)
    if ref.offset < 0 or ref.offset + GATE_BYTES > len(mm) or ref.offset % 8:
        from ..core.session import CudaError
        raise CudaError(1, f"host function gate {ref.offset}+{GATE_BYTES} outside client segment {ref.seg}")
    gates = sess.hostfn_gates
    g = gates.get(ref.seg)
    if g is None or g.mm is not mm or g.offset != ref.offset:
        if g is not None:
            g.release()
        life = sess.shm.path(sess.staging_seg) if sess.staging_seg is not None else None
        g = gates[ref.seg] = Gate(mm, ref.offset, life)
    return g


def close_gates(sess):
    for g in sess.hostfn_gates.values():
        g.release()
    sess.hostfn_gates.clear()
