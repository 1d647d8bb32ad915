"""The stream-ordered allocator (cuMemAllocAsync, cuMemFreeAsync,
cuMemAllocFromPoolAsync) and memory pools (CUDA Driver API, "Stream Ordered
Memory Allocator"), on the session's arena.

Every allocation, whatever pool it comes from, is an arena allocation: it
lives at the session's fixed addresses, the image stores it like any other,
and a restore maps it back at the same address. Pools are proxyd objects of
the session (kind mem_pool), not driver pools: a pool is the bookkeeping the
API exposes (its device, attributes, access map, and which live allocations
came from it), which the image records and a restore recreates under the
same handle.

Semantics kept: memory returned by an asynchronous allocation is usable in
stream order (here: at once, which is a valid implementation of "available
when the stream reaches the allocation"); an asynchronous free returns the
range to the arena only after the stream has finished the work enqueued
before it (the worker synchronises that stream first), so no work still
using it can see it handed out again. Pools cache nothing, so
cuMemPoolTrimTo has nothing to release and the reserved figures equal the
used ones.

Locking: handlers run on the worker's main loop (dispatch.py).
"""
from __future__ import annotations

import secrets
import struct

from ..core import protocol as P
from ..core.kinds import Kind, Stage, register
from ..core.arena import ArenaError
from ..core.registry import CUDA_SUCCESS, handler
from ..core.session import CudaError
from .frees import claimed

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_INVALID_DEVICE = 101
CUDA_ERROR_NOT_SUPPORTED = 801

# CUmemPool_attribute (cuda.h); the first three are int, the rest cuuint64_t
ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1
ATTR_REUSE_ALLOW_OPPORTUNISTIC = 2
ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3
ATTR_RELEASE_THRESHOLD = 4
ATTR_RESERVED_MEM_CURRENT = 5
ATTR_RESERVED_MEM_HIGH = 6
ATTR_USED_MEM_CURRENT = 7
ATTR_USED_MEM_HIGH = 8
INT_ATTRS = (1, 2, 3)
# a new pool's values (cuda.h: the reuse policies are on by default, the
# release threshold is 0)
ATTR_DEFAULTS = {1: 1, 2: 1, 3: 1, 4: 0}

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_HANDLE_TYPE_NONE = 0
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
POOL_PROPS = struct.Struct("<iiii")       # allocType, handleTypes, location.type, location.id (CUmemPoolProps head)


def _device_ok(d, dev: int) -> int:
    if not 0 <= dev < d.backend.device_count():
        raise CudaError(CUDA_ERROR_INVALID_DEVICE, f"invalid device ordinal {dev}")
    return dev


def new_pool(sess, device: int, default: bool, ident: int | None = None):
    return sess.add(P.K_MEM_POOL, None, 0, {"device": device, "default": default, "attrs": dict(ATTR_DEFAULTS),
                                             "access": {}, "allocs": {}, "used_high": 0}, ident=ident)


def default_pool(d, sess, device: int):
    """The device's default pool, made on first use (one per device)."""
    _device_ok(d, device)
    for o in sess.of_kind(P.K_MEM_POOL):
        if o.info["device"] == device and o.info["default"]:
            return o
    return new_pool(sess, device, True)


def current_pool(d, sess, device: int):
    pid = sess.mem_pool_current.get(device)
    if pid is not None:
        o = sess.objects.get((P.K_MEM_POOL, pid))
        if o is not None:
            return o
    return default_pool(d, sess, device)


def _pool(sess, handle):
    return sess.get(P.K_MEM_POOL, int(handle or 0))


def _used(pool) -> int:
    return sum(pool.info["allocs"].values())


def _stream(d, sess, fn, handle):
    """The stream argument; in a _ptsz variant NULL is the calling thread's
    per-thread default stream (cuda.h, CU_STREAM_PER_THREAD)."""
    from ..core.registry import stream_of
    if fn.name.endswith("_ptsz") and not handle:
        handle = P.STREAM_PER_THREAD
    return stream_of(d, sess, handle)


