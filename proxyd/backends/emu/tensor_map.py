"""cuTensorMapEncodeTiled and cuTensorMapEncodeIm2col on the emulated GPU.

A CUtensorMap is 128 opaque bytes the driver fills and a kernel receives by
value (cuda.h, "Tensor Map Object Management"). On the real GPU the worker
asks NVIDIA's driver (the generic call path: same device addresses, so the
encoding embeds the application's address and stays valid across a
restore, which brings every allocation back at its address). Here the
emulated GPU has no TMA unit, so the encoding only has to be deterministic
(the same arguments give the same bytes) and to be refused where the driver
refuses: every requirement cuda.h lists for the two calls is checked and
answered with CUDA_ERROR_INVALID_VALUE. The layout written is this module's
own (a tag, the arguments in order, zero padding); nothing reads it back.

Requirements not checked: the 64-byte alignment of the caller's CUtensorMap
(the shim checks it, it is the application's address: interceptor/
tensor_map.c) and the compute capability (the emulated GPU is a 9.0 part).
"""
from __future__ import annotations

import struct

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1

MAP_BYTES = 128
# CUtensorMapDataType (cuda.h): element size in bytes; the packed 4- and
# 6-bit types (13, 14, 15) count individual values (size None)
ELEM_BYTES = [1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4, None, None, None]
T_16U4_ALIGN8B, T_16U4_ALIGN16B, T_16U6_ALIGN16B = 13, 14, 15
FLOAT_TYPES = {6, 7, 8, 9, 10, 11, 12}
INTERLEAVE_NONE, INTERLEAVE_16B, INTERLEAVE_32B = 0, 1, 2
SWIZZLE_SPAN = {0: None, 1: 32, 2: 64, 3: 128, 4: 128, 5: 128, 6: 128}
L2_PROMOTIONS = (0, 1, 2, 3)
OOB_FILLS = (0, 1)
TAG_TILED, TAG_IM2COL = b"GPTMT\0\0\0", b"GPTMI\0\0\0"


class Invalid(Exception):
    pass


def _need(cond: bool, why: str) -> None:
    if not cond:
        raise Invalid(why)


def _u64s(raw, n: int, what: str) -> list[int]:
    b = bytes(raw or b"")
    _need(len(b) >= 8 * n, f"{what}: {n} values needed")
    return list(struct.unpack_from(f"<{n}Q", b))


def _u32s(raw, n: int, what: str) -> list[int]:
    b = bytes(raw or b"")
    _need(len(b) >= 4 * n, f"{what}: {n} values needed")
    return list(struct.unpack_from(f"<{n}I", b))


def _common(dtype, rank, addr, gdim_raw, gstride_raw, estride_raw, interleave, swizzle, l2, oob, min_rank):
    """The requirements cuTensorMapEncodeTiled and _Im2col share (cuda.h)."""
    _need(0 <= dtype < len(ELEM_BYTES), f"unknown tensorDataType {dtype}")
    _need(interleave in (INTERLEAVE_NONE, INTERLEAVE_16B, INTERLEAVE_32B), f"unknown interleave {interleave}")
    _need(swizzle in SWIZZLE_SPAN, f"unknown swizzle {swizzle}")
    _need(l2 in L2_PROMOTIONS, f"unknown l2Promotion {l2}")
    _need(oob in OOB_FILLS, f"unknown oobFill {oob}")
    lo = 3 if interleave != INTERLEAVE_NONE else min_rank
    _need(lo <= rank <= 5, f"tensorRank {rank} outside {lo}..5")
    packed16 = dtype in (T_16U4_ALIGN16B, T_16U6_ALIGN16B)
    align = 32 if interleave == INTERLEAVE_32B or packed16 else 16
    _need(addr % align == 0, f"globalAddress must be {align}-byte aligned")
    gdim = _u64s(gdim_raw, rank, "globalDim")
    _need(all(1 <= d <= 1 << 32 for d in gdim), "globalDim values must be in 1..2^32")
    if packed16:
        _need(gdim[0] % 128 == 0, "globalDim[0] of a 16-byte-aligned packed type must be a multiple of 128")
    if dtype == T_16U4_ALIGN8B:
        _need(gdim[0] % 2 == 0, "globalDim[0] of 16U4_ALIGN8B must be even")
    gstr = _u64s(gstride_raw, rank - 1, "globalStrides") if rank > 1 else []
    smul = 32 if interleave == INTERLEAVE_32B or packed16 else 16
    _need(all(s % smul == 0 and s < 1 << 40 for s in gstr), f"globalStrides must be multiples of {smul} below 2^40")
    estr = _u32s(estride_raw, rank, "elementStrides")
    _need(all(1 <= e <= 8 for e in estr), "elementStrides values must be in 1..8")
    if interleave == INTERLEAVE_32B:
        _need(swizzle == 1, "the 32-byte interleave needs CU_TENSOR_MAP_SWIZZLE_32B")
    if dtype == T_16U6_ALIGN16B:
        _need(interleave == INTERLEAVE_NONE, "16U6_ALIGN16B needs no interleave")
        _need(swizzle in (0, 3, 4, 6), f"swizzle {swizzle} with 16U6_ALIGN16B")
    if dtype == T_16U4_ALIGN16B:
        _need(swizzle in (0, 3, 4), f"swizzle {swizzle} with 16U4_ALIGN16B")
    if oob:
        _need(dtype in FLOAT_TYPES, "the NaN out-of-bounds fill needs a floating-point type")
    return gdim, gstr, estr


