"""Client host memory shared with proxyd (interceptor/hostmem.c).

Segments are POSIX shared memory objects named /gpuproxy-<token>-<n> (files in
/dev/shm). proxyd maps one when the client first refers to it: the staging
segment at HELLO (opening it proves that both sides see the same /dev/shm),
pinned-host segments at cuMemAllocHost/cuMemHostAlloc, when the backend also
page-locks them so that copies are plain DMA.

Locking: used by the daemon's main loop only.
"""
from __future__ import annotations

import mmap
import os

SHM_DIR = "/dev/shm"


class ShmError(Exception):
    pass


class ShmMap:
    def __init__(self, token: str):
        self.token = token
        self.maps: dict[int, mmap.mmap] = {}
        self.registered: dict[int, object] = {}

    def path(self, seg: int) -> str:
        return os.path.join(SHM_DIR, f"gpuproxy-{self.token}-{seg}")

    def open(self, seg: int, size: int | None = None) -> mmap.mmap:
        m = self.maps.get(seg)
        if m is not None:
            return m
        try:
            fd = os.open(self.path(seg), os.O_RDWR)
        except OSError as e:
            raise ShmError(f"cannot open client segment {self.path(seg)}: {e.strerror}") from e
        try:
            n = os.fstat(fd).st_size
            if size is not None and n < size:
                raise ShmError(f"client segment {seg} has {n} bytes, expected {size}")
            m = mmap.mmap(fd, n, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.maps[seg] = m
        return m

    def view(self, seg: int, offset: int, length: int) -> memoryview:
        m = self.open(seg)
        if offset < 0 or length < 0 or offset + length > len(m):
            raise ShmError(f"reference {offset}+{length} outside client segment {seg} ({len(m)} bytes)")
        return memoryview(m)[offset:offset + length]

    def close(self, seg: int):
        m = self.maps.pop(seg, None)
        if m is not None:
            try:
                m.close()
            except BufferError:
                # a numpy view still refers to it; the mapping goes with the last view
                pass

    def close_all(self):
        for seg in list(self.maps):
            self.close(seg)
