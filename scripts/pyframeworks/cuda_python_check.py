"""cuda-python (cuda.bindings) checks, run natively and under gpuproxy by
scripts/gpu_check.py (--python): the driver-API basic example (init,
context, NVRTC-free module from PTX, launch, copies) and a few runtime
calls. Prints one JSON object {check: "ok" | "FAIL: ..."}."""
import json

import numpy as np

from checks import check, results  # noqa: E402  (scripts/pyframeworks/checks.py)


from cuda.bindings import driver as drv  # noqa: E402
from cuda.bindings import runtime as rt  # noqa: E402

PTX = b"""
.version 7.0
.target sm_50
.address_size 64
.visible .entry scale(.param .u64 p, .param .f32 s, .param .u32 n)
{
  .reg .pred %p; .reg .b32 %r<6>; .reg .f32 %f<3>; .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [p]; ld.param.f32 %f1, [s]; ld.param.u32 %r1, [n];
  mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x;
  mad.lo.s32 %r5, %r2, %r3, %r4;
  setp.ge.u32 %p, %r5, %r1; @%p bra DONE;
  cvta.to.global.u64 %rd2, %rd1; mul.wide.u32 %rd3, %r5, 4; add.s64 %rd2, %rd2, %rd3;
  ld.global.f32 %f2, [%rd2]; mul.f32 %f2, %f2, %f1; st.global.f32 [%rd2], %f2;
DONE:
  ret;
}
"""


def ok(r):
    """cuda.bindings calls return (err,) or (err, value, ...)."""
    err, *vals = r if isinstance(r, tuple) else (r,)
    assert int(err) == 0, f"error {err!r}"
    return vals[0] if len(vals) == 1 else (tuple(vals) or None)


state = {}


@check("driver: cuInit/cuDeviceGet/cuCtxCreate")
def _():
    ok(drv.cuInit(0))
    dev = ok(drv.cuDeviceGet(0))
    try:   # cuda-python 13: cuCtxCreate(ctxCreateParams, flags, dev); 12: (flags, dev)
        state["ctx"] = ok(drv.cuCtxCreate(None, 0, dev))
    except TypeError:
        state["ctx"] = ok(drv.cuCtxCreate(0, dev))


@check("driver: module from PTX, launch, copies")
def _():
    mod = ok(drv.cuModuleLoadData(PTX))
    fn = ok(drv.cuModuleGetFunction(mod, b"scale"))
    n = 1000
    h = np.arange(n, dtype=np.float32)
    d = ok(drv.cuMemAlloc(h.nbytes))
    ok(drv.cuMemcpyHtoD(d, h.ctypes.data, h.nbytes))
    args = (np.array([int(d)], np.uint64), np.array([3.0], np.float32), np.array([n], np.uint32))
    ptrs = np.array([a.ctypes.data for a in args], np.uint64)
    ok(drv.cuLaunchKernel(fn, 4, 1, 1, 256, 1, 1, 0, 0, ptrs.ctypes.data, 0))
    out = np.empty_like(h)
    ok(drv.cuMemcpyDtoH(out.ctypes.data, d, h.nbytes))
    assert np.array_equal(out, 3 * h)
    ok(drv.cuMemFree(d))


@check("driver: streams and events")
def _():
    s = ok(drv.cuStreamCreate(0))
    e = ok(drv.cuEventCreate(0))
    ok(drv.cuEventRecord(e, s))
    ok(drv.cuStreamSynchronize(s))
    ok(drv.cuEventDestroy(e))
    ok(drv.cuStreamDestroy(s))


@check("runtime: cudaGetDeviceCount/cudaMalloc/cudaMemcpy")
def _():
    assert ok(rt.cudaGetDeviceCount()) >= 1
    p = ok(rt.cudaMalloc(4096))
    h = np.arange(1024, dtype=np.int32)
    ok(rt.cudaMemcpy(p, h.ctypes.data, 4096, rt.cudaMemcpyKind.cudaMemcpyHostToDevice))
    o = np.empty_like(h)
    ok(rt.cudaMemcpy(o.ctypes.data, p, 4096, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost))
    assert np.array_equal(o, h)
    ok(rt.cudaFree(p))


print(json.dumps(results, indent=1))
