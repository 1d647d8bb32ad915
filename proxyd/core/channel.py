"""proxyd's side of the same-host fast channel (interceptor/channel.c).

A shared-memory mailbox per client: one request slot and one reply slot.
The layout and the publishing rules are described in interceptor/channel.c
and docs/protocol.md ("Fast channel"); ZeroMQ stays the doorbell and the
path for everything that does not fit.

Memory ordering: x86-64 keeps stores in order and loads in order, so bytes
written before a sequence number are seen before it. The reply slot is
published like a seqlock: its number is 0 while the bytes change. The two idle flags need
a full fence between a store and the following load; a locked instruction
gives one (threading.Lock acquire/release uses one).

Locking: used by the daemon's main loop only.
"""
from __future__ import annotations

import mmap
import os
import struct
import threading

from .addrspace import MAP_GATE

MAX = 1 << 20
SIZE = 4096 + 2 * MAX
REQ_SEQ, REQ_LEN, REQ_TAKEN, REP_SEQ, REP_LEN, DAEMON_IDLE, CLIENT_IDLE = 64, 72, 128, 192, 200, 256, 320
REQ_DATA, REP_DATA = 4096, 4096 + MAX

_fence_lock = threading.Lock()
_u64 = struct.Struct("<Q")
_u32 = struct.Struct("<I")


def fence():
    """A full memory fence (a locked instruction)."""
    _fence_lock.acquire()
    _fence_lock.release()


class ChannelError(Exception):
    pass


class Channel:
    def __init__(self, name: str, size: int):
        if size != SIZE:
            raise ChannelError(f"channel of {size} bytes, expected {SIZE}")
        path = os.path.join("/dev/shm", name.lstrip("/"))
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as e:
            raise ChannelError(f"cannot open {path}: {e.strerror}") from e
        try:
            with MAP_GATE.shared():       # never inside an open driver zone (addrspace.py)
                self.mm = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        if self.mm[:8] != b"GPXCHAN1":
            raise ChannelError(f"{path} is not a gpuproxy channel")
        self.name = name
        self.taken = _u64.unpack_from(self.mm, REQ_TAKEN)[0]
        self._cptr = None      # (ffi, pointer) while the C serving loop uses the mapping

    def address(self, ffi):
        """The mapping's address for the C serving loop (native_serve.py);
        close() releases it."""
        if self._cptr is None:
            self._cptr = (ffi, ffi.from_buffer(self.mm))
        return self._cptr[1]

    def poll(self) -> tuple[int, bytes] | None:
        """The request in the slot if it is new (and marks it taken)."""
        mm = self.mm
        seq = _u64.unpack_from(mm, REQ_SEQ)[0]
        if seq <= self.taken:
            return None
        n = _u32.unpack_from(mm, REQ_LEN)[0]
        if n > MAX:
            return None
        data = mm[REQ_DATA:REQ_DATA + n]
        self.taken = seq
        _u64.pack_into(mm, REQ_TAKEN, seq)
        return seq, data

    def pending(self) -> bool:
        """Whether a request newer than the last one taken is in the slot."""
        return _u64.unpack_from(self.mm, REQ_SEQ)[0] > self.taken

    def reply(self, seq: int, frame) -> bool:
        """Puts a reply in the slot; True if the client polls (no ZeroMQ copy
        needed), False if it sleeps and must also get it by ZeroMQ."""
        n = len(frame)
        if n > MAX:
            return False
        mm = self.mm
        # Seqlock publishing: the slot's sequence number is 0 while its bytes
        # change, so a client that read the previous reply's number before we
        # began sees 0 (or this number) when it checks again, never the old
        # number over new bytes (x86-64 keeps these stores in order).
        _u64.pack_into(mm, REP_SEQ, 0)
        mm[REP_DATA:REP_DATA + n] = frame
        _u32.pack_into(mm, REP_LEN, n)
        _u64.pack_into(mm, REP_SEQ, seq)
        fence()
        return _u32.unpack_from(mm, CLIENT_IDLE)[0] == 0

    def set_idle(self, idle: bool):
        _u32.pack_into(self.mm, DAEMON_IDLE, 1 if idle else 0)

    def close(self):
        if self._cptr is not None:
            ffi, p = self._cptr
            self._cptr = None
            ffi.release(p)
        try:
            self.mm.close()
        except BufferError:
            pass
