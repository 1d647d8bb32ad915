"""The application's own virtual memory management (CUDA Driver API,
"Virtual Memory Management"): cuMemAddressReserve/Free, cuMemCreate/Release,
cuMemMap/Unmap, cuMemSetAccess/GetAccess, cuMemGetAllocationGranularity,
cuMemGetAllocationPropertiesFromHandle.

Everything is placed in the session's arena (arena.py), so a restore puts
it back at the same addresses: a reservation is a range of the session's
slice; a physical allocation (cuMemCreate) is a proxyd object of kind
mem_handle that records its size, device and properties, and gets its device
memory when it is mapped: the mapping is an arena chunk of its own at the
application's address, which checkpoints store and restore like any memory.

Limits (answered with CUDA_ERROR_NOT_SUPPORTED and a message): a physical
allocation is mapped whole (offset 0, its full size) and once -- no second
mapping of the same memory (aliasing), no mapping again after cuMemUnmap
(the bytes lived in the mapping); exportable handles (IPC) are refused.

Locking: handlers run on the worker's main loop (dispatch.py).
"""
from __future__ import annotations

import struct

from ..core import protocol as P
from ..core.kinds import Kind, Stage, register
from ..core.arena import GRANULARITY, ArenaError
from ..core.registry import CUDA_SUCCESS, handler
from ..core.session import CudaError

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_DEVICE = 101
CUDA_ERROR_NOT_SUPPORTED = 801

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
# CUmemAllocationProp head (cuda.h): type, requestedHandleTypes, location.type, location.id
PROP_HEAD = struct.Struct("<iiii")
PROP_SIZE = 32                      # sizeof(CUmemAllocationProp) on 64-bit Linux
ACCESS_DESC = struct.Struct("<iii")  # CUmemAccessDesc: location.type, location.id, flags


def _arena_call(fn, f, *a):
    try:
        return f(*a)
    except ArenaError as e:
        raise CudaError(e.code, f"{fn.name}: {e}") from e


def _prop(d, fn, raw) -> tuple[bytes, int, int]:
    raw = bytes(raw or b"")
    if len(raw) < PROP_HEAD.size:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: allocation properties of {len(raw)} bytes")
    typ, handle_types, loc_type, loc_id = PROP_HEAD.unpack_from(raw)
    if typ != CU_MEM_ALLOCATION_TYPE_PINNED or loc_type != CU_MEM_LOCATION_TYPE_DEVICE:
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name}: only pinned device memory is supported "
                                                  f"(type {typ}, location type {loc_type})")
    if not 0 <= loc_id < d.backend.device_count():
        raise CudaError(CUDA_ERROR_INVALID_DEVICE, f"{fn.name}: invalid device {loc_id}")
    return raw[:PROP_SIZE].ljust(PROP_SIZE, b"\0"), loc_id, handle_types


@handler("vmm_granularity")
def h_granularity(d, sess, fn, ctx, args, **kw):
    """cuMemGetAllocationGranularity: the arena's mapping granularity, for
    the minimum and the recommended option alike."""
    _prop(d, fn, d.data(sess, args[1]))
    if int(args[2]) not in (0, 1):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: option {int(args[2])}")
    return CUDA_SUCCESS, [GRANULARITY]


@handler("vmm_reserve")
def h_reserve(d, sess, fn, ctx, args, **kw):
    if int(args[4] or 0) != 0:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: flags must be 0")
    start = _arena_call(fn, sess.arena.reserve_range, int(args[1]), int(args[2]), int(args[3] or 0))
    return CUDA_SUCCESS, [start]


@handler("vmm_address_free")
def h_address_free(d, sess, fn, ctx, args, **kw):
    _arena_call(fn, sess.arena.free_range, int(args[0]), int(args[1]))
    return CUDA_SUCCESS, []


