"""CUDA arrays, texture objects and surface objects (CUDA Driver API,
"Memory Management" cuArray*, "Texture Object Management", "Surface Object
Management"), for the session's worker.

Arrays are session objects (kind array) behind proxyd handles, as streams
are: the application only names them in API calls. Their descriptors are
recorded, and a dump stores their contents as chunks of the image (flagged
FLAG_GLOBAL | FLAG_ARRAY, keyed by array id and offset: array memory is
opaque, so it is not in the arena); a restore creates them again under the
same handles and uploads the contents.

Mipmapped arrays (cuMipmappedArrayCreate) are session objects of their own
kind; cuMipmappedArrayGetLevel gives a level as an array object (the same
handle on every call) whose backend array belongs to the mipmapped array:
copies, texture and surface objects use it like any array, cuArrayDestroy
refuses it, and it goes with its mipmapped array. A dump stores the
contents of the levels the application fetched (a level never fetched was
never written: its contents are undefined natively too); a restore creates
the mipmapped array, fetches those levels under their old handles and
uploads them.

Texture and surface objects are 64-bit values that kernels receive as plain
kernel arguments, and an application may keep them in its own memory
(host or device). They cannot be translated at launch, so the worker gives
the application the driver's own value, and a restore must make the driver
hand out the same values again. The driver numbers these objects per
context (an index into the context's descriptor tables): in a fresh context,
creating objects in the same order yields the same values, and a value that
was freed comes back. A restore therefore recreates them in ascending value
order, and where the driver hands out a smaller value than the one recorded
(a gap left by an object destroyed before the dump) it keeps creating
placeholder objects until the recorded value comes back, then destroys the
placeholders. A value that cannot be reproduced fails the restore with the
object named (never a silently different value).

Locking: handlers run on the worker's main loop (dispatch.py); describe()
and the checkpoint helpers run while the session is frozen.
"""
from __future__ import annotations

import struct

from ..core import protocol as P
from ..core.kinds import CheckpointError, Kind, Stage, register
from ..core.registry import CUDA_SUCCESS, handler
from ..core.cuda_structs import (  # noqa: F401  (the family's own names for them)
    ARRAY3D_DESC, ARRAY_DESC, FORMATS, MEMCPY3D, MEMCPY3D_SIDE, MT_ARRAY, MT_DEVICE, MT_HOST, MT_UNIFIED,
    RES_ARRAY, RES_DESC_SIZE, RES_LINEAR, RES_MIPMAPPED, RES_PITCH2D, TEX_DESC_SIZE, VIEW_DESC_SIZE)
from ..core.session import CudaError

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_ERROR_INVALID_HANDLE = 400

# chunk keys of array contents in an image: the top byte marks them, then
# the array id and the offset of the piece
ARRAY_KEY = 0xA5 << 56
ARRAY_PIECE = 1 << 26          # bytes per chunk (chunk lengths are u32 in chunks.idx)
FLAG_ARRAY = 1 << 16           # in FLAG_USER_MASK (image.py)
# placeholders a restore may create to reach a recorded object value
MAX_FILLERS = 4096