def _alloc(d, sess, fn, ctx, size: int, pool, stream_handle):
    from ..core.registry import need_ctx
    ctx = need_ctx(ctx, fn)
    _stream(d, sess, fn, stream_handle)          # an invalid stream is an error, as natively
    if size <= 0:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: size {size}")
    dev = pool.info["device"]
    total = d.backend.device_total_mem(dev)
    if size > total:
        raise CudaError(CUDA_ERROR_OUT_OF_MEMORY, f"{fn.name} of {size} bytes: out of memory (device {dev} "
                                                  f"has {total} bytes)")
    try:
        addr = sess.arena.alloc(size, dev)
    except ArenaError as e:
        raise CudaError(e.code, f"{fn.name} of {size} bytes: {e}") from e
    pool.info["allocs"][addr] = size
    pool.info["used_high"] = max(pool.info["used_high"], _used(pool))
    sess.pool_allocs[addr] = pool.id
    return addr


@handler("mem_alloc_async")
def h_mem_alloc_async(d, sess, fn, ctx, args, **kw):
    """cuMemAllocAsync(dptr, bytesize, hStream): from the current pool of the
    context's device."""
    from ..core.registry import need_ctx
    pool = current_pool(d, sess, need_ctx(ctx, fn).device)
    addr = _alloc(d, sess, fn, ctx, int(args[1]), pool, args[2])
    return CUDA_SUCCESS, [addr if args[0] else None]


@handler("mem_alloc_from_pool_async")
def h_mem_alloc_from_pool_async(d, sess, fn, ctx, args, **kw):
    """cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream)."""
    addr = _alloc(d, sess, fn, ctx, int(args[1]), _pool(sess, args[2]), args[3])
    return CUDA_SUCCESS, [addr if args[0] else None]


@handler("mem_free_async")
def h_mem_free_async(d, sess, fn, ctx, args, **kw):
    """cuMemFreeAsync(dptr, hStream): any arena allocation (cudaMalloc's too,
    as natively). The stream is synchronised first: work before the free may
    still use the range."""
    addr = sess.translate(int(args[0] or 0))
    stream = _stream(d, sess, fn, args[1])
    if addr == 0:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: NULL pointer")
    if claimed(d, sess, fn, ctx, addr, stream):
        return CUDA_SUCCESS, []     # a graph allocation freed after its graph ran (graph_mem.py), or a
                                    # pointer imported from another process's pool (mempool_ipc.py)
    if addr not in sess.arena.allocs:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {addr:#x} is not the start of an allocation")
    d.backend.stream_sync(stream)
    try:
        sess.arena.free(addr)
    except ArenaError as e:
        raise CudaError(e.code, f"{fn.name}: {e}") from e
    pid = sess.pool_allocs.pop(addr, None)
    o = sess.objects.get((P.K_MEM_POOL, pid)) if pid is not None else None
    if o is not None:
        o.info["allocs"].pop(addr, None)
    return CUDA_SUCCESS, []


def forget_allocation(sess, addr: int):
    """A pool allocation freed by cuMemFree (allowed: it is device memory)."""
    pid = sess.pool_allocs.pop(addr, None)
    o = sess.objects.get((P.K_MEM_POOL, pid)) if pid is not None else None
    if o is not None:
        o.info["allocs"].pop(addr, None)


@handler("mem_pool_create")
def h_mem_pool_create(d, sess, fn, ctx, args, **kw):
    props = bytes(d.data(sess, args[1]) or b"")
    if len(props) < POOL_PROPS.size:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: pool properties of {len(props)} bytes")
    alloc_type, handle_types, loc_type, loc_id = POOL_PROPS.unpack_from(props)
    if alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED or loc_type != CU_MEM_LOCATION_TYPE_DEVICE:
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED,
                        f"{fn.name}: only device-located pinned pools are supported (allocType {alloc_type}, "
                        f"location type {loc_type})")
    if handle_types not in (CU_MEM_HANDLE_TYPE_NONE, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR):
        # Win32 handles have no meaning here; fabric handles need an IMEX channel (multi-node)
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name}: exportable pools of handle types {handle_types} "
                                                  f"are not supported (POSIX file descriptors are)")
    _device_ok(d, loc_id)
    o = new_pool(sess, loc_id, False)
    if handle_types:
        set_exportable(o, handle_types)
    return CUDA_SUCCESS, [o.handle]


