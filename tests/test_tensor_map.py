"""cuTensorMapEncodeTiled / cuTensorMapEncodeIm2col (TMA descriptors, cuda.h
"Tensor Map Object Management") through the shim on the emulated backend:
the 128-byte CUtensorMap comes back filled, the same arguments give the same
bytes and another address other bytes, and every requirement cuda.h lists
that the arguments break is CUDA_ERROR_INVALID_VALUE, as from the driver
(the shim checks the caller's struct alignment and the rank; the worker the
rest: proxyd/backends/emu/tensor_map.py, NVIDIA's driver on the GPU)."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import client_env

APP = r'''
import ctypes, json
from ctypes import byref, c_int, c_uint, c_uint64, c_void_p
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
ctx = c_void_p()
assert cu.cuDevicePrimaryCtxRetain(byref(ctx), 0) == 0
cu.cuCtxSetCurrent(ctx)
d = c_uint64()
assert cu.cuMemAlloc_v2(byref(d), 1 << 20) == 0
raw = ctypes.create_string_buffer(128 + 64)
base = (ctypes.addressof(raw) + 63) & ~63          # CUtensorMap is 64-byte aligned (cuda.h)
F32, NONE = 7, 0
def tiled(addr=None, rank=2, gdim=(256, 128), gstr=(1024,), box=(32, 16), est=(1, 1), inter=0, swz=0, l2=0,
          oob=0, dtype=F32, at=base):
    ctypes.memset(at, 0xEE, 128)
    g = (c_uint64 * 5)(*gdim)
    s = (c_uint64 * 4)(*gstr)
    b = (c_uint * 5)(*box)
    e = (c_uint * 5)(*est)
    rc = cu.cuTensorMapEncodeTiled(c_void_p(at), c_int(dtype), c_uint(rank),
                                   c_void_p(d.value if addr is None else addr), g, s, b, e, c_int(inter),
                                   c_int(swz), c_int(l2), c_int(oob))
    return rc, ctypes.string_at(at, 128).hex()
out = {}
out["ok"] = tiled()
out["again"] = tiled()
out["other_addr"] = tiled(addr=d.value + 4096)
out["bad"] = {
    "misaligned_address": tiled(addr=d.value + 8)[0],
    "rank_0": tiled(rank=0)[0],
    "rank_6": tiled(rank=6)[0],
    "box_0": tiled(box=(32, 0))[0],
    "box_257": tiled(box=(32, 257))[0],
    "box_inner_not_16_bytes": tiled(box=(3, 16))[0],
    "stride_not_16": tiled(gstr=(1000,))[0],
    "element_stride_9": tiled(est=(1, 9))[0],
    "swizzle_span": tiled(box=(64, 16), swz=1)[0],
    "unknown_type": tiled(dtype=99)[0],
    "nan_fill_int": tiled(dtype=3, oob=1)[0],
    "misaligned_map": tiled(at=base + 8)[0],
}
g = (c_uint64 * 4)(64, 16, 16, 2)
s = (c_uint64 * 3)(256, 4096, 65536)
lo, hi = (c_int * 2)(-1, -1), (c_int * 2)(1, 1)
e = (c_uint * 4)(1, 1, 1, 1)
out["im2col"] = cu.cuTensorMapEncodeIm2col(c_void_p(base), c_int(F32), c_uint(4), c_void_p(d.value), g, s, lo, hi,
                                           c_uint(64), c_uint(32), e, c_int(0), c_int(0), c_int(0), c_int(0))
out["im2col_rank2"] = cu.cuTensorMapEncodeIm2col(c_void_p(base), c_int(F32), c_uint(2), c_void_p(d.value), g, s, lo,
                                                 hi, c_uint(64), c_uint(32), e, c_int(0), c_int(0), c_int(0), c_int(0))
print(json.dumps(out))
'''


def test_tensor_map_encode(emu_daemon):
    r = subprocess.run([sys.executable, "-c", APP], capture_output=True, text=True, timeout=60,
                       env=client_env(emu_daemon))
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout.strip().splitlines()[-1])
    rc, enc = o["ok"]
    assert rc == 0 and enc != "ee" * 128, "the map is filled"
    assert o["again"] == o["ok"], "deterministic"
    assert o["other_addr"][0] == 0 and o["other_addr"][1] != enc, "the address is part of the encoding"
    assert o["bad"] == {k: 1 for k in o["bad"]}, o["bad"]
    assert o["im2col"] == 0 and o["im2col_rank2"] == 1
    assert "not supported" not in r.stderr
