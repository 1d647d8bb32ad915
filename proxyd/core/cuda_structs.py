"""Layouts and codes of cuda.h structures that more than one layer reads:
the array family (families/arrays.py) packs and checks them, the backends
(backends/cuda.py, emu/textures.py) hand them to the driver or emulate
them. Values as cuda.h (CUDA 13) defines them.
"""
import struct

# CUarray_format (cuda.h) -> (numpy kind, bytes per channel). Only the plain
# integer and floating-point formats; the packed, block-compressed and video
# formats are refused with CUDA_ERROR_NOT_SUPPORTED.
FORMATS = {0x01: ("u1", 1), 0x02: ("u2", 2), 0x03: ("u4", 4), 0x08: ("i1", 1), 0x09: ("i2", 2),
           0x0A: ("i4", 4), 0x10: ("f2", 2), 0x20: ("f4", 4)}

# CUDA_ARRAY_DESCRIPTOR (Width, Height, Format, NumChannels) and
# CUDA_ARRAY3D_DESCRIPTOR (Width, Height, Depth, Format, NumChannels, Flags), cuda.h
ARRAY_DESC = struct.Struct("<QQII")
ARRAY3D_DESC = struct.Struct("<QQQIII4x")
# CUDA_MEMCPY3D (cuda.h): per side XInBytes, Y, Z, LOD, memoryType (+pad),
# host, device, array, reserved, pitch, height; then Width, Height, Depth
MEMCPY3D_SIDE = struct.Struct("<QQQQI4xQQQQQQ")
MEMCPY3D = struct.Struct("<" + MEMCPY3D_SIDE.format[1:] * 2 + "QQQ")
MT_HOST, MT_DEVICE, MT_ARRAY, MT_UNIFIED = 1, 2, 3, 4
# CUDA_RESOURCE_DESC (cuda.h): resType, a 128-byte union, flags
RES_DESC_SIZE = 144
RES_ARRAY, RES_MIPMAPPED, RES_LINEAR, RES_PITCH2D = 0, 1, 2, 3
TEX_DESC_SIZE = 104
VIEW_DESC_SIZE = 112
