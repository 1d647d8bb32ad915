"""What proxyd needs from a GPU backend.

proxyd executes only driver-level operations. A backend offers
 - `call(fn, args)`: the generic path, a driver function by name with
   arguments already decoded and handles translated (see dispatch.py);
 - the operations that hand-written handlers need (contexts, memory mapped
   at fixed addresses, copies, modules, launches, synchronisation).
Two backends exist: `cuda` (cuda_backend.py, the real driver through cffi)
and `emu` (gpuproxy.emu, host memory and Python kernels).

Objects a backend returns (contexts, modules, functions, streams, events,
chunk backings) are opaque to the rest of proxyd.
"""
from __future__ import annotations

from typing import Any


class Backend:
    name = "abstract"

    # ---- devices and generic calls
    def init(self) -> None: ...
    def device_count(self) -> int: raise NotImplementedError
    def device_name(self, dev: int) -> str: raise NotImplementedError
    def device_total_mem(self, dev: int) -> int: raise NotImplementedError
    def driver_version(self) -> int: raise NotImplementedError
    def call(self, fn, args: list) -> tuple[int, list]: raise NotImplementedError

    # ---- contexts
    def ctx_create(self, dev: int, flags: int) -> Any: raise NotImplementedError
    def ctx_destroy(self, ctx: Any) -> None: raise NotImplementedError
    def make_current(self, ctx: Any) -> None: ...
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
    def host_register(self, buf) -> Any: return None
    def host_unregister(self, token: Any) -> None: ...

    # ---- modules and launches
    def module_load(self, ctx: Any, image: bytes, parsed) -> Any: raise NotImplementedError
    def module_unload(self, mod: Any) -> None: raise NotImplementedError
    def module_function(self, mod: Any, name: str) -> Any: raise NotImplementedError
    def module_global(self, mod: Any, name: str) -> tuple[int, int]: raise NotImplementedError
    def param_info(self, fn: Any) -> list[tuple[int, int]] | None: return None
    def launch(self, fn: Any, grid, block, shmem: int, stream: Any, params: bytes, info: dict) -> None:
        raise NotImplementedError

    # ---- streams and events
    def stream(self, special: int) -> Any:
        """The backend's value for the NULL / legacy / per-thread stream handle."""
        raise NotImplementedError
    def stream_sync(self, stream: Any) -> None: raise NotImplementedError
    def event_sync(self, event: Any) -> None: raise NotImplementedError
