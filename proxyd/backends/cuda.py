"""The real GPU backend: proxyd calls libcuda.so.1 through cffi (ABI mode).

Declarations come from two places: the generic path's functions are declared
from the specs by autogen (_generated.CDEF, one source of truth with the
shim), and the functions the hand-written handlers need (virtual memory
management, copies, modules, launch) are declared below with the structs
they take, as cuda.h (CUDA 13) defines them; tests/test_cuda_decls.py
checks their sizes against the C compiler's.

Device memory: each session's slice of addresses is reserved with
cuMemAddressReserve at its fixed base (CUDA Driver API, "Virtual Memory
Management"); chunks are backed by cuMemCreate + cuMemMap + cuMemSetAccess,
so addresses are chosen by gpuproxy, not by the driver, and a restore can map
memory again at the same addresses.

Every backend object (context, module, function, stream, event) is kept as
an integer (its pointer value), so objects from any cffi call site mix freely.

Locking: used by the daemon's main loop; checkpoint workers call the copy and
hash functions concurrently, which the driver API allows (it is thread-safe;
each thread sets its own current context).
"""
from __future__ import annotations

import ctypes
import logging
import os
import re
import threading

from cffi import FFI

from . import driver_zone, maps_debug
from .base import Backend
from ..core.session import CudaError

log = logging.getLogger("proxyd")

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
# GPUPROXY_SESSION_PRIMARY=1: a session's primary contexts are the devices'
# real primary contexts (shared with the worker's own work) instead of
# contexts of their own; needed for NCCL in the worker (docs/multigpu.md)
SESSION_PRIMARY = os.environ.get("GPUPROXY_SESSION_PRIMARY", "0") == "1"
# GPUPROXY_FUNC_LOAD=0: kernels' code loaded when the driver decides (first
# launch) instead of at their lookup (module_function)
FUNC_LOAD = os.environ.get("GPUPROXY_FUNC_LOAD", "1") != "0"
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_NOT_SUPPORTED = 801

HAND_CDEF = """
typedef unsigned long long CUdeviceptr;
/* CUipcEventHandle (cuda.h): 64 opaque bytes, passed by value */
typedef struct { char reserved[64]; } CUipcEventHandle;
int cuIpcGetEventHandle(CUipcEventHandle *, void *);
int cuIpcOpenEventHandle(void **, CUipcEventHandle);
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;
/* CUlaunchAttribute / CUlaunchConfig (cuda.h): the value union is 64 bytes,
   8-byte aligned; proxyd only copies it */
typedef struct { int id; char pad[4]; unsigned long long value[8]; } CUlaunchAttribute;
typedef struct {
    unsigned int gridDimX; unsigned int gridDimY; unsigned int gridDimZ;
    unsigned int blockDimX; unsigned int blockDimY; unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    void *hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

int cuInit(unsigned int flags);
int cuDriverGetVersion(int *v);
int cuDeviceGetCount(int *n);
int cuDeviceGet(int *dev, int ordinal);
int cuDeviceGetName(char *name, int len, int dev);
int cuDeviceTotalMem_v2(size_t *bytes, int dev);
int cuGetErrorName(int error, const char **str);
int cuDevicePrimaryCtxRetain(void **pctx, int dev);
int cuCtxCreate_v4(void **pctx, void *params, unsigned int flags, int dev);
int cuCtxCreate_v2(void **pctx, unsigned int flags, int dev);
int cuCtxSetFlags(unsigned int flags);
int cuCtxDestroy_v2(void *ctx);
int cuCtxSetCurrent(void *ctx);
int cuCtxPopCurrent_v2(void **pctx);
int cuCtxSynchronize(void);
int cuMemGetInfo_v2(size_t *free, size_t *total);
int cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags);
int cuMemAddressFree(CUdeviceptr ptr, size_t size);
int cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option);
int cuMemCreate(unsigned long long *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags);
int cuMemRelease(unsigned long long handle);
int cuMemExportToShareableHandle(void *shareableHandle, unsigned long long handle, int handleType, unsigned long long flags);
int cuMemImportFromShareableHandle(unsigned long long *handle, void *osHandle, int shHandleType);
int cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, unsigned long long handle, unsigned long long flags);
int cuMemUnmap(CUdeviceptr ptr, size_t size);
int cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
int cuMemAlloc_v2(CUdeviceptr *p, size_t n);
int cuMemFree_v2(CUdeviceptr p);
int cuMemHostRegister_v2(void *p, size_t n, unsigned int flags);
int cuMemHostGetDevicePointer_v2(unsigned long long *pdptr, void *p, unsigned int flags);
int cuMemHostUnregister(void *p);
int cuMemHostAlloc(void **pp, size_t n, unsigned int flags);
int cuMemFreeHost(void *p);
int cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
int cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *stream);
int cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
int cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *stream);
int cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n);
int cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *stream);
int cuMemcpyPeerAsync(CUdeviceptr dst, void *dstCtx, CUdeviceptr src, void *srcCtx, size_t n, void *stream);
int cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, void *stream);
int cuMemsetD16Async(CUdeviceptr dst, unsigned short v, size_t n, void *stream);
int cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, void *stream);
int cuMemsetD2D8Async(CUdeviceptr dst, size_t pitch, unsigned char v, size_t w, size_t h, void *stream);
int cuMemsetD2D16Async(CUdeviceptr dst, size_t pitch, unsigned short v, size_t w, size_t h, void *stream);
int cuMemsetD2D32Async(CUdeviceptr dst, size_t pitch, unsigned int v, size_t w, size_t h, void *stream);
int cuModuleLoadData(void **mod, const void *image);
int cuModuleUnload(void *mod);
int cuModuleGetFunction(void **fn, void *mod, const char *name);
int cuModuleGetGlobal_v2(CUdeviceptr *p, size_t *size, void *mod, const char *name);
int cuFuncGetParamInfo(void *fn, size_t index, size_t *offset, size_t *size);
int cuFuncLoad(void *fn);
int cuLaunchKernel(void *f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
                   unsigned int bz, unsigned int shmem, void *stream, void **params, void **extra);
int cuLaunchKernelEx(const CUlaunchConfig *config, void *f, void **params, void **extra);
int cuOccupancyMaxActiveClusters(int *numClusters, void *f, const CUlaunchConfig *config);
int cuStreamCreate(void **s, unsigned int flags);
int cuStreamDestroy_v2(void *s);
int cuStreamSynchronize(void *s);
int cuStreamQuery(void *s);
int cuStreamWaitEvent(void *s, void *e, unsigned int flags);
int cuEventCreate(void **e, unsigned int flags);
int cuEventRecord(void *e, void *s);
int cuEventSynchronize(void *e);
int cuEventQuery(void *e);
int cuEventDestroy_v2(void *e);
int cuLaunchHostFunc(void *s, void (*fn)(void *), void *userData);
int cuArray3DCreate_v2(void **pHandle, const void *desc);
int cuArrayDestroy(void *hArray);
int cuMipmappedArrayCreate(void **pHandle, const void *desc, unsigned int numMipmapLevels);
int cuMipmappedArrayGetLevel(void **pLevelArray, void *hMipmappedArray, unsigned int level);
int cuMipmappedArrayDestroy(void *hMipmappedArray);
int cuMemcpy3D_v2(const void *pCopy);
int cuMemcpy3DAsync_v2(const void *pCopy, void *stream);
int cuTexObjectCreate(unsigned long long *pTexObject, const void *pResDesc, const void *pTexDesc,
                      const void *pResViewDesc);
int cuTexObjectDestroy(unsigned long long texObject);
int cuSurfObjectCreate(unsigned long long *pSurfObject, const void *pResDesc);
int cuSurfObjectDestroy(unsigned long long surfObject);
"""