class ArrayInfo:
    """An array's shape (cuda.h, CUDA_ARRAY3D_DESCRIPTOR: Height 0 is a 1D
    array, Depth 0 a 1D or 2D one)."""

    def __init__(self, width: int, height: int, depth: int, fmt: int, channels: int, flags: int):
        if fmt not in FORMATS:
            raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"CUDA array format {fmt:#x} is not supported by gpuproxy "
                                                      f"(only the 8/16/32-bit integer, half and float formats)")
        if channels not in (1, 2, 4) or width <= 0 or height < 0 or depth < 0:
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"CUDA array {width}x{height}x{depth} with {channels} channels")
        self.width, self.height, self.depth = width, height, depth
        self.format, self.channels, self.flags = fmt, channels, flags

    @property
    def elem(self) -> int:
        return FORMATS[self.format][1] * self.channels

    @property
    def row_bytes(self) -> int:
        return self.width * self.elem

    @property
    def rows(self) -> int:
        return max(self.height, 1)

    @property
    def slices(self) -> int:
        return max(self.depth, 1)

    @property
    def nbytes(self) -> int:
        return self.row_bytes * self.rows * self.slices

    def desc3d(self) -> bytes:
        return ARRAY3D_DESC.pack(self.width, self.height, self.depth, self.format, self.channels, self.flags)

    def as_dict(self) -> dict:
        return {"width": self.width, "height": self.height, "depth": self.depth, "format": self.format,
                "channels": self.channels, "flags": self.flags}

    @classmethod
    def from_dict(cls, d: dict) -> "ArrayInfo":
        return cls(d["width"], d["height"], d["depth"], d["format"], d["channels"], d["flags"])

    def level(self, n: int) -> "ArrayInfo":
        """Shape of mipmap level n (CUDA Programming Guide, "Texture Memory":
        each level halves every dimension, down to 1; a 0 height or depth
        stays 0)."""
        def half(v):
            return max(v >> n, 1) if v else 0
        return ArrayInfo(max(self.width >> n, 1), half(self.height), half(self.depth), self.format,
                         self.channels, self.flags)

    def max_levels(self) -> int:
        return max(self.width, self.height, self.depth).bit_length()


def _bytes(d, sess, v, n: int, what: str) -> bytes:
    data = d.data(sess, v)
    if data is None:
        data = b""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: a descriptor must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < n:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: {len(data)} bytes, expected {n}")
    return data[:n]


def array_of(sess, handle) -> tuple:
    o = sess.get(P.K_ARRAY, int(handle or 0))
    return o, o.info["shape"]


def _create(d, sess, fn, ctx, info: ArrayInfo, ident: int | None = None):
    from ..core.registry import need_ctx
    ctx = need_ctx(ctx, fn)
    real = d.backend.array_create(info)
    return sess.add(P.K_ARRAY, real, ctx.id, {"shape": info}, ident=ident)


@handler("array_create")
def h_array_create(d, sess, fn, ctx, args, **kw):
    """cuArrayCreate_v2 / cuArray3DCreate_v2 (pHandle, pAllocateArray)."""
    if fn.name.startswith("cuArray3D"):
        w, h, dep, fmt, ch, flags = ARRAY3D_DESC.unpack(_bytes(d, sess, args[1], ARRAY3D_DESC.size, fn.name))
    else:
        w, h, fmt, ch = ARRAY_DESC.unpack(_bytes(d, sess, args[1], ARRAY_DESC.size, fn.name))
        dep, flags = 0, 0
        if h == 0 and fn.name.startswith("cuArrayCreate"):
            pass        # cuda.h: Height 0 makes a 1D array
    o = _create(d, sess, fn, ctx, ArrayInfo(w, h, dep, fmt, ch, flags))
    return CUDA_SUCCESS, [o.handle if args[0] else None]


def _drop_objects_of(d, sess, res_type: int, handle: int):
    for key, t in list(sess.tex_objects.items()):
        if t["res"][0] == res_type and t["res"][1] == handle:
            # An object still reading the array (programs free the array
            # first at cleanup). Using it afterwards reads freed memory,
            # which cuda.h leaves undefined; proxyd destroys it with the
            # array, since a restore could not recreate it, and accepts the
            # application's later destroy of its value (tex_gone).
            (d.backend.tex_destroy if key[0] == "t" else d.backend.surf_destroy)(key[1])
            del sess.tex_objects[key]
            sess.tex_gone.add(key)


@handler("array_destroy")
def h_array_destroy(d, sess, fn, ctx, args, **kw):
    o, _ = array_of(sess, args[0])
    if "level_of" in o.info:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the array is a level of a mipmapped array "
                                                  f"(cuMipmappedArrayDestroy frees it)")
    _drop_objects_of(d, sess, RES_ARRAY, o.handle)
    d.backend.array_destroy(o.real)
    sess.drop(o)
    return CUDA_SUCCESS, []


# ----------------------------------------------------------- mipmapped arrays

def mipmap_of(sess, handle):
    return sess.get(P.K_MIPMAPPED_ARRAY, int(handle or 0))