def set_exportable(o, handle_types: int) -> None:
    """An exportable pool (proxyd/families/mempool_ipc.py): its handle types and the
    tag that ties pointer exports to the pool."""
    o.info["handle_types"] = handle_types
    o.info["ipc_tag"] = new_tag()


def new_tag() -> str:
    """The tag that ties an exportable pool's pointer exports to it (mempool_ipc.py)."""
    return secrets.token_bytes(8).hex()


@handler("mem_pool_destroy")
def h_mem_pool_destroy(d, sess, fn, ctx, args, **kw):
    """Allocations still live stay valid (cuda.h: the pool's resources go
    once no allocation is outstanding); the device's current pool falls back
    to its default pool."""
    o = _pool(sess, args[0])
    if o.info["default"]:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: a device's default pool cannot be destroyed")
    for dev, pid in list(sess.mem_pool_current.items()):
        if pid == o.id:
            del sess.mem_pool_current[dev]
    sess.drop(o)
    return CUDA_SUCCESS, []


@handler("mem_pool_trim_to")
def h_mem_pool_trim_to(d, sess, fn, ctx, args, **kw):
    _pool(sess, args[0])        # nothing cached: nothing to release
    return CUDA_SUCCESS, []


@handler("mem_pool_set_attribute")
def h_mem_pool_set_attribute(d, sess, fn, ctx, args, **kw):
    """[pool, attr, value]: the shim sends the value as an integer."""
    o, attr, value = _pool(sess, args[0]), int(args[1]), args[2]
    if type(value) is not int:
        value = int.from_bytes(bytes(d.data(sess, value) or b"")[:8], "little")
    if attr in INT_ATTRS or attr == ATTR_RELEASE_THRESHOLD:
        o.info["attrs"][attr] = value
    elif attr in (ATTR_RESERVED_MEM_HIGH, ATTR_USED_MEM_HIGH):
        if value != 0:     # cuda.h: "It is illegal to set this attribute to a non-zero value"
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: attribute {attr} can only be reset to 0")
        o.info["used_high"] = _used(o)
    else:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: attribute {attr} cannot be set")
    return CUDA_SUCCESS, []


@handler("mem_pool_get_attribute")
def h_mem_pool_get_attribute(d, sess, fn, ctx, args, **kw):
    o, attr = _pool(sess, args[0]), int(args[1])
    if attr in INT_ATTRS or attr == ATTR_RELEASE_THRESHOLD:
        v = o.info["attrs"].get(attr, ATTR_DEFAULTS[attr])
    elif attr in (ATTR_RESERVED_MEM_CURRENT, ATTR_USED_MEM_CURRENT):
        v = _used(o)
    elif attr in (ATTR_RESERVED_MEM_HIGH, ATTR_USED_MEM_HIGH):
        v = o.info["used_high"]
    else:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: unknown attribute {attr}")
    return CUDA_SUCCESS, [v]


ACCESS_DESC = struct.Struct("<iii")      # CUmemAccessDesc: location.type, location.id, flags


@handler("mem_pool_set_access")
def h_mem_pool_set_access(d, sess, fn, ctx, args, **kw):
    o, count = _pool(sess, args[0]), int(args[2])
    raw = bytes(d.data(sess, args[1]) or b"")
    if count < 0 or len(raw) < count * ACCESS_DESC.size:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {count} descriptors in {len(raw)} bytes")
    new = {}
    for i in range(count):
        lt, lid, flags = ACCESS_DESC.unpack_from(raw, i * ACCESS_DESC.size)
        if lt != CU_MEM_LOCATION_TYPE_DEVICE or flags not in (0, 1, 3):
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: descriptor {i} (location type {lt}, flags {flags})")
        _device_ok(d, lid)
        if lid == o.info["device"] and flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
            # the pool's own device always has read-write access (cuda.h)
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the pool's own device must keep read-write access")
        new[lid] = flags
    o.info["access"].update(new)
    return CUDA_SUCCESS, []


