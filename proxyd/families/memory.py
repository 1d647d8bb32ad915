"""Device memory (CUDA Driver API, "Memory Management"): cuMemAlloc and
cuMemFree in the session's arena, address ranges, copies and memsets with
their range checks (check_range), and page-locked host memory in the
client's shared segments (cuMemHostAlloc/FreeHost).

Every handler takes (dispatcher, session, fn, ctx, args) with one argument per
spec'd parameter and returns (CUresult, outs), outs being one value per
out_value/out_buffer parameter (None where the client passed NULL).

Locking: called on the worker's main loop (dispatch.py).
"""
from __future__ import annotations

from . import hostmap
from . import ipc
from ..core import protocol as P
from ..core.arena import ARENA_BASE, SLOT_SIZE, ArenaError
from ..core.kinds import CheckpointError, Kind, Stage, register
from ..core.registry import CUDA_SUCCESS, handler, need_ctx, stream_of
from ..core.session import CudaError

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_FOUND = 500


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
    from .frees import claimed
    if claimed(d, sess, fn, ctx, addr, None, "cuMemFree"):
        return CUDA_SUCCESS, []     # a graph allocation freed outside its graph (graph_mem.py), or a
                                    # pointer imported from another process's pool (mempool_ipc.py)
    try:
        sess.arena.free(addr)
    except ArenaError as e:
        raise CudaError(e.code, f"cuMemFree: {e}") from e
    from .mempool import forget_allocation
    forget_allocation(sess, addr)
    return CUDA_SUCCESS, []


@handler("mem_get_address_range")
def h_mem_range(d, sess, fn, ctx, args, **kw):
    asked = int(args[2])
    addr = sess.translate(asked)
    hit = sess.arena.find(addr)
    if hit is None:
        for o in sess.of_kind(P.K_MODULE):
            for base, size in o.info.get("globals", {}).values():
                if base <= addr < base + size:
                    # a variable a restore moved (device_vars.py) answers in
                    # the app's numbers, around the address it asked about:
                    # NVIDIA's runtimes check the address they kept against
                    # this range (cudaMemcpyFromSymbol failed with
                    # cudaErrorInvalidSymbol after a restore otherwise)
                    base += asked - addr
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


# ------------------------------------------------------------ checkpoints
# The arena as a checkpoint object kind (core/kinds.py): its chunks and
# allocations (every device allocation lives there: cuMemAlloc's, pools',
# VMM mappings', graph memory nodes'), mapped again at their addresses
# before the families that allocate in it rebuild. Its contents are the
# engine's "memory" kind (pieces, uploaded at Stage.MEMORY).

def _rebuild_arena(r) -> None:
    arena_desc = dict(r.desc["arena"])
    arena_desc["chunks"] = [[s, n, r.dmap(d), small] for s, n, d, small in r.desc["arena"]["chunks"]]
    r.sess.arena.rebuild(arena_desc)


def _precheck_arena(desc: dict, backend, device_map: dict) -> None:
    """The arena a manifest describes must be the session slot's own
    address range, hold its chunks and allocations, and fit each device's
    memory; one line naming the field otherwise."""
    a = desc["arena"]
    base = ARENA_BASE + desc["slot"] * SLOT_SIZE
    if a["base"] != base or a["size"] != SLOT_SIZE:
        raise CheckpointError(f"image refused: manifest field session.arena: [{a['base']:#x}, +{a['size']:#x}) "
                              f"is not the address slot {desc['slot']} ([{base:#x}, +{SLOT_SIZE:#x}))")
    per_dev: dict[int, int] = {}
    end = base
    for i, (start, size, dev, _small) in enumerate(a["chunks"]):
        if start < end or start + size > base + SLOT_SIZE or size == 0:
            raise CheckpointError(f"image refused: manifest field session.arena.chunks[{i}]: {start:#x}+{size:#x} "
                                  f"overlaps another chunk or lies outside the session's slot")
        end = start + size
        nd = device_map.get(dev, dev)
        per_dev[nd] = per_dev.get(nd, 0) + size
    for nd, total in per_dev.items():
        if total > backend.device_total_mem(nd):
            raise CheckpointError(f"image refused: manifest field session.arena.chunks: {total} bytes on device "
                                  f"{nd}, which has {backend.device_total_mem(nd)}")


register(Kind("arena", Stage.ARENA, ("arena",), describe=lambda sess: {"arena": sess.arena.describe()},
              rebuild=_rebuild_arena, precheck=_precheck_arena, owner=__name__))