# constants from cuda.h
CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
CU_MEMHOSTREGISTER_PORTABLE = 1
CU_MEMHOSTREGISTER_DEVICEMAP = 2
CU_MEMHOSTREGISTER_READ_ONLY = 8
CU_LAUNCH_PARAM_BUFFER_POINTER = 1
CU_LAUNCH_PARAM_BUFFER_SIZE = 2
CU_EVENT_DISABLE_TIMING = 2
CU_STREAM_NON_BLOCKING = 1


class CudaUnavailable(RuntimeError):
    pass


def _real_libcuda() -> str:
    """The system's libcuda.so.1, never the shim."""
    name = os.environ.get("GPUPROXY_LIBCUDA", "libcuda.so.1")
    try:
        lib = ctypes.CDLL(name)
    except OSError as e:
        raise CudaUnavailable(f"cannot load {name}: {e}") from e
    if hasattr(lib, "gp_session"):
        raise CudaUnavailable(f"{name} resolves to the gpuproxy shim, not the NVIDIA driver; unset LD_PRELOAD")
    return name


def _generic_cdef(known: set[str]) -> str:
    from .._generated import CDEF
    lines = []
    for line in CDEF.splitlines():
        m = re.match(r"int (\w+)\(", line)
        if m and m.group(1) not in known:
            lines.append(line)
    return "\n".join(lines)


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self):
        path = _real_libcuda()
        self.ffi = FFI()
        self.ffi.cdef(HAND_CDEF)
        known = set(re.findall(r"int (\w+)\(", HAND_CDEF))
        self.ffi.cdef(_generic_cdef(known))
        self.lib = self.ffi.dlopen(path)
        r = self.lib.cuInit(0)
        if r != CUDA_SUCCESS:
            raise CudaUnavailable(f"cuInit failed: {self.err_name(r)}")
        # functions newer than the driver answer not-supported (driver_floor.py)
        from . import driver_floor
        v = self.ffi.new("int *")
        self.lib.cuDriverGetVersion(v)
        self.lib = driver_floor.GatedLib(self.lib, driver_floor.effective_version(v[0]))
        n = self.ffi.new("int *")
        self.check(self.lib.cuDeviceGetCount(n), "cuDeviceGetCount")
        self.ndev = n[0]
        if self.ndev == 0:
            raise CudaUnavailable("the driver reports no GPU")
        # one primary context per device for proxyd's own work (arena mapping,
        # checkpoint copies); sessions get contexts of their own
        self.mgmt = []
        for d in range(self.ndev):
            p = self.ffi.new("void **")
            self.check(self.lib.cuDevicePrimaryCtxRetain(p, d), "cuDevicePrimaryCtxRetain")
            self.mgmt.append(self.ptr(p[0]))
        self._tls = threading.local()
        self._extra = None
        from . import native
        from .._generated import FUNCTIONS
        self.native = native.load(path, [fid for fid, f in FUNCTIONS.items() if f.handler == "launch_kernel"])
        if self.native is None:
            log.info("native launch path unavailable; launches go through Python")
        self._names = {}
        g = self.ffi.new("size_t *")
        prop = self._prop(0)
        self.check(self.lib.cuMemGetAllocationGranularity(g, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "granularity")
        self.granularity = g[0]
        from ..core.arena import GRANULARITY
        if GRANULARITY % self.granularity:
            raise CudaUnavailable(f"VMM granularity {self.granularity} does not divide the arena's {GRANULARITY}")
        # proxyd's own module (the gp64 hash kernel) is placed by the driver
        # like the app's; loaded at the first hash it would land between the
        # app's loads in one worker and after all of them in the worker that
        # restores (issue 23, target 5). Loaded here, it comes first in every
        # worker. GPUPROXY_PRELOAD_HASH=0: at the first hash, as before.
        if os.environ.get("GPUPROXY_PRELOAD_HASH", "1") != "0":
            for d in range(self.ndev):
                try:
                    self._hash_fn(d)
                except Exception as e:        # hashing falls back as when the kernel is missing
                    log.info("gp64 hash kernel not preloaded on device %d: %s", d, e)
        # the address space a session's context and its modules land in,
        # reserved at this point every worker reaches with the same
        # mappings (driver_zone.py)
        self._zone = driver_zone.make()

    # ------------------------------------------------------------- helpers
    def ptr(self, cdata) -> int:
        return int(self.ffi.cast("uintptr_t", cdata))

    def vp(self, v):
        return self.ffi.cast("void *", v or 0)

    def err_name(self, code: int) -> str:
        s = self.ffi.new("const char **")
        if self.lib.cuGetErrorName(code, s) == 0 and s[0] != self.ffi.NULL:
            return self.ffi.string(s[0]).decode()
        return f"error {code}"

    def check(self, r: int, what: str):
        if r != CUDA_SUCCESS:
            raise CudaError(r, f"{what}: {self.err_name(r)}")

    def _set(self, ctx: int):
        if getattr(self._tls, "cur", None) != ctx:
            self.check(self.lib.cuCtxSetCurrent(self.vp(ctx)), "cuCtxSetCurrent")
            self._tls.cur = ctx

    def _prop(self, dev: int):
        prop = self.ffi.new("CUmemAllocationProp *")
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = dev
        return prop

    # ------------------------------------------------------------- devices
    def init(self):
        pass

    def device_count(self) -> int:
        return self.ndev

    def device_name(self, dev: int) -> str:
        if dev not in self._names:
            buf = self.ffi.new("char[256]")
            self.check(self.lib.cuDeviceGetName(buf, 256, dev), "cuDeviceGetName")
            self._names[dev] = self.ffi.string(buf).decode()
        return self._names[dev]

    def device_total_mem(self, dev: int) -> int:
        n = self.ffi.new("size_t *")
        self.check(self.lib.cuDeviceTotalMem_v2(n, dev), "cuDeviceTotalMem")
        return n[0]

    def driver_version(self) -> int:
        # what the application is told (HELLO): the driver's, or less under
        # GPUPROXY_DRIVER_VERSION_CAP, so that a runtime newer than the
        # driver refuses as it would natively (driver_floor.py)
        return self.lib.version

    # ------------------------------------------------------------ contexts
    def ctx_create(self, dev: int, flags: int, primary: bool = False) -> int:
        if primary and SESSION_PRIMARY:
            # the session's primary context is the device's (docs/multigpu.md:
            # NCCL's cudaSetDevice makes it current in the worker)
            ctx = self.mgmt[dev]
            if flags:
                self.ctx_set_flags(ctx, flags)
            return ctx
        maps_debug.note("ctx_create")
        p = self.ffi.new("void **")
        with driver_zone.opened(getattr(self, "_zone", None), full=True):
            if self.lib.has("cuCtxCreate_v4"):
                self.check(self.lib.cuCtxCreate_v4(p, self.ffi.NULL, flags, dev), "cuCtxCreate")
            else:   # drivers before CUDA 12.5: the same context without creation parameters
                self.check(self.lib.cuCtxCreate_v2(p, flags, dev), "cuCtxCreate")
        maps_debug.note("ctx_created")      # where it landed, against the worker that served the app
        ctx = self.ptr(p[0])
        # cuCtxCreate pushes the new context; proxyd sets contexts per call
        self.lib.cuCtxPopCurrent_v2(self.ffi.new("void **"))
        self._tls.cur = None
        return ctx

    def ctx_destroy(self, ctx: int):
        if ctx in self.mgmt:
            # a session on the device's primary context (SESSION_PRIMARY): its
            # objects are freed already; the context is the worker's own
            self.ctx_sync(ctx)
            return
        self.check(self.lib.cuCtxDestroy_v2(self.vp(ctx)), "cuCtxDestroy")
        driver_zone.note_freed(getattr(self, "_zone", None))     # its address space may be free again
        if getattr(self._tls, "cur", None) == ctx:
            self._tls.cur = None

    def make_current(self, ctx: int):
        self._set(ctx)

    def forget_current(self):
        """A library switched this thread's context behind our back (NCCL's
        cudaSetDevice makes the device's primary context current,
        proxyd/families/nccl.py): the next _set calls cuCtxSetCurrent again."""
        self._tls.cur = None

    def ctx_set_flags(self, ctx: int, flags: int):
        # cuCtxSetFlags (CUDA >= 12.1) acts on the current context
        self._set(ctx)
        self.check(self.lib.cuCtxSetFlags(flags), "cuCtxSetFlags")

    def ctx_sync(self, ctx: int):
        self._set(ctx)
        self.check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")

    def mgmt_ctx(self, dev: int = 0) -> int:
        return self.mgmt[dev]

    # -------------------------------------------------------------- memory
    def reserve(self, base: int, size: int):
        self._set(self.mgmt[0])
        p = self.ffi.new("CUdeviceptr *")
        self.check(self.lib.cuMemAddressReserve(p, size, 0, base, 0), "cuMemAddressReserve")
        if p[0] != base:
            self.lib.cuMemAddressFree(p[0], size)
            raise CudaError(2, f"device addresses {base:#x}..{base + size:#x} are taken in this process "
                               f"(the driver offered {p[0]:#x}); cannot place session memory at its fixed address")
        return (base, size)

    def unreserve(self, token):
        base, size = token
        self.lib.cuMemAddressFree(base, size)

    def map_chunk(self, dev: int, addr: int, size: int):
        self._set(self.mgmt[dev])
        h = self.ffi.new("unsigned long long *")
        # shareable as a file descriptor, so that CUDA IPC can hand the chunk
        # to another session's worker (proxyd/families/ipc.py); where the driver
        # refuses that, plain memory (IPC export then answers not-supported)
        prop = self._prop(dev)
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        r = self.lib.cuMemCreate(h, size, prop, 0) if self._shareable else 1
        if r != CUDA_SUCCESS:
            if self._shareable and r != 2:      # not out of memory: the handle type is not available
                log.info("VMM memory shareable as a file descriptor is not available (%s); CUDA IPC exports "
                         "will answer not-supported", self.err_name(r))
                self._shareable = False
            self.check(self.lib.cuMemCreate(h, size, self._prop(dev), 0), f"cuMemCreate({size} bytes)")
        r = self.lib.cuMemMap(addr, size, 0, h[0], 0)
        if r != CUDA_SUCCESS:
            self.lib.cuMemRelease(h[0])
            self.check(r, f"cuMemMap at {addr:#x}")
        # read-write for its own device and for every device that can reach
        # it: all of a session's devices share this worker's address space,
        # so a peer pointer works in kernels and copies as it does natively
        # after cuCtxEnablePeerAccess (proxyd/backends/peer.py)
        from .peer import access_devices
        devs = access_devices(self, dev)
        desc = self.ffi.new("CUmemAccessDesc[]", len(devs))
        for i, d in enumerate(devs):
            desc[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE
            desc[i].location.id = d
            desc[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        r = self.lib.cuMemSetAccess(addr, size, desc, len(devs))
        if r != CUDA_SUCCESS:
            self.lib.cuMemUnmap(addr, size)
            self.lib.cuMemRelease(h[0])
            self.check(r, f"cuMemSetAccess at {addr:#x}")
        return (addr, size, h[0], dev)

    def unmap_chunk(self, backing):
        addr, size, h, dev = backing
        self._set(self.mgmt[dev])
        self.check(self.lib.cuMemUnmap(addr, size), "cuMemUnmap")
        self.check(self.lib.cuMemRelease(h), "cuMemRelease")

    def set_access(self, addr: int, size: int, device: int, flags: int):
        desc = self.ffi.new("CUmemAccessDesc *")
        desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = device
        desc.flags = flags
        self._set(self.mgmt[0])
        self.check(self.lib.cuMemSetAccess(addr, size, desc, 1), f"cuMemSetAccess at {addr:#x} for device {device}")

    def host_register(self, buf):
        b = self.ffi.from_buffer(buf, require_writable=True)
        self._set(self.mgmt[0])
        self.check(self.lib.cuMemHostRegister_v2(b, len(buf), CU_MEMHOSTREGISTER_PORTABLE), "cuMemHostRegister")
        return b

    def host_unregister(self, token):
        self._set(self.mgmt[0])
        if isinstance(token, tuple) and token[0] == "hostmap":
            self.lib.cuMemHostUnregister(self.ffi.cast("void *", token[1]))
            return
        self.lib.cuMemHostUnregister(token)

    _shareable = True

    # CUDA IPC (proxyd/families/ipc.py)
    def chunk_export_fd(self, backing) -> int:
        addr, size, h, dev = backing
        self._set(self.mgmt[dev])
        fd = self.ffi.new("int *")
        r = self.lib.cuMemExportToShareableHandle(fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
        if r != CUDA_SUCCESS:
            raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"cannot export device memory at {addr:#x} as a file "
                                                      f"descriptor ({self.err_name(r)})")
        return fd[0]

    def ipc_event_handle(self, event) -> bytes:
        h = self.ffi.new("CUipcEventHandle *")
        self.check(self.lib.cuIpcGetEventHandle(h, self.vp(event)), "cuIpcGetEventHandle")
        return bytes(self.ffi.buffer(h))

    def ipc_event_open(self, raw: bytes):
        h = self.ffi.new("CUipcEventHandle *")
        self.ffi.memmove(h, raw, 64)
        p = self.ffi.new("void **")
        self.check(self.lib.cuIpcOpenEventHandle(p, h[0]), "cuIpcOpenEventHandle")
        return self.ptr(p[0])

    def import_fd_at(self, dev: int, base: int, size: int, fd: int):
        self._set(self.mgmt[dev])
        h = self.ffi.new("unsigned long long *")
        self.check(self.lib.cuMemImportFromShareableHandle(h, self.ffi.cast("void *", fd),
                                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                   "cuMemImportFromShareableHandle")
        r = self.lib.cuMemMap(base, size, 0, h[0], 0)
        if r != CUDA_SUCCESS:
            self.lib.cuMemRelease(h[0])
            self.check(r, f"cuMemMap at {base:#x}")
        desc = self.ffi.new("CUmemAccessDesc *")
        desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = dev
        desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        r = self.lib.cuMemSetAccess(base, size, desc, 1)
        if r != CUDA_SUCCESS:
            self.lib.cuMemUnmap(base, size)
            self.lib.cuMemRelease(h[0])
            self.check(r, f"cuMemSetAccess at {base:#x}")
        return (base, size, h[0], dev)

    def unimport(self, token):
        self.unmap_chunk(token)

    def host_map(self, addr, buf):
        """Registers the client's segment, mapped here at the client's
        address, for device access. With unified addressing the device
        pointer of registered memory is its host address where the device
        reports CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
        (cuda.h, cuMemHostRegister); checked, since the client hands that
        address to kernels."""
        self._set(self.mgmt[0])
        p = self.ffi.cast("void *", addr)
        self.check(self.lib.cuMemHostRegister_v2(p, len(buf), CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP),
                   f"cuMemHostRegister({addr:#x}, {len(buf)})")
        d = self.ffi.new("unsigned long long *")
        r = self.lib.cuMemHostGetDevicePointer_v2(d, p, 0)
        if r != CUDA_SUCCESS or d[0] != addr:
            self.lib.cuMemHostUnregister(p)
            raise CudaError(CUDA_ERROR_NOT_SUPPORTED if r == CUDA_SUCCESS else r,
                            f"registered host memory at {addr:#x} has device address "
                            f"{d[0]:#x}: the device cannot use host pointers for registered memory")
        return ("hostmap", addr)

    def _buf(self, data, writable=False):
        if data is None:
            return self.ffi.NULL
        return self.ffi.from_buffer(data, require_writable=writable)

    def htod(self, dst, src, n, stream, sync):
        p = self._buf(src)
        if stream in (None, 0) and sync:
            self.check(self.lib.cuMemcpyHtoD_v2(dst, p, n), "cuMemcpyHtoD")
            return
        self.check(self.lib.cuMemcpyHtoDAsync_v2(dst, p, n, self.vp(stream)), "cuMemcpyHtoDAsync")
        if sync:
            self.check(self.lib.cuStreamSynchronize(self.vp(stream)), "cuStreamSynchronize")

    def dtoh(self, dst, src, n, stream, sync):
        p = self._buf(dst, writable=True)
        if stream in (None, 0) and sync:
            self.check(self.lib.cuMemcpyDtoH_v2(p, src, n), "cuMemcpyDtoH")
            return
        self.check(self.lib.cuMemcpyDtoHAsync_v2(p, src, n, self.vp(stream)), "cuMemcpyDtoHAsync")
        if sync:
            self.check(self.lib.cuStreamSynchronize(self.vp(stream)), "cuStreamSynchronize")

    def dtod(self, dst, src, n, stream, sync):
        if stream in (None, 0) and sync:
            self.check(self.lib.cuMemcpyDtoD_v2(dst, src, n), "cuMemcpyDtoD")
        else:
            self.check(self.lib.cuMemcpyDtoDAsync_v2(dst, src, n, self.vp(stream)), "cuMemcpyDtoDAsync")

    def memset(self, dst, value, elem, count, stream, sync):
        s = self.vp(stream)
        if elem == 1:
            r = self.lib.cuMemsetD8Async(dst, value & 0xFF, count, s)
        elif elem == 2:
            r = self.lib.cuMemsetD16Async(dst, value & 0xFFFF, count, s)
        else:
            r = self.lib.cuMemsetD32Async(dst, value & 0xFFFFFFFF, count, s)
        self.check(r, "cuMemset")

    def memset2d(self, dst, pitch, value, elem, width, height, stream):
        s = self.vp(stream)
        if elem == 1:
            r = self.lib.cuMemsetD2D8Async(dst, pitch, value & 0xFF, width, height, s)
        elif elem == 2:
            r = self.lib.cuMemsetD2D16Async(dst, pitch, value & 0xFFFF, width, height, s)
        else:
            r = self.lib.cuMemsetD2D32Async(dst, pitch, value & 0xFFFFFFFF, width, height, s)
        self.check(r, "cuMemsetD2D")

    # ------------------------------------------- arrays, textures, surfaces
    # (proxyd/families/arrays.py): descriptors are packed as cuda.h lays them out,
    # with the driver's own array handles and the arena's device addresses
    def array_create(self, info):
        p = self.ffi.new("void **")
        self.check(self.lib.cuArray3DCreate_v2(p, self.ffi.from_buffer(info.desc3d())), "cuArray3DCreate")
        return self.ptr(p[0])

    def array_destroy(self, arr):
        self.check(self.lib.cuArrayDestroy(self.vp(arr)), "cuArrayDestroy")

    # mipmapped arrays: a level is the driver's own CUarray, owned by the
    # mipmapped array (cuda.h, cuMipmappedArrayGetLevel), never destroyed alone
    def mipmap_create(self, info, levels):
        p = self.ffi.new("void **")
        self.check(self.lib.cuMipmappedArrayCreate(p, self.ffi.from_buffer(info.desc3d()), levels),
                   "cuMipmappedArrayCreate")
        return self.ptr(p[0])

    def mipmap_level(self, mip, level, info):
        p = self.ffi.new("void **")
        self.check(self.lib.cuMipmappedArrayGetLevel(p, self.vp(mip), level), "cuMipmappedArrayGetLevel")
        return self.ptr(p[0])

    def mipmap_destroy(self, mip):
        self.check(self.lib.cuMipmappedArrayDestroy(self.vp(mip)), "cuMipmappedArrayDestroy")

    @staticmethod
    def _side3d(side, host_addr=0):
        from ..core.cuda_structs import MT_ARRAY, MT_DEVICE, MT_HOST
        if side["type"] == "array":
            return (side["x"], side["y"], side["z"], 0, MT_ARRAY, 0, 0, side["real"], 0, 0, 0)
        if side["type"] == "host":
            return (0, 0, 0, 0, MT_HOST, host_addr, 0, 0, 0, side["pitch"], side["height"])
        return (side["x"], side["y"], side["z"], 0, MT_DEVICE, 0, side["addr"], 0, 0, side["pitch"], side["height"])

    def _copy3d(self, src, dst, extent, stream, keep=None):
        from ..core.cuda_structs import MEMCPY3D
        raw = MEMCPY3D.pack(*self._side3d(src, src.get("host", 0)), *self._side3d(dst, dst.get("host", 0)), *extent)
        buf = self.ffi.from_buffer(raw)
        if stream is None:
            self.check(self.lib.cuMemcpy3D_v2(buf), "cuMemcpy3D")
        else:
            self.check(self.lib.cuMemcpy3DAsync_v2(buf, self.vp(stream)), "cuMemcpy3DAsync")

    def array_copy(self, src, dst, extent, stream):
        self._copy3d(src, dst, extent, stream)

    def _whole(self, arr, info, host_addr, to_array):
        a = {"type": "array", "real": arr, "x": 0, "y": 0, "z": 0}
        h = {"type": "host", "host": host_addr, "pitch": info.row_bytes, "height": info.rows}
        ext = (info.row_bytes, info.rows, info.slices)
        self._copy3d(h, a, ext, None) if to_array else self._copy3d(a, h, ext, None)

    def array_read(self, arr, info) -> bytes:
        out = bytearray(info.nbytes)
        if out:
            self._whole(arr, info, self.ptr(self.ffi.from_buffer(out, require_writable=True)), False)
        return bytes(out)

    def array_write(self, arr, info, data):
        buf = self.ffi.from_buffer(data)
        if len(data):
            self._whole(arr, info, self.ptr(buf), True)

    def _res_desc(self, res) -> bytes:
        import struct
        from ..core.cuda_structs import RES_ARRAY, RES_LINEAR, RES_MIPMAPPED, RES_DESC_SIZE
        out = bytearray(RES_DESC_SIZE)
        struct.pack_into("<I", out, 0, res["type"])
        if res["type"] in (RES_ARRAY, RES_MIPMAPPED):       # hArray / hMipmappedArray
            struct.pack_into("<Q", out, 8, res["real"])
        elif res["type"] == RES_LINEAR:
            struct.pack_into("<QIIQ", out, 8, res["addr"], res["format"], res["channels"], res["size"])
        else:
            struct.pack_into("<QIIQQQ", out, 8, res["addr"], res["format"], res["channels"], res["width"],
                             res["height"], res["pitch"])
        struct.pack_into("<I", out, 136, res["flags"])
        return bytes(out)

    def tex_create(self, res, tex, view):
        p = self.ffi.new("unsigned long long *")
        r = self.lib.cuTexObjectCreate(p, self.ffi.from_buffer(self._res_desc(res)), self.ffi.from_buffer(tex),
                                       self.ffi.from_buffer(view) if view is not None else self.ffi.NULL)
        self.check(r, "cuTexObjectCreate")
        return int(p[0])

    def tex_destroy(self, value):
        self.check(self.lib.cuTexObjectDestroy(value), "cuTexObjectDestroy")

    def surf_create(self, res):
        p = self.ffi.new("unsigned long long *")
        self.check(self.lib.cuSurfObjectCreate(p, self.ffi.from_buffer(self._res_desc(res))), "cuSurfObjectCreate")
        return int(p[0])

    def surf_destroy(self, value):
        self.check(self.lib.cuSurfObjectDestroy(value), "cuSurfObjectDestroy")

    # ------------------------------------------------------------- JIT linker
    # (proxyd/families/link.py): the option arrays and log buffers stay alive with the
    # link state, because the driver writes the logs during later calls
    def link_create(self, pairs, info_size, err_size):
        logs = [(3, 4, info_size), (5, 6, err_size)]
        n = len(pairs) + sum(2 for _b, _s, size in logs if size)
        opts = self.ffi.new("unsigned int[]", max(n, 1))
        vals = self.ffi.new("void *[]", max(n, 1))
        for i, (o, v) in enumerate(pairs):
            opts[i], vals[i] = o, self.ffi.cast("void *", v)
        i = len(pairs)
        bufs = []
        for buf_opt, size_opt, size in logs:
            buf = self.ffi.new("char[]", size) if size else None
            bufs.append(buf)
            if size:
                opts[i], vals[i] = buf_opt, buf
                opts[i + 1], vals[i + 1] = size_opt, self.ffi.cast("void *", size)
                i += 2
        p = self.ffi.new("void **")
        self.check(self.lib.cuLinkCreate_v2(n, opts, vals, p), "cuLinkCreate")
        return {"state": p[0], "keep": [opts, vals], "logs": bufs}

    def link_add(self, st, kind, data, name, pairs):
        n = len(pairs)
        opts = self.ffi.new("unsigned int[]", max(n, 1))
        vals = self.ffi.new("void *[]", max(n, 1))
        for i, (o, v) in enumerate(pairs):
            opts[i], vals[i] = o, self.ffi.cast("void *", v)
        buf = self.ffi.from_buffer(data)
        st["keep"] += [opts, vals, buf, data]
        self.check(self.lib.cuLinkAddData_v2(st["state"], kind, buf, len(data), name.encode() + b"\0",
                                             n, opts, vals), f"cuLinkAddData({name})")

    def link_complete(self, st):
        p = self.ffi.new("void **")
        n = self.ffi.new("size_t *")
        self.check(self.lib.cuLinkComplete(st["state"], p, n), "cuLinkComplete")
        return bytes(self.ffi.buffer(self.ffi.cast("char *", p[0]), n[0]))

    def link_logs(self, st):
        return tuple(self.ffi.string(b) if b is not None else b"" for b in st["logs"])

    def link_destroy(self, st):
        self.check(self.lib.cuLinkDestroy(st["state"]), "cuLinkDestroy")
        st["keep"].clear()

    # ------------------------------------------------------------- modules
    def module_load(self, ctx, image, parsed):
        maps_debug.note("module_load")
        p = self.ffi.new("void **")
        with driver_zone.opened(getattr(self, "_zone", None)):    # a load that needs new address space takes it there
            self.check(self.lib.cuModuleLoadData(p, image), "cuModuleLoadData")
        return self.ptr(p[0])

    def module_unload(self, mod):
        self.check(self.lib.cuModuleUnload(self.vp(mod)), "cuModuleUnload")
        driver_zone.note_freed(getattr(self, "_zone", None))

    def module_function(self, mod, name):
        p = self.ffi.new("void **")
        self.check(self.lib.cuModuleGetFunction(p, self.vp(mod), name.encode()), f"cuModuleGetFunction({name})")
        if FUNC_LOAD and self.lib.has("cuFuncLoad"):
            # with lazy loading the driver places a kernel's code when it is
            # first needed (a launch), in the memory later modules' __device__
            # variables come from; loaded at its lookup, it is placed at the
            # same point of the app's order in the worker that served the app
            # and in the one that restores it, which replays the lookups but
            # not the launches (families/modrestore.py; cuda.h, cuFuncLoad)
            try:
                with driver_zone.opened(getattr(self, "_zone", None)):
                    self.lib.cuFuncLoad(p[0])
            except CudaError:
                pass          # a driver without it: logged once by driver_floor
        return self.ptr(p[0])

    def module_global(self, mod, name):
        p = self.ffi.new("CUdeviceptr *")
        s = self.ffi.new("size_t *")
        self.check(self.lib.cuModuleGetGlobal_v2(p, s, self.vp(mod), name.encode()), f"cuModuleGetGlobal({name})")
        return int(p[0]), int(s[0])

    def param_info(self, fn):
        off = self.ffi.new("size_t *")
        size = self.ffi.new("size_t *")
        out = []
        while True:
            r = self.lib.cuFuncGetParamInfo(self.vp(fn), len(out), off, size)
            if r == CUDA_ERROR_INVALID_VALUE:
                return out
            self.check(r, "cuFuncGetParamInfo")
            out.append((int(off[0]), int(size[0])))

    def occupancy_max_active_clusters(self, fn, grid, block, shmem, attrs):
        ffi = self.ffi
        cfg = ffi.new("CUlaunchConfig *")
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
        cfg.sharedMemBytes = shmem
        arr = ffi.new("CUlaunchAttribute[]", max(len(attrs), 1))
        for i, (aid, val) in enumerate(attrs):
            arr[i].id = aid
            ffi.memmove(arr[i].value, val, 64)
        cfg.attrs = arr
        cfg.numAttrs = len(attrs)
        n = ffi.new("int *")
        self.check(self.lib.cuOccupancyMaxActiveClusters(n, ffi.cast("void *", fn), cfg),
                   "cuOccupancyMaxActiveClusters")
        return int(n[0])

    def launch(self, fn, grid, block, shmem, stream, params, info, attrs=None):
        # The packed argument buffer goes in `extra` (cuLaunchKernel,
        # CU_LAUNCH_PARAM_BUFFER_POINTER/SIZE), so proxyd never needs to know
        # the parameters' types. The extra array is reused: main loop only.
        ffi = self.ffi
        if params:
            buf = ffi.from_buffer(params)
            ex = self._extra
            if ex is None:
                self._lsize = ffi.new("size_t *")
                ex = self._extra = ffi.new("void *[5]", [self.vp(CU_LAUNCH_PARAM_BUFFER_POINTER), ffi.NULL,
                                                         self.vp(CU_LAUNCH_PARAM_BUFFER_SIZE), self._lsize, ffi.NULL])
            ex[1] = buf
            self._lsize[0] = len(params)
        else:
            ex = ffi.NULL
        if attrs:
            # launch attributes (cluster dimensions, cooperative, ...): cuLaunchKernelEx
            # with the same argument buffer
            cfg = ffi.new("CUlaunchConfig *")
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
            cfg.sharedMemBytes = shmem
            cfg.hStream = ffi.cast("void *", stream)
            arr = ffi.new("CUlaunchAttribute[]", len(attrs))
            for i, (aid, val) in enumerate(attrs):
                arr[i].id = aid
                ffi.memmove(arr[i].value, val, 64)
            cfg.attrs = arr
            cfg.numAttrs = len(attrs)
            r = self.lib.cuLaunchKernelEx(cfg, ffi.cast("void *", fn), ffi.NULL, ex)
            if r:
                self.check(r, f"cuLaunchKernelEx({info.get('name', '?')})")
            return
        r = self.lib.cuLaunchKernel(ffi.cast("void *", fn), grid[0], grid[1], grid[2], block[0], block[1], block[2],
                                    shmem, ffi.cast("void *", stream), ffi.NULL, ex)
        if r:
            self.check(r, f"cuLaunchKernel({info.get('name', '?')})")

    def native_launches(self, slot, raw, off, max_ops):
        """Runs launch ops in C (native.py); keeps the current-context cache
        shared with the C side coherent."""
        lib = self.native.lib
        lib.gpx_note_current(getattr(self._tls, "cur", None) or 0)
        r = self.native.run_launches(slot, raw, off, max_ops)
        self._tls.cur = int(lib.gpx_current()) or None
        return r

    # ---------------------------------------------------------- checkpoints
    # The gp64 kernel may hash a range that crosses from one mapping into the
    # next (a kernel reads any mapped virtual address). One copy
    # (cuMemcpy*Async) crosses adjacent mappings too: on the H100 (driver
    # 580, 2026-11-24) dumps and restores of 20,000 and 100,000 small
    # allocations this way came back intact (device-side verification) and
    # the restore's upload went from 9,281 copies at 5.1 GB/s to 1,161 at
    # 7.1 GB/s. $GPUPROXY_CKPT_SPAN_COPIES=0 copies mapping by mapping (the
    # restore's verification catches a wrong copy; a refused one is an
    # error, never silent).
    hash_spans_mappings = True
    spans_mappings = os.environ.get("GPUPROXY_CKPT_SPAN_COPIES", "1") != "0"

    def _ckpt_stream(self, dev: int, lane: int = 0) -> int:
        """A stream of proxyd's own per device and lane for checkpoint copies
        (the calling thread's). Lanes let several copies be in flight, each
        waited for by its own event (lane_fence) instead of a stream or
        device synchronisation (CUDA Driver API, Stream Management: work on
        different streams may overlap)."""
        st = getattr(self._tls, "streams", None)
        if st is None:
            st = self._tls.streams = {}
        key = dev if lane == 0 else (dev, lane)
        if key not in st:
            self._set(self.mgmt[dev])
            p = self.ffi.new("void **")
            self.check(self.lib.cuStreamCreate(p, CU_STREAM_NON_BLOCKING), "cuStreamCreate")
            st[key] = self.ptr(p[0])
        return st[key]

    def _lanes(self, dev):
        st = getattr(self._tls, "streams", None) or {}
        return [v for k, v in st.items() if k == dev or (isinstance(k, tuple) and k[0] == dev)]

    def lane_fence(self, dev, lane=0):
        """An event recorded on the lane's stream: what was queued there so
        far. wait_fence blocks until it has run (cuEventSynchronize), and
        frees it. Events come from a per-thread free list: no create/destroy
        per fence."""
        # an event belongs to the context it was created in: one free list per device
        pools = getattr(self._tls, "free_events", None)
        if pools is None:
            pools = self._tls.free_events = {}
        free = pools.setdefault(dev, [])
        self._set(self.mgmt[dev])
        if free:
            ev = free.pop()
        else:
            p = self.ffi.new("void **")
            self.check(self.lib.cuEventCreate(p, CU_EVENT_DISABLE_TIMING), "cuEventCreate")
            ev = self.ptr(p[0])
        self.check(self.lib.cuEventRecord(self.vp(ev), self.vp(self._ckpt_stream(dev, lane))), "cuEventRecord")
        return dev, ev

    def wait_fence(self, fence):
        if fence is None:
            return
        dev, ev = fence
        self._set(self.mgmt[dev])
        self.check(self.lib.cuEventSynchronize(self.vp(ev)), "cuEventSynchronize")
        self._tls.free_events[dev].append(ev)

    def read_device_async(self, dev, addr, n, out, lane=0):
        """Device -> page-locked host memory (a host_buffer slice) on a copy
        lane; done once a later fence or sync_copies(dev) has returned."""
        self._set(self.mgmt[dev])
        self.check(self.lib.cuMemcpyDtoHAsync_v2(self.ffi.from_buffer(out, require_writable=True), addr, n,
                                                 self.vp(self._ckpt_stream(dev, lane))), "cuMemcpyDtoHAsync")

    def copy_dtod(self, dev, dst, src, n):
        s = self._ckpt_stream(dev)
        self.check(self.lib.cuMemcpyDtoDAsync_v2(dst, src, n, self.vp(s)), "cuMemcpyDtoDAsync")

    def sync_copies(self, dev):
        self._set(self.mgmt[dev])
        self._ckpt_stream(dev)
        for s in self._lanes(dev):
            self.check(self.lib.cuStreamSynchronize(self.vp(s)), "cuStreamSynchronize")

    def read_device(self, dev, addr, n, out):
        self._set(self.mgmt[dev])
        self.check(self.lib.cuMemcpyDtoH_v2(self.ffi.from_buffer(out, require_writable=True), addr, n), "cuMemcpyDtoH")

    def write_device(self, dev, addr, data):
        self._set(self.mgmt[dev])
        self.check(self.lib.cuMemcpyHtoD_v2(addr, self.ffi.from_buffer(data), len(data)), "cuMemcpyHtoD")

    def _hash_fn(self, dev):
        fns = getattr(self, "_hash_fns", None)
        if fns is None:
            fns = self._hash_fns = {}
        if dev not in fns:
            ptx = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gp64.ptx")   # gpuproxy/proxyd/
            if not os.path.exists(ptx):
                fns[dev] = None
            else:
                self._set(self.mgmt[dev])
                data = open(ptx, "rb").read() + b"\0"
                m = self.ffi.new("void **")
                self.check(self.lib.cuModuleLoadData(m, data), "cuModuleLoadData(gp64)")
                f = self.ffi.new("void **")
                self.check(self.lib.cuModuleGetFunction(f, m[0], b"gp64_chunks"), "gp64_chunks")
                fns[dev] = self.ptr(f[0])
        return fns[dev]

    def hash_device(self, dev, addr, n, chunk):
        fn = self._hash_fn(dev)
        if fn is None:
            return None
        ffi = self.ffi
        nch = (n + chunk - 1) // chunk
        self._set(self.mgmt[dev])
        # the result buffer is kept per thread and device, grown as needed
        bufs = getattr(self._tls, "hashbuf", None)
        if bufs is None:
            bufs = self._tls.hashbuf = {}
        have = bufs.get(dev)
        if have is None or have[1] < nch:
            if have is not None:
                self.lib.cuMemFree_v2(have[0])
            p = ffi.new("CUdeviceptr *")
            self.check(self.lib.cuMemAlloc_v2(p, 8 * max(nch, 4096)), "cuMemAlloc")
            bufs[dev] = have = (int(p[0]), max(nch, 4096))
        out = have[0]
        a = ffi.new("unsigned long long[4]", [addr, n, chunk, out])
        args = ffi.new("void *[4]", [a + 0, a + 1, a + 2, a + 3])
        s = self.vp(self._ckpt_stream(dev))
        self.check(self.lib.cuLaunchKernel(self.vp(fn), nch, 1, 1, 512, 1, 1, 0, s, args, ffi.NULL), "gp64_chunks")
        host = ffi.new("unsigned long long[]", nch)
        self.check(self.lib.cuStreamSynchronize(s), "cuStreamSynchronize")
        self.check(self.lib.cuMemcpyDtoH_v2(host, out, 8 * nch), "cuMemcpyDtoH")
        return list(host)

    def hash_device_many(self, dev, spans, chunk):
        """gp64 of every chunk of every (addr, n) span: one launch per span,
        all into one result buffer, then one synchronisation and one copy
        back (a session of many small mappings would otherwise pay a round
        trip per mapping). None where the gp64 kernel is missing."""
        fn = self._hash_fn(dev)
        if fn is None:
            return None
        ffi = self.ffi
        counts = [(n + chunk - 1) // chunk for _, n in spans]
        total = sum(counts)
        if total == 0:
            return [[] for _ in spans]
        self._set(self.mgmt[dev])
        bufs = getattr(self._tls, "hashbuf", None)
        if bufs is None:
            bufs = self._tls.hashbuf = {}
        have = bufs.get(dev)
        if have is None or have[1] < total:
            if have is not None:
                self.lib.cuMemFree_v2(have[0])
            p = ffi.new("CUdeviceptr *")
            self.check(self.lib.cuMemAlloc_v2(p, 8 * max(total, 4096)), "cuMemAlloc")
            bufs[dev] = have = (int(p[0]), max(total, 4096))
        s = self.vp(self._ckpt_stream(dev))
        o = 0
        keep = []
        for (addr, n), nch in zip(spans, counts):
            if nch:
                a = ffi.new("unsigned long long[4]", [addr, n, chunk, have[0] + 8 * o])
                args = ffi.new("void *[4]", [a + 0, a + 1, a + 2, a + 3])
                keep.append((a, args))
                self.check(self.lib.cuLaunchKernel(self.vp(fn), nch, 1, 1, 512, 1, 1, 0, s, args, ffi.NULL),
                           "gp64_chunks")
            o += nch
        host = ffi.new("unsigned long long[]", total)
        self.check(self.lib.cuStreamSynchronize(s), "cuStreamSynchronize")
        self.check(self.lib.cuMemcpyDtoH_v2(host, have[0], 8 * total), "cuMemcpyDtoH")
        out, o = [], 0
        for nch in counts:
            out.append(list(host[o:o + nch]))
            o += nch
        return out

    def host_register_readonly(self, buf):
        b = self.ffi.from_buffer(buf)
        self._set(self.mgmt[0])
        r = self.lib.cuMemHostRegister_v2(b, len(buf), CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_READ_ONLY)
        if r != CUDA_SUCCESS:
            self.last_register_error = self.err_name(r)
            log.info("cannot page-lock image memory (%s); restore copies through pageable memory", self.err_name(r))
            return None
        return b

    def host_buffer(self, n):
        """Page-locked host memory, kept and grown across checkpoints, pinned
        in the background a segment at a time (proxyd/backends/pinned_pool.py): copy
        into it only after wait_pinned() of the range, and never across
        segment_end(). The engine frees it after an idle period
        (release_host_buffer)."""
        from .pinned_pool import PinnedPool
        pool = getattr(self, "_pool", None)
        if pool is None or pool.size < n:
            if pool is not None:
                self._free_pool()
            size = max(n, 1 << 20)
            size = (size + (1 << 30) - 1) // (1 << 30) * (1 << 30) if size > (1 << 30) else size
            # page-locked already: the supervisor's shared pool (shared_pool.py), when on
            from .shared_pool import lease
            self._pool = lease(self, size) or PinnedPool(size, self._register_pool_segment,
                                                         self._unregister_pool_segment)
        if hasattr(self._pool, "touch"):
            self._pool.touch()    # its contents change: a note of what an image left there goes
        return self._pool.view

    def current_host_pool(self):
        return getattr(self, "_pool", None)

    def adopt_host_pool(self, pool):
        """A pool leased for a restore from memory becomes the staging memory."""
        self.release_host_buffer()
        self._pool = pool

    def _register_pool_segment(self, view):
        """cuMemHostRegister of one pool segment (called on a pinning thread;
        PORTABLE: usable from every context, CUDA Driver API, Memory
        Management)."""
        self._set(self.mgmt[0])
        b = self.ffi.from_buffer(view, require_writable=True)
        r = self.lib.cuMemHostRegister_v2(b, len(view), CU_MEMHOSTREGISTER_PORTABLE)
        if r != CUDA_SUCCESS:
            raise CudaError(r, f"cuMemHostRegister({len(view)}): {self.err_name(r)}")
        return b

    def _unregister_pool_segment(self, b):
        self._set(self.mgmt[0])
        self.lib.cuMemHostUnregister(b)

    def wait_pinned(self, off, n):
        pool = getattr(self, "_pool", None)
        return pool.wait_pinned(off, n) if pool is not None else 0.0

    def segment_end(self, off):
        pool = getattr(self, "_pool", None)
        return pool.segment_end(off) if pool is not None else 1 << 62

    def pinned_pool(self):
        return getattr(self, "_pool", None)

    def pool_stats(self):
        pool = getattr(self, "_pool", None)
        if pool is None:
            return None
        st = dict(pool.stats, size=pool.size, all_pinned=pool.all_pinned(), failed=pool.failed)
        st["touch_s"], st["register_s"] = round(st["touch_s"], 4), round(st["register_s"], 4)
        if pool.t_done is not None:
            st["pinned_in_s"] = round(pool.t_done - pool.t0, 4)
        return st

    def release_host_buffer(self):
        if getattr(self, "_pool", None) is not None:
            self._free_pool()

    def _free_pool(self):
        pool, self._pool = self._pool, None
        pool.free()

    def write_device_async(self, dev, addr, data, lane=0):
        """Host -> device on one of proxyd's copy lanes; data must be
        page-locked (a host_buffer slice) and stay untouched until a later
        fence of that lane or sync_copies(dev) has returned."""
        self._set(self.mgmt[dev])
        s = self._ckpt_stream(dev, lane)
        self.check(self.lib.cuMemcpyHtoDAsync_v2(addr, self.ffi.from_buffer(data), len(data), self.vp(s)),
                   "cuMemcpyHtoDAsync")

    # ------------------------------------------- library work in a capture
    def lib_graph_capture(self, stream, run):
        """Runs run() (a math-library call on `stream`) under a capture of
        that stream and instantiates what it recorded (graph_libcapture.py).
        Relaxed mode (cuda.h, CUstreamCaptureMode): calls of proxyd's other
        threads are not this capture's business. Returns (exec, None) or
        (None, why)."""
        s = self.vp(stream)
        r = self.lib.cuStreamBeginCapture_v2(s, 2)      # CU_STREAM_CAPTURE_MODE_RELAXED
        if r != CUDA_SUCCESS:
            return None, f"cuStreamBeginCapture: {self.err_name(r)}"
        try:
            run()
        finally:
            g = self.ffi.new("void **")
            r = self.lib.cuStreamEndCapture(s, g)
        if r != CUDA_SUCCESS:
            return None, f"cuStreamEndCapture: {self.err_name(r)}"
        e = self.ffi.new("void **")
        r = self.lib.cuGraphInstantiateWithFlags(e, g[0], 0)
        self.lib.cuGraphDestroy(g[0])
        if r != CUDA_SUCCESS:
            return None, f"cuGraphInstantiateWithFlags: {self.err_name(r)}"
        return self.ptr(e[0]), None

    def cond_driver(self):
        """The driver calls of conditional graph nodes (cuda_cond.py)."""
        if getattr(self, "_cond", None) is None:
            from .cuda_cond import DriverConds
            self._cond = DriverConds(self)
        return self._cond

    def lib_graph_launch(self, exec_, stream):
        self.check(self.lib.cuGraphLaunch(self.vp(exec_), self.vp(stream)), "cuGraphLaunch")

    def lib_graph_destroy(self, exec_):
        self.lib.cuGraphExecDestroy(self.vp(exec_))

    # ------------------------------------------------------------- streams
    def stream(self, special: int):
        return special      # NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD are their own values

    def launch_host_func(self, stream, run):
        """cuLaunchHostFunc with a worker-side function: the driver calls it
        on its own thread when the stream reaches it, and the stream waits
        until it returned (CUDA Driver API, cuLaunchHostFunc). It must not
        call CUDA, and does not: it only waits for the client (hostfn.py).
        One cffi callback for all; userData is a key into _host_calls."""
        if getattr(self, "_host_cb", None) is None:
            self._host_calls = {}
            self._host_next = 0
            self._host_mu = threading.Lock()

            @self.ffi.callback("void(void *)")
            def _host_cb(user):
                key = int(self.ffi.cast("uintptr_t", user))
                with self._host_mu:
                    fn = self._host_calls.pop(key, None)
                if fn is None:
                    return
                try:
                    fn()
                except Exception:       # never let an exception into the driver's thread
                    log.exception("host function failed in proxyd")
            self._host_cb = _host_cb
        with self._host_mu:
            self._host_next += 1
            key = self._host_next
            self._host_calls[key] = run
        r = self.lib.cuLaunchHostFunc(self.vp(stream), self._host_cb, self.vp(key))
        if r != CUDA_SUCCESS:
            with self._host_mu:
                self._host_calls.pop(key, None)
            self.check(r, "cuLaunchHostFunc")

    def stream_sync(self, stream):
        self.check(self.lib.cuStreamSynchronize(self.vp(stream)), "cuStreamSynchronize")

    def event_sync(self, event):
        self.check(self.lib.cuEventSynchronize(self.vp(event)), "cuEventSynchronize")

    def event_mark_complete(self, event):
        # recorded on the (empty) NULL stream of the current context: complete
        # as soon as the restore's final synchronisation has run
        self.check(self.lib.cuEventRecord(self.vp(event), self.ffi.NULL), "cuEventRecord")

    # ---------------------------------------------------------- generic path
    def call(self, fn, args):
        f = getattr(self.lib, fn.name, None)
        if f is None:
            raise CudaError(801, f"{fn.name} has no declaration for the generic path")
        ffi = self.ffi
        cargs, outs = [], []
        for (name, role, kind, ctype, cls, size, _sz), a in zip(fn.params, args):
            if role == "handle" and kind not in ("memory", "device"):
                cargs.append(self.vp(a))
            elif role == "device_ptr" and cls == "pointer":
                # a device address declared `void *` (cuTensorMapEncodeTiled's globalAddress)
                cargs.append(ffi.cast("void *", int(a or 0)))
            elif role in ("scalar", "device_ptr", "handle"):
                cargs.append(a)
            elif role == "in_buffer":
                cargs.append(self._buf(a) if a is not None else ffi.NULL)
            elif role == "out_buffer":
                if a is None:
                    cargs.append(ffi.NULL)
                    outs.append(None)
                else:
                    b = ffi.new("char[]", int(a))
                    cargs.append(ffi.cast("void *", b))
                    outs.append(("buf", b))
            elif role == "out_value":
                if a is None:
                    cargs.append(ffi.NULL)
                    outs.append(None)
                    continue
                if cls == "handle":
                    b = ffi.new("void *[1]")
                elif cls == "float":
                    b = ffi.new("float[1]" if size == 4 else "double[1]")
                elif cls in ("int", "uint"):
                    b = ffi.new(f"{'' if cls == 'int' else 'u'}int{8 * size}_t[1]")
                else:
                    # a struct, 64-byte aligned: CUtensorMap must be (cuda.h,
                    # cuTensorMapEncodeTiled) and no struct minds
                    raw = ffi.new("char[]", size + 64)
                    at = (-int(ffi.cast("uintptr_t", raw))) % 64
                    b = ffi.cast("char *", raw) + at
                    cargs.append(ffi.cast("void *", b))
                    outs.append(("struct", (raw, b, size)))
                    continue
                # declared pointee types differ between the generated and the
                # hand-written declarations (int * vs int32_t *): pass void *
                cargs.append(ffi.cast("void *", b))
                outs.append((cls, b))
            else:
                raise CudaError(801, f"{fn.name}: parameter {name} cannot be passed")
        r = f(*cargs)
        if r != CUDA_SUCCESS:
            return r, None
        res = []
        for o in outs:
            if o is None:
                res.append(None)
            elif o[0] == "buf":
                res.append(bytes(ffi.buffer(o[1])))
            elif o[0] == "handle":
                res.append(self.ptr(o[1][0]))
            elif o[0] in ("int", "uint", "float"):
                res.append(o[1][0])
            elif o[0] == "struct":
                res.append(bytes(ffi.buffer(o[1][1], o[1][2])))
            else:
                res.append(bytes(ffi.buffer(o[1])))
        return CUDA_SUCCESS, res

    def call_named(self, name, args):
        from .._generated import FUNCTIONS
        for fn in FUNCTIONS.values():
            if fn.name == name:
                return self.call(fn, args)
        raise CudaError(801, f"{name} unknown")
