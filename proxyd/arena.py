"""Device address space of one session, handed out deterministically.

Every session owns a fixed slice of virtual addresses, [base, base + size).
Allocations are placed by a pure function of the session's allocation
history: physical memory is mapped in chunks (a large allocation gets a chunk
of its own, rounded up to the mapping granularity; small ones share 2 MiB
chunks), chunks take the lowest free address range that fits, and small
allocations take the lowest free 256-byte-aligned range inside the
lowest-addressed chunk with room. The state is fully described by the list of
chunks and the list of live allocations, which is what a checkpoint records:
rebuilding the arena from them gives the same future addresses.

Backing is the backend's business: `map_chunk(dev, addr, size)` returns an
opaque handle (VMM memory on a GPU, a numpy array on the emulated backend),
`unmap_chunk(handle)` releases it.

Locking: an Arena belongs to one session and is used by the daemon's main
loop only; checkpoint code reads it while the session is quiesced.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Callable

MiB = 1 << 20
GRANULARITY = 2 * MiB        # VMM mapping granularity on current NVIDIA GPUs (cuMemGetAllocationGranularity)
SMALL_LIMIT = 1 * MiB        # allocations below this share chunks
ALIGN = 256                  # cudaMalloc guarantees at least 256-byte alignment


def round_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


class ArenaError(Exception):
    """Raised for requests the arena cannot satisfy; carries a CUresult."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2


class _Ranges:
    """Sorted, non-overlapping free ranges [start, end); first fit by address."""

    def __init__(self, start: int, end: int):
        self.starts = [start]
        self.ends = [end]

    def take(self, size: int, align: int) -> int | None:
        for i, (s, e) in enumerate(zip(self.starts, self.ends)):
            a = round_up(s, align)
            if a + size <= e:
                self._remove(i, a, a + size)
                return a
        return None

    def _remove(self, i: int, a: int, b: int):
        s, e = self.starts[i], self.ends[i]
        del self.starts[i], self.ends[i]
        if b < e:
            self.starts.insert(i, b)
            self.ends.insert(i, e)
        if s < a:
            self.starts.insert(i, s)
            self.ends.insert(i, a)

    def reserve(self, a: int, b: int):
        """Marks [a, b) used; it must lie inside one free range."""
        i = bisect.bisect_right(self.starts, a) - 1
        if i < 0 or self.ends[i] < b:
            raise ArenaError(CUDA_ERROR_INVALID_VALUE, f"range {a:#x}-{b:#x} is not free")
        self._remove(i, a, b)

    def give(self, a: int, b: int):
        i = bisect.bisect_left(self.starts, a)
        self.starts.insert(i, a)
        self.ends.insert(i, b)
        # merge with neighbours
        if i + 1 < len(self.starts) and self.ends[i] == self.starts[i + 1]:
            self.ends[i] = self.ends[i + 1]
            del self.starts[i + 1], self.ends[i + 1]
        if i > 0 and self.ends[i - 1] == self.starts[i]:
            self.ends[i - 1] = self.ends[i]
            del self.starts[i], self.ends[i]

    def is_all_free(self, start: int, end: int) -> bool:
        return self.starts == [start] and self.ends == [end]


@dataclass
class Chunk:
    start: int
    size: int
    device: int
    small: bool
    backing: Any = None
    free: _Ranges | None = None
    live: int = 0

    @property
    def end(self) -> int:
        return self.start + self.size


@dataclass
class Allocation:
    addr: int
    size: int          # as requested
    chunk: Chunk
    extent: int = 0    # bytes reserved (rounded)


