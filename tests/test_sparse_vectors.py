"""cuSPARSE's sparse vectors (issue 26, part 3): the SpVec descriptor
(cusparseCreateSpVec/Const, SpVecGet, GetIndexBase, GetValues, SetValues,
DestroySpVec) and the generic-API calls that take it -- cusparseGather (what
CuPy 14's csrsort/cscsort/coosort call when the legacy cusparse<t>gthr is
gone), cusparseScatter, cusparseSpVV (+ bufferSize) in host and device
pointer mode -- through the stand-in libcusparse.so.12 and the emulated
backend, each result against numpy indexing on the host; and a sparse
vector that is used (Gather, SpVV) after a GPU-only dump and a restore into
a fresh proxyd, its SetValues replayed.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from test_sparse_generic import PRELUDE, _run, dump_and_restore

SPVEC_PRELUDE = PRELUDE + r"""
C64F = 5                                    # cudaDataType CUDA_C_64F
for n, a in {"cusparseCreateSpVec": [P, I64, I64, P, P, I32, I32, I32],
             "cusparseCreateConstSpVec": [P, I64, I64, P, P, I32, I32, I32],
             "cusparseDestroySpVec": [P], "cusparseSpVecGet": [P, P, P, P, P, P, P, P],
             "cusparseConstSpVecGet": [P, P, P, P, P, P, P, P],
             "cusparseSpVecGetIndexBase": [P, P], "cusparseSpVecGetValues": [P, P],
             "cusparseConstSpVecGetValues": [P, P], "cusparseSpVecSetValues": [P, P],
             "cusparseGather": [P, P, P], "cusparseScatter": [P, P, P],
             "cusparseSpVV_bufferSize": [P, I32, P, P, P, I32, P], "cusparseSpVV": [P, I32, P, P, P, I32, P],
             "cusparseSetPointerMode": [P, I32]}.items():
    getattr(sp, n).argtypes = a
"""

SCRIPT = SPVEC_PRELUDE + r"""
n = 10
yv = np.arange(1.0, n + 1) * 1.5                 # the dense vector
idx = np.array([7, 0, 3, 9], np.int32)            # unsorted, as CuPy's permutations are
dy = dev(yv); vy = c_void_p(); ok(sp.cusparseCreateDnVec(byref(vy), n, dy, R64F), "DnVec y")
di = dev(idx); dx = empty(4, np.float64)
vx = c_void_p(); ok(sp.cusparseCreateSpVec(byref(vx), n, 4, di, dx, I32T, 0, R64F), "CreateSpVec")
# the getters answer what the create named
s, z, pi, pv, it, b, vt = c_int64(), c_int64(), c_void_p(), c_void_p(), c_int(), c_int(), c_int()
ok(sp.cusparseSpVecGet(vx, byref(s), byref(z), byref(pi), byref(pv), byref(it), byref(b), byref(vt)), "SpVecGet")
out["get"] = [s.value, z.value, pi.value == di.value, pv.value == dx.value, it.value, b.value, vt.value]
ok(sp.cusparseConstSpVecGet(vx, byref(s), byref(z), byref(pi), byref(pv), byref(it), byref(b), byref(vt)), "Const")
out["cget"] = [s.value, z.value, pi.value == di.value, pv.value == dx.value]
ok(sp.cusparseSpVecGetIndexBase(vx, byref(b)), "GetIndexBase"); out["base"] = b.value
ok(sp.cusparseSpVecGetValues(vx, byref(pv)), "GetValues"); out["getvalues"] = pv.value == dx.value
# Gather: x.values = y[idx]
ok(sp.cusparseGather(h, vy, vx), "Gather")
out["gather"] = host(dx, 4, np.float64).tolist()
# Scatter of other values into a zeroed dense vector: y2[idx] = v
v = np.array([-1.0, 2.0, -3.0, 4.0]); dv = dev(v)
ok(sp.cusparseSpVecSetValues(vx, dv), "SetValues")
ok(sp.cusparseConstSpVecGetValues(vx, byref(pv)), "ConstGetValues"); out["setvalues"] = pv.value == dv.value
dy2 = dev(np.full(n, 0.5)); vy2 = c_void_p(); ok(sp.cusparseCreateDnVec(byref(vy2), n, dy2, R64F), "DnVec y2")
ok(sp.cusparseScatter(h, vx, vy2), "Scatter")
out["scatter"] = host(dy2, n, np.float64).tolist()
# SpVV, host pointer mode: sum v * y[idx]
bs = c_size_t(); res = c_double(0)
ok(sp.cusparseSpVV_bufferSize(h, 0, vx, vy, byref(res), R64F, byref(bs)), "SpVV_bufferSize")
buf = empty(max(bs.value, 1), np.uint8)
ok(sp.cusparseSpVV(h, 0, vx, vy, byref(res), R64F, buf), "SpVV"); out["spvv"] = res.value
# SpVV, device pointer mode: the result lands in device memory
dres = empty(1, np.float64)
ok(sp.cusparseSetPointerMode(h, 1), "device mode")
ok(sp.cusparseSpVV(h, 0, vx, vy, dres, R64F, buf), "SpVV device")
ok(sp.cusparseSetPointerMode(h, 0), "host mode")
out["spvv_dev"] = host(dres, 1, np.float64)[0]
# a one-based, 64-bit-index, complex const vector: SpVV with the conjugate
ci = np.array([2, 5], np.int64); cv = np.array([1 + 2j, -3 + 0.5j]); cy = np.arange(n) + 1j * np.arange(n)[::-1]
vcx = c_void_p()
ok(sp.cusparseCreateConstSpVec(byref(vcx), n, 2, dev(ci), dev(cv), I64T, 1, C64F), "CreateConstSpVec")
vcy = c_void_p(); ok(sp.cusparseCreateDnVec(byref(vcy), n, dev(cy), C64F), "DnVec cy")
cres = (c_double * 2)()
ok(sp.cusparseSpVV(h, 2, vcx, vcy, cres, C64F, buf), "SpVV conj")
out["spvv_c"] = [cres[0], cres[1]]
for d in (vx, vcx):
    ok(sp.cusparseDestroySpVec(d), "DestroySpVec")