def _inner_bytes(dtype: int, n: int) -> int:
    size = ELEM_BYTES[dtype]
    if size is not None:
        return n * size
    return n // 2 if dtype in (T_16U4_ALIGN8B, T_16U4_ALIGN16B) else n * 3 // 4


def _box_rules(dtype, interleave, swizzle, inner_elems):
    if interleave == INTERLEAVE_NONE:
        inner = _inner_bytes(dtype, inner_elems)
        _need(inner % 16 == 0, "the box's inner dimension must be a multiple of 16 bytes")
        span = SWIZZLE_SPAN[swizzle]
        if span is not None:
            _need(inner <= span, f"the box's inner dimension ({inner} bytes) exceeds the swizzle span {span}")


def _encode(tag: bytes, fields: list[int]) -> bytes:
    body = tag + struct.pack(f"<{len(fields)}Q", *fields)
    assert len(body) <= MAP_BYTES, len(body)
    return body + bytes(MAP_BYTES - len(body))


def encode_tiled(out, dtype, rank, addr, gdim_raw, gstride_raw, box_raw, estride_raw, interleave, swizzle, l2, oob):
    """cuTensorMapEncodeTiled: (status, [128 bytes])."""
    try:
        gdim, gstr, estr = _common(dtype, rank, int(addr or 0), gdim_raw, gstride_raw, estride_raw, interleave,
                                   swizzle, l2, oob, 1)
        box = _u32s(box_raw, rank, "boxDim")
        _need(all(1 <= b <= 256 for b in box), "boxDim values must be in 1..256")
        if dtype in (T_16U4_ALIGN16B, T_16U6_ALIGN16B):
            _need(box[0] == 128, "boxDim[0] of a 16-byte-aligned packed type must be 128")
        _box_rules(dtype, interleave, swizzle, box[0])
    except Invalid:
        return CUDA_ERROR_INVALID_VALUE, [None]
    # the arguments in 12 words (after the 8-byte tag: 104 of the 128 bytes)
    words = [dtype | rank << 8 | interleave << 16 | swizzle << 24 | l2 << 32 | oob << 40, int(addr)]
    words += [gdim[i] if i < rank else 0 for i in range(5)]
    words += [(gstr[i] if i < rank - 1 else 0) for i in range(4)]
    words += [sum((box[i] - 1) << (8 * i) for i in range(rank)) | sum((estr[i] - 1) << (40 + 3 * i)
                                                                       for i in range(rank))]
    return CUDA_SUCCESS, [_encode(TAG_TILED, words)]


# cuda.h, cuTensorMapEncodeIm2col: the corner offsets' range by rank
CORNER_RANGE = {3: (-(1 << 15), (1 << 15) - 1), 4: (-(1 << 7), (1 << 7) - 1), 5: (-(1 << 4), (1 << 4) - 1)}


def encode_im2col(out, dtype, rank, addr, gdim_raw, gstride_raw, lower_raw, upper_raw, channels, pixels,
                  estride_raw, interleave, swizzle, l2, oob):
    """cuTensorMapEncodeIm2col: (status, [128 bytes])."""
    try:
        gdim, gstr, estr = _common(dtype, rank, int(addr or 0), gdim_raw, gstride_raw, estride_raw, interleave,
                                   swizzle, l2, oob, 3)
        n = rank - 2
        b = bytes(lower_raw or b""), bytes(upper_raw or b"")
        _need(len(b[0]) >= 4 * n and len(b[1]) >= 4 * n, "pixelBox corners: tensorRank - 2 values each")
        lower, upper = (list(struct.unpack_from(f"<{n}i", x)) for x in b)
        lo, hi = CORNER_RANGE[rank]
        _need(all(lo <= v <= hi for v in lower + upper), f"pixelBox corner offsets must be in {lo}..{hi}")
        _need(1 <= channels <= 256, "channelsPerPixel must be in 1..256")
        _need(1 <= pixels <= 1024, "pixelsPerColumn must be in 1..1024")
        _box_rules(dtype, interleave, swizzle, channels)
    except Invalid:
        return CUDA_ERROR_INVALID_VALUE, [None]
    words = [dtype | rank << 8 | interleave << 16 | swizzle << 24 | l2 << 32 | oob << 40, int(addr)]
    words += [gdim[i] if i < rank else 0 for i in range(5)]
    words += [(gstr[i] if i < rank - 1 else 0) for i in range(4)]
    words += [sum((v & 0xFFFF) << (16 * i) for i, v in enumerate(lower)),
              sum((v & 0xFFFF) << (16 * i) for i, v in enumerate(upper)),
              channels | pixels << 16 | sum((estr[i] - 1) << (32 + 3 * i) for i in range(rank))]
    return CUDA_SUCCESS, [_encode(TAG_IM2COL, words)]
