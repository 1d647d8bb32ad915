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

The application's own virtual memory management (cuMemAddressReserve,
cuMemMap, ...: proxyd/families/vmm.py) lives here too: a reservation takes a range of
the slice like a chunk would, and a mapping inside it is a chunk of its own
(`vmm`), with one allocation covering it, so that checkpoints store and
restore it like any other memory, at the same address.

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


# Each session's device addresses live in their own slice of virtual address
# space at a fixed, documented place (docs/protocol.md, "Device addresses"):
# slice n is [ARENA_BASE + n * SLOT_SIZE, ARENA_BASE + (n + 1) * SLOT_SIZE).
# The worker (worker/server.py), the backends' scratch slot and the
# checkpoint engine's slot check all read them here.
ARENA_BASE = 0x2000_0000_0000
SLOT_SIZE = 0x100_0000_0000       # 1 TiB
MAX_SLOTS = 63                    # slot 63 is proxyd's own (backends/base.py, SCRATCH_SLOT)


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

    def largest(self) -> int:
        return max((e - s for s, e in zip(self.starts, self.ends)), default=0)

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
    vmm: bool = False      # mapped by the application (cuMemMap) inside one of its reservations
    max_free: int = 0      # small chunks: the longest free range (the key of Arena._fit)

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
    # told of the application's reservations (the emulated backend backs a
    # reservation with one array, so that contiguous mappings are one range)
    on_reserve: Callable[[int, int], None] | None = None
    on_release: Callable[[int, int], None] | None = None

    def __post_init__(self):
        self._va = _Ranges(self.base, self.base + self.size)
        self.reservations: dict[int, int] = {}     # start -> size (cuMemAddressReserve)
        self._chunk_starts: list[int] = []
        self._alloc_starts: list[int] = []
        # Small chunks by (longest free range, start), per device: a request
        # goes to the chunk whose longest free range is the smallest that
        # fits (one bisection), not to a scan of every chunk, which made
        # 100,000 allocations quadratic (issue 13, target 6).
        self._fit: dict[int, list[tuple[int, int]]] = {}

    def _fit_drop(self, c: Chunk):
        lst = self._fit.get(c.device, [])
        i = bisect.bisect_left(lst, (c.max_free, c.start))
        if i < len(lst) and lst[i] == (c.max_free, c.start):
            del lst[i]

    def _fit_put(self, c: Chunk):
        c.max_free = c.free.largest()
        bisect.insort(self._fit.setdefault(c.device, []), (c.max_free, c.start))

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
    def _new_chunk(self, size: int, device: int, small: bool, start: int | None = None, vmm: bool = False) -> Chunk:
        if vmm:
            pass        # inside a reservation, whose range _va already counts as used
        elif start is None:
            start = self._va.take(size, GRANULARITY)
            if start is None:
                raise ArenaError(CUDA_ERROR_OUT_OF_MEMORY, "session address space exhausted")
        else:
            self._va.reserve(start, start + size)
        try:
            backing = self.map_chunk(device, start, size)
        except Exception:
            if not vmm:
                self._va.give(start, start + size)
            raise
        c = Chunk(start, size, device, small, backing, _Ranges(start, start + size) if small else None, vmm=vmm)
        self.chunks[start] = c
        bisect.insort(self._chunk_starts, start)
        if small:
            self._fit_put(c)
        return c

    def _drop_chunk(self, c: Chunk):
        if c.small:
            self._fit_drop(c)
        self.unmap_chunk(c.backing)
        del self.chunks[c.start]
        self._chunk_starts.remove(c.start)
        if not c.vmm:
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
            lst = self._fit.get(device, [])
            i = bisect.bisect_left(lst, (extent, 0))
            # free ranges of small chunks start and end on ALIGN (chunk
            # starts and extents are multiples of it): the longest one fits
            c = self.chunks[lst[i][1]] if i < len(lst) else self._new_chunk(GRANULARITY, device, small=True)
            self._fit_drop(c)
            addr = c.free.take(extent, ALIGN)
            self._fit_put(c)
        c.live += 1
        self.allocs[addr] = Allocation(addr, size, c, extent)
        bisect.insort(self._alloc_starts, addr)
        return addr

    def free(self, addr: int, vmm: bool = False) -> Allocation:
        a = self.allocs.get(addr)
        if a is None:
            raise ArenaError(CUDA_ERROR_INVALID_VALUE, f"{addr:#x} is not the start of a live allocation")
        if a.chunk.vmm != vmm:
            raise ArenaError(CUDA_ERROR_INVALID_VALUE,
                             f"{addr:#x} was mapped with cuMemMap: cuMemUnmap releases it" if a.chunk.vmm else
                             f"{addr:#x} was not mapped with cuMemMap")
        del self.allocs[addr]
        self._alloc_starts.remove(addr)
        c = a.chunk
        c.live -= 1
        if c.small:
            self._fit_drop(c)
            c.free.give(addr, addr + a.extent)
            self._fit_put(c)
            if c.live == 0:
                self._drop_chunk(c)
        else:
            self._drop_chunk(c)
        return a

    # ---------------------------------------- the application's VMM (vmm.py)
    def reserve_range(self, size: int, alignment: int = 0, hint: int = 0) -> int:
        """cuMemAddressReserve: size is a multiple of the granularity; the
        hint is honoured when that range is free (cuda.h: "hint")."""
        if size <= 0 or size % GRANULARITY:
            raise ArenaError(CUDA_ERROR_INVALID_VALUE, f"reservation of {size} bytes (not a multiple of "
                                                       f"{GRANULARITY})")
        align = max(GRANULARITY, alignment or 0)
        if align & (align - 1):
            raise ArenaError(CUDA_ERROR_INVALID_VALUE, f"alignment {alignment} is not a power of two")
        start = None
        if hint and hint % align == 0 and self.contains(hint) and self.contains(hint + size - 1):
            try:
                self._va.reserve(hint, hint + size)
                start = hint
            except ArenaError:
                start = None
        if start is None:
            start = self._va.take(size, align)
            if start is None:
                raise ArenaError(CUDA_ERROR_OUT_OF_MEMORY, "session address space exhausted")
        self.reservations[start] = size
        if self.on_reserve:
            self.on_reserve(start, size)
        return start

    def reservation_of(self, addr: int, size: int) -> int | None:
        for s, n in self.reservations.items():
            if s <= addr and addr + size <= s + n:
                return s
        return None

    def free_range(self, start: int, size: int):
        """cuMemAddressFree: the whole reservation, with nothing mapped in it."""
        if self.reservations.get(start) != size:
            raise ArenaError(CUDA_ERROR_INVALID_VALUE, f"{start:#x}+{size:#x} is not a reservation")
        if any(c.vmm and start <= c.start < start + size for c in self.chunks.values()):
            raise ArenaError(CUDA_ERROR_INVALID_VALUE, f"reservation {start:#x} still has mappings")
        del self.reservations[start]
        self._va.give(start, start + size)
        if self.on_release:
            self.on_release(start, size)

    def map_in_reservation(self, addr: int, size: int, device: int) -> Allocation:
        """cuMemMap of a whole physical allocation: a chunk of its own at addr."""
        if addr % GRANULARITY or size <= 0 or size % GRANULARITY:
            raise ArenaError(CUDA_ERROR_INVALID_VALUE, f"mapping {addr:#x}+{size:#x} is not granularity-aligned")
        if self.reservation_of(addr, size) is None:
            raise ArenaError(CUDA_ERROR_INVALID_VALUE, f"{addr:#x}+{size:#x} is not inside one reservation")
        for c in self.chunks.values():
            if c.start < addr + size and addr < c.end:
                raise ArenaError(CUDA_ERROR_INVALID_VALUE, f"{addr:#x}+{size:#x} overlaps a mapping at {c.start:#x}")
        c = self._new_chunk(size, device, small=False, start=addr, vmm=True)
        c.live = 1
        a = self.allocs[addr] = Allocation(addr, size, c, size)
        bisect.insort(self._alloc_starts, addr)
        return a

    def release_all(self):
        for c in list(self.chunks.values()):
            self.unmap_chunk(c.backing)
        if self.on_release:
            for s, n in self.reservations.items():
                self.on_release(s, n)
        self.reservations.clear()
        self.chunks.clear()
        self.allocs.clear()
        self._chunk_starts.clear()
        self._alloc_starts.clear()
        self._fit.clear()
        self._va = _Ranges(self.base, self.base + self.size)

    # ------------------------------------------------------- checkpointing
    def describe(self) -> dict:
        """Everything needed to rebuild this arena exactly."""
        return {
            "base": self.base,
            "size": self.size,
            "chunks": [[c.start, c.size, c.device, c.small] for c in sorted(self.chunks.values(), key=lambda c: c.start)],
            "allocations": [[a.addr, a.size, a.extent] for a in sorted(self.allocs.values(), key=lambda a: a.addr)],
            # the application's reservations and the chunks it mapped in them
            "reservations": [[s, n] for s, n in sorted(self.reservations.items())],
            "vmm_chunks": sorted(c.start for c in self.chunks.values() if c.vmm),
        }

    def rebuild(self, desc: dict):
        """Re-creates chunks and allocations at their recorded addresses."""
        if self.chunks:
            raise ArenaError(CUDA_ERROR_INVALID_VALUE, "rebuild into a non-empty arena")
        for start, size in desc.get("reservations", []):
            self._va.reserve(start, start + size)
            self.reservations[start] = size
            if self.on_reserve:
                self.on_reserve(start, size)
        vmm = set(desc.get("vmm_chunks", []))
        for start, size, device, small in desc["chunks"]:
            if start in vmm and self.reservation_of(start, size) is None:
                raise ArenaError(CUDA_ERROR_INVALID_VALUE, f"mapping {start:#x} outside every reservation")
            self._new_chunk(size, device, small, start=start, vmm=start in vmm)
        for addr, size, extent in desc["allocations"]:
            c = self.chunk_at(addr)
            if c is None:
                raise ArenaError(CUDA_ERROR_INVALID_VALUE, f"allocation {addr:#x} outside every chunk")
            if c.small:
                c.free.reserve(addr, addr + extent)
            c.live += 1
            self.allocs[addr] = Allocation(addr, size, c, extent)
            bisect.insort(self._alloc_starts, addr)
        self._fit = {}
        for c in self.chunks.values():
            if c.small:
                self._fit_put(c)
