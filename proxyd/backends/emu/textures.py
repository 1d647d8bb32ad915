"""CUDA arrays, texture and surface objects on the emulated GPU.

An array is a numpy byte buffer of shape (slices, rows, row bytes), the
element size given by its format and channel count (cuda.h,
CUarray_format). Texture and surface objects get values from a counter that
hands out the lowest free value from 1, as the driver's per-context
descriptor tables do (proxyd/families/arrays.py relies on that order at restore).

What emulated kernels can do (KernelLaunch.tex1dfetch / tex2d / surf2dread
/ surf2dwrite, proxyd/backends/emu/kernels.py): point sampling with unnormalised or
normalised coordinates, clamp addressing (every address mode is treated as
clamp), element-type reads (integer formats are never converted to
normalised floats) of linear, pitch-2D and array resources; surface reads
and writes with byte x-coordinates and trap on out-of-range accesses (the
CUDA default, cudaBoundaryModeTrap). Not modelled: linear filtering, wrap /
mirror / border addressing, normalised-float read mode, sRGB, layered and
cubemap arrays, texture gather. Mipmapped arrays: explicit-level fetches
(tex2DLod / tex3DLod) with point mipmap filtering, the level rounded to the
nearest and clamped to the texture's level range; a lod of the form n + 0.5
is not used by the tests (rounding ties is the hardware's choice).

Locking: used on the worker's main loop only, as the rest of the backend.
"""
from __future__ import annotations

import struct

import numpy as np

from gpuproxy.proxyd.core.cuda_structs import FORMATS, RES_ARRAY, RES_LINEAR, RES_MIPMAPPED, RES_PITCH2D
from gpuproxy.proxyd.core.session import CudaError

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_ILLEGAL_ADDRESS = 700
CU_TRSF_NORMALIZED_COORDINATES = 0x02     # CUDA_TEXTURE_DESC.flags (cuda.h)


class EmuArray:
    def __init__(self, info):
        self.info = info
        self.data = np.zeros((info.slices, info.rows, info.row_bytes), np.uint8)

    def elements(self) -> np.ndarray:
        """(slices, rows, width, channels) view in the array's element type."""
        kind, size = FORMATS[self.info.format]
        return self.data.view(np.dtype(kind)).reshape(self.info.slices, self.info.rows, self.info.width,
                                                      self.info.channels)


class EmuTexObject:
    def __init__(self, res: dict, tex: bytes | None, backend):
        self.res = res
        self.normalized = False
        self.bias, self.min_level, self.max_level = 0.0, 0.0, 0.0
        if tex is not None:
            flags, = struct.unpack_from("<I", tex, 16)
            self.normalized = bool(flags & CU_TRSF_NORMALIZED_COORDINATES)
            # CUDA_TEXTURE_DESC: addressMode[3], filterMode, flags, maxAnisotropy,
            # mipmapFilterMode, mipmapLevelBias, minMipmapLevelClamp, maxMipmapLevelClamp
            self.bias, self.min_level, self.max_level = struct.unpack_from("<fff", tex, 28)
        self.backend = backend

    def view(self, level: int = 0) -> np.ndarray:
        """(slices, rows, width, channels) elements of the resource (of one
        level of a mipmapped array)."""
        r = self.res
        if r["type"] == RES_ARRAY:
            return r["real"].elements()
        if r["type"] == RES_MIPMAPPED:
            return r["real"][level].elements()
        kind, size = FORMATS[r["format"]]
        elem = size * r["channels"]
        if r["type"] == RES_LINEAR:
            n = r["size"] // elem
            raw = self.backend.resolve(r["addr"], n * elem)
            return raw.view(np.dtype(kind)).reshape(1, 1, n, r["channels"])
        if r["type"] == RES_PITCH2D:
            raw = self.backend.resolve(r["addr"], r["pitch"] * r["height"]).reshape(r["height"], r["pitch"])
            rows = raw[:, :r["width"] * elem]
            return rows.view(np.dtype(kind)).reshape(1, r["height"], r["width"], r["channels"])
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"resource type {r['type']}")