@handler("vmm_create")
def h_create(d, sess, fn, ctx, args, **kw):
    size = int(args[1])
    prop, dev, handle_types = _prop(d, fn, d.data(sess, args[2]))
    # A POSIX file descriptor may be requested (PyTorch's expandable segments
    # always ask for one, c10/cuda/CUDACachingAllocator.cpp, for the rare
    # case it shares a segment with another process): the memory is created
    # as usual and only an export (cuMemExportToShareableHandle) is refused.
    # Other handle types (fabric, win32) are refused here, as a GPU without
    # fabric support refuses them; PyTorch then falls back to the fd type.
    if handle_types & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR:
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name}: exportable handles (types {handle_types}) are not "
                                                  f"supported")
    if int(args[3] or 0) != 0:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: flags must be 0")
    if size <= 0 or size % GRANULARITY:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: size {size} is not a multiple of the granularity "
                                                  f"{GRANULARITY}")
    o = sess.add(P.K_MEM_HANDLE, None, 0, {"size": size, "device": dev, "prop": prop, "mapped": None, "used": False})
    return CUDA_SUCCESS, [o.handle]


@handler("vmm_release")
def h_release(d, sess, fn, ctx, args, **kw):
    """The memory of a mapped handle stays until it is unmapped (cuda.h)."""
    sess.remove(P.K_MEM_HANDLE, int(args[0]))
    return CUDA_SUCCESS, []


@handler("vmm_map")
def h_map(d, sess, fn, ctx, args, **kw):
    addr, size, offset = int(args[0]), int(args[1]), int(args[2])
    o = sess.get(P.K_MEM_HANDLE, int(args[3]))
    if int(args[4] or 0) != 0:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: flags must be 0")
    if offset != 0 or size != o.info["size"]:
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name}: only whole physical allocations are mapped by gpuproxy "
                                                  f"(offset {offset}, {size} of {o.info['size']} bytes)")
    if o.info["mapped"] is not None or o.info["used"]:
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name}: a physical allocation is mapped only once under "
                                                  f"gpuproxy (no aliasing, no mapping again after cuMemUnmap)")
    _arena_call(fn, sess.arena.map_in_reservation, addr, size, o.info["device"])
    o.info["mapped"] = addr
    o.info["used"] = True
    sess.vmm_mapped[addr] = o.id
    return CUDA_SUCCESS, []


@handler("vmm_unmap")
def h_unmap(d, sess, fn, ctx, args, **kw):
    """Whole mappings only, one or several side by side: cuMemUnmap takes
    any range made of whole mappings (cuda.h: "the range must be the entire
    contiguous address range that was mapped to"; the driver accepts two
    adjacent cuMemMap's unmapped by one call). Each mapping is one physical
    allocation; all are checked before any is freed."""
    addr, size = int(args[0]), int(args[1])
    end, cur, parts = addr + size, addr, []
    while cur < end:
        a = sess.arena.allocs.get(cur)
        if a is None or not a.chunk.vmm or cur + a.size > end:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {addr:#x}+{size:#x} is not a range of whole "
                                                      f"mappings (at {cur:#x})")
        parts.append(cur)
        cur += a.size
    if not parts:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: empty range at {addr:#x}")
    if ctx is not None:
        d.backend.ctx_sync(ctx.real)      # work still using the range finishes first
    for start in parts:
        _arena_call(fn, sess.arena.free, start, True)
        hid = sess.vmm_mapped.pop(start, None)
        o = sess.objects.get((P.K_MEM_HANDLE, hid)) if hid is not None else None
        if o is not None:
            o.info["mapped"] = None
    return CUDA_SUCCESS, []


def _mapped_range(sess, fn, addr: int, size: int):
    """The mappings covering [addr, addr + size) exactly, without holes."""
    end, out = addr + size, []
    while addr < end:
        c = sess.arena.chunk_at(addr)
        if c is None or not c.vmm:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {addr:#x} is not mapped")
        out.append(c)
        addr = c.end
    return out


@handler("vmm_set_access")
def h_set_access(d, sess, fn, ctx, args, **kw):
    """Each mapping is read-write for its own device from the start (the
    arena maps it so); access for other devices goes to the backend."""
    addr, size, count = int(args[0]), int(args[1]), int(args[3])
    raw = bytes(d.data(sess, args[2]) or b"")
    if count <= 0 or len(raw) < count * ACCESS_DESC.size:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {count} descriptors in {len(raw)} bytes")
    chunks = _mapped_range(sess, fn, addr, size)
    for i in range(count):
        lt, lid, flags = ACCESS_DESC.unpack_from(raw, i * ACCESS_DESC.size)
        if lt != CU_MEM_LOCATION_TYPE_DEVICE or not 0 <= lid < d.backend.device_count() or flags not in (0, 1, 3):
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: descriptor {i} (location {lt}/{lid}, flags {flags})")
        for c in chunks:
            if lid == c.device and flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
                raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name}: gpuproxy keeps a mapping read-write for "
                                                          f"its own device")
            if lid != c.device:
                d.backend.set_access(c.start, c.size, lid, flags)
                _note_access(sess, c.start, lid, flags)
    return CUDA_SUCCESS, []


