"""The application's device numbers after a restore onto other GPUs
(issue 22; docs/multigpu.md, "Checkpoints").

A restore with a device map (`--device-map OLD=NEW`) puts the session's
contexts and memory on other physical devices, but the application keeps
its own numbering: the shim answers cudaGetDevice, cuCtxGetDevice and
pointer attributes from its own records, and every later call that names a
device (cuDevicePrimaryCtxRetain for a device first used after the
restore, cuCtxCreate, cuDeviceGetAttribute, cuDeviceCanAccessPeer, ...)
must reach the device that now stands for that number. `sess.dev_map`
(application ordinal -> physical ordinal; empty: the same) does that: the
dispatcher translates every argument the specs declare a device handle
(kind `device`) before the call runs (physical_args), and the map goes
into the image (`dev_map`) so that a second restore composes with it.

The map given to a restore is completed to a permutation of the
machine's devices: a device the map does not name goes to the first
device no named one went to (a job on 0 and 1 restored onto 2 and 3 finds
its never-used numbers 2 and 3 on 0 and 1), so two application devices
never share a physical one.

Device numbers inside structures: a CUmemLocation of type
CU_MEM_LOCATION_TYPE_DEVICE (cuda.h) names a device by its ordinal. Every
structure that carries one is described once, by its C type, in LOCATED
(its size and the offsets of its locations, checked against cuda.h by
tests/test_devnum_structs.py); which calls carry such a structure is the
specs' business: every parameter whose declared type is one of them --
cuMemCreate's and cuMemGetAllocationGranularity's CUmemAllocationProp,
cuMemSetAccess's and cuMemPoolSetAccess's CUmemAccessDesc arrays,
cuMemGetAccess's and cuMemPoolGetAccess's CUmemLocation, cuMemPoolCreate's
CUmemPoolProps (the runtime's cudaMem* forms reach the worker as these) --
is translated on the way in (an array element by element), and one the
worker answers (cuMemGetAllocationPropertiesFromHandle) on the way back
(app_outs). Locations of other types (host, host NUMA) are left alone.
cuMemAdvise_v2 / cuMemPrefetchAsync_v2 take a location too, but are
answered in the shim (managed memory never migrates under gpuproxy: spec
`shim: local`), so nothing reaches the worker. The one structure the shim
sends in a form of its own, CUDA_MEM_ALLOC_NODE_PARAMS (graph_mem.py: a
list, not the C bytes), is translated there with physical()/app_device().
Objects made before the dump are rebuilt on their mapped device by their
own kinds (vmm.py, mempool.py, graph_mem.py: `r.dmap`).

Locking: read and written on the worker's main loop (and by a restore,
which builds a detached session).
"""
from __future__ import annotations

import struct

from ..core import protocol as P
from ..core.kinds import Kind, Stage, register
from ..core.shm import ShmError

_DEVICE_ARGS: dict[int, tuple[int, ...]] = {}

CU_MEM_LOCATION_TYPE_DEVICE = 1
_LOC = struct.Struct("<ii")          # CUmemLocation: type, id (cuda.h)
# C type -> (sizeof, offsets of the CUmemLocation members) on 64-bit Linux
# (cuda.h; the runtime's cudaMemLocation, cudaMemAccessDesc and
# cudaMemPoolProps have the same layout, and reach the worker as these)
LOCATED: dict[str, tuple[int, tuple[int, ...]]] = {
    "CUmemLocation": (8, (0,)),
    "CUmemAccessDesc": (12, (0,)),
    "CUmemAllocationProp": (32, (8,)),
    "CUmemPoolProps": (88, (8,)),
}
_STRUCT_ARGS: dict[int, tuple] = {}
_STRUCT_OUTS: dict[int, tuple] = {}


def base_type(ctype: str) -> str:
    """'const struct CUmemAccessDesc *' -> 'CUmemAccessDesc'."""
    t = ctype.replace("*", " ").split()
    return " ".join(w for w in t if w not in ("const", "struct", "volatile"))


def _struct_params(fn, out: bool) -> tuple:
    """(index, size, offsets) of each parameter of fn that carries device
    locations, going in (in_buffer, struct by value) or coming back
    (out_value), by the type the spec declares."""
    cache = _STRUCT_OUTS if out else _STRUCT_ARGS
    idx = cache.get(id(fn))
    if idx is None:
        roles = ("out_value", "inout_value") if out else ("in_buffer", "scalar", "inout_value")
        idx = cache[id(fn)] = tuple((i, *LOCATED[base_type(p[3])]) for i, p in enumerate(fn.params)
                                    if p[1] in roles and isinstance(p[3], str) and base_type(p[3]) in LOCATED)
    return idx


