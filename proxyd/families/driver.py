"""Hand-written handlers for the calls that translate pointers or handles, or
manage objects whose state a checkpoint must capture (spec: `handler:`).

Every handler takes (dispatcher, session, fn, ctx, args) with one argument per
spec'd parameter and returns (CUresult, outs), outs being one value per
out_value/out_buffer parameter (None where the client passed NULL).

Locking: called on the daemon's main loop.
"""
from __future__ import annotations

import logging

from . import hostmap
from . import ipc
from ..core import protocol as P
from ..core.arena import ArenaError
from ..core.kinds import CheckpointError, Kind, Stage, provide, register
from ..core.registry import CUDA_SUCCESS, handler, need_ctx, stream_of  # noqa: F401  (stream_of: by this name too)
from ..core.session import CudaError

log = logging.getLogger("proxyd")

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_INVALID_DEVICE = 101
CUDA_ERROR_INVALID_IMAGE = 200
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_NOT_SUPPORTED = 801

def parse_image_cached(image, uid=None, digest=None) -> object:
    """The parsed layout of a module image, once per distinct content: the
    worker's module store (modstore.py: a bounded LRU by SHA-256, and the
    disk cache of earlier runs for uid's images)."""
    from ..core.fatbin import FatbinError
    from .modstore import store
    try:
        return store().parsed(bytes(image), uid, digest)
    except FatbinError as e:
        raise CudaError(CUDA_ERROR_INVALID_IMAGE, f"module image rejected: {e}") from e


def placement_seq(sess) -> int:
    """The next number of the session's placement order: module loads and
    first kernel lookups, the driver calls that take space in the driver's
    own device memory for code and __device__ variables (modrestore.py).
    Loop thread only, as every handler."""
    n = getattr(sess, "_placement_seq", 0) + 1
    sess._placement_seq = n
    return n


def session_uid(sess):
    """The client's user (for the per-user module cache), None if unknown:
    a keyed-tcp client's key user, else the owner of its process where
    this worker can see it (same pid namespace)."""
    if getattr(sess, "key_uid", None) is not None:
        return sess.key_uid
    cached = getattr(sess, "_module_uid", False)
    if cached is not False:
        return cached
    from ..core import procinfo
    uid = None
    if getattr(sess, "pid", None) and (getattr(sess, "pidns", "") or procinfo.OWN_PIDNS) == procinfo.OWN_PIDNS:
        who = procinfo.owner(sess.pid)
        uid = who[0] if who else None
    sess._module_uid = uid
    return uid


# ------------------------------------------------------------------ init / contexts

@handler("init")
def h_init(d, sess, fn, ctx, args, **kw):
    d.backend.init()
    return CUDA_SUCCESS, []


def _check_device(d, dev):
    if not 0 <= dev < d.backend.device_count():
        raise CudaError(CUDA_ERROR_INVALID_DEVICE, f"invalid device ordinal {dev}")


@handler("primary_ctx_retain")
def h_primary_retain(d, sess, fn, ctx, args, **kw):
    dev = int(args[1])
    _check_device(d, dev)
    cid = sess.primary.get(dev)
    if cid is None:
        flags = sess.primary_flags.get(dev, 0)
        c = sess.add_context(dev, d.backend.ctx_create(dev, flags, primary=True), primary=True, flags=flags)
    else:
        c = sess.contexts[cid]
        c.refcount += 1
    return CUDA_SUCCESS, [c.handle]


@handler("primary_ctx_release")
def h_primary_release(d, sess, fn, ctx, args, **kw):
    dev = int(args[0])
    _check_device(d, dev)
    cid = sess.primary.get(dev)
    if cid is not None and sess.contexts[cid].refcount > 0:
        # The context stays alive at refcount 0 so that handles derived from it
        # keep working; it goes with cuDevicePrimaryCtxReset or the session.
        sess.contexts[cid].refcount -= 1
    return CUDA_SUCCESS, []