def _note_access(sess, start: int, dev: int, flags: int):
    """What cuMemGetAccess answers for another device (several GPUs): the
    flags the application set on the mapping's handle."""
    hid = sess.vmm_mapped.get(start)
    o = sess.objects.get((P.K_MEM_HANDLE, hid)) if hid is not None else None
    if o is not None:
        o.info.setdefault("access", {})[dev] = flags


@handler("vmm_get_access")
def h_get_access(d, sess, fn, ctx, args, **kw):
    raw = bytes(d.data(sess, args[1]) or b"")
    if len(raw) < 8:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: location of {len(raw)} bytes")
    lt, lid = struct.unpack_from("<ii", raw)
    c = sess.arena.chunk_at(int(args[2]))
    if c is None or not c.vmm or lt != CU_MEM_LOCATION_TYPE_DEVICE:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {int(args[2]):#x} is not mapped")
    if lid == c.device:
        return CUDA_SUCCESS, [CU_MEM_ACCESS_FLAGS_PROT_READWRITE]
    hid = sess.vmm_mapped.get(c.start)
    o = sess.objects.get((P.K_MEM_HANDLE, hid)) if hid is not None else None
    return CUDA_SUCCESS, [(o.info.get("access") or {}).get(lid, 0) if o is not None else 0]


@handler("vmm_get_prop")
def h_get_prop(d, sess, fn, ctx, args, **kw):
    o = sess.get(P.K_MEM_HANDLE, int(args[1]))
    return CUDA_SUCCESS, [o.info["prop"]]


# ------------------------------------------------------------ checkpoints

def describe(sess) -> list:
    out = []
    for o in sess.of_kind(P.K_MEM_HANDLE):
        e = {"id": o.id, "size": o.info["size"], "device": o.info["device"], "mapped": o.info["mapped"],
             "used": bool(o.info["used"]), "prop": o.info["prop"].hex()}
        if o.info.get("access"):
            e["access"] = [[dev, flags] for dev, flags in sorted(o.info["access"].items())]
        out.append(e)
    return out


def rebuild(sess, handles: list, dmap):
    """Recreates the physical allocation handles (their memory is in the
    arena's chunks, rebuilt before)."""
    for h in handles:
        prop = bytearray(bytes.fromhex(h["prop"]))
        dev = dmap(int(h["device"]))
        struct.pack_into("<i", prop, 12, dev)
        o = sess.add(P.K_MEM_HANDLE, None, 0, {"size": int(h["size"]), "device": dev, "prop": bytes(prop),
                                                "mapped": h.get("mapped"), "used": bool(h.get("used"))},
                     ident=int(h["id"]))
        if h.get("access"):
            # the worker maps memory for every device that reaches it
            # (proxyd/backends/peer.py): what is restored is the answer cuMemGetAccess gives
            o.info["access"] = {dmap(int(dev)): int(flags) for dev, flags in h["access"]}
        if o.info["mapped"] is not None:
            sess.vmm_mapped[int(o.info["mapped"])] = o.id
    # mappings whose handle was released keep no handle: nothing to record


register(Kind("mem_handles", Stage.VMM, ("mem_handles",), describe=lambda sess: {"mem_handles": describe(sess)},
              rebuild=lambda r: rebuild(r.sess, r.desc.get("mem_handles", []), r.dmap), owner=__name__))
