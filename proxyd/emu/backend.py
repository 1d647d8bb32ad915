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
import logging
import struct
import time
import traceback

import numpy as np

from gpuproxy.proxyd.backend import Backend
from gpuproxy.proxyd.session import CudaError
from .kernels import KERNELS, KernelError, KernelLaunch

log = logging.getLogger("proxyd")

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_DEVICE = 101
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_ILLEGAL_ADDRESS = 700
CUDA_ERROR_LAUNCH_FAILED = 719
CUDA_ERROR_NOT_SUPPORTED = 801

GLOBALS_BASE = 0x7E00_0000_0000   # module variables; above every session slice
EMU_TOTAL_MEM = 80 << 30

# Attribute values of the emulated device: an H100-like part, so that
# programs that size work from attributes behave as they would there.
ATTRS = {
    1: 1024, 2: 1024, 3: 1024, 4: 64, 5: 2147483647, 6: 65535, 7: 65535, 8: 49152, 9: 65536,
    10: 32, 11: 2147483647, 12: 65536, 13: 1980000, 14: 512, 15: 1, 16: 132, 17: 0, 18: 0, 19: 1,
    20: 0, 30: 512, 31: 1, 32: 1, 33: 0, 34: 0, 35: 0, 36: 2619000, 37: 5120, 38: 52428800,
    39: 2048, 40: 2, 41: 1, 50: 0, 51: 32, 75: 9, 76: 0, 78: 1, 79: 1, 80: 1, 81: 233472,
    82: 65536, 83: 1, 84: 0, 85: 0, 86: 0, 88: 0, 89: 1, 90: 1, 91: 0, 95: 1, 96: 0, 97: 232448,
    99: 1, 102: 1, 106: 32, 108: 83886080, 109: 134213632, 111: 1024, 115: 1, 120: 1,
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


class EmuEvent:
    def __init__(self, flags=0):
        self.flags = flags
        self.time: float | None = None


class EmuModule:
    def __init__(self, parsed, globals_: dict[str, tuple[int, int]]):
        self.parsed = parsed
        self.globals = globals_
        self.loaded = True


class EmuFunction:
    def __init__(self, module: EmuModule, name: str):
        self.module = module
        self.name = name
        self.attrs: dict[int, int] = {}


class EmuBackend(Backend):
    name = "emu"

    def __init__(self, devices: int = 1):
        self.devices = devices
        self._starts: list[int] = []
        self._regions: dict[int, np.ndarray] = {}
        self._next_global = GLOBALS_BASE
        self._null = {v: EmuStream(special=v) for v in (0, 1, 2)}
        self.primary_flags: dict[int, int] = {}

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

    def map_chunk(self, dev: int, addr: int, size: int):
        self._register(addr, np.zeros(size, np.uint8))
        return addr

    def unmap_chunk(self, backing):
        self._unregister(backing)

    def reserve(self, base, size):
        return None

    def chunk_array(self, backing) -> np.ndarray:
        return self._regions[backing]

    def copy_dtod(self, dev, dst, src, n):
        self.dtod(dst, src, n, None, True)

    def read_device(self, dev, addr, n, out):
        np.frombuffer(out, np.uint8, n)[:] = self.resolve(addr, n)

    def write_device(self, dev, addr, data):
        self.resolve(addr, len(data))[:] = np.frombuffer(data, np.uint8)

    def htod(self, dst, src, n, stream, sync):
        self.resolve(dst, n)[:] = np.frombuffer(src, np.uint8, n)

    def dtoh(self, dst, src, n, stream, sync):
        np.frombuffer(dst, np.uint8, n)[:] = self.resolve(src, n)

    def dtod(self, dst, src, n, stream, sync):
        self.resolve(dst, n)[:] = self.resolve(src, n).copy()

    def memset(self, dst, value, elem, count, stream, sync):
        dt = {1: np.uint8, 2: np.uint16, 4: np.uint32}[elem]
        self.resolve(dst, elem * count).view(dt)[:] = value & ((1 << (8 * elem)) - 1)

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
        return 13000

    # ----------------------------------------------------------- contexts
    def ctx_create(self, dev, flags):
        return EmuContext(self._dev(dev), flags)

    def ctx_destroy(self, ctx):
        pass

    def ctx_sync(self, ctx):
        pass

    def stream(self, special: int):
        return self._null[special]

    def stream_sync(self, stream):
        pass

    def event_sync(self, event):
        pass

    # ------------------------------------------------------------ modules
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
        return EmuFunction(mod, name)

    def module_global(self, mod, name):
        g = mod.globals.get(name)
        if g is None:
            raise CudaError(CUDA_ERROR_NOT_FOUND, f"module has no __device__ variable named {name}")
        return g

    def launch(self, fn, grid, block, shmem, stream, params, info):
        impl = KERNELS.get(fn.name)
        if impl is None:
            raise CudaError(CUDA_ERROR_LAUNCH_FAILED,
                            f"emulated backend has no implementation of kernel {fn.name} "
                            f"(load one with proxyd --emu-kernels FILE)")
        k = KernelLaunch(fn.name, grid, block, shmem, params, info["layout"], self.resolve, fn.module.globals)
        try:
            impl(k)
        except CudaError as e:
            raise CudaError(CUDA_ERROR_ILLEGAL_ADDRESS, f"emulated kernel {fn.name}: {e.message}") from e
        except KernelError as e:
            raise CudaError(CUDA_ERROR_LAUNCH_FAILED, str(e)) from e
        except Exception as e:
            tb = traceback.format_exc(limit=3).strip().splitlines()[-1]
            raise CudaError(CUDA_ERROR_LAUNCH_FAILED, f"emulated kernel {fn.name} raised {tb}") from e

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

    def drv_cuDevicePrimaryCtxGetState(self, dev, flags, active):
        return CUDA_SUCCESS, [self.primary_flags.get(self._dev(dev), 0), 1]

    def drv_cuDevicePrimaryCtxSetFlags_v2(self, dev, flags):
        self.primary_flags[self._dev(dev)] = int(flags)
        return CUDA_SUCCESS, []

    def drv_cuCtxGetApiVersion(self, ctx, out):
        return CUDA_SUCCESS, [13000]

    def drv_cuCtxGetFlags(self, out):
        return CUDA_SUCCESS, [0]

    def drv_cuCtxSetLimit(self, limit, value):
        self._limits()[int(limit)] = int(value)
        return CUDA_SUCCESS, []

    def drv_cuCtxGetLimit(self, out, limit):
        defaults = {0: 1024, 1: 1 << 20, 2: 8 << 20, 3: 2, 4: 2048, 5: 32, 6: 0}
        return CUDA_SUCCESS, [self._limits().get(int(limit), defaults.get(int(limit), 0))]

    def _limits(self):
        if not hasattr(self, "_lim"):
            self._lim = {}
        return self._lim

    def drv_cuCtxGetStreamPriorityRange(self, least, greatest):
        return CUDA_SUCCESS, [0, -5]

    def drv_cuCtxGetCacheConfig(self, out):
        return CUDA_SUCCESS, [0]

    def drv_cuCtxSetCacheConfig(self, config):
        return CUDA_SUCCESS, []

    def drv_cuModuleGetLoadingMode(self, out):
        return CUDA_SUCCESS, [2]   # CU_MODULE_LAZY_LOADING

    def drv_cuFuncGetAttribute(self, out, attrib, fn):
        defaults = {0: 1024, 1: 0, 2: 0, 3: 0, 4: 32, 5: 90, 6: 90, 7: 0, 8: 49152, 9: -1}
        return CUDA_SUCCESS, [fn.attrs.get(int(attrib), defaults.get(int(attrib), 0))]

    def drv_cuFuncSetAttribute(self, fn, attrib, value):
        fn.attrs[int(attrib)] = int(value)
        return CUDA_SUCCESS, []

    def drv_cuFuncSetCacheConfig(self, fn, config):
        return CUDA_SUCCESS, []

    def drv_cuMemGetInfo_v2(self, free_, total):
        used = sum(a.size for a in self._regions.values())
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

    def drv_cuOccupancyMaxActiveBlocksPerMultiprocessor(self, out, fn, block_size, smem):
        return CUDA_SUCCESS, [max(1, 2048 // max(int(block_size), 1))]

    def drv_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(self, out, fn, block_size, smem, flags):
        return self.drv_cuOccupancyMaxActiveBlocksPerMultiprocessor(out, fn, block_size, smem)
