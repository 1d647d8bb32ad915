"""proxyd's native launch path (proxyd/native/gpxd.c), checked against a fake
driver that records the launches it receives: same handles, dimensions,
argument bytes and order as the Python path would pass. No GPU needed."""
import ctypes
import os
import shutil
import subprocess

import msgpack
import pytest

FAKE = r'''
#include <stdint.h>
#include <string.h>
typedef int CUresult;
struct rec { uintptr_t f, s, ctx; unsigned d[7]; size_t n; unsigned char p[64]; };
struct rec recs[64]; int nrecs; uintptr_t cur; int fail_at = -1;
CUresult cuCtxSetCurrent(void *c) { cur = (uintptr_t)c; return 0; }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned sh, void *s, void **kp, void **extra) {
    if (nrecs == fail_at) return 719;
    struct rec *r = &recs[nrecs++];
    r->f = (uintptr_t)f; r->s = (uintptr_t)s; r->ctx = cur;
    unsigned d[7] = {gx, gy, gz, bx, by, bz, sh}; memcpy(r->d, d, sizeof d);
    r->n = 0;
    if (extra) { r->n = *(size_t *)extra[3]; memcpy(r->p, extra[1], r->n < 64 ? r->n : 64); }
    return 0;
}
'''


class Rec(ctypes.Structure):
    _fields_ = [("f", ctypes.c_size_t), ("s", ctypes.c_size_t), ("ctx", ctypes.c_size_t),
                ("d", ctypes.c_uint * 7), ("n", ctypes.c_size_t), ("p", ctypes.c_ubyte * 64)]


@pytest.fixture
def native(tmp_path):
    from gpuproxy.proxyd.backends import native as nat
    if not os.path.exists(nat.LIB) or not shutil.which("cc"):
        pytest.skip("native helper not built or no C compiler")
    src = tmp_path / "fake.c"
    src.write_text(FAKE)
    lib = tmp_path / "libfakecuda.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    fake = ctypes.CDLL(str(lib))
    n = nat.Native(str(lib), [77, 78])
    return n, fake


def test_runs_launches_and_stops_at_other_ops(native):
    n, fake = native
    slot = 3
    n.lib.gpx_set(slot, 1, 1, 0xC0)        # context 1
    n.lib.gpx_set(slot, 3, 5, 0xF5)        # function 5
    n.lib.gpx_set(slot, 4, 2, 0x52)        # stream 2
    ctx, fn, st = (1 << 32) | 1, (3 << 32) | 5, (4 << 32) | 2
    ops = [[77, ctx, fn, 2, 1, 1, 128, 1, 1, 0, st, b"\x01\x02\x03\x04", None],
           [78, ctx, fn, 1, 1, 1, 32, 1, 1, 64, 0, b"", None],
           [5, ctx, 1, 2],                                  # another function: left to Python
           [77, ctx, fn, 9, 9, 9, 1, 1, 1, 0, 1, b"\xAA" * 20, None]]
    raw = msgpack.packb([1, 10, ops])
    off, count = n.ops_start(raw)
    assert count == 4
    done, off, err, _ = n.run_launches(slot, raw, off, 4)
    assert (done, err) == (2, 0)
    recs = (Rec * 64).in_dll(fake, "recs")
    assert ctypes.c_int.in_dll(fake, "nrecs").value == 2
    assert (recs[0].f, recs[0].s, recs[0].ctx) == (0xF5, 0x52, 0xC0)
    assert list(recs[0].d) == [2, 1, 1, 128, 1, 1, 0] and bytes(recs[0].p[:4]) == b"\x01\x02\x03\x04"
    assert recs[1].s == 0 and recs[1].n == 0 and recs[1].d[6] == 64
    # the third op is Python's; the fourth runs after skipping it
    assert n.run_launches(slot, raw, off, 2)[0] == 0
    off = n.skip(raw, off)
    done, off, err, _ = n.run_launches(slot, raw, off, 1)
    assert done == 1 and recs[2].s == 1 and recs[2].n == 20 and off == len(raw)


def test_unknown_handle_left_to_python_and_failure_reported(native):
    n, fake = native
    n.lib.gpx_set(0, 3, 1, 0xF1)
    ops = [[77, 0, (3 << 32) | 9, 1, 1, 1, 1, 1, 1, 0, 0, b"", None]]     # function 9 unknown
    raw = msgpack.packb([1, 1, ops])
    off, _ = n.ops_start(raw)
    assert n.run_launches(0, raw, off, 1)[0] == 0
    ctypes.c_int.in_dll(fake, "fail_at").value = ctypes.c_int.in_dll(fake, "nrecs").value
    ops = [[77, 0, (3 << 32) | 1, 1, 1, 1, 1, 1, 1, 0, 0, b"", None]] * 2
    raw = msgpack.packb([1, 2, ops])
    off, _ = n.ops_start(raw)
    done, off, err, idx = n.run_launches(0, raw, off, 2)
    assert (done, err, idx) == (1, 719, 0)
