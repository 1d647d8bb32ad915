"""What proxyd needs from a GPU backend.

proxyd executes only driver-level operations. A backend offers
 - `call(fn, args)`: the generic path, a driver function by name with
   arguments already decoded and handles translated (see dispatch.py);
 - the operations that hand-written handlers need (contexts, memory mapped
   at fixed addresses, copies, modules, launches, synchronisation).
Two backends exist: `cuda` (backends/cuda.py, the real driver through cffi)
and `emu` (gpuproxy.emu, host memory and Python kernels).

Objects a backend returns (contexts, modules, functions, streams, events,
chunk backings) are opaque to the rest of proxyd.
"""
from __future__ import annotations

from typing import Any

# Slot of the address space that proxyd keeps for its own checkpoint
# snapshots (session slots are 0..SCRATCH_SLOT-1; server.py).
SCRATCH_SLOT = 63


class Backend:
    name = "abstract"
    _scratch = None

    # ---- checkpoint support, shared by both backends
    def scratch_alloc(self, dev: int, size: int) -> int | None:
        """Device memory for a snapshot copy, from proxyd's own address slot
        (so it never takes addresses a session may need); None if the device
        has no room, and the caller copies to host memory instead."""
        from ..core.arena import ARENA_BASE, SLOT_SIZE, Arena, ArenaError
        from ..core.session import CudaError
        if self._scratch is None:
            base = ARENA_BASE + SCRATCH_SLOT * SLOT_SIZE
            self._scratch_res = self.reserve(base, SLOT_SIZE)
            self._scratch = Arena(base, SLOT_SIZE, self.map_chunk, self.unmap_chunk)
        try:
            return self._scratch.alloc(size, dev)
        except (ArenaError, CudaError):
            return None

    def scratch_free(self, addr: int) -> None:
        self._scratch.free(addr)

    def copy_dtod(self, dev: int, dst: int, src: int, n: int) -> None: raise NotImplementedError
    def read_device(self, dev: int, addr: int, n: int, out) -> None: raise NotImplementedError
    def write_device(self, dev: int, addr: int, data) -> None: raise NotImplementedError
    def hash_device(self, dev: int, addr: int, n: int, chunk: int) -> list[int] | None:
        """gp64 of each chunk of [addr, addr+n), computed on the device; None
        where the backend cannot (the caller hashes on the CPU)."""
        return None
    def hash_device_many(self, dev: int, spans, chunk: int):
        """hash_device for a list of (addr, n) spans: a list of hash lists,
        or None where the backend cannot hash on the device."""
        out = []
        for addr, n in spans:
            hs = self.hash_device(dev, addr, n, chunk)
            if hs is None:
                return None
            out.append(hs)
        return out

    # Copies for checkpoints go on "lanes" (streams on a GPU): *_async calls
    # queue them, lane_fence() marks what is queued on a lane so far,
    # wait_fence() waits for it, sync_copies() for all of a device's lanes.
    # Where copies are synchronous (emulated GPU) these are plain copies.
    def write_device_async(self, dev: int, addr: int, data, lane: int = 0) -> None:
        self.write_device(dev, addr, data)

    def read_device_async(self, dev: int, addr: int, n: int, out, lane: int = 0) -> None:
        self.read_device(dev, addr, n, out)

    def lane_fence(self, dev: int, lane: int = 0):
        return None

    def wait_fence(self, fence) -> None:
        pass

    def sync_copies(self, dev: int) -> None:
        pass

    # copies and device hashing may span adjacent arena chunks (separate
    # mappings that follow each other in the address space)
    spans_mappings = False

    def host_register_readonly(self, buf):
        """Page-locks a read-only buffer for DMA (None where not needed or possible)."""
        return None

    def host_buffer(self, n: int):
        """A host buffer of at least n bytes for draining snapshots (page-locked on a GPU)."""
        return memoryview(bytearray(n))

    # host_buffer memory on a GPU is page-locked in the background
    # (pinned_pool.py): a copy waits for its range and stays in one segment
    def wait_pinned(self, off: int, n: int) -> float:
        return 0.0

    def segment_end(self, off: int) -> int:
        return 1 << 62

    def pool_stats(self):
        return None

    def pinned_pool(self):
        """The PinnedPool behind host_buffer, or None (no background pinning)."""
        return None

    def release_host_buffer(self) -> None:
        pass

    # the shared host pool behind host_buffer (shared_pool.py), where a backend uses one:
    # a restore from host memory takes over a pool leased for it (checkpoint/memory_restore.py)
    current_host_pool = None
    adopt_host_pool = None

    # ---- devices and generic calls
    def init(self) -> None: ...
    def device_count(self) -> int: raise NotImplementedError
    def device_name(self, dev: int) -> str: raise NotImplementedError
    def device_total_mem(self, dev: int) -> int: raise NotImplementedError
    def driver_version(self) -> int: raise NotImplementedError
    def call(self, fn, args: list) -> tuple[int, list]: raise NotImplementedError

    # ---- contexts
    def ctx_create(self, dev: int, flags: int, primary: bool = False) -> Any: raise NotImplementedError
    def ctx_destroy(self, ctx: Any) -> None: raise NotImplementedError
    def make_current(self, ctx: Any) -> None: ...
    def ctx_set_flags(self, ctx: Any, flags: int) -> None: raise NotImplementedError
    def ctx_sync(self, ctx: Any) -> None: raise NotImplementedError

    # ---- memory: per-session fixed address ranges
    def reserve(self, base: int, size: int) -> Any: raise NotImplementedError
    def unreserve(self, token: Any) -> None: ...
    def map_chunk(self, dev: int, addr: int, size: int) -> Any: raise NotImplementedError
    def unmap_chunk(self, backing: Any) -> None: raise NotImplementedError
    def htod(self, dst: int, src, n: int, stream: Any, sync: bool) -> None: raise NotImplementedError
    def dtoh(self, dst, src: int, n: int, stream: Any, sync: bool) -> None: raise NotImplementedError
    def dtod(self, dst: int, src: int, n: int, stream: Any, sync: bool) -> None: raise NotImplementedError
    def memset(self, dst: int, value: int, elem: int, count: int, stream: Any, sync: bool) -> None:
        raise NotImplementedError
    def memset2d(self, dst: int, pitch: int, value: int, elem: int, width: int, height: int, stream: Any) -> None:
        """height rows of width elements of elem bytes, rows pitch bytes apart;
        stream-ordered. This default sets row by row."""
        for y in range(height):
            self.memset(dst + y * pitch, value, elem, width, stream, False)
    def host_register(self, buf) -> Any: return None
    def host_unregister(self, token: Any) -> None: ...
    # GPU-visible host memory (docs/host-memory.md): buf is mapped at addr in
    # this process; afterwards kernels, copies and memsets reach it at addr.
    # host_unregister(token) withdraws it.
    def host_map(self, addr: int, buf) -> Any: raise NotImplementedError

    # ---- modules and launches
    def module_load(self, ctx: Any, image: bytes, parsed) -> Any: raise NotImplementedError
    def module_unload(self, mod: Any) -> None: raise NotImplementedError
    def module_function(self, mod: Any, name: str) -> Any: raise NotImplementedError
    def module_global(self, mod: Any, name: str) -> tuple[int, int]: raise NotImplementedError
    def param_info(self, fn: Any) -> list[tuple[int, int]] | None: return None
    def launch(self, fn: Any, grid, block, shmem: int, stream: Any, params: bytes, info: dict,
               attrs: list[tuple[int, bytes]] | None = None) -> None:
        """attrs: launch attributes as cuLaunchKernelEx takes them, (CUlaunchAttributeID,
        the 64 bytes of CUlaunchAttributeValue); only data-valued ones reach here."""
        raise NotImplementedError

    # ---- streams and events
    def stream(self, special: int) -> Any:
        """The backend's value for the NULL / legacy / per-thread stream handle."""
        raise NotImplementedError
    def set_access(self, addr: int, size: int, device: int, flags: int) -> None:
        """cuMemSetAccess of [addr, addr + size) for another device (the
        application's VMM mappings, vmm.py)."""

    def launch_host_func(self, stream: Any, run) -> None:
        """Enqueues run() (a Python callable, no arguments) in stream, in
        stream order: work enqueued later waits until it returned."""
        raise NotImplementedError
    def stream_sync(self, stream: Any) -> None: raise NotImplementedError
    def event_sync(self, event: Any) -> None: raise NotImplementedError
    def event_mark_complete(self, event: Any) -> None:
        """Puts a re-created event in the completed state (restore of an event
        that had been recorded): queries and waits on it succeed at once."""
        raise NotImplementedError