def _mipmap_create(d, sess, fn, ctx, info: ArrayInfo, levels: int, ident: int | None = None):
    from ..core.registry import need_ctx
    ctx = need_ctx(ctx, fn)
    if info.flags:
        # layered, cubemap, surface and gather flags of mipmapped arrays are not modelled
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name}: mipmapped arrays with flags {info.flags:#x} are "
                                                  f"not supported")
    if not 1 <= levels <= info.max_levels():
        # cuda.h: numMipmapLevels is at most 1 + floor(log2(max(width, height, depth)))
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {levels} levels for a "
                                                  f"{info.width}x{info.height}x{info.depth} array")
    real = d.backend.mipmap_create(info, levels)
    return sess.add(P.K_MIPMAPPED_ARRAY, real, ctx.id, {"shape": info, "levels": levels, "level_arrays": {}},
                    ident=ident)


@handler("mipmap_create")
def h_mipmap_create(d, sess, fn, ctx, args, **kw):
    """cuMipmappedArrayCreate(pHandle, pMipmappedArrayDesc, numMipmapLevels)."""
    w, h, dep, fmt, ch, flags = ARRAY3D_DESC.unpack(_bytes(d, sess, args[1], ARRAY3D_DESC.size, fn.name))
    o = _mipmap_create(d, sess, fn, ctx, ArrayInfo(w, h, dep, fmt, ch, flags), int(args[2]))
    return CUDA_SUCCESS, [o.handle if args[0] else None]


def _level(d, sess, m, level: int, ident: int | None = None):
    """The array object of level `level` of mipmapped array m (made once)."""
    aid = m.info["level_arrays"].get(level)
    if aid is not None:
        return sess.objects[(P.K_ARRAY, aid)]
    info = m.info["shape"].level(level)
    real = d.backend.mipmap_level(m.real, level, info)
    o = sess.add(P.K_ARRAY, real, m.ctx, {"shape": info, "level_of": (m.id, level)}, ident=ident)
    m.info["level_arrays"][level] = o.id
    return o


@handler("mipmap_get_level")
def h_mipmap_get_level(d, sess, fn, ctx, args, **kw):
    """cuMipmappedArrayGetLevel(pLevelArray, hMipmappedArray, level)."""
    m, level = mipmap_of(sess, args[1]), int(args[2])
    if not 0 <= level < m.info["levels"]:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: level {level} of {m.info['levels']}")
    o = _level(d, sess, m, level)
    return CUDA_SUCCESS, [o.handle if args[0] else None]


@handler("mipmap_destroy")
def h_mipmap_destroy(d, sess, fn, ctx, args, **kw):
    """cuMipmappedArrayDestroy: its levels and the objects that read them go too."""
    m = mipmap_of(sess, args[0])
    _drop_objects_of(d, sess, RES_MIPMAPPED, m.handle)
    for aid in m.info["level_arrays"].values():
        lo = sess.objects.get((P.K_ARRAY, aid))
        if lo is not None:
            _drop_objects_of(d, sess, RES_ARRAY, lo.handle)
            sess.drop(lo)
    d.backend.mipmap_destroy(m.real)
    sess.drop(m)
    return CUDA_SUCCESS, []


@handler("array_get_descriptor")
def h_array_get_descriptor(d, sess, fn, ctx, args, **kw):
    """cuArrayGetDescriptor_v2 / cuArray3DGetDescriptor_v2 (out, hArray)."""
    _, s = array_of(sess, args[1])
    if fn.name.startswith("cuArray3D"):
        out = s.desc3d()
    else:
        if s.depth:
            # cuda.h: cuArrayGetDescriptor on a 3D array fails
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: a 3D array (use cuArray3DGetDescriptor)")
        out = ARRAY_DESC.pack(s.width, s.height, s.format, s.channels)
    return CUDA_SUCCESS, [out if args[0] else None]


# ------------------------------------------------------------------ copies

def _side(sess, fields, who: str) -> dict:
    x, y, z, lod, mt, host, dev, arr, _res, pitch, height = fields
    if lod:
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{who}: mipmap levels (LOD {lod}) are not supported")
    if mt == MT_ARRAY:
        o, s = array_of(sess, arr)
        return {"type": "array", "real": o.real, "shape": s, "x": x, "y": y, "z": z}
    if mt in (MT_DEVICE, MT_UNIFIED):
        return {"type": "device", "addr": sess.translate(int(dev)), "x": x, "y": y, "z": z, "pitch": pitch,
                "height": height}
    # host memory never reaches proxyd in this op: the shim stages it
    # through device memory (interceptor/arrays.c)
    raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{who}: memory type {mt} (host sides are staged by the shim)")


