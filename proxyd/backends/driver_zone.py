"""Where the driver places a session's context (issue 23, target 5: a
restored `__device__` variable at its recorded address).

What the GPU showed (H100 and H200, driver 580; GPUPROXY_DEBUG_MAPS,
backends/maps_debug.py): cuCtxCreate maps the new context's address space
(a 512 MiB reservation that module code and variables are then carved
from, at fixed offsets when the loads are replayed in order) top-down, in
the highest gap of the process's address space that fits, like any other
mmap. What lies above it by then differs between the worker that served
the app and the worker that restores its image: the first holds the app's
64 MiB shared data buffer and a serving thread's stack, the second a
malloc arena and the stack of its restore thread. Every variable of the
restored program moved by the same 64 MiB, and the pointers the program
keeps to them in device memory went stale.

So every worker reserves one zone of address space right after the driver
is initialised (a point both reach with the same mappings: same binary,
same start, the address layout fixed, supervisor/daemon.py), as
inaccessible, unbacked memory, and opens it only for a session's context
creation: the zone's free parts are unmapped, the context is created and
lands at the zone's top, and what it left free is reserved again at once,
so later mappings of either worker go elsewhere and a second context lands
below the first in the same way. GPUPROXY_DRIVER_ZONE_MB sizes the zone
(default 4096; 0: off, the old placement).

Cost: the zone is opened around every context creation, module load and
first kernel lookup (cuFuncLoad), and a restore replays the lookups (a
PyTorch process: about a thousand). Reading /proc/self/maps at each close
cost about 0.24 ms (H100 machine), so a close first holds again exactly
the ranges it released (one mmap each, MAP_FIXED_NOREPLACE, which fails
where anything was mapped meanwhile) and reads the maps only when one of
them fails (the call mapped into the zone: the usual case of a context
creation, rare for a lookup) or when part of the zone may have been given
back since the last read (note_freed(): a context destroyed, a module
unloaded), so that freed space is held again as before. A context
creation always reads them (open(full=True)). Measured on the CPU build
machine (117 mappings): 15 us per open and close, against 236 us with the
read.

Locking: a window is core/addrspace.py's MAP_GATE held exclusively
(contexts are created on the worker's main loop or its restore thread);
the worker's own mappings of client segments and channels and the restore's
module-image preparation hold it shared, so they never run inside an open
window. A mapping made in the window by code that takes neither (a
library's own threads) can still take the context's place: the window is
one driver call.
"""
from __future__ import annotations

import ctypes
import logging
import os
from contextlib import contextmanager

from ..core.addrspace import MAP_GATE

log = logging.getLogger("proxyd")

PROT_NONE = 0
MAP_PRIVATE, MAP_ANONYMOUS, MAP_NORESERVE = 0x02, 0x20, 0x4000
MAP_FIXED_NOREPLACE = 0x100000           # Linux 4.17+; older kernels take it as a hint (checked below)
MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]



def _mappings_in(lo: int, hi: int) -> list[tuple[int, int]]:
    """The mappings of this process that overlap [lo, hi), clipped."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            a, b = (int(x, 16) for x in line.split(None, 1)[0].split("-"))
            if a < hi and b > lo:
                out.append((max(a, lo), min(b, hi)))
    return sorted(out)


class Zone:
    """[base, base+size): parts held reserved (ours), the rest taken by the
    driver's contexts."""

    def __init__(self, base: int, size: int):
        self.base, self.size = base, size
        self.held = [(base, base + size)]
        self.freed = False          # the driver may have unmapped part of the zone (note_freed)
        self.maps_reads = 0         # closes that read /proc/self/maps (the slow path)

    def note_freed(self) -> None:
        """The driver may have given back part of the zone (a context
        destroyed, a module unloaded): the next close reads the maps."""
        self.freed = True

    @classmethod
    def reserve(cls, size: int) -> "Zone | None":
        p = _libc.mmap(None, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
        if p in (None, MAP_FAILED):
            log.info("driver zone: %d bytes of address space not reserved (errno %d)", size, ctypes.get_errno())
            return None
        return cls(int(p), size)

    def _release(self) -> list[tuple[int, int]]:
        was, self.held = self.held, []
        for a, b in was:
            _libc.munmap(a, b - a)
        return was

    def _hold(self, a: int, b: int) -> bool:
        """Reserves [a, b) if nothing is mapped in it."""
        p = _libc.mmap(a, b - a, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE,
                       -1, 0)
        if p in (None, MAP_FAILED):
            return False                      # something lies in it
        if int(p) != a:                       # a kernel without MAP_FIXED_NOREPLACE placed it elsewhere
            _libc.munmap(p, b - a)
            return False
        self.held.append((a, b))
        return True

    def _hold_again(self, was: list[tuple[int, int]], full: bool) -> None:
        """After a window: the released ranges held again, the maps read
        only where that fails, space may have been freed, or full (module
        comment, "Cost")."""
        missed = [r for r in was if not self._hold(*r)]
        if missed or self.freed or full:
            self.freed = False
            self._hold_free()

    def _hold_free(self):
        """Reserves every part of the zone no mapping took meanwhile."""
        self.maps_reads += 1
        lo, hi = self.base, self.base + self.size
        cur, free = lo, []
        for a, b in _mappings_in(lo, hi):
            if a > cur:
                free.append((cur, a))
            cur = max(cur, b)
        if cur < hi:
            free.append((cur, hi))
        for a, b in free:
            self._hold(a, b)                  # False: taken between the read and the map, no longer free
        self.held.sort()

    @contextmanager
    def open(self, full: bool = False):
        """full: the maps are read at the close whatever happened (a context
        creation, once per session: it maps into the zone and may reshape
        what the driver holds there)."""
        # exclusive against the worker's own mapping work (core/addrspace.py);
        # one window at a time
        with MAP_GATE.exclusive():
            was = self._release()
            try:
                yield
            finally:
                self._hold_again(was, full)


def make() -> Zone | None:
    mb = int(os.environ.get("GPUPROXY_DRIVER_ZONE_MB", "4096") or 0)
    return Zone.reserve(mb << 20) if mb > 0 else None


def note_freed(zone: Zone | None) -> None:
    if zone is not None:
        zone.note_freed()


@contextmanager
def opened(zone: Zone | None, full: bool = False):
    if zone is None:
        yield
    else:
        with zone.open(full):
            yield