@dataclass
class Arena:
    base: int
    size: int
    map_chunk: Callable[[int, int, int], Any]
    unmap_chunk: Callable[[Any], None]
    chunks: dict[int, Chunk] = field(default_factory=dict)
    allocs: dict[int, Allocation] = field(default_factory=dict)

    def __post_init__(self):
        self._va = _Ranges(self.base, self.base + self.size)
        self._chunk_starts: list[int] = []
        self._alloc_starts: list[int] = []

    # ---------------------------------------------------------------- queries
    def bytes_in_use(self) -> int:
        return sum(a.size for a in self.allocs.values())

    def bytes_mapped(self) -> int:
        return sum(c.size for c in self.chunks.values())

    def chunk_at(self, addr: int) -> Chunk | None:
        i = bisect.bisect_right(self._chunk_starts, addr) - 1
        if i >= 0:
            c = self.chunks[self._chunk_starts[i]]
            if addr < c.end:
                return c
        return None

    def find(self, addr: int) -> tuple[Allocation, int] | None:
        """The live allocation containing addr, and addr's offset in it."""
        i = bisect.bisect_right(self._alloc_starts, addr) - 1
        if i >= 0:
            a = self.allocs[self._alloc_starts[i]]
            if addr < a.addr + max(a.size, 1):
                return a, addr - a.addr
        return None

    def contains(self, addr: int) -> bool:
        return self.base <= addr < self.base + self.size

    # ------------------------------------------------------------- mutation
    def _new_chunk(self, size: int, device: int, small: bool, start: int | None = None) -> Chunk:
        if start is None:
            start = self._va.take(size, GRANULARITY)
            if start is None:
                raise ArenaError(CUDA_ERROR_OUT_OF_MEMORY, "session address space exhausted")
        else:
            self._va.reserve(start, start + size)
        try:
            backing = self.map_chunk(device, start, size)
        except Exception:
            self._va.give(start, start + size)
            raise
        c = Chunk(start, size, device, small, backing, _Ranges(start, start + size) if small else None)
        self.chunks[start] = c
        bisect.insort(self._chunk_starts, start)
        return c

    def _drop_chunk(self, c: Chunk):
        self.unmap_chunk(c.backing)
        del self.chunks[c.start]
        self._chunk_starts.remove(c.start)
        self._va.give(c.start, c.end)

    def alloc(self, size: int, device: int = 0) -> int:
        if size <= 0:
            raise ArenaError(CUDA_ERROR_INVALID_VALUE, "allocation of 0 bytes")
        if size >= SMALL_LIMIT:
            extent = round_up(size, GRANULARITY)
            c = self._new_chunk(extent, device, small=False)
            addr = c.start
        else:
            extent = round_up(size, ALIGN)
            addr = None
            for s in self._chunk_starts:
                c = self.chunks[s]
                if c.small and c.device == device:
                    addr = c.free.take(extent, ALIGN)
                    if addr is not None:
                        break
            if addr is None:
                c = self._new_chunk(GRANULARITY, device, small=True)
                addr = c.free.take(extent, ALIGN)
        c.live += 1
        self.allocs[addr] = Allocation(addr, size, c, extent)
        bisect.insort(self._alloc_starts, addr)
        return addr

    def free(self, addr: int) -> Allocation:
        a = self.allocs.pop(addr, None)
        if a is None:
            raise ArenaError(CUDA_ERROR_INVALID_VALUE, f"{addr:#x} is not the start of a live allocation")
        self._alloc_starts.remove(addr)
        c = a.chunk
        c.live -= 1
        if c.small:
            c.free.give(addr, addr + a.extent)
            if c.live == 0:
                self._drop_chunk(c)
        else:
            self._drop_chunk(c)
        return a

    def release_all(self):
        for c in list(self.chunks.values()):
            self.unmap_chunk(c.backing)
        self.chunks.clear()
        self.allocs.clear()
        self._chunk_starts.clear()
        self._alloc_starts.clear()
        self._va = _Ranges(self.base, self.base + self.size)

    # ------------------------------------------------------- checkpointing
    def describe(self) -> dict:
        """Everything needed to rebuild this arena exactly."""
        return {
            "base": self.base,
            "size": self.size,
            "chunks": [[c.start, c.size, c.device, c.small] for c in sorted(self.chunks.values(), key=lambda c: c.start)],
            "allocations": [[a.addr, a.size, a.extent] for a in sorted(self.allocs.values(), key=lambda a: a.addr)],
        }

    def rebuild(self, desc: dict):
        """Re-creates chunks and allocations at their recorded addresses."""
        if self.chunks:
            raise ArenaError(CUDA_ERROR_INVALID_VALUE, "rebuild into a non-empty arena")
        for start, size, device, small in desc["chunks"]:
            self._new_chunk(size, device, small, start=start)
        for addr, size, extent in desc["allocations"]:
            c = self.chunk_at(addr)
            if c is None:
                raise ArenaError(CUDA_ERROR_INVALID_VALUE, f"allocation {addr:#x} outside every chunk")
            if c.small:
                c.free.reserve(addr, addr + extent)
            c.live += 1
            self.allocs[addr] = Allocation(addr, size, c, extent)
            bisect.insort(self._alloc_starts, addr)