def check_region(side: dict, w: int, h: int, dep: int, who: str):
    if side["type"] == "array":
        s = side["shape"]
        if side["x"] % s.elem or w % s.elem:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{who}: offset or width not a multiple of the array's "
                                                      f"{s.elem}-byte elements")
        if side["x"] + w > s.row_bytes or side["y"] + h > s.rows or side["z"] + dep > s.slices:
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"{who}: region {w}x{h}x{dep} at ({side['x']}, {side['y']}, {side['z']}) lies outside "
                            f"the {s.row_bytes}x{s.rows}x{s.slices}-byte array")
    else:
        if not side["pitch"]:
            side["pitch"] = w
        if not side["height"]:
            side["height"] = h
        if side["pitch"] < w or side["height"] < h:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{who}: pitch or height smaller than the copy")


def parse_copy(sess, data: bytes, who: str):
    v = MEMCPY3D.unpack(data[:MEMCPY3D.size])
    src, dst = _side(sess, v[0:11], who), _side(sess, v[11:22], who)
    w, h, dep = v[22], max(v[23], 1), max(v[24], 1)
    check_region(src, w, h, dep, who)
    check_region(dst, w, h, dep, who)
    return src, dst, (w, h, dep)


@handler("memcpy_3d")
def h_memcpy_3d(d, sess, fn, ctx, args, **kw):
    """cuMemcpy3D_v2 / cuMemcpy3DAsync_v2 (and their per-thread twins) with a
    CUDA array on at least one side: the shim sends the descriptor with
    array handles and device addresses (host sides staged). Linear-only
    copies never come here (interceptor/copy2d.c)."""
    from ..core.registry import need_ctx
    need_ctx(ctx, fn)
    if not args[0]:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: NULL descriptor")
    src, dst, extent = parse_copy(sess, _bytes(d, sess, args[0], MEMCPY3D.size, fn.name), fn.name)
    stream = None
    if len(args) > 1:
        from .mempool import _stream
        stream = _stream(d, sess, fn, args[1])
    d.backend.array_copy(src, dst, extent, stream)
    return CUDA_SUCCESS, []


# ------------------------------------------------------- texture / surface