class Textures:
    """The backend's arrays and objects (EmuBackend.textures)."""

    def __init__(self, backend):
        self.backend = backend
        self.objects: dict[int, EmuTexObject] = {}

    def create(self, res: dict, tex: bytes | None) -> int:
        v = 1
        while v in self.objects:
            v += 1
        self.objects[v] = EmuTexObject(res, tex, self.backend)
        return v

    def destroy(self, value: int):
        if self.objects.pop(int(value), None) is None:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"no texture or surface object {int(value):#x}")

    def get(self, value: int) -> EmuTexObject:
        o = self.objects.get(int(value))
        if o is None:
            raise CudaError(CUDA_ERROR_ILLEGAL_ADDRESS, f"kernel used unknown texture/surface object {int(value):#x}")
        return o

    # ------------------------------------------------------------- copies
    def region(self, side: dict, extent) -> np.ndarray:
        """A writable (depth, height, width bytes) view of one side of a 3D copy."""
        w, h, dep = extent
        if side["type"] == "array":
            arr = side["real"].data
            return arr[side["z"]:side["z"] + dep, side["y"]:side["y"] + h, side["x"]:side["x"] + w]
        pitch, height = side["pitch"], side["height"]
        start = side["addr"] + (side["z"] * height + side["y"]) * pitch + side["x"]
        span = ((dep - 1) * height + (h - 1)) * pitch + w
        raw = self.backend.resolve(start, span)
        return np.lib.stride_tricks.as_strided(raw, (dep, h, w), (height * pitch, pitch, 1), writeable=True)

    def copy(self, src: dict, dst: dict, extent):
        s = self.region(src, extent).copy()
        self.region(dst, extent)[...] = s


def level_of(obj: EmuTexObject, lod: float) -> int:
    """The mipmap level a point-filtered fetch at lod reads: the nearest
    level, within the texture's clamps and the array's levels."""
    if obj.res["type"] != RES_MIPMAPPED:
        return 0
    lod = min(max(float(lod) + obj.bias, obj.min_level), obj.max_level)
    return int(min(max(np.floor(lod + 0.5), 0), obj.res["levels"] - 1))


def fetch(obj: EmuTexObject, x, y=None, z=None, lod: float = 0.0) -> np.ndarray:
    """Point-sampled, clamp-addressed texels at coordinates x (and y, z):
    one row of channels per coordinate (CUDA C++ Programming Guide,
    "Texture Fetching": nearest-point sampling takes the texel floor(x))."""
    el = obj.view(level_of(obj, lod))
    d, h, w, _ = el.shape
    x = np.asarray(x, np.float64)

    def idx(c, n):
        c = np.asarray(c, np.float64)
        if obj.normalized:
            c = c * n
        return np.clip(np.floor(c), 0, n - 1).astype(np.int64)
    xi = idx(x, w)
    yi = idx(y, h) if y is not None else np.zeros_like(xi)
    zi = idx(z, d) if z is not None else np.zeros_like(xi)
    return el[zi, yi, xi]


def fetch_linear(obj: EmuTexObject, i) -> np.ndarray:
    """tex1Dfetch: integer index into a linear resource, clamped."""
    el = obj.view()
    n = el.shape[2]
    i = np.clip(np.asarray(i, np.int64), 0, n - 1)
    return el[0, 0, i]


def surf_index(obj: EmuTexObject, xbytes, y):
    if obj.res["type"] != RES_ARRAY:
        raise CudaError(CUDA_ERROR_ILLEGAL_ADDRESS, "surface object without an array")
    el = obj.view()
    info = obj.res["shape"]
    xb = np.asarray(xbytes, np.int64)
    yi = np.asarray(y, np.int64)
    if np.any(xb % info.elem) or np.any(xb < 0) or np.any(xb >= info.row_bytes) or np.any(yi < 0) \
            or np.any(yi >= info.rows):
        # cudaBoundaryModeTrap, the default: an out-of-range access faults
        raise CudaError(CUDA_ERROR_ILLEGAL_ADDRESS, "surface access out of range (boundary mode trap)")
    return el, xb // info.elem, yi