def destroy_context(d, sess, c):
    """Frees everything the session created in context c, then c itself."""
    d.backend.ctx_sync(c.real)
    from .arrays import release_context
    release_context(d, sess, c.id)       # texture/surface objects before the arrays they read
    for o in list(sess.objects.values()):
        if o.ctx == c.id:
            release_object(d, sess, o)
    for a in [a for a in sess.arena.allocs.values() if a.chunk.device == c.device and c.primary]:
        sess.arena.free(a.addr, vmm=a.chunk.vmm)
    for addr in [x for x in sess.graph_mem if x not in sess.arena.allocs]:
        del sess.graph_mem[addr]            # graph allocations went with the arena (graph_mem.py)
    d.backend.ctx_destroy(c.real)
    sess.drop_context(c)


def release_object(d, sess, o):
    b = d.backend
    if o.kind == P.K_MODULE:
        b.module_unload(o.real)
    elif o.kind == P.K_STREAM:
        b.call_named("cuStreamDestroy_v2", [o.real])
    elif o.kind == P.K_EVENT:
        b.call_named("cuEventDestroy_v2", [o.real])
    elif o.kind == P.K_ARRAY:
        if "level_of" not in o.info:      # a mipmap level goes with its mipmapped array
            b.array_destroy(o.real)
    elif o.kind == P.K_MIPMAPPED_ARRAY:
        b.mipmap_destroy(o.real)
    elif o.kind in (P.K_GRAPH, P.K_GRAPH_EXEC, P.K_GRAPH_NODE):
        from .graph_libcapture import close_in
        close_in(o)          # the driver's graphs of captured library work, while the context lives
    sess.drop(o)


@handler("primary_ctx_set_flags")
def h_primary_set_flags(d, sess, fn, ctx, args, **kw):
    """cuDevicePrimaryCtxSetFlags: proxyd gives every session a context of its
    own in place of the device's primary context, so the flags go to that
    context (cuCtxSetFlags takes the same values: cuda.h), or, before the
    session has one, to the context it will create. The device's real primary
    context belongs to proxyd and is never changed."""
    dev, flags = int(args[0]), int(args[1])
    _check_device(d, dev)
    cid = sess.primary.get(dev)
    if cid is not None:
        c = sess.contexts[cid]
        d.backend.ctx_set_flags(c.real, flags)
        c.flags = flags
    sess.primary_flags[dev] = flags
    return CUDA_SUCCESS, []


@handler("primary_ctx_get_state")
def h_primary_get_state(d, sess, fn, ctx, args, **kw):
    dev = int(args[0])
    _check_device(d, dev)
    cid = sess.primary.get(dev)
    c = sess.contexts[cid] if cid is not None else None
    flags = c.flags if c is not None else sess.primary_flags.get(dev, 0)
    active = 1 if c is not None and c.refcount > 0 else 0
    return CUDA_SUCCESS, [flags if args[1] else None, active if args[2] else None]


@handler("primary_ctx_reset")
def h_primary_reset(d, sess, fn, ctx, args, **kw):
    dev = int(args[0])
    _check_device(d, dev)
    cid = sess.primary.get(dev)
    if cid is not None:
        destroy_context(d, sess, sess.contexts[cid])
    return CUDA_SUCCESS, []


@handler("ctx_create")
def h_ctx_create(d, sess, fn, ctx, args, **kw):
    flags, dev = int(args[2] or 0), int(args[3])
    _check_device(d, dev)
    c = sess.add_context(dev, d.backend.ctx_create(dev, flags), primary=False, flags=flags)
    return CUDA_SUCCESS, [c.handle]


@handler("ctx_destroy")
def h_ctx_destroy(d, sess, fn, ctx, args, **kw):
    c = sess.context(int(args[0]))
    destroy_context(d, sess, c)
    return CUDA_SUCCESS, []


@handler("ctx_sync")
def h_ctx_sync(d, sess, fn, ctx, args, **kw):
    d.backend.ctx_sync(need_ctx(ctx, fn).real)
    return CUDA_SUCCESS, []


# ------------------------------------------------------------------------ memory

@handler("mem_alloc")
def h_mem_alloc(d, sess, fn, ctx, args, **kw):
    ctx = need_ctx(ctx, fn)
    size = int(args[1])
    # cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY when the device cannot hold the
    # request (cuda.h, cuMemAlloc; the runtime maps it to
    # cudaErrorMemoryAllocation). A request beyond the device's total memory
    # can never succeed: refuse it before asking the backend to map it.
    total = d.backend.device_total_mem(ctx.device)
    if size > total:
        raise CudaError(CUDA_ERROR_OUT_OF_MEMORY, f"{fn.name} of {size} bytes: out of memory (device {ctx.device} "
                                                  f"has {total} bytes)")
    try:
        addr = sess.arena.alloc(size, ctx.device)
    except ArenaError as e:
        raise CudaError(e.code, f"cuMemAlloc of {size} bytes: {e}") from e
    return CUDA_SUCCESS, [addr if args[0] else None]