def _res(d, sess, raw: bytes, who: str) -> tuple[tuple, dict]:
    """A CUDA_RESOURCE_DESC as the app gave it (array handles are proxyd's):
    (recorded form, form for the backend)."""
    rtype, = struct.unpack_from("<I", raw, 0)
    flags, = struct.unpack_from("<I", raw, 136)
    if rtype == RES_ARRAY:
        h, = struct.unpack_from("<Q", raw, 8)
        o, s = array_of(sess, h)
        return (RES_ARRAY, o.handle), {"type": RES_ARRAY, "real": o.real, "shape": s, "flags": flags}
    if rtype == RES_LINEAR:
        dev, fmt, ch, size = struct.unpack_from("<QIIQ", raw, 8)
        if fmt not in FORMATS:
            raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{who}: format {fmt:#x} is not supported")
        return (RES_LINEAR, dev, fmt, ch, size), {"type": RES_LINEAR, "addr": sess.translate(dev), "format": fmt,
                                                  "channels": ch, "size": size, "flags": flags}
    if rtype == RES_PITCH2D:
        dev, fmt, ch, w, h, pitch = struct.unpack_from("<QIIQQQ", raw, 8)
        if fmt not in FORMATS:
            raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{who}: format {fmt:#x} is not supported")
        return (RES_PITCH2D, dev, fmt, ch, w, h, pitch), {"type": RES_PITCH2D, "addr": sess.translate(dev),
                                                           "format": fmt, "channels": ch, "width": w, "height": h,
                                                           "pitch": pitch, "flags": flags}
    if rtype == RES_MIPMAPPED:
        h, = struct.unpack_from("<Q", raw, 8)
        m = mipmap_of(sess, h)
        return (RES_MIPMAPPED, m.handle), {"type": RES_MIPMAPPED, "real": m.real, "shape": m.info["shape"],
                                            "levels": m.info["levels"], "flags": flags}
    raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{who}: resource type {rtype} is not supported")


def _create_obj(d, sess, ctx, kind: str, raw_res: bytes, tex: bytes | None, view: bytes | None, who: str,
                want: int | None = None) -> int:
    rec, res = _res(d, sess, raw_res, who)
    b = d.backend
    value = b.tex_create(res, tex, view) if kind == "t" else b.surf_create(res)
    if want is not None and value != want:
        fillers = []
        try:
            while value != want and value < want and len(fillers) < MAX_FILLERS:
                fillers.append(value)
                value = b.tex_create(res, tex, view) if kind == "t" else b.surf_create(res)
        finally:
            for v in fillers:
                b.tex_destroy(v) if kind == "t" else b.surf_destroy(v)
        if value != want:
            b.tex_destroy(value) if kind == "t" else b.surf_destroy(value)
            raise CudaError(CUDA_ERROR_INVALID_VALUE,
                            f"{'texture' if kind == 't' else 'surface'} object {want:#x} could not be recreated "
                            f"under its value (the driver gave {value:#x}): kernels that hold the old value "
                            f"would read the wrong object")
    sess.tex_gone.discard((kind, value))      # the driver reuses a value that went with its array
    sess.tex_objects[(kind, value)] = {"ctx": ctx.id, "res": rec, "raw": bytes(raw_res),
                                       "tex": bytes(tex) if tex is not None else None,
                                       "view": bytes(view) if view is not None else None}
    return value


@handler("tex_object_create")
def h_tex_object_create(d, sess, fn, ctx, args, **kw):
    """cuTexObjectCreate(pTexObject, pResDesc, pTexDesc, pResViewDesc)."""
    from ..core.registry import need_ctx
    ctx = need_ctx(ctx, fn)
    raw = _bytes(d, sess, args[1], RES_DESC_SIZE, fn.name)
    tex = _bytes(d, sess, args[2], TEX_DESC_SIZE, fn.name)
    view = _bytes(d, sess, args[3], VIEW_DESC_SIZE, fn.name) if args[3] is not None else None
    if view is not None and not any(view):
        view = None
    value = _create_obj(d, sess, ctx, "t", raw, tex, view, fn.name)
    return CUDA_SUCCESS, [value if args[0] else None]


@handler("surf_object_create")
def h_surf_object_create(d, sess, fn, ctx, args, **kw):
    """cuSurfObjectCreate(pSurfObject, pResDesc): an array resource
    (cuda.h: created with CUDA_ARRAY3D_SURFACE_LDST)."""
    from ..core.registry import need_ctx
    ctx = need_ctx(ctx, fn)
    raw = _bytes(d, sess, args[1], RES_DESC_SIZE, fn.name)
    if struct.unpack_from("<I", raw, 0)[0] != RES_ARRAY:
        # (a level of a mipmapped array is an array resource)
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: a surface needs a CUDA array resource")
    value = _create_obj(d, sess, ctx, "s", raw, None, None, fn.name)
    return CUDA_SUCCESS, [value if args[0] else None]


def _obj(sess, kind: str, value, who: str) -> dict | None:
    t = sess.tex_objects.get((kind, int(value or 0)))
    if t is None:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{who}: unknown {'texture' if kind == 't' else 'surface'} "
                                                  f"object {int(value or 0):#x}")
    return t


@handler("tex_object_destroy")
def h_tex_object_destroy(d, sess, fn, ctx, args, **kw):
    kind = "t" if fn.name.startswith("cuTex") else "s"
    if (kind, int(args[0] or 0)) in sess.tex_gone:
        sess.tex_gone.discard((kind, int(args[0])))    # went with its array (h_array_destroy)
        return CUDA_SUCCESS, []
    _obj(sess, kind, args[0], fn.name)
    (d.backend.tex_destroy if kind == "t" else d.backend.surf_destroy)(int(args[0]))
    del sess.tex_objects[(kind, int(args[0]))]
    return CUDA_SUCCESS, []


@handler("tex_object_get")
def h_tex_object_get(d, sess, fn, ctx, args, **kw):
    """cuTexObjectGetResourceDesc / TextureDesc / ResourceViewDesc,
    cuSurfObjectGetResourceDesc (out, object): the descriptors as the app
    gave them (array handles are the app's)."""
    kind = "t" if fn.name.startswith("cuTex") else "s"
    t = _obj(sess, kind, args[1], fn.name)
    if fn.name.endswith("ResourceDesc"):
        out = t["raw"]
    elif fn.name.endswith("TextureDesc"):
        out = t["tex"]
    else:
        out = t["view"] or bytes(VIEW_DESC_SIZE)
    return CUDA_SUCCESS, [out if args[0] else None]


def release_context(d, sess, ctx_id: int):
    """Texture and surface objects of a context that goes (with its arrays,
    which release_object frees)."""
    for (kind, value), t in list(sess.tex_objects.items()):
        if t["ctx"] == ctx_id:
            try:
                (d.backend.tex_destroy if kind == "t" else d.backend.surf_destroy)(value)
            except CudaError:
                pass
            del sess.tex_objects[(kind, value)]


# ------------------------------------------------------------- checkpoint

def describe(sess) -> tuple[list, list]:
    arrays = [{"id": o.id, "ctx": o.ctx, **o.info["shape"].as_dict(), "mipmap_levels": o.info["levels"]}
              for o in sess.of_kind(P.K_MIPMAPPED_ARRAY)]
    arrays += [{"id": o.id, "ctx": o.ctx, **o.info["shape"].as_dict(),
                **({"level_of": list(o.info["level_of"])} if "level_of" in o.info else {})}
               for o in sess.of_kind(P.K_ARRAY)]
    objs = [{"kind": "texture" if k == "t" else "surface", "value": v, "ctx": t["ctx"], "res": t["raw"].hex(),
             "tex": t["tex"].hex() if t["tex"] is not None else None,
             "view": t["view"].hex() if t["view"] is not None else None}
            for (k, v), t in sorted(sess.tex_objects.items(), key=lambda kv: kv[0][1])]
    # objects that went with their array and that the app may still destroy
    objs += [{"kind": "texture" if k == "t" else "surface", "value": v, "ctx": 0, "res": "", "tex": None,
              "view": None, "gone": True} for k, v in sorted(sess.tex_gone)]
    return arrays, objs


class _RestoreFn:
    """Stands for the API function in messages of checks a restore repeats."""
    def __init__(self, what: str):
        self.name = f"restore of a {what}"


def contents(backend, o):
    """(chunk key, bytes) of array o, in ARRAY_PIECE pieces (the caller has
    made its context current)."""
    data = backend.array_read(o.real, o.info["shape"])
    for off in range(0, len(data), ARRAY_PIECE):
        yield ARRAY_KEY | (o.id << 32) | (off // ARRAY_PIECE), bytes(data[off:off + ARRAY_PIECE])


def rebuild(d, sess, arrays: list, objs: list, read_key):
    """Arrays (with their contents: read_key(key) -> bytes or None), then
    texture and surface objects in ascending value order, in the contexts
    that exist again."""
    b = d.backend

    def context(i):
        c = sess.contexts.get(i)
        if c is None:
            raise RuntimeError(f"the image names context {i} for a CUDA array or texture object; it has none such")
        return c
    mipmaps = [a for a in arrays if "mipmap_levels" in a]
    for a in sorted(mipmaps, key=lambda a: a["id"]):
        ctx = context(a["ctx"])
        b.make_current(ctx.real)
        try:
            _mipmap_create(d, sess, _RestoreFn("mipmapped array"), ctx, ArrayInfo.from_dict(a),
                           int(a["mipmap_levels"]), ident=a["id"])
        except CudaError as e:
            raise RuntimeError(f"mipmapped CUDA array {a['id']} in the image: {e.message}") from e
    for a in sorted((a for a in arrays if "mipmap_levels" not in a), key=lambda a: a["id"]):
        ctx = context(a["ctx"])
        b.make_current(ctx.real)
        try:
            info = ArrayInfo.from_dict(a)
        except CudaError as e:
            raise RuntimeError(f"CUDA array {a['id']} in the image: {e.message}") from e
        if "level_of" in a:
            mid, level = (int(x) for x in a["level_of"])
            m = sess.objects.get((P.K_MIPMAPPED_ARRAY, mid))
            if m is None or not 0 <= level < m.info["levels"]:
                raise RuntimeError(f"CUDA array {a['id']} in the image is level {level} of mipmapped array {mid}, "
                                   f"which the image does not describe")
            o = _level(d, sess, m, level, ident=a["id"])
            if o.info["shape"].as_dict() != info.as_dict():
                raise RuntimeError(f"CUDA array {a['id']}: level {level} has another shape than in the image")
        else:
            o = sess.add(P.K_ARRAY, b.array_create(info), ctx.id, {"shape": info}, ident=a["id"])
        parts = []
        for k in range((info.nbytes + ARRAY_PIECE - 1) // ARRAY_PIECE):
            piece = read_key(ARRAY_KEY | (a["id"] << 32) | k)
            if piece is None:
                raise RuntimeError(f"image lacks the contents of CUDA array {o.handle:#x} (piece {k})")
            parts.append(piece)
        data = b"".join(parts)
        if len(data) != info.nbytes:
            raise RuntimeError(f"CUDA array {o.handle:#x}: {len(data)} bytes in the image, expected {info.nbytes}")
        b.array_write(o.real, info, data)
    for t in objs:
        if t.get("gone"):
            sess.tex_gone.add(("t" if t["kind"] == "texture" else "s", t["value"]))
    for t in sorted((t for t in objs if not t.get("gone")), key=lambda t: t["value"]):
        ctx = context(t["ctx"])
        b.make_current(ctx.real)
        kind = "t" if t["kind"] == "texture" else "s"
        sizes = (("res", RES_DESC_SIZE), ("tex", TEX_DESC_SIZE if kind == "t" else None), ("view", VIEW_DESC_SIZE))
        for field, n in sizes:
            if (t[field] is not None or field == "res") and (t[field] is None or len(t[field]) != 2 * (n or 0)):
                raise RuntimeError(f"{t['kind']} object {t['value']:#x}: its {field} descriptor in the image "
                                   f"has the wrong size")
        try:
            _create_obj(d, sess, ctx, kind, bytes.fromhex(t["res"]),
                        bytes.fromhex(t["tex"]) if t["tex"] is not None else None,
                        bytes.fromhex(t["view"]) if t["view"] is not None else None, "restore", want=t["value"])
        except CudaError as e:
            raise RuntimeError(e.message) from e


def _capture(backend, sess, desc=None) -> list:
    """Contents of every CUDA array as image pieces (key, bytes, FLAG_ARRAY),
    read while the session is frozen."""
    out = []
    for o in sess.of_kind(P.K_ARRAY):
        ctx = sess.contexts.get(o.ctx)
        if ctx is not None:
            backend.make_current(ctx.real)
        for key, data in contents(backend, o):
            out.append((key, data, FLAG_ARRAY))
    return out


def _rebuild_kind(r) -> None:
    """CUDA arrays with their contents, then texture and surface objects
    under their old values, once the arena is mapped again (objects on
    linear memory name arena addresses)."""
    desc = r.desc
    try:
        rebuild(r.dispatcher, r.sess, desc.get("arrays", []), desc.get("tex_objects", []),
                lambda key: r.read_key(key, f"CUDA array piece {key:#x}"))
    except RuntimeError as e:
        raise CheckpointError(str(e)) from None
    r.stats["arrays"] = len(desc.get("arrays", []))
    r.stats["tex_objects"] = len(desc.get("tex_objects", []))


# CUDA arrays (their contents are chunks of the image, FLAG_ARRAY) and
# texture/surface objects with the descriptors they were created from
register(Kind("arrays", Stage.ARRAYS, ("arrays", "tex_objects"),
              describe=lambda sess: dict(zip(("arrays", "tex_objects"), describe(sess))),
              capture=_capture, rebuild=_rebuild_kind, owner=__name__))
