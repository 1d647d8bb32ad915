"""CUDA arrays, texture and surface objects in proxyd (proxyd/families/arrays.py) on
the emulated backend, driven through the handlers the dispatcher calls:
copies with pitched device memory, the emulated texture fetch and surface
access rules, and the restore of texture objects under their old values
(with a gap left by a destroyed object, and a value that cannot come back).
The whole path through the shim, with a dump and restore, is the corpus
program textures (tests/test_corpus_*.py)."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from gpuproxy.proxyd.families import arrays as A
from gpuproxy.proxyd.core import protocol as P
from gpuproxy.proxyd._generated import FUNCTIONS
from gpuproxy.proxyd.core.arena import Arena
from gpuproxy.emu.backend import EmuBackend
from gpuproxy.proxyd.core.session import CudaError, Session
from gpuproxy.proxyd.worker.server import ARENA_BASE, SLOT_SIZE

FN = {fn.name: fn for fn in FUNCTIONS.values()}
CU_AD_FORMAT_FLOAT = 0x20
CU_AD_FORMAT_UNSIGNED_INT8 = 0x01


class Disp:
    """What the handlers use of the dispatcher."""

    def __init__(self, backend):
        self.backend = backend

    def data(self, sess, v):
        return v


def _session(b):
    s = Session("t-1", 1, "x", 0, Arena(ARENA_BASE, SLOT_SIZE, b.map_chunk, b.unmap_chunk))
    ctx = s.add_context(0, b.ctx_create(0, 0), primary=True)
    return s, ctx


def _call(d, s, ctx, name, *args):
    from gpuproxy.proxyd.worker.dispatch import HANDLERS
    fn = FN[name]
    code, outs = HANDLERS[fn.handler](d, s, fn, ctx, list(args))
    assert code == 0
    return outs


def _array(d, s, ctx, w, h, fmt=CU_AD_FORMAT_FLOAT, ch=1, flags=0):
    return _call(d, s, ctx, "cuArray3DCreate_v2", True, A.ARRAY3D_DESC.pack(w, h, 0, fmt, ch, flags))[0]


def _res_array(handle) -> bytes:
    raw = bytearray(A.RES_DESC_SIZE)
    struct.pack_into("<IxxxxQ", raw, 0, A.RES_ARRAY, handle)
    return bytes(raw)


def _tex_desc(normalized=False) -> bytes:
    raw = bytearray(A.TEX_DESC_SIZE)
    struct.pack_into("<IIII", raw, 0, 1, 1, 1, 0)       # clamp, clamp, clamp, point
    struct.pack_into("<I", raw, 16, 0x02 if normalized else 0)
    return bytes(raw)


def _copy(src, dst, w, h):
    """A CUDA_MEMCPY3D (cuda.h) from two side tuples (type, x, y, device, array, pitch, height)."""
    def side(t, x, y, dev, arr, pitch, height):
        return (x, y, 0, 0, t, 0, dev, arr, 0, pitch, height)
    return A.MEMCPY3D.pack(*side(*src), *side(*dst), w, h, 1)


@pytest.fixture
def env():
    b = EmuBackend()
    d = Disp(b)
    s, ctx = _session(b)
    return b, d, s, ctx


def test_device_to_array_copy_with_pitch_and_offsets(env):
    b, d, s, ctx = env
    arr = _array(d, s, ctx, 8, 4)
    dev = s.arena.alloc(1 << 16, 0)
    pitch = 64
    rows = np.arange(4 * 16, dtype=np.float32).reshape(4, 16)     # 16 floats a row = 64 bytes
    b.write_device(0, dev, rows.tobytes())
    # a 3x2 region: device (x=2, y=1) -> array (x=4, y=2), widths in bytes
    _call(d, s, ctx, "cuMemcpy3D_v2", _copy((A.MT_DEVICE, 8, 1, dev, 0, pitch, 4),
                                             (A.MT_ARRAY, 16, 2, 0, arr, 0, 0), 12, 2))
    o = s.get(P.K_ARRAY, arr)
    got = np.frombuffer(b.array_read(o.real, o.info["shape"]), np.float32).reshape(4, 8)
    want = np.zeros((4, 8), np.float32)
    want[2:4, 4:7] = rows[1:3, 2:5]
    assert np.array_equal(got, want)
    # and back out to device memory elsewhere (array -> device)
    _call(d, s, ctx, "cuMemcpy3D_v2", _copy((A.MT_ARRAY, 16, 2, 0, arr, 0, 0),
                                             (A.MT_DEVICE, 0, 0, dev + 4096, 0, 12, 2), 12, 2))
    out = bytearray(24)
    b.read_device(0, dev + 4096, 24, out)
    assert np.array_equal(np.frombuffer(bytes(out), np.float32).reshape(2, 3), rows[1:3, 2:5])


def test_copy_outside_the_array_is_refused(env):
    b, d, s, ctx = env
    arr = _array(d, s, ctx, 8, 4)
    dev = s.arena.alloc(4096, 0)
    fn = FN["cuMemcpy3D_v2"]
    with pytest.raises(CudaError, match="outside"):
        A.h_memcpy_3d(d, s, fn, ctx, [_copy((A.MT_DEVICE, 0, 0, dev, 0, 64, 4), (A.MT_ARRAY, 8, 0, 0, arr, 0, 0),
                                            32, 1)])
    with pytest.raises(CudaError, match="multiple"):
        A.h_memcpy_3d(d, s, fn, ctx, [_copy((A.MT_DEVICE, 0, 0, dev, 0, 64, 4), (A.MT_ARRAY, 2, 0, 0, arr, 0, 0),
                                            4, 1)])
    with pytest.raises(CudaError, match="host sides are staged"):
        A.h_memcpy_3d(d, s, fn, ctx, [_copy((A.MT_HOST, 0, 0, 0, 0, 32, 4), (A.MT_ARRAY, 0, 0, 0, arr, 0, 0),
                                            32, 1)])


def test_emulated_fetch_clamps_and_surface_traps(env):
    b, d, s, ctx = env
    arr = _array(d, s, ctx, 4, 3, CU_AD_FORMAT_UNSIGNED_INT8, 2, flags=0x02)
    o = s.get(P.K_ARRAY, arr)
    vals = np.arange(24, dtype=np.uint8)
    b.array_write(o.real, o.info["shape"], vals.tobytes())
    tex = _call(d, s, ctx, "cuTexObjectCreate", True, _res_array(arr), _tex_desc(), None)[0]
    surf = _call(d, s, ctx, "cuSurfObjectCreate", True, _res_array(arr))[0]
    assert tex != surf
    el = vals.reshape(3, 4, 2)
    from gpuproxy.emu.textures import fetch, surf_index
    t = b.textures.get(tex)
    # inside, and clamped on every side (x = -3 -> 0, x = 9 -> 3, y = -1 -> 0, y = 7 -> 2)
    got = fetch(t, [1.5, -3.0, 9.0, 2.2, 0.0], [0.5, 1.0, 2.9, -1.0, 7.0])
    assert got.tolist() == [el[0, 1].tolist(), el[1, 0].tolist(), el[2, 3].tolist(), el[0, 2].tolist(),
                            el[2, 0].tolist()]
    # normalised coordinates: x in [0, 1) covers the width
    tn = _call(d, s, ctx, "cuTexObjectCreate", True, _res_array(arr), _tex_desc(normalized=True), None)[0]
    assert fetch(b.textures.get(tn), [0.80], [0.5]).tolist() == [el[1, 3].tolist()]
    # surface: byte x coordinates, writes land in the array; out of range traps
    sv = b.textures.get(surf)
    e, xi, yi = surf_index(sv, [2 * 3], [2])
    e[0, yi, xi] = [[200, 201]]
    assert b.array_read(o.real, o.info["shape"])[2 * 8 + 6:2 * 8 + 8] == bytes([200, 201])
    for xb, y in ((8, 0), (1, 0), (0, 3), (-2, 0)):
        with pytest.raises(CudaError, match="boundary mode trap"):
            surf_index(sv, [xb], [y])
    # the descriptors come back as given
    assert _call(d, s, ctx, "cuTexObjectGetResourceDesc", True, tex)[0] == _res_array(arr)
    assert _call(d, s, ctx, "cuTexObjectGetTextureDesc", True, tex)[0] == _tex_desc()
    assert _call(d, s, ctx, "cuArray3DGetDescriptor_v2", True, arr)[0] == \
        A.ARRAY3D_DESC.pack(4, 3, 0, CU_AD_FORMAT_UNSIGNED_INT8, 2, 2)
    # an array freed before its objects (a common cleanup order): the
    # objects go with it; the app's later destroys of them succeed, also
    # after a restore in between
    _call(d, s, ctx, "cuArrayDestroy", arr)
    assert not s.tex_objects and tex not in b.textures.objects
    _call(d, s, ctx, "cuTexObjectDestroy", tex)
    b2, d2, s2, arrays, objs, keys = _rebuild_into_fresh(s, b)
    A.rebuild(d2, s2, arrays, objs, keys.get)
    assert not b2.textures.objects
    _call(d2, s2, ctx, "cuSurfObjectDestroy", surf)
    _call(d2, s2, ctx, "cuTexObjectDestroy", tn)
    with pytest.raises(CudaError, match="unknown texture object"):
        A.h_tex_object_destroy(d2, s2, FN["cuTexObjectDestroy"], ctx, [tn])


def _rebuild_into_fresh(s, b):
    arrays, objs = A.describe(s)
    keys = {}
    for o in s.of_kind(P.K_ARRAY):
        for k, data in A.contents(b, o):
            keys[k] = data
    b2 = EmuBackend()
    d2 = Disp(b2)
    s2, ctx2 = _session(b2)
    return b2, d2, s2, arrays, objs, keys


def test_restore_recreates_objects_under_their_values_across_a_gap(env):
    b, d, s, ctx = env
    arr = _array(d, s, ctx, 5, 2)
    o = s.get(P.K_ARRAY, arr)
    b.array_write(o.real, o.info["shape"], np.arange(10, dtype=np.float32).tobytes())
    values = [_call(d, s, ctx, "cuTexObjectCreate", True, _res_array(arr), _tex_desc(), None)[0] for _ in range(3)]
    surf = _call(d, s, ctx, "cuSurfObjectCreate", True, _res_array(arr))[0]
    _call(d, s, ctx, "cuTexObjectDestroy", values[1])
    b2, d2, s2, arrays, objs, keys = _rebuild_into_fresh(s, b)
    A.rebuild(d2, s2, arrays, objs, keys.get)
    assert sorted(v for _, v in s2.tex_objects) == sorted([values[0], values[2], surf])
    # the placeholder that filled the gap is gone again
    assert sorted(b2.textures.objects) == sorted([values[0], values[2], surf])
    o2 = s2.get(P.K_ARRAY, arr)       # same handle
    assert np.array_equal(np.frombuffer(b2.array_read(o2.real, o2.info["shape"]), np.float32), np.arange(10))
    # the recreated texture reads the restored array
    from gpuproxy.emu.textures import fetch
    assert fetch(b2.textures.get(values[2]), [3.5], [1.5]).tolist() == [[8.0]]


def test_restore_fails_clearly_when_a_value_cannot_come_back(env):
    b, d, s, ctx = env
    arr = _array(d, s, ctx, 2, 2)
    tex = _call(d, s, ctx, "cuTexObjectCreate", True, _res_array(arr), _tex_desc(), None)[0]
    b2, d2, s2, arrays, objs, keys = _rebuild_into_fresh(s, b)
    b2.textures.objects[tex] = object()       # the value is taken in the new worker
    with pytest.raises(RuntimeError, match=f"texture object {tex:#x} could not be recreated under its value"):
        A.rebuild(d2, s2, arrays, objs, keys.get)
    assert list(b2.textures.objects) == [tex]     # nothing left behind


def test_restore_refuses_missing_array_contents(env):
    b, d, s, ctx = env
    _array(d, s, ctx, 2, 2)
    b2, d2, s2, arrays, objs, keys = _rebuild_into_fresh(s, b)
    with pytest.raises(RuntimeError, match="lacks the contents of CUDA array"):
        A.rebuild(d2, s2, arrays, objs, {}.get)


def test_unsupported_format_is_refused(env):
    b, d, s, ctx = env
    with pytest.raises(CudaError, match="format 0xb0 is not supported"):
        A.h_array_create(d, s, FN["cuArray3DCreate_v2"], ctx, [True, A.ARRAY3D_DESC.pack(4, 4, 0, 0xB0, 1, 0)])


# ------------------------------------------------------- mipmapped arrays

def _mipmap(d, s, ctx, w, h, levels, fmt=CU_AD_FORMAT_FLOAT):
    return _call(d, s, ctx, "cuMipmappedArrayCreate", True, A.ARRAY3D_DESC.pack(w, h, 0, fmt, 1, 0), levels)[0]


def test_mipmap_levels_are_arrays_owned_by_the_mipmapped_array(env):
    b, d, s, ctx = env
    m = _mipmap(d, s, ctx, 16, 6, 4)        # 16x6, 8x3, 4x1, 2x1
    lv = [_call(d, s, ctx, "cuMipmappedArrayGetLevel", True, m, n)[0] for n in range(4)]
    assert _call(d, s, ctx, "cuMipmappedArrayGetLevel", True, m, 2)[0] == lv[2]     # the same handle again
    shapes = [(s.get(P.K_ARRAY, h).info["shape"].width, s.get(P.K_ARRAY, h).info["shape"].height) for h in lv]
    assert shapes == [(16, 6), (8, 3), (4, 1), (2, 1)]
    with pytest.raises(CudaError, match="level 4 of 4"):
        A.h_mipmap_get_level(d, s, FN["cuMipmappedArrayGetLevel"], ctx, [True, m, 4])
    # more levels than the largest dimension allows (1 + floor(log2(16)) = 5)
    with pytest.raises(CudaError, match="6 levels"):
        A.h_mipmap_create(d, s, FN["cuMipmappedArrayCreate"], ctx,
                          [True, A.ARRAY3D_DESC.pack(16, 6, 0, CU_AD_FORMAT_FLOAT, 1, 0), 6])
    with pytest.raises(CudaError, match="is a level of a mipmapped array"):
        A.h_array_destroy(d, s, FN["cuArrayDestroy"], ctx, [lv[1]])
    # a texture over the mipmapped resource and one over a level go with it
    raw = bytearray(A.RES_DESC_SIZE)
    struct.pack_into("<IxxxxQ", raw, 0, A.RES_MIPMAPPED, m)
    t_mip = _call(d, s, ctx, "cuTexObjectCreate", True, bytes(raw), _tex_desc(True), None)[0]
    t_lvl = _call(d, s, ctx, "cuTexObjectCreate", True, _res_array(lv[1]), _tex_desc(), None)[0]
    _call(d, s, ctx, "cuMipmappedArrayDestroy", m)
    assert not s.of_kind(P.K_ARRAY) and not s.of_kind(P.K_MIPMAPPED_ARRAY)
    assert not b.textures.objects and {("t", t_mip), ("t", t_lvl)} <= s.tex_gone


def test_mipmap_restore_brings_back_fetched_levels_and_lod_fetches(env):
    b, d, s, ctx = env
    m = _mipmap(d, s, ctx, 8, 4, 3)
    l0, l2 = (_call(d, s, ctx, "cuMipmappedArrayGetLevel", True, m, n)[0] for n in (0, 2))
    o0, o2 = s.get(P.K_ARRAY, l0), s.get(P.K_ARRAY, l2)
    b.array_write(o0.real, o0.info["shape"], np.arange(32, dtype=np.float32).tobytes())
    b.array_write(o2.real, o2.info["shape"], np.array([100, 200], np.float32).tobytes())
    raw = bytearray(A.RES_DESC_SIZE)
    struct.pack_into("<IxxxxQ", raw, 0, A.RES_MIPMAPPED, m)
    tex = bytearray(_tex_desc(True))
    struct.pack_into("<fff", tex, 28, 0.0, 0.0, 2.0)        # bias, min and max level clamp
    t = _call(d, s, ctx, "cuTexObjectCreate", True, bytes(raw), bytes(tex), None)[0]
    b2, d2, s2, arrays, objs, keys = _rebuild_into_fresh(s, b)
    A.rebuild(d2, s2, arrays, objs, keys.get)
    assert s2.get(P.K_MIPMAPPED_ARRAY, m).info["levels"] == 3
    assert _call(d2, s2, ctx, "cuMipmappedArrayGetLevel", True, m, 2)[0] == l2    # same handle
    from gpuproxy.emu.textures import fetch
    obj = b2.textures.get(t)
    # level 0 texel (5, 2) = 21; level 2 (2x1) texel (1, 0) = 200; lod 7 is clamped to level 2
    assert fetch(obj, [5.5 / 8], [2.5 / 4], lod=0.0).tolist() == [[21.0]]
    assert fetch(obj, [0.9], [0.5], lod=2.0).tolist() == [[200.0]]
    assert fetch(obj, [0.1], [0.5], lod=7.0).tolist() == [[100.0]]
    # level 1 was never fetched by the app: it exists, with no recorded contents
    assert [a.get("level_of") for a in arrays if "level_of" in a] == [[1, 0], [1, 2]]


# ------------------------------------------------------------ 2D memsets

def test_memset2d_checks_and_sets_rows(env):
    from gpuproxy.proxyd.families import memory as Hd
    b, d, s, ctx = env
    dev = s.arena.alloc(4096, 0)
    b.write_device(0, dev, bytes(4096))
    fn = FN["cuMemsetD2D16_v2"]
    Hd.h_memset2d(d, s, fn, ctx, [dev + 2, 64, 0xBEEF, 5, 3])
    out = bytearray(4096)
    b.read_device(0, dev, 4096, out)
    rows = np.frombuffer(bytes(out), np.uint8).reshape(64, 64)
    for y in range(64):
        want = bytes(2) + bytes.fromhex("efbe") * 5 + bytes(52) if y < 3 else bytes(64)
        assert rows[y].tobytes() == want, y
    with pytest.raises(CudaError, match="pitch 8 is smaller than a row"):
        Hd.h_memset2d(d, s, fn, ctx, [dev, 8, 1, 5, 2])
    # the last row would end past the allocation
    with pytest.raises(CudaError, match="runs past the end"):
        Hd.h_memset2d(d, s, FN["cuMemsetD2D8_v2"], ctx, [dev, 1024, 1, 200, 5])


@pytest.mark.gpu
def test_gpu_texture_values_come_back_in_a_fresh_context():
    """On the GPU: objects made in one context (with a gap: one destroyed)
    and recreated by arrays.rebuild in a fresh context after the first is
    gone get the same values, and the array its contents. (A restore does
    this in a fresh worker process; the corpus program textures checks that
    path, dumped and restored, on the GPU too.)"""
    from gpuproxy.proxyd.backends.cuda import CudaBackend
    b = CudaBackend()
    d = Disp(b)
    s, ctx = _session(b)
    b.make_current(ctx.real)
    arr = _array(d, s, ctx, 16, 8, flags=0x02)
    o = s.get(P.K_ARRAY, arr)
    data = np.arange(16 * 8, dtype=np.float32)
    b.array_write(o.real, o.info["shape"], data.tobytes())
    texs = [_call(d, s, ctx, "cuTexObjectCreate", True, _res_array(arr), _tex_desc(), None)[0] for _ in range(3)]
    surf = _call(d, s, ctx, "cuSurfObjectCreate", True, _res_array(arr))[0]
    _call(d, s, ctx, "cuTexObjectDestroy", texs[1])
    arrays, objs = A.describe(s)
    keys = dict(A.contents(b, o))
    before = sorted(v for _, v in s.tex_objects)
    A.release_context(d, s, ctx.id)
    b.array_destroy(o.real)
    b.ctx_destroy(ctx.real)
    s2, ctx2 = _session(b)
    b.make_current(ctx2.real)
    A.rebuild(d, s2, arrays, objs, keys.get)
    after = sorted(v for _, v in s2.tex_objects)
    assert after == before, f"texture/surface values {before} came back as {after} (created {texs}, surface {surf})"
    o2 = s2.get(P.K_ARRAY, arr)
    assert np.array_equal(np.frombuffer(b.array_read(o2.real, o2.info["shape"]), np.float32), data)
    A.release_context(d, s2, ctx2.id)
    b.array_destroy(o2.real)
    b.ctx_destroy(ctx2.real)
