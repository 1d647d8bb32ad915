"""The emulated GPU: device memory is host memory, kernels are Python.

Device addresses are the same as on a real GPU backend (each session's arena
slice); every mapped chunk is a numpy byte array registered by its address,
so a pointer read from emulated device memory (a pointer table) resolves like
any other. `__device__` variables of a loaded module get addresses in a
separate region, initialised from the module image (.nv.global.init).

Everything runs synchronously on the daemon's main loop: streams and events
keep their API semantics (ordering holds trivially), and emulated kernels
never run concurrently.
"""
from __future__ import annotations

import bisect
import os
import logging
import mmap
import struct
import sys
import time
import traceback

import numpy as np

from gpuproxy.proxyd.backends.base import Backend
from gpuproxy.proxyd.core.session import CudaError
from .kernels import KERNELS, KernelError, KernelLaunch
from . import tensor_map as _tensor_map

log = logging.getLogger("proxyd")

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_INVALID_DEVICE = 101
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_ILLEGAL_ADDRESS = 700
CUDA_ERROR_LAUNCH_FAILED = 719
CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE = 720
CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_ERROR_INVALID_CLUSTER_SIZE = 912

# launch / stream attribute ids (cuda.h, CUlaunchAttributeID)
ATTR_COOPERATIVE = 2
ATTR_CLUSTER_DIMENSION = 4
ATTR_PRIORITY = 8
ATTR_VALUE_SIZE = 64
PORTABLE_CLUSTER_SIZE = 8        # cudaOccupancyMaxPotentialClusterSize's portable limit

# per-SM resources of the emulated part (H100 SXM: CUDA C++ Programming
# Guide, "Technical Specifications per Compute Capability", 9.0)
SM_THREADS = 2048
SM_BLOCKS = 32
SM_REGS = 65536
SM_SMEM = 233472                  # shared memory per SM usable by blocks
BLOCK_SMEM_RESERVED = 1024        # reserved per block (CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK)
BLOCK_SMEM_DEFAULT = 49152        # dynamic + static without the opt-in attribute
BLOCK_SMEM_OPTIN = 232448

# CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES and its default, 48 KiB
FUNC_MAX_DYNAMIC_SHARED = 8
DEFAULT_DYNAMIC_SHARED = 49152

GLOBALS_BASE = 0x7E00_0000_0000   # module variables; above every session slice
# memory of each emulated device (an H100's 80 GiB); GPUPROXY_EMU_TOTAL_MB
# sets another size (tests of out-of-memory behaviour use a small one)
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform == "linux" else 0)
EMU_TOTAL_MEM = int(os.environ.get("GPUPROXY_EMU_TOTAL_MB") or 80 << 10) << 20

# Attribute values of the emulated device: an H100-like part, so that
# programs that size work from attributes behave as they would there.
ATTRS = {
    1: 1024, 2: 1024, 3: 1024, 4: 64, 5: 2147483647, 6: 65535, 7: 65535, 8: 49152, 9: 65536,
    10: 32, 11: 2147483647, 12: 65536, 13: 1980000, 14: 512, 15: 1, 16: 132, 17: 0, 18: 0, 19: 1,
    20: 0, 30: 512, 31: 1, 32: 1, 33: 0, 34: 0, 35: 0, 36: 2619000, 37: 5120, 38: 52428800,
    39: 2048, 40: 2, 41: 1, 50: 0, 51: 32, 75: 9, 76: 0, 78: 1, 79: 1, 80: 1, 81: 233472,
    82: 65536, 83: 1, 84: 0, 85: 0, 86: 0, 88: 0, 89: 1, 90: 1, 91: 0, 95: 1, 96: 0, 97: 232448,
    99: 1, 102: 1, 106: 32, 108: 83886080, 109: 134213632, 111: 1024, 115: 1, 119: 1, 120: 1,
}


class EmuContext:
    def __init__(self, dev: int, flags: int):
        self.device = dev
        self.flags = flags
        self.limits: dict[int, int] = {}
        self.cache_config = 0


class EmuStream:
    def __init__(self, flags=0, priority=0, special=None):
        self.flags, self.priority, self.special = flags, priority, special
        self.attrs: dict[int, bytes] = {}     # cuStreamSetAttribute values


class EmuEvent:
    def __init__(self, flags=0):
        self.flags = flags
        self.time: float | None = None


class EmuModule:
    def __init__(self, parsed, globals_: dict[str, tuple[int, int]]):
        self.parsed = parsed
        self.globals = globals_
        self.loaded = True
        self.code_placed: set[str] = set()     # kernels whose code took space (module_function)


class EmuFunction:
    def __init__(self, module: EmuModule, name: str):
        self.module = module
        self.name = name
        self.attrs: dict[int, int] = {}
        self.cache_config = 0


