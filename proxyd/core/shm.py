"""Client host memory shared with proxyd (interceptor/hostmem.c).

Segments are POSIX shared memory objects named /gpuproxy-<public id>-<n> (files in
/dev/shm). proxyd maps one when the client first refers to it: the staging
segment at HELLO (opening it proves that both sides see the same /dev/shm),
pinned-host segments at cuMemAllocHost/cuMemHostAlloc, when the backend also
page-locks them so that copies are plain DMA.

Locking: used by the daemon's main loop only.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os

from .addrspace import MAP_GATE

SHM_DIR = "/dev/shm"

# Fixed-address mappings (GPU-visible host memory, docs/host-memory.md):
# Python's mmap module cannot place a mapping, so libc's mmap is called.
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_FIXED_NOREPLACE = 0x100000      # linux/mman.h; never replaces an existing mapping


class ShmError(Exception):
    pass


class AddressInUse(ShmError):
    pass


class ShmMap:
    def __init__(self, token: str):
        self.token = token
        self.maps: dict[int, mmap.mmap] = {}
        self.registered: dict[int, object] = {}
        # GPU-visible segments: seg -> (address, length, kind, flags); kept
        # while the mapping itself comes and goes (parking, restore)
        self.fixed: dict[int, tuple[int, int, int, int]] = {}
        # () -> the uid whose files the session's segments must be (the
        # session's user, worker_gate.py); None: not checked (no gate)
        self.owner_of = None

    def path(self, seg: int) -> str:
        from .shm_names import public_id
        return os.path.join(SHM_DIR, f"gpuproxy-{public_id(self.token)}-{seg}")

    def open(self, seg: int, size: int | None = None) -> mmap.mmap:
        m = self.maps.get(seg)
        if m is not None:
            return m
        if seg in self.fixed:
            return self._open_fixed(seg)
        try:
            fd = os.open(self.path(seg), os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            raise ShmError(f"cannot open client segment {self.path(seg)}: {e.strerror}") from e
        self._check_owner(fd, seg)
        try:
            n = os.fstat(fd).st_size
            if size is not None and n < size:
                raise ShmError(f"client segment {seg} has {n} bytes, expected {size}")
            with MAP_GATE.shared():       # never inside an open driver zone (addrspace.py)
                m = mmap.mmap(fd, n, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.maps[seg] = m
        return m

    def _check_owner(self, fd: int, seg: int) -> None:
        """A segment is a regular file of the session's user: its public name
        can be taken by anyone (issue 21), whose file proxyd must not map
        in the session's place."""
        import stat
        st = os.fstat(fd)
        want = self.owner_of() if self.owner_of is not None else None
        if not stat.S_ISREG(st.st_mode) or (want is not None and st.st_uid != want):
            os.close(fd)
            raise ShmError(f"client segment {seg} is not a file of the session's user")

    def _open_fixed(self, seg: int):
        """Maps a GPU-visible segment at the address it has in the client.
        The range must be free in this process (MAP_FIXED_NOREPLACE): a
        worker never puts anything of its own in the client's host-memory
        window, but the driver or a library might."""
        addr, length, _kind, _flags = self.fixed[seg]
        try:
            fd = os.open(self.path(seg), os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            raise ShmError(f"cannot open client segment {self.path(seg)}: {e.strerror}") from e
        self._check_owner(fd, seg)
        try:
            n = os.fstat(fd).st_size
            if n < length:
                raise ShmError(f"client segment {seg} has {n} bytes, expected {length}")
            with MAP_GATE.shared():
                p = _libc.mmap(addr, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | MAP_FIXED_NOREPLACE,
                               fd, 0)
                err = ctypes.get_errno()
        finally:
            os.close(fd)
        if p is None or p == ctypes.c_void_p(-1).value or p != addr:
            if p not in (None, ctypes.c_void_p(-1).value):
                _libc.munmap(p, length)      # a kernel before 4.17 took the address as a hint
                err = errno.EEXIST
            raise AddressInUse(f"address range {addr:#x}+{length} of client segment {seg} is not free in the worker "
                               f"({os.strerror(err)})")
        m = memoryview((ctypes.c_ubyte * length).from_address(addr)).cast("B")
        self.maps[seg] = m
        return m

    def view(self, seg: int, offset: int, length: int) -> memoryview:
        m = self.open(seg)
        if offset < 0 or length < 0 or offset + length > len(m):
            raise ShmError(f"reference {offset}+{length} outside client segment {seg} ({len(m)} bytes)")
        return memoryview(m)[offset:offset + length]

    def close(self, seg: int):
        m = self.maps.pop(seg, None)
        if m is not None and seg in self.fixed:
            # the caller unregistered it from the driver first; nothing of
            # proxyd keeps a view of a fixed mapping past a call
            try:
                m.release()
            except BufferError:
                pass       # a slice of it is still referenced; it must not be used after the free
            _libc.munmap(self.fixed[seg][0], self.fixed[seg][1])
        elif m is not None:
            try:
                m.close()
            except BufferError:
                # a numpy view still refers to it; the mapping goes with the last view
                pass

    def close_all(self):
        for seg in list(self.maps):
            self.close(seg)