@handler("mem_free")
def h_mem_free(d, sess, fn, ctx, args, **kw):
    addr = int(args[0])
    if addr == 0:
        return CUDA_SUCCESS, []
    # cuMemFree waits for work that may still use the memory before the
    # range can be handed out again.
    if ctx is not None:
        d.backend.ctx_sync(ctx.real)
    from .graph_mem import free_outside
    if free_outside(d, sess, "cuMemFree", addr):
        return CUDA_SUCCESS, []     # a graph allocation freed outside its graph (graph_mem.py)
    from .mempool_ipc import release_pointer
    if release_pointer(d, sess, fn, ctx, addr):     # a pointer imported from another process's pool
        return CUDA_SUCCESS, []
    try:
        sess.arena.free(addr)
    except ArenaError as e:
        raise CudaError(e.code, f"cuMemFree: {e}") from e
    from .mempool import forget_allocation
    forget_allocation(sess, addr)
    return CUDA_SUCCESS, []


@handler("mem_get_address_range")
def h_mem_range(d, sess, fn, ctx, args, **kw):
    addr = sess.translate(int(args[2]))
    hit = sess.arena.find(addr)
    if hit is None:
        for o in sess.of_kind(P.K_MODULE):
            for base, size in o.info.get("globals", {}).values():
                if base <= addr < base + size:
                    return CUDA_SUCCESS, [base if args[0] else None, size if args[1] else None]
        raise CudaError(CUDA_ERROR_NOT_FOUND, f"{addr:#x} is not inside a device allocation")
    a, _off = hit
    return CUDA_SUCCESS, [a.addr if args[0] else None, a.size if args[1] else None]


def _vmm_contiguous(sess, c, end: int) -> bool:
    """The application's mappings (cuMemMap) are one range where they follow
    each other without a hole, as on a GPU."""
    while c.end < end:
        nxt = sess.arena.chunk_at(c.end)
        if nxt is None or not nxt.vmm:
            return False
        c = nxt
    return True