def _remap(raw, size: int, offsets: tuple, m) -> bytes | None:
    """raw with every device location's id passed through m; None when
    nothing changes."""
    b = bytearray(raw)
    changed = False
    for base in range(0, len(b) - size + 1, size):
        for off in offsets:
            t, dev = _LOC.unpack_from(b, base + off)
            if t == CU_MEM_LOCATION_TYPE_DEVICE:
                new = m(dev)
                if new != dev:
                    _LOC.pack_into(b, base + off, t, new)
                    changed = True
    return bytes(b) if changed else None


def physical(sess, dev: int) -> int:
    """The physical device of the application's ordinal dev."""
    return sess.dev_map.get(dev, dev) if sess.dev_map else dev


def _indices(fn) -> tuple[int, ...]:
    idx = _DEVICE_ARGS.get(id(fn))
    if idx is None:
        idx = _DEVICE_ARGS[id(fn)] = tuple(i for i, p in enumerate(fn.params)
                                           if p[1] == "handle" and p[2] == "device")
    return idx


def physical_args(sess, fn, args: list) -> list:
    """args with every device handle in the application's numbering
    replaced by its physical device."""
    idx = _indices(fn)
    sidx = _struct_params(fn, False)
    if not idx and not sidx:
        return args
    out = list(args)
    m = sess.dev_map
    for i in idx:
        if i < len(out) and type(out[i]) is int:
            out[i] = m.get(out[i], out[i])
    for i, size, offsets in sidx:
        if i < len(out) and out[i] is not None:
            v = out[i]
            if isinstance(v, P.ShmRef):      # read here, handed on as bytes (dispatch.data takes both)
                try:
                    v = sess.shm.view(v.seg, v.offset, v.length)
                except ShmError:
                    continue                 # the handler's dispatch.data answers it
            if isinstance(v, (bytes, bytearray, memoryview)):
                new = _remap(v, size, offsets, lambda d: m.get(d, d))
                if new is not None:
                    out[i] = new
    return out


def app_outs(sess, fn, outs):
    """outs with the device locations of the structures the worker answers
    in the application's numbering."""
    sidx = _struct_params(fn, True)
    if not sidx or not outs:
        return outs
    outs = list(outs)
    # outs follow the out parameters in order
    pos = {i: k for k, i in enumerate(i for i, p in enumerate(fn.params) if p[1] in ("out_value", "inout_value"))}
    for i, size, offsets in sidx:
        k = pos.get(i)
        if k is not None and k < len(outs) and isinstance(outs[k], (bytes, bytearray, memoryview)):
            new = _remap(outs[k], size, offsets, lambda d: app_device(sess, d))
            if new is not None:
                outs[k] = new
    return outs


def app_device(sess, phys: int) -> int:
    """The application's number of a physical device."""
    for a, p in sess.dev_map.items():
        if p == phys:
            return a
    return phys


def complete(device_map: dict, count: int) -> dict[int, int]:
    """device_map (old physical -> new physical) as a permutation of
    range(count) (module docstring)."""
    m = {int(k): int(v) for k, v in (device_map or {}).items()}
    free = [d for d in range(count) if d not in m.values()]
    for d in range(count):
        if d not in m:
            m[d] = free.pop(0) if free else d
    return m


def compose(old: dict, device_map: dict, count: int) -> dict[int, int]:
    """The application's map after a restore: its map at the dump (app ->
    old physical), then the restore's (old physical -> new physical)."""
    perm = complete(device_map, count)
    apps = set(range(count)) | set(old)
    new = {a: perm.get(old.get(a, a), old.get(a, a)) for a in apps}
    return {a: p for a, p in new.items() if a != p}


def _describe(sess) -> dict:
    m = getattr(sess, "dev_map", None)
    return {"dev_map": {str(a): p for a, p in m.items()}} if m else {}


def _rebuild(r) -> None:
    old = {int(k): int(v) for k, v in (r.desc.get("dev_map") or {}).items()}
    r.sess.dev_map = compose(old, r.device_map, r.backend.device_count()) if (old or r.device_map) else {}


register(Kind("device_numbers", Stage.CONTEXTS, ("dev_map",), describe=_describe, rebuild=_rebuild, owner=__name__))