class EmuBackend(Backend):
    name = "emu"

    def __init__(self, devices: int = 1):
        self.devices = devices
        self._starts: list[int] = []
        self._regions: dict[int, np.ndarray] = {}
        # GPUPROXY_EMU_GLOBALS_SKEW (bytes) starts __device__ variables elsewhere,
        # as a real driver may place them after a restore: tests of the
        # moved-global path use it (a worker is a fresh process, so a module
        # reloaded in the same order otherwise lands where it was)
        self._next_global = GLOBALS_BASE + int(os.environ.get("GPUPROXY_EMU_GLOBALS_SKEW", "0") or 0) // 256 * 256
        # A real driver with lazy loading (CUDA_MODULE_LOADING=LAZY) places a
        # kernel's code at its first lookup, in the device memory it also puts
        # later modules' variables in: so do we (GPUPROXY_EMU_CODE_BYTES per
        # kernel, 0 turns it off), so that a restore that loads modules and
        # looks up kernels in another order than the app moves variables here
        # too (families/modrestore.py replays the order)
        try:
            self._code_bytes = max(0, int(os.environ.get("GPUPROXY_EMU_CODE_BYTES", "4096") or 0)) // 256 * 256
        except ValueError:
            self._code_bytes = 4096
        self._null = {v: EmuStream(special=v) for v in (0, 1, 2)}
        self._cur: EmuContext | None = None     # the context make_current chose
        self._mapped: dict[int, int] = {}                  # device -> bytes of arena chunks mapped
        self._memfd: dict[int, int] = {}                   # chunk address -> its memfd (IPC export)
        # one descriptor per chunk: allow as many as the hard limit does
        try:
            import resource
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            if soft != hard:
                resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ImportError, ValueError, OSError):
            pass
        self._chunk_dev: dict[int, tuple[int, int]] = {}   # chunk address -> (device, size)
        self._reserved: dict[int, int] = {}                # the app's reservations: start -> size
        from .textures import Textures
        self.textures = Textures(self)                     # CUDA arrays, texture/surface objects

    # ------------------------------------------------------------- memory
    def _register(self, addr: int, arr: np.ndarray):
        bisect.insort(self._starts, addr)
        self._regions[addr] = arr

    def _unregister(self, addr: int):
        self._starts.remove(addr)
        del self._regions[addr]

    def resolve(self, addr: int, n: int) -> np.ndarray:
        """The bytes [addr, addr + n) of emulated device memory, as a view."""
        i = bisect.bisect_right(self._starts, addr) - 1
        if i >= 0:
            base = self._starts[i]
            arr = self._regions[base]
            off = addr - base
            if off + n <= arr.size:
                return arr[off:off + n]
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"device range {addr:#x}+{n} is not inside one allocation")

    # CUDA IPC (proxyd/families/ipc.py): a chunk's memfd, and another worker's chunk
    # mapped at base in this one
    def chunk_export_fd(self, backing) -> int:
        fd = self._memfd.get(backing)
        if fd is None:
            raise CudaError(CUDA_ERROR_NOT_SUPPORTED, "this memory cannot be exported")
        return os.dup(fd)

    # IPC event handles (proxyd/families/ipc.py): the emulated GPU runs every operation
    # when it is issued, so whatever another process recorded into a shared
    # event has completed: an opened event is a complete event. The handle
    # names the exporter so that opening one's own handle fails as natively.
    def ipc_event_handle(self, event) -> bytes:
        if not (getattr(event, "flags", 0) & 0x4):      # CU_EVENT_INTERPROCESS
            raise CudaError(1, "cuIpcGetEventHandle: the event was not created with CU_EVENT_INTERPROCESS")
        return struct.pack("<8sII", b"GPXEMUEV", os.getpid(), id(event) & 0xFFFFFFFF).ljust(64, b"\0")

    def ipc_event_open(self, raw: bytes):
        magic, pid, _ = struct.unpack_from("<8sII", raw)
        if magic != b"GPXEMUEV":
            raise CudaError(1, "cuIpcOpenEventHandle: not an event handle")
        if pid == os.getpid():
            raise CudaError(201, "cuIpcOpenEventHandle: the handle was exported by this same process")
        ev = EmuEvent(0x4 | 0x2)
        ev.time = time.perf_counter()
        return ev

    def import_fd_at(self, dev: int, base: int, size: int, fd: int):
        mm = mmap.mmap(fd, size)
        self._register(base, np.frombuffer(mm, np.uint8))
        return ("ipc", base, mm)

    def unimport(self, token):
        _kind, base, mm = token
        self._unregister(base)
        try:
            mm.close()
        except BufferError:
            pass       # a view of it is still referenced; it goes with the last one

    def host_map(self, addr: int, buf):
        # the worker's mapping of the client's segment, at the client's
        # address: emulated kernels read and write the shared bytes
        self._register(addr, np.frombuffer(buf, np.uint8))
        return ("hostmap", addr)

    def host_unregister(self, token):
        if isinstance(token, tuple) and token[0] == "hostmap":
            self._unregister(token[1])

    # The application's VMM (proxyd/families/vmm.py): a reservation is one array
    # (anonymous memory, not committed until touched), and a mapping inside
    # it is a slice of that array, so that contiguous mappings form one range
    # for copies and kernels, as on a GPU. Reading an unmapped part of a
    # reservation is not caught here (a GPU would fault).
    def vmm_reserve(self, start: int, size: int):
        # MAP_NORESERVE: PyTorch's expandable segments reserve more than the
        # device's memory per stream (about 9/8 of it); without it such a
        # reservation counts against the host's commit limit and fails.
        # Python's mmap module names the flag only from 3.13; 0x4000 is its
        # value on Linux (x86-64 and arm64, <asm-generic/mman.h>).
        mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
        self._register(start, np.frombuffer(mm, np.uint8))
        self._reserved[start] = size

    def vmm_release(self, start: int, size: int):
        if self._reserved.pop(start, None) is not None:
            self._unregister(start)

    def _in_reservation(self, addr: int, size: int) -> bool:
        return any(s <= addr and addr + size <= s + n for s, n in self._reserved.items())

    def map_chunk(self, dev: int, addr: int, size: int):
        # Like cuMemCreate on a GPU: CUDA_ERROR_OUT_OF_MEMORY when the device's
        # memory (EMU_TOTAL_MEM each) is used up, or when the host cannot back
        # the emulated memory.
        used = self._mapped.get(dev, 0)
        if used + size > EMU_TOTAL_MEM:
            raise CudaError(CUDA_ERROR_OUT_OF_MEMORY, f"out of memory: {size} bytes requested, {EMU_TOTAL_MEM - used} "
                                                      f"of {EMU_TOTAL_MEM} free on emulated device {dev}")
        if self._in_reservation(addr, size):
            self.resolve(addr, size)[:] = 0          # fresh physical memory
            self._mapped[dev] = used + size
            self._chunk_dev[addr] = (dev, size)
            return ("vmm", addr)
        # Backed by a memfd (zero-filled, like np.zeros) so that CUDA IPC can
        # hand the chunk to another session's worker (proxyd/families/ipc.py)
        try:
            fd = os.memfd_create(f"gpuproxy-emu-{addr:x}", os.MFD_CLOEXEC)
            try:
                os.ftruncate(fd, size)
                mm = mmap.mmap(fd, size)
            except BaseException:
                os.close(fd)
                raise
            arr = np.frombuffer(mm, np.uint8)
        except (MemoryError, ValueError, OSError) as e:
            raise CudaError(CUDA_ERROR_OUT_OF_MEMORY, f"out of memory: cannot back {size} bytes of emulated device "
                                                      f"memory ({e})") from None
        self._memfd[addr] = fd
        self._register(addr, arr)
        self._mapped[dev] = used + size
        self._chunk_dev[addr] = (dev, size)
        return addr

    def unmap_chunk(self, backing):
        if isinstance(backing, tuple):       # a mapping inside a reservation: the array stays
            backing = backing[1]
        else:
            self._unregister(backing)
            fd = self._memfd.pop(backing, None)
            if fd is not None:
                os.close(fd)
        dev, size = self._chunk_dev.pop(backing, (0, 0))
        self._mapped[dev] = self._mapped.get(dev, 0) - size

    def reserve(self, base, size):
        return None

    def chunk_array(self, backing) -> np.ndarray:
        if isinstance(backing, tuple):       # a mapping inside a reservation
            addr = backing[1]
            return self.resolve(addr, self._chunk_dev[addr][1])
        return self._regions[backing]

    def copy_dtod(self, dev, dst, src, n):
        buf = np.empty(n, np.uint8)          # checkpoint snapshots: either side may span mappings
        self.read_device(dev, src, n, buf)
        self.write_device(dev, dst, buf)

    # Checkpoint copies may span adjacent mappings (chunks that follow each
    # other in the address space), as one copy over a contiguous range of
    # mapped virtual addresses does on a GPU.
    spans_mappings = True

    def _spans(self, addr, n):
        """(offset, view) pieces of [addr, addr+n), one per mapping it crosses;
        CudaError where a byte of it is not mapped."""
        done = 0
        while done < n:
            a = addr + done
            i = bisect.bisect_right(self._starts, a) - 1
            arr = self._regions[self._starts[i]] if i >= 0 else None
            off = a - self._starts[i] if i >= 0 else 0
            if arr is None or off >= arr.size:
                raise CudaError(CUDA_ERROR_INVALID_VALUE, f"device range {addr:#x}+{n}: {a:#x} is not mapped")
            k = min(n - done, arr.size - off)
            yield done, arr[off:off + k]
            done += k

    def read_device(self, dev, addr, n, out):
        dst = np.frombuffer(out, np.uint8, n)
        for o, v in self._spans(addr, n):
            dst[o:o + v.size] = v

    def write_device(self, dev, addr, data):
        src = np.frombuffer(data, np.uint8)
        for o, v in self._spans(addr, len(src)):
            v[:] = src[o:o + v.size]

    def htod(self, dst, src, n, stream, sync):
        self.resolve(dst, n)[:] = np.frombuffer(src, np.uint8, n)

    def dtoh(self, dst, src, n, stream, sync):
        np.frombuffer(dst, np.uint8, n)[:] = self.resolve(src, n)

    def dtod(self, dst, src, n, stream, sync):
        self.resolve(dst, n)[:] = self.resolve(src, n).copy()

    def memset(self, dst, value, elem, count, stream, sync):
        dt = {1: np.uint8, 2: np.uint16, 4: np.uint32}[elem]
        self.resolve(dst, elem * count).view(dt)[:] = value & ((1 << (8 * elem)) - 1)

    def memset2d(self, dst, pitch, value, elem, width, height, stream):
        # one strided view over the rows: [height, pitch] bytes, first width * elem of each
        dt = {1: np.uint8, 2: np.uint16, 4: np.uint32}[elem]
        span = pitch * (height - 1) + width * elem
        flat = self.resolve(dst, span)
        rows = np.lib.stride_tricks.as_strided(flat, shape=(height, width * elem), strides=(pitch, 1))
        rows.view(dt)[:] = value & ((1 << (8 * elem)) - 1)

    # ------------------------------------------- arrays, textures, surfaces
    # (proxyd/families/arrays.py calls these; emu/textures.py holds the objects)
    def array_create(self, info):
        from .textures import EmuArray
        return EmuArray(info)

    def array_destroy(self, arr):
        arr.data = arr.data[:0]

    def mipmap_create(self, info, levels):
        from .textures import EmuArray
        return [EmuArray(info.level(n)) for n in range(levels)]

    def mipmap_level(self, mip, level, info):
        return mip[level]

    def mipmap_destroy(self, mip):
        for a in mip:
            a.data = a.data[:0]

    def array_copy(self, src, dst, extent, stream):
        self.textures.copy(src, dst, extent)

    def array_read(self, arr, info) -> bytes:
        return arr.data.tobytes()

    def array_write(self, arr, info, data):
        arr.data.reshape(-1)[:] = np.frombuffer(data, np.uint8)

    def tex_create(self, res, tex, view):
        return self.textures.create(res, tex)

    def tex_destroy(self, value):
        self.textures.destroy(value)

    def surf_create(self, res):
        return self.textures.create(res, None)

    def surf_destroy(self, value):
        self.textures.destroy(value)

    # ------------------------------------------------------------ devices
    def device_count(self) -> int:
        return self.devices

    def _dev(self, dev) -> int:
        dev = int(dev)
        if not 0 <= dev < self.devices:
            raise CudaError(CUDA_ERROR_INVALID_DEVICE, f"invalid device ordinal {dev}")
        return dev

    def device_name(self, dev: int) -> str:
        return "gpuproxy emulated GPU"

    def device_total_mem(self, dev: int) -> int:
        return EMU_TOTAL_MEM

    def driver_version(self) -> int:
        # 13.0, or less under GPUPROXY_DRIVER_VERSION_CAP (the worker's
        # oldest-driver mode, backends/driver_floor.py), as the cuda backend
        from gpuproxy.proxyd.backends.driver_floor import effective_version
        return effective_version(13000)

    # ----------------------------------------------------------- contexts
    def ctx_create(self, dev, flags, primary=False):
        return EmuContext(self._dev(dev), flags)

    def ctx_destroy(self, ctx):
        if self._cur is ctx:
            self._cur = None

    def make_current(self, ctx):
        self._cur = ctx

    def ctx_set_flags(self, ctx, flags):
        ctx.flags = int(flags)

    def _ctx(self) -> EmuContext:
        if self._cur is None:
            raise CudaError(CUDA_ERROR_INVALID_CONTEXT, "no current context")
        return self._cur

    def ctx_sync(self, ctx):
        pass

    # conditional graph nodes (emu/conditionals.py, families/graph_cond.py)
    def cond_create(self, ctx, default: int, flags: int) -> int:
        from . import conditionals
        return conditionals.create()

    def cond_restore(self, ctx, handle: int, default: int, flags: int) -> int:
        from . import conditionals
        conditionals.restore(handle)
        return int(handle)

    def cond_get(self, handle: int) -> int:
        from . import conditionals
        return conditionals.get(handle)

    def cond_set(self, handle: int, value: int) -> None:
        from . import conditionals
        conditionals.set_value(handle, value)

    def stream(self, special: int):
        return self._null[special]

    def stream_sync(self, stream):
        pass

    def launch_host_func(self, stream, run):
        # every emulated stream runs in order on the main loop: the host
        # function runs now, and the loop executes nothing else until it returned
        run()

    def event_sync(self, event):
        pass

    def event_mark_complete(self, event):
        event.time = time.perf_counter()

    # ------------------------------------------------------------ JIT linker (emu/link.py)
    def link_create(self, pairs, info_size, err_size):
        from .link import EmuLink
        return EmuLink(info_size, err_size)

    def link_add(self, st, kind, data, name, pairs):
        st.add(kind, data, name)

    def link_complete(self, st):
        return st.complete()

    def link_logs(self, st):
        return st.info, st.err

    def link_destroy(self, st):
        st.entries.clear()

    # ------------------------------------------------------------ modules
    # staging for checkpoints: the supervisor's shared host pool when it is
    # on (proxyd/backends/shared_pool.py: a memfd here), else plain memory
    def host_buffer(self, n: int):
        pool = getattr(self, "_spool", None)
        if pool is None or pool.size < n:
            self.release_host_buffer()
            from gpuproxy.proxyd.backends.shared_pool import lease
            pool = self._spool = lease(self, max(int(n), 1))
        if pool is not None:
            pool.touch()          # its contents change: a note of what an image left there goes
        return pool.view if pool is not None else memoryview(bytearray(n))

    def current_host_pool(self):
        return getattr(self, "_spool", None)

    def adopt_host_pool(self, pool) -> None:
        """A pool leased for a restore from memory becomes the staging memory."""
        self.release_host_buffer()
        self._spool = pool

    def release_host_buffer(self) -> None:
        pool, self._spool = getattr(self, "_spool", None), None
        if pool is not None:
            pool.free()

    def pool_stats(self):
        pool = getattr(self, "_spool", None)
        return None if pool is None else dict(pool.stats, size=pool.size, all_pinned=True, failed=None)

    def module_load(self, ctx, image, parsed):
        globals_ = {}
        for name, g in parsed.globals.items():
            size = max(int(g.size), 1)
            addr = self._next_global
            self._next_global += (size + 255) // 256 * 256
            arr = np.zeros(size, np.uint8)
            if g.init:
                arr[:len(g.init)] = np.frombuffer(g.init, np.uint8)[:size]
            self._register(addr, arr)
            globals_[name] = (addr, int(g.size))
        return EmuModule(parsed, globals_)

    def module_unload(self, mod):
        for addr, _ in mod.globals.values():
            self._unregister(addr)
        mod.loaded = False

    def module_function(self, mod, name):
        if name not in mod.parsed.kernels:
            raise CudaError(CUDA_ERROR_NOT_FOUND, f"module has no kernel named {name}")
        if name not in mod.code_placed:
            mod.code_placed.add(name)
            self._next_global += self._code_bytes
        return EmuFunction(mod, name)

    def module_global(self, mod, name):
        g = mod.globals.get(name)
        if g is None:
            raise CudaError(CUDA_ERROR_NOT_FOUND, f"module has no __device__ variable named {name}")
        return g

    def launch(self, fn, grid, block, shmem, stream, params, info, attrs=None):
        # A launch may use dynamic shared memory up to the function's
        # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 48 KiB unless raised
        # with cuFuncSetAttribute; above it CUDA fails the launch with
        # CUDA_ERROR_INVALID_VALUE (CUDA C++ Programming Guide, "Shared Memory").
        limit = fn.attrs.get(FUNC_MAX_DYNAMIC_SHARED, DEFAULT_DYNAMIC_SHARED)
        if int(shmem) > limit:
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"launch of {fn.name} with {int(shmem)} bytes of dynamic shared memory; "
                            f"the function allows {limit} (cuFuncSetAttribute raises it)")
        impl = KERNELS.get(fn.name)
        if impl is None:
            raise CudaError(CUDA_ERROR_LAUNCH_FAILED,
                            f"emulated backend has no implementation of kernel {fn.name} "
                            f"(load one with proxyd --emu-kernels FILE)")
        cluster, coop = (1, 1, 1), False
        for aid, val in attrs or ():
            if aid == ATTR_COOPERATIVE:
                coop = struct.unpack_from("i", val)[0] != 0
            elif aid == ATTR_CLUSTER_DIMENSION:
                cluster = tuple(max(int(x), 1) for x in struct.unpack_from("3I", val))
        self._check_launch(fn, grid, block, shmem, cluster, coop)
        k = KernelLaunch(fn.name, grid, block, shmem, params, info["layout"], self.resolve, fn.module.globals,
                         cluster=cluster, cooperative=coop)
        k._textures = self.textures
        try:
            impl(k)
        except CudaError as e:
            raise CudaError(CUDA_ERROR_ILLEGAL_ADDRESS, f"emulated kernel {fn.name}: {e.message}") from e
        except KernelError as e:
            raise CudaError(CUDA_ERROR_LAUNCH_FAILED, str(e)) from e
        except Exception as e:
            tb = traceback.format_exc(limit=3).strip().splitlines()[-1]
            raise CudaError(CUDA_ERROR_LAUNCH_FAILED, f"emulated kernel {fn.name} raised {tb}") from e

    def _check_launch(self, fn, grid, block, shmem, cluster, coop):
        """The launch errors of the driver that the emulation can meet: a
        cluster shape that does not tile the grid or exceeds the portable
        cluster size, a cooperative grid larger than can be co-resident."""
        if cluster != (1, 1, 1):
            n = cluster[0] * cluster[1] * cluster[2]
            if n > PORTABLE_CLUSTER_SIZE or any(g % c for g, c in zip(grid, cluster)):
                raise CudaError(CUDA_ERROR_INVALID_CLUSTER_SIZE,
                                f"cluster {cluster} does not fit grid {tuple(grid)} (at most "
                                f"{PORTABLE_CLUSTER_SIZE} blocks per cluster)")
        if coop:
            per_sm = self.occupancy(fn, block[0] * block[1] * block[2], shmem)
            if grid[0] * grid[1] * grid[2] > per_sm * ATTRS[16]:
                raise CudaError(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
                                f"cooperative grid of {grid[0] * grid[1] * grid[2]} blocks exceeds "
                                f"{per_sm} resident blocks x {ATTRS[16]} SMs")

    def occupancy_max_active_clusters(self, fn, grid, block, shmem, attrs):
        """Co-resident clusters on the emulated GPU: resident blocks per SM
        times SMs, divided by the cluster's size (the cluster dimension
        attribute; one block without it), refusing a cluster larger than the portable size."""
        cluster = (1, 1, 1)
        for aid, val in attrs:
            if aid == ATTR_CLUSTER_DIMENSION:
                cluster = struct.unpack_from("<3I", val)
        n = cluster[0] * cluster[1] * cluster[2]
        if not 1 <= n <= PORTABLE_CLUSTER_SIZE:
            raise CudaError(CUDA_ERROR_INVALID_CLUSTER_SIZE, f"cluster {cluster}: at most "
                                                             f"{PORTABLE_CLUSTER_SIZE} blocks per cluster")
        per_sm = self.occupancy(fn, block[0] * block[1] * block[2], shmem)
        return (per_sm * ATTRS[16]) // n

    # ------------------------------------------------------- generic path
    def call(self, fn, args):
        impl = getattr(self, "drv_" + fn.name, None)
        if impl is None and fn.name.endswith(("_ptsz", "_ptds")):
            # per-thread-default-stream twins: on the emulated GPU every
            # stream runs in order on one thread, so they behave as the base
            impl = getattr(self, "drv_" + fn.name[:-5], None)
        if impl is None:
            raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name} is not implemented by the emulated backend")
        return impl(*args)

    def call_named(self, name, args):
        return getattr(self, "drv_" + name)(*args)

    def library(self, api: str):
        """The emulated cuBLAS / cuBLASLt / NVML (blas.py) and cuFFT / cuRAND /
        cuSPARSE / cuSOLVER (mathlibs.py); proxyd/families/libraries.py."""
        if api == "cudnn":
            from .cudnn import EmuCudnn  # the backend API's plumbing and one conv engine
            return EmuCudnn(self, api)
        if api == "nccl":
            from .collectives import EmuNccl    # collectives between sessions (issue 22)
            return EmuNccl(self, api)
        from .blas import EmuLibrary
        from .library_classes import CLASSES     # mathlibs.py's, extended
        return CLASSES.get(api, EmuLibrary)(self, api)

    def drv_cuDeviceGet(self, out, ordinal):
        return CUDA_SUCCESS, [self._dev(ordinal)]

    def drv_cuDeviceGetCount(self, out):
        return CUDA_SUCCESS, [self.devices]

    def drv_cuDeviceGetName(self, size, n, dev):
        name = self.device_name(self._dev(dev)).encode()[: max(int(n) - 1, 0)] + b"\0"
        return CUDA_SUCCESS, [name if size else None]

    def drv_cuDeviceGetUuid(self, out, dev):
        return CUDA_SUCCESS, [bytes([0x67, 0x70, self._dev(dev)] + [0] * 13)]

    drv_cuDeviceGetUuid_v2 = drv_cuDeviceGetUuid

    def drv_cuDeviceTotalMem_v2(self, out, dev):
        return CUDA_SUCCESS, [self.device_total_mem(self._dev(dev))]

    def drv_cuDeviceGetAttribute(self, out, attrib, dev):
        self._dev(dev)
        if attrib == 33:  # PCI bus id: one bus per emulated device
            return CUDA_SUCCESS, [int(dev)]
        return CUDA_SUCCESS, [ATTRS.get(int(attrib), 0)]

    def drv_cuDeviceGetPCIBusId(self, size, n, dev):
        s = f"0000:{self._dev(dev):02x}:00.0".encode()[: max(int(n) - 1, 0)] + b"\0"
        return CUDA_SUCCESS, [s if size else None]

    def drv_cuDeviceComputeCapability(self, major, minor, dev):
        self._dev(dev)
        return CUDA_SUCCESS, [9, 0]

    def drv_cuDeviceGetProperties(self, out, dev):
        self._dev(dev)
        a = ATTRS
        vals = [a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14]]
        return CUDA_SUCCESS, [struct.pack("14i", *[min(v, 2**31 - 1) for v in vals])]

    def drv_cuDeviceCanAccessPeer(self, out, dev, peer):
        self._dev(dev)
        self._dev(peer)
        return CUDA_SUCCESS, [1 if dev != peer else 0]

    def drv_cuCtxGetApiVersion(self, ctx, out):
        return CUDA_SUCCESS, [13000]

    def drv_cuCtxGetFlags(self, out):
        return CUDA_SUCCESS, [self._ctx().flags]

    # CUlimit values (cuda.h) and their defaults on an H100
    LIMIT_DEFAULTS = {0: 1024, 1: 1 << 20, 2: 8 << 20, 3: 2, 4: 2048, 5: 32, 6: 0}

    # CUlimit values of a fresh context (cuda.h order: stack size, printf
    # FIFO, malloc heap, device runtime sync depth, pending launch count,
    # max L2 fetch granularity, persisting L2 cache size)
    LIMIT_DEFAULTS = {0: 1024, 1: 1 << 20, 2: 8 << 20, 3: 2, 4: 2048, 5: 32, 6: 0}

    def drv_cuCtxResetPersistingL2Cache(self):
        self._ctx()          # needs a current context, as the driver does; no L2 to reset here
        return CUDA_SUCCESS, []

    def drv_cuCtxSetLimit(self, limit, value):
        if int(limit) not in self.LIMIT_DEFAULTS:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"cuCtxSetLimit: unknown limit {int(limit)}")
        self._ctx().limits[int(limit)] = int(value)
        return CUDA_SUCCESS, []

    def drv_cuCtxGetLimit(self, out, limit):
        if int(limit) not in self.LIMIT_DEFAULTS:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"cuCtxGetLimit: unknown limit {int(limit)}")
        return CUDA_SUCCESS, [self._ctx().limits.get(int(limit), self.LIMIT_DEFAULTS[int(limit)])]

    def drv_cuCtxGetStreamPriorityRange(self, least, greatest):
        return CUDA_SUCCESS, [0, -5]

    def drv_cuCtxGetCacheConfig(self, out):
        return CUDA_SUCCESS, [self._ctx().cache_config]

    def drv_cuCtxSetCacheConfig(self, config):
        self._ctx().cache_config = int(config)
        return CUDA_SUCCESS, []

    def drv_cuModuleGetLoadingMode(self, out):
        return CUDA_SUCCESS, [2]   # CU_MODULE_LAZY_LOADING

    def drv_cuFuncGetAttribute(self, out, attrib, fn):
        defaults = {0: 1024, 1: 0, 2: 0, 3: 0, 4: 32, 5: 90, 6: 90, 7: 0,
                    FUNC_MAX_DYNAMIC_SHARED: DEFAULT_DYNAMIC_SHARED, 9: -1}
        return CUDA_SUCCESS, [fn.attrs.get(int(attrib), defaults.get(int(attrib), 0))]

    # CUfunction_attribute values that cuFuncSetAttribute accepts (cuda.h):
    # max dynamic shared size, preferred carveout, and the cluster settings
    SETTABLE_FUNC_ATTRS = (8, 9, 11, 12, 13, 14, 15, 16)

    def drv_cuFuncSetAttribute(self, fn, attrib, value):
        attrib, value = int(attrib), int(value)
        if attrib not in self.SETTABLE_FUNC_ATTRS:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"cuFuncSetAttribute: attribute {attrib} cannot be set")
        if attrib == FUNC_MAX_DYNAMIC_SHARED and not 0 <= value <= ATTRS[97]:
            # at most the device's opt-in shared memory per block (attribute 97)
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"cuFuncSetAttribute: {value} bytes of dynamic shared memory exceed the device's {ATTRS[97]}")
        fn.attrs[attrib] = value
        return CUDA_SUCCESS, []

    def drv_cuFuncSetCacheConfig(self, fn, config):
        fn.cache_config = int(config)
        return CUDA_SUCCESS, []

    # tensor maps (TMA descriptors): checked and encoded as the driver would (tensor_map.py)
    drv_cuTensorMapEncodeTiled = staticmethod(_tensor_map.encode_tiled)
    drv_cuTensorMapEncodeIm2col = staticmethod(_tensor_map.encode_im2col)

    def drv_cuMemGetInfo_v2(self, free_, total):
        # device memory in use on the current context's device: the mapped
        # chunks (cudaMalloc's and the app's cuMemMap'ed ones), not the
        # registered regions, which include address reservations (PyTorch's
        # expandable segments reserve more than the whole device) and
        # mapped host memory
        used = self._mapped.get(self._cur.device if self._cur else 0, 0)
        return CUDA_SUCCESS, [max(EMU_TOTAL_MEM - used, 0), EMU_TOTAL_MEM]

    def drv_cuStreamCreate(self, out, flags):
        return CUDA_SUCCESS, [EmuStream(int(flags), 0)]

    def drv_cuStreamCreateWithPriority(self, out, flags, priority):
        return CUDA_SUCCESS, [EmuStream(int(flags), int(priority))]

    def drv_cuStreamDestroy_v2(self, s):
        if s is None or s.special is not None:
            raise CudaError(CUDA_ERROR_INVALID_HANDLE, "cannot destroy a default stream")
        return CUDA_SUCCESS, []

    def drv_cuStreamQuery(self, s):
        return CUDA_SUCCESS, []

    def drv_cuStreamWaitEvent(self, s, e, flags):
        return CUDA_SUCCESS, []

    def drv_cuStreamGetPriority(self, s, out):
        return CUDA_SUCCESS, [s.priority if s is not None else 0]

    def drv_cuStreamGetFlags(self, s, out):
        return CUDA_SUCCESS, [s.flags if s is not None else 0]

    def drv_cuEventCreate(self, out, flags):
        return CUDA_SUCCESS, [EmuEvent(int(flags))]

    def drv_cuEventRecord(self, e, s):
        e.time = time.perf_counter()
        return CUDA_SUCCESS, []

    def drv_cuEventRecordWithFlags(self, e, s, flags):
        return self.drv_cuEventRecord(e, s)

    def drv_cuEventQuery(self, e):
        return CUDA_SUCCESS, []

    def drv_cuEventElapsedTime_v2(self, out, start, end):
        if start.flags & 2 or end.flags & 2:     # CU_EVENT_DISABLE_TIMING
            raise CudaError(CUDA_ERROR_INVALID_HANDLE, "event created with CU_EVENT_DISABLE_TIMING")
        if start.time is None or end.time is None:
            raise CudaError(CUDA_ERROR_INVALID_HANDLE, "event not recorded")
        return CUDA_SUCCESS, [max(end.time - start.time, 0.0) * 1000.0]

    drv_cuEventElapsedTime = drv_cuEventElapsedTime_v2

    def drv_cuEventDestroy_v2(self, e):
        return CUDA_SUCCESS, []

    def occupancy(self, fn, block_size: int, smem: int) -> int:
        """Resident blocks per SM: the smallest of the thread, block,
        register and shared memory limits, as the occupancy calculator
        computes them (warp-granular threads and registers)."""
        block_size, smem = int(block_size), int(smem)
        if block_size <= 0 or block_size > self.drv_cuFuncGetAttribute(None, 0, fn)[1][0]:
            return 0
        warps = (block_size + 31) // 32
        regs = fn.attrs.get(4, 32)
        per_block_smem = smem + fn.attrs.get(1, 0)
        if per_block_smem > fn.attrs.get(8, BLOCK_SMEM_DEFAULT):
            return 0
        return max(0, min(SM_THREADS // (warps * 32), SM_BLOCKS, SM_REGS // max(regs * warps * 32, 1),
                          SM_SMEM // (per_block_smem + BLOCK_SMEM_RESERVED)))

    def drv_cuOccupancyMaxActiveBlocksPerMultiprocessor(self, out, fn, block_size, smem):
        return CUDA_SUCCESS, [self.occupancy(fn, block_size, smem)]

    def drv_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(self, out, fn, block_size, smem, flags):
        return self.drv_cuOccupancyMaxActiveBlocksPerMultiprocessor(out, fn, block_size, smem)

    def drv_cuOccupancyAvailableDynamicSMemPerBlock(self, out, fn, num_blocks, block_size):
        num_blocks, block_size = int(num_blocks), int(block_size)
        if num_blocks <= 0 or block_size <= 0:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, "numBlocks and blockSize must be positive")
        warps = (block_size + 31) // 32
        if num_blocks * warps * 32 > SM_THREADS or num_blocks > SM_BLOCKS:
            return CUDA_SUCCESS, [0]
        per_block = SM_SMEM // num_blocks - BLOCK_SMEM_RESERVED - fn.attrs.get(1, 0)
        return CUDA_SUCCESS, [max(0, min(per_block, BLOCK_SMEM_OPTIN - fn.attrs.get(1, 0)))]

    # ------------------------------------------------- streams: attributes
    def drv_cuStreamSetAttribute(self, s, attr, value):
        value = bytes(value)[:ATTR_VALUE_SIZE].ljust(ATTR_VALUE_SIZE, b"\0")
        if int(attr) == ATTR_PRIORITY:
            s.priority = struct.unpack_from("i", value)[0]
        s.attrs[int(attr)] = value
        return CUDA_SUCCESS, []

    def drv_cuStreamGetAttribute(self, s, attr, out):
        if int(attr) == ATTR_PRIORITY:
            return CUDA_SUCCESS, [struct.pack("i", s.priority).ljust(ATTR_VALUE_SIZE, b"\0")]
        return CUDA_SUCCESS, [s.attrs.get(int(attr), bytes(ATTR_VALUE_SIZE))]

    def drv_cuStreamCopyAttributes(self, dst, src):
        dst.attrs.update(src.attrs)
        return CUDA_SUCCESS, []

    # ----------------------------------------------------------------- peers
    def drv_cuDeviceGetP2PAttribute(self, out, attrib, src, dst):
        src, dst = self._dev(src), self._dev(dst)
        if src == dst:
            # documented answer (a device is not its own peer), so no message:
            # the real driver prints nothing either
            raise CudaError(CUDA_ERROR_INVALID_DEVICE)
        # emulated devices share one memory: access, atomics and arrays all work
        values = {1: 0, 2: 1, 3: 1, 4: 1, 5: 0}
        if int(attrib) not in values:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"unknown P2P attribute {attrib}")
        return CUDA_SUCCESS, [values[int(attrib)]]