ok(sp.cusparseDestroyDnVec(vy), "DestroyDnVec")
out.update(y=yv.tolist(), idx=idx.tolist(), v=v.tolist(), ci=ci.tolist(), cv=[[c.real, c.imag] for c in cv],
           cy=[[c.real, c.imag] for c in cy])
print(json.dumps(out))
"""


def test_sparse_vectors_against_numpy(emu_daemon):
    r = _run(emu_daemon, SCRIPT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not supported" not in r.stderr, r.stderr
    o = json.loads(r.stdout)
    y, idx, v = np.array(o["y"]), np.array(o["idx"]), np.array(o["v"])
    assert o["get"] == [10, 4, True, True, 2, 0, 1]          # _32I, BASE_ZERO, R_64F
    assert o["cget"] == [10, 4, True, True] and o["base"] == 0
    assert o["getvalues"] and o["setvalues"]
    np.testing.assert_array_equal(o["gather"], y[idx])
    want = np.full(10, 0.5)
    want[idx] = v
    np.testing.assert_array_equal(o["scatter"], want)
    assert o["spvv"] == pytest.approx(float(np.dot(v, y[idx])))
    assert o["spvv_dev"] == pytest.approx(float(np.dot(v, y[idx])))
    ci = np.array(o["ci"]) - 1                                 # one-based
    cv = np.array([complex(*c) for c in o["cv"]])
    cy = np.array([complex(*c) for c in o["cy"]])
    want_c = np.sum(np.conj(cv) * cy[ci])
    assert complex(*o["spvv_c"]) == pytest.approx(want_c)


RESTORE = SPVEC_PRELUDE + r"""
n = 6
yv = np.array([10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
idx = np.array([4, 1, 5], np.int32)
dy = dev(yv); vy = c_void_p(); ok(sp.cusparseCreateDnVec(byref(vy), n, dy, R64F), "DnVec")
di = dev(idx); dx0 = empty(3, np.float64); dx = empty(3, np.float64)
vx = c_void_p(); ok(sp.cusparseCreateSpVec(byref(vx), n, 3, di, dx0, I32T, 0, R64F), "CreateSpVec")
ok(sp.cusparseSpVecSetValues(vx, dx), "SetValues")           # replayed on restore
ok(sp.cusparseGather(h, vy, vx), "Gather before")
ok(rt.cudaDeviceSynchronize(), "sync")
before = host(dx, 3, np.float64).tolist()
print("ready", flush=True)
sys.stdin.readline()                                          # dump, restore into a fresh proxyd
s, z, pi, pv, it, b, vt = c_int64(), c_int64(), c_void_p(), c_void_p(), c_int(), c_int(), c_int()
ok(sp.cusparseSpVecGet(vx, byref(s), byref(z), byref(pi), byref(pv), byref(it), byref(b), byref(vt)), "Get after")
kept = host(dx, 3, np.float64).tolist()                       # device memory came back
dz = empty(n, np.float64); vz = c_void_p(); ok(sp.cusparseCreateDnVec(byref(vz), n, dz, R64F), "DnVec z")
ok(sp.cusparseScatter(h, vx, vz), "Scatter after")            # z[idx] = x (what Gather put there)
ok(rt.cudaDeviceSynchronize(), "sync")
scattered = host(dz, n, np.float64).tolist()
ok(rt.cudaMemcpy(dy, np.full(n, 2.0).ctypes.data, 8 * n, 1), "new y")
ok(sp.cusparseGather(h, vy, vx), "Gather after")
res = c_double(0)
ok(sp.cusparseSpVV(h, 0, vx, vy, byref(res), R64F, empty(256, np.uint8)), "SpVV after")
ok(rt.cudaDeviceSynchronize(), "sync")
print(json.dumps({"before": before, "kept": kept, "get": [s.value, z.value, pv.value == dx.value],
                  "gather": host(dx, 3, np.float64).tolist(), "spvv": res.value, "want": yv[idx].tolist(),
                  "scattered": scattered, "idx": idx.tolist()}))
"""


@pytest.mark.slow
def test_sparse_vector_survives_a_restore(tmp_path):
    """A sparse vector created before a GPU-only dump is recreated with its
    device addresses (and its SetValues replayed) in a fresh proxyd:
    Gather, Scatter and SpVV work on it afterwards."""
    from gpuproxy.proxyd._generated import FUNCTIONS

    def check_image(libs):
        spvecs = [o for o in libs if o["kind"] == "cusparse_spvec"]
        assert len(spvecs) == 1 and FUNCTIONS[spvecs[0]["create"][0]].name == "cusparseCreateSpVec"
        assert [FUNCTIONS[f].name for f, _ in spvecs[0]["settings"]] == ["cusparseSpVecSetValues"]
    o = dump_and_restore(RESTORE, tmp_path, "spvec", check_image)
    assert o["before"] == o["want"] and o["kept"] == o["want"]
    assert o["get"] == [6, 3, True]
    z = np.zeros(6)
    z[o["idx"]] = o["want"]
    assert o["scattered"] == z.tolist()
    assert o["gather"] == [2.0, 2.0, 2.0]
    assert o["spvv"] == pytest.approx(2.0 * 2.0 * 3)