@handler("mem_pool_get_access")
def h_mem_pool_get_access(d, sess, fn, ctx, args, **kw):
    o = _pool(sess, args[1])
    raw = bytes(d.data(sess, args[2]) or b"")
    if len(raw) < 8:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: location of {len(raw)} bytes")
    lt, lid = struct.unpack_from("<ii", raw)
    if lt != CU_MEM_LOCATION_TYPE_DEVICE:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: location type {lt}")
    _device_ok(d, lid)
    flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE if lid == o.info["device"] else o.info["access"].get(lid, 0)
    return CUDA_SUCCESS, [flags]


@handler("device_get_default_mem_pool")
def h_device_get_default_mem_pool(d, sess, fn, ctx, args, **kw):
    return CUDA_SUCCESS, [default_pool(d, sess, int(args[1])).handle]


@handler("device_get_mem_pool")
def h_device_get_mem_pool(d, sess, fn, ctx, args, **kw):
    return CUDA_SUCCESS, [current_pool(d, sess, _device_ok(d, int(args[1]))).handle]


@handler("device_set_mem_pool")
def h_device_set_mem_pool(d, sess, fn, ctx, args, **kw):
    dev, o = _device_ok(d, int(args[0])), _pool(sess, args[1])
    if o.info["device"] != dev:
        raise CudaError(CUDA_ERROR_INVALID_DEVICE, f"{fn.name}: pool of device {o.info['device']} for device {dev}")
    sess.mem_pool_current[dev] = o.id
    return CUDA_SUCCESS, []


# ------------------------------------------------------------ checkpoints

def describe(sess) -> tuple[list, dict]:
    """The pools and the devices' current pools, for the image."""
    pools = [{"id": o.id, "device": o.info["device"], "default": bool(o.info["default"]),
              "attrs": {str(k): int(v) for k, v in o.info["attrs"].items()},
              "access": {str(k): int(v) for k, v in o.info["access"].items()},
              "allocs": [[a, n] for a, n in sorted(o.info["allocs"].items())],
              "used_high": int(o.info["used_high"]),
              **({"handle_types": int(o.info["handle_types"])} if o.info.get("handle_types") else {})}
             for o in sess.of_kind(P.K_MEM_POOL)]
    return pools, {str(k): int(v) for k, v in sess.mem_pool_current.items()}


def rebuild(sess, pools: list, current: dict, dmap):
    """Recreates the pools under their ids (after the arena: their
    allocations are arena allocations, back at their addresses)."""
    for p in pools:
        o = new_pool(sess, dmap(int(p["device"])), bool(p["default"]), ident=int(p["id"]))
        o.info["attrs"].update({int(k): int(v) for k, v in p.get("attrs", {}).items()})
        o.info["access"].update({dmap(int(k)): int(v) for k, v in p.get("access", {}).items()})
        for a, n in p.get("allocs", []):
            if int(a) in sess.arena.allocs:
                o.info["allocs"][int(a)] = int(n)
                sess.pool_allocs[int(a)] = o.id
        o.info["used_high"] = int(p.get("used_high", 0))
        if p.get("handle_types"):
            set_exportable(o, int(p["handle_types"]))
    sess.mem_pool_current = {dmap(int(k)): int(v) for k, v in current.items()}


register(Kind("mem_pools", Stage.POOLS, ("mem_pools", "mem_pool_current"),
              describe=lambda sess: dict(zip(("mem_pools", "mem_pool_current"), describe(sess))),
              rebuild=lambda r: rebuild(r.sess, r.desc.get("mem_pools", []), r.desc.get("mem_pool_current", {}),
                                        r.dmap),
              owner=__name__))