def check_range(sess, fn, addr: int, n: int, what: str) -> None:
    """[addr, addr + n) must lie inside one allocation of this session (or
    one __device__ variable it looked up): the driver refuses copies and
    memsets that run past the allocation they touch with
    CUDA_ERROR_INVALID_VALUE (cuda.h, cuMemcpy*: "invalid value"), and a
    session must never reach memory that is not its own.
    Allocations are checked up to their reserved extent (256-byte rounding
    for small ones, the 2 MiB mapping for large ones), as the driver's own
    rounding lets a program do."""
    if n < 0:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: negative size {n}")
    if n == 0:
        return
    if hostmap.contains(sess, addr, n):
        return       # GPU-visible host memory of the session (hostmap.py)
    if ipc.imported_range(sess, addr, n):
        return       # another session's memory opened through CUDA IPC (ipc.py)
    if sess.arena.contains(addr):
        hit = sess.arena.find(addr)
        if hit is not None:
            a, off = hit
            if off + n <= max(a.extent, a.size):
                return
            if a.chunk.vmm and _vmm_contiguous(sess, a.chunk, addr + n):
                return
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"{fn.name}: {what} of {n} bytes at {addr:#x} runs past the end of its allocation "
                            f"({a.addr:#x}, {a.size} bytes)")
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {what} {addr:#x} is not inside a live allocation")
    for o in sess.of_kind(P.K_MODULE):
        for base, size in o.info.get("globals", {}).values():
            if base <= addr < base + max(size, 1):
                if addr + n <= base + size:
                    return
                raise CudaError(CUDA_ERROR_INVALID_VALUE,
                                f"{fn.name}: {what} of {n} bytes at {addr:#x} runs past the end of its "
                                f"__device__ variable ({base:#x}, {size} bytes)")
    raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {what} {addr:#x} is not a device address of this session")


def _is_async(fn) -> bool:
    return "Async" in fn.name


def _pinned(sess, ref) -> bool:
    return isinstance(ref, P.ShmRef) and ref.seg != sess.staging_seg


@handler("memcpy_htod")
def h_memcpy_htod(d, sess, fn, ctx, args, **kw):
    dst, src, n = sess.translate(int(args[0])), args[1], int(args[2])
    stream = stream_of(d, sess, args[3]) if len(args) > 3 else d.backend.stream(0)
    check_range(sess, fn, dst, n, "destination")
    data = d.data(sess, src)
    if data is None or len(data) < n:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {n} bytes announced, {0 if data is None else len(data)} sent")
    # Only a copy from pinned client memory may stay in flight after the
    # answer; staging and inline data are consumed before proxyd answers.
    sync = not (_is_async(fn) and _pinned(sess, src))
    if sess.graph_replay and isinstance(src, P.ShmRef):
        # A graph's copy from a bounce buffer that a host function of the
        # app fills just before it (captured pageable copies, explicit
        # memcpy nodes: graph_build.c, capture_copy.c). The driver may read
        # host memory when the copy is enqueued rather than when the stream
        # reaches it (CUDA Runtime API, "API synchronization behavior":
        # pageable sources are staged at once), which on the H100 gave
        # stale bytes; waiting for the stream first makes the order real.
        d.backend.stream_sync(stream)
        sync = True
    d.backend.htod(dst, data, n, stream, sync)
    return CUDA_SUCCESS, []


@handler("memcpy_dtoh")
def h_memcpy_dtoh(d, sess, fn, ctx, args, **kw):
    dst, src, n = args[0], sess.translate(int(args[1])), int(args[2])
    stream = stream_of(d, sess, args[3]) if len(args) > 3 else d.backend.stream(0)
    check_range(sess, fn, src, n, "source")
    if dst is None:
        buf = bytearray(n)
        d.backend.dtoh(buf, src, n, stream, True)
        return CUDA_SUCCESS, [bytes(buf)]
    view = d.data(sess, dst)
    if not isinstance(view, memoryview) or len(view) < n:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: destination buffer smaller than {n} bytes")
    sync = not (_is_async(fn) and _pinned(sess, dst))
    if sess.graph_replay:
        sync = True     # the host function after it reads the buffer (as in h_memcpy_htod)
    d.backend.dtoh(view, src, n, stream, sync)
    return CUDA_SUCCESS, [None]


@handler("memcpy_dtod")
def h_memcpy_dtod(d, sess, fn, ctx, args, **kw):
    dst, src, n = sess.translate(int(args[0])), sess.translate(int(args[1])), int(args[2])
    stream = stream_of(d, sess, args[3]) if len(args) > 3 else d.backend.stream(0)
    check_range(sess, fn, dst, n, "destination")
    check_range(sess, fn, src, n, "source")
    d.backend.dtod(dst, src, n, stream, not _is_async(fn))
    return CUDA_SUCCESS, []


@handler("memset")
def h_memset(d, sess, fn, ctx, args, **kw):
    dst, value, count = sess.translate(int(args[0])), int(args[1]), int(args[2])
    elem = 1 if "D8" in fn.name else 2 if "D16" in fn.name else 4
    stream = stream_of(d, sess, args[3]) if len(args) > 3 else d.backend.stream(0)
    check_range(sess, fn, dst, elem * count, "destination")
    d.backend.memset(dst, value, elem, count, stream, False)
    return CUDA_SUCCESS, []


@handler("memset2d")
def h_memset2d(d, sess, fn, ctx, args, **kw):
    """cuMemsetD2D{8,16,32}[Async]: Height rows of Width elements, rows
    dstPitch bytes apart (cuda.h, cuMemsetD2D8: the pitch is in bytes, Width
    in elements). Checked as one range from the first row's start to the last
    row's end: it must lie inside one allocation, as for the 1D memsets."""
    dst, pitch, value = sess.translate(int(args[0])), int(args[1]), int(args[2])
    width, height = int(args[3]), int(args[4])
    elem = 1 if "D2D8" in fn.name else 2 if "D2D16" in fn.name else 4
    # cuda.h: the _ptds/_ptsz forms use the per-thread default stream for NULL
    per_thread = fn.name.endswith(("_ptds", "_ptsz"))
    if len(args) > 5:
        stream = stream_of(d, sess, args[5] or (P.STREAM_PER_THREAD if per_thread else 0))
    else:
        stream = d.backend.stream(P.STREAM_PER_THREAD if per_thread else 0)
    if width == 0 or height == 0:
        return CUDA_SUCCESS, []
    if pitch < width * elem or (height > 1 and pitch % elem):
        raise CudaError(CUDA_ERROR_INVALID_VALUE,
                        f"{fn.name}: pitch {pitch} is smaller than a row of {width} x {elem} bytes or not a "
                        f"multiple of the element size")
    check_range(sess, fn, dst, pitch * (height - 1) + width * elem, "destination")
    d.backend.memset2d(dst, pitch, value, elem, width, height, stream)
    return CUDA_SUCCESS, []


@handler("host_alloc")
def h_host_alloc(d, sess, fn, ctx, args, **kw):
    ref = args[0]
    if not isinstance(ref, P.ShmRef):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: expected a shared segment")
    view = sess.shm.view(ref.seg, 0, ref.length)
    sess.shm.registered[ref.seg] = d.backend.host_register(view)
    return CUDA_SUCCESS, [None]


@handler("host_free")
def h_host_free(d, sess, fn, ctx, args, **kw):
    ref = args[0]
    if not isinstance(ref, P.ShmRef):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: expected a shared segment")
    if ctx is not None:
        d.backend.ctx_sync(ctx.real)
    tok = sess.shm.registered.pop(ref.seg, None)
    if tok is not None:
        d.backend.host_unregister(tok)
    sess.shm.close(ref.seg)
    return CUDA_SUCCESS, []


# ----------------------------------------------------------------------- modules

def load_module(d, sess, ctx, image, create, ident=None, digest=None, parsed=None, real=None):
    """real: the driver's module when the caller loaded it already
    (modrestore.py's measuring mode)."""
    image = bytes(image)
    if parsed is None:
        parsed = parse_image_cached(image, session_uid(sess), digest)
    if real is None:
        real = d.backend.module_load(ctx.real, image, parsed)
    return sess.add(P.K_MODULE, real, ctx.id, {"image": image, "parsed": parsed, "globals": {},
                                               "seq": placement_seq(sess)},
                    create=create, ident=ident)


@handler("module_load")
def h_module_load(d, sess, fn, ctx, args, fid=0, ctxh=0, **kw):
    """cuModuleLoadData and friends. The image comes by content first
    (P.ContentRef, docs/protocol.md "Module images by content"): known to
    the store, it is loaded; otherwise the answer is no module and a second
    out of 1, and the shim sends the bytes. Outs: [module, missing]."""
    ctx = need_ctx(ctx, fn)
    image = args[1]
    from .modstore import store
    uid = session_uid(sess)
    if isinstance(image, P.ContentRef):
        digest = image.digest
        image = store().image(digest, image.length, uid)
        if image is None:
            return CUDA_SUCCESS, [0, 1]
    else:
        if not image:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: empty image")
        digest = store().add_image(bytes(image), uid)
    o = load_module(d, sess, ctx, image, create=(fid, ctxh, []), digest=digest)
    return CUDA_SUCCESS, [o.handle, 0]


@handler("module_unload")
def h_module_unload(d, sess, fn, ctx, args, **kw):
    o = sess.get(P.K_MODULE, int(args[0]))
    for f in sess.of_kind(P.K_FUNCTION):
        if f.info.get("module") == o.id:
            sess.drop(f)
    release_object(d, sess, o)
    return CUDA_SUCCESS, []


def function_layout(d, mod, name: str, real) -> list[list[int]]:
    """Parameter layout of kernel `name`: parsed from the module image, and
    checked against the driver's own answer where the backend has one."""
    parsed = mod.info["parsed"]
    k = parsed.kernels.get(name)
    layout = [[p.offset, p.size] for p in k.params] if k is not None else None
    driver = d.backend.param_info(real)
    if layout is None:
        if driver is None:
            amb = getattr(parsed, "ambiguous", {}).get(name)
            if amb:
                raise CudaError(CUDA_ERROR_INVALID_IMAGE, f"kernel {name}: its parameter layout differs between the "
                                                          f"module image's entries ({amb}) and this backend cannot "
                                                          f"say which entry it loaded")
            raise CudaError(CUDA_ERROR_INVALID_IMAGE, f"no parameter layout for kernel {name} in its module image")
        return [list(x) for x in driver]
    if driver is not None and [tuple(x) for x in layout] != [tuple(x) for x in driver]:
        msg = (f"parameter layout of {name} parsed from the image {layout} disagrees with "
               f"cuFuncGetParamInfo {[list(x) for x in driver]}")
        log.error(msg)
        raise CudaError(CUDA_ERROR_INVALID_IMAGE, msg)
    return layout


@handler("module_get_function")
def h_module_get_function(d, sess, fn, ctx, args, fid=0, ctxh=0, **kw):
    mod = sess.get(P.K_MODULE, int(args[1]))
    name = bytes(args[2]).rstrip(b"\0").decode()
    for f in sess.of_kind(P.K_FUNCTION):   # the same handle for the same kernel, as the driver does
        if f.info.get("module") == mod.id and f.info.get("name") == name:
            return CUDA_SUCCESS, [f.handle, f.info["layout"]]
    real = d.backend.module_function(mod.real, name)
    layout = function_layout(d, mod, name, real)
    o = sess.add(P.K_FUNCTION, real, mod.ctx, {"module": mod.id, "name": name, "layout": layout,
                                                "seq": placement_seq(sess)},
                 create=(fid, ctxh, list(args)))
    return CUDA_SUCCESS, [o.handle, layout]


@handler("module_get_global")
def h_module_get_global(d, sess, fn, ctx, args, **kw):
    mod = sess.get(P.K_MODULE, int(args[2]))
    name = bytes(args[3]).rstrip(b"\0").decode()
    addr, size = d.backend.module_global(mod.real, name)
    mod.info["globals"][name] = (addr, size)
    return CUDA_SUCCESS, [addr if args[0] else None, size if args[1] else None]


@handler("launch_kernel")
def h_launch(d, sess, fn, ctx, args, **kw):
    f = sess.get(P.K_FUNCTION, int(args[0]))
    grid = tuple(int(x) for x in args[1:4])
    block = tuple(int(x) for x in args[4:7])
    shmem = int(args[7])
    stream = stream_of(d, sess, args[8])
    params = args[9] if args[9] is not None else b""
    d.backend.launch(f.real, grid, block, shmem, stream, bytes(params), f.info)
    return CUDA_SUCCESS, []


# ------------------------------------------------------------------- synchronise

@handler("stream_sync")
def h_stream_sync(d, sess, fn, ctx, args, **kw):
    d.backend.stream_sync(stream_of(d, sess, args[0]))
    return CUDA_SUCCESS, []


@handler("event_sync")
def h_event_sync(d, sess, fn, ctx, args, **kw):
    d.backend.event_sync(sess.get(P.K_EVENT, int(args[0])).real)
    return CUDA_SUCCESS, []


# ------------------------------------------------------------ launch variants

CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2
ATTR_VALUE_SIZE = 64          # sizeof(CUlaunchAttributeValue), cuda.h
# launch attributes whose value is plain data (the shim refuses the others:
# events of the client, graph-only attributes); cuda.h CUlaunchAttributeID
DATA_LAUNCH_ATTRIBUTES = {1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 14, 16}


def _launch_attrs(fn, raw) -> list[tuple[int, bytes]]:
    out = []
    for a in raw or []:
        aid, val = int(a[0]), bytes(a[1])
        if aid not in DATA_LAUNCH_ATTRIBUTES:
            raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name}: launch attribute {aid} is not supported")
        if len(val) != ATTR_VALUE_SIZE:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: attribute {aid} value of {len(val)} bytes")
        out.append((aid, val))
    return out


@handler("launch_kernel_ex")
def h_launch_ex(d, sess, fn, ctx, args, **kw):
    """cuLaunchKernelEx: [config, f, params, extra], config = [gx, gy, gz,
    bx, by, bz, shmem, stream, [[attribute id, value bytes], ...]]; the shim
    also sends cooperative launches this way."""
    cfg = args[0]
    if not isinstance(cfg, list) or len(cfg) != 9:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: malformed launch configuration")
    f = sess.get(P.K_FUNCTION, int(args[1]))
    grid = tuple(int(x) for x in cfg[0:3])
    block = tuple(int(x) for x in cfg[3:6])
    stream = stream_of(d, sess, cfg[7])
    params = bytes(args[2]) if args[2] is not None else b""
    d.backend.launch(f.real, grid, block, int(cfg[6]), stream, params, f.info, attrs=_launch_attrs(fn, cfg[8]))
    return CUDA_SUCCESS, []


@handler("occupancy_max_active_clusters")
def h_occupancy_clusters(d, sess, fn, ctx, args, **kw):
    """cuOccupancyMaxActiveClusters: [want, f, config] with config as
    cuLaunchKernelEx sends it."""
    cfg = args[2]
    if not isinstance(cfg, list) or len(cfg) != 9:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: malformed launch configuration")
    f = sess.get(P.K_FUNCTION, int(args[1]))
    n = d.backend.occupancy_max_active_clusters(f.real, tuple(int(x) for x in cfg[0:3]),
                                                tuple(int(x) for x in cfg[3:6]), int(cfg[6]),
                                                _launch_attrs(fn, cfg[8]))
    return CUDA_SUCCESS, [n if args[0] else None]


@handler("launch_cooperative")
def h_launch_cooperative(d, sess, fn, ctx, args, **kw):
    """cuLaunchCooperativeKernel's own op (cuLaunchKernel's without `extra`)."""
    f = sess.get(P.K_FUNCTION, int(args[0]))
    grid = tuple(int(x) for x in args[1:4])
    block = tuple(int(x) for x in args[4:7])
    params = bytes(args[9]) if args[9] is not None else b""
    coop = (CU_LAUNCH_ATTRIBUTE_COOPERATIVE, (1).to_bytes(4, "little").ljust(ATTR_VALUE_SIZE, b"\0"))
    d.backend.launch(f.real, grid, block, int(args[7]), stream_of(d, sess, args[8]), params, f.info, attrs=[coop])
    return CUDA_SUCCESS, []


# ------------------------------------------- state a restore must re-apply
#
# Stream attributes, context limits and whether an event has been recorded
# are kept on the session's objects; the checkpoint engine records them and
# re-applies them after re-creating the objects (checkpoint/engine.py).

def _stream_state(sess, ctx, handle) -> dict:
    """Where the attributes of a stream are kept: on the stream object, or,
    for the NULL / legacy / per-thread streams, on the calling context."""
    h = int(handle or 0)
    if h in (0, P.STREAM_LEGACY, P.STREAM_PER_THREAD):
        if ctx is None:
            return {}
        return ctx.stream_attrs.setdefault(h, {})
    return sess.get(P.K_STREAM, h).info.setdefault("attrs", {})


@handler("stream_set_attribute")
def h_stream_set_attribute(d, sess, fn, ctx, args, fid=0, ctxh=0, **kw):
    code, outs = d.generic(sess, fn, ctx, args, fid, ctxh)
    if code == CUDA_SUCCESS:
        _stream_state(sess, ctx, args[0])[int(args[1])] = bytes(d.data(sess, args[2]))
    return code, outs


@handler("stream_copy_attributes")
def h_stream_copy_attributes(d, sess, fn, ctx, args, fid=0, ctxh=0, **kw):
    code, outs = d.generic(sess, fn, ctx, args, fid, ctxh)
    if code == CUDA_SUCCESS:
        _stream_state(sess, ctx, args[0]).update(_stream_state(sess, ctx, args[1]))
    return code, outs


@handler("ctx_set_limit")
def h_ctx_set_limit(d, sess, fn, ctx, args, fid=0, ctxh=0, **kw):
    c = need_ctx(ctx, fn)
    code, outs = d.generic(sess, fn, ctx, args, fid, ctxh)
    if code == CUDA_SUCCESS:
        c.limits[int(args[0])] = int(args[1])
    return code, outs


@handler("event_record")
def h_event_record(d, sess, fn, ctx, args, fid=0, ctxh=0, **kw):
    code, outs = d.generic(sess, fn, ctx, args, fid, ctxh)
    if code == CUDA_SUCCESS:
        sess.get(P.K_EVENT, int(args[0])).info["recorded"] = True
    return code, outs


# ------------------------------------------------------------ host functions

@handler("host_func")
def h_host_func(d, sess, fn, ctx, args, **kw):
    """cuLaunchHostFunc / cuStreamAddCallback (and _ptsz): the shim sends
    [stream, id, gate] (+ flags), where id names the application's function
    in the shim's table (the `fn`/`callback` slot) and gate is a shared-memory
    reference (the `userData` slot): the function and its data never leave
    the application's process (interceptor/hostfn.c, proxyd/families/hostfn.py).
    The backend enqueues a host function of the worker's own in the stream,
    which has the client run the application's and waits for it."""
    from .hostfn import gate_for
    stream = stream_of(d, sess, args[0])
    ident, ref = args[1], args[2]
    if type(ident) is not int or ident <= 0 or not isinstance(ref, P.ShmRef):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: malformed host function op")
    if len(args) > 3 and int(args[3] or 0) != 0:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: flags must be 0")
    try:
        gate = gate_for(sess, ref)
    except Exception as e:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: no host function gate ({e})") from e
    # ops of an executable graph run again at every launch: the shim keeps
    # the function in its table (bit 63 of the id, interceptor/hostfn.c)
    ident_sent = ident | (1 << 63) if sess.graph_replay else ident
    d.backend.launch_host_func(stream, lambda: gate.run(ident_sent))
    return CUDA_SUCCESS, []


# The handlers of the stream-ordered allocator, the application's VMM and
# graphs live in modules of their own; importing this module registers them too.
from . import arrays, graph_mem, graph_nodes, graphs, hostmap, ipc, link, mempool, mempool_ipc, vmm  # noqa: E402,F401


# ------------------------------------------------------------ checkpoints
# Modules and kernels as checkpoint object kinds (core/kinds.py); contexts,
# streams and events are the engine's own steps.

def _describe_modules(sess) -> dict:
    return {"modules": [{"id": o.id, "ctx": o.ctx, "size": len(o.info["image"]),
                         "kernels": sorted(o.info["parsed"].kernels), "globals": {},
                         **({"seq": o.info["seq"]} if o.info.get("seq") else {})}
                        for o in sess.of_kind(P.K_MODULE)]}


def _rebuild_modules(r) -> None:
    """Modules first, in the order the app loaded them (ids grow with each
    load) and before any memory is mapped: a fresh process that loads the
    same modules in the same order gets their __device__ variables at the
    same addresses from the driver, which is what lets pointers to them that
    the app keeps (in host or device memory) stay valid. Kernels the app
    looked up are looked up again between the loads, in the order the app
    did (their placement numbers): with lazy loading the driver places a
    kernel's code at its first lookup, before the next module's variables.
    How the images are read and parsed (serially or in parallel, always
    loaded in order): modrestore.py."""
    from . import modrestore
    modrestore.rebuild(r, load_module, _restore_function, session_uid(r.sess))


def _restore_function(r, f) -> None:
    """A kernel of a reloaded module by name, its layout checked."""
    sess, b = r.sess, r.backend
    mod = sess.objects[(P.K_MODULE, f["module"])]
    b.make_current(sess.contexts[f["ctx"]].real)
    real = b.module_function(mod.real, f["name"])
    layout = function_layout(r.dispatcher, mod, f["name"], real)
    if [list(x) for x in layout] != [list(x) for x in f["layout"]]:
        raise CheckpointError(f"kernel {f['name']}: parameter layout changed")
    sess.add(P.K_FUNCTION, real, f["ctx"], {"module": f["module"], "name": f["name"], "layout": layout,
                                            "seq": placement_seq(sess)}, ident=f["id"])


def _describe_functions(sess) -> dict:
    return {"functions": [{"id": o.id, "ctx": o.ctx, "module": o.info["module"], "name": o.info["name"],
                           "layout": o.info["layout"], **({"seq": o.info["seq"]} if o.info.get("seq") else {})}
                          for o in sess.of_kind(P.K_FUNCTION)]}


def _rebuild_functions(r) -> None:
    """The kernels not looked up with their modules (images without
    placement numbers)."""
    for f in r.desc["functions"]:
        if (P.K_FUNCTION, f["id"]) not in r.sess.objects:
            _restore_function(r, f)


register(Kind("modules", Stage.MODULES, ("modules",), describe=_describe_modules, rebuild=_rebuild_modules,
              owner=__name__))
register(Kind("functions", Stage.FUNCTIONS, ("functions",), describe=_describe_functions,
              rebuild=_rebuild_functions, owner=__name__))
provide("destroy_context", destroy_context)      # the engine's release after a dump
