"""numba-cuda checks, run natively and under gpuproxy by scripts/gpu_check.py
(--python, step frameworks): @cuda.jit kernels (NVVM -> PTX, then the
driver's JIT linker and module loading), device arrays, copies, streams,
events, shared memory, atomics, device functions, a reduction. Each result
is checked against numpy on the host. Prints one JSON object
{check: "ok" | "FAIL: ..."}."""
import json
import math
import sys

import numpy as np

from checks import check, results  # noqa: E402  (scripts/pyframeworks/checks.py)


# numba-cuda 0.30.4 registers an overload for np.row_stack at import, which
# numpy 2.5 (the GPU machine's) removed: natively too, numba.cuda would not
# import. The alias (numpy's own deprecated spelling of vstack) is set for
# both runs alike; it changes nothing gpuproxy sees.
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

try:
    from numba import cuda
except Exception as e:   # not installed, or numpy too new for this numba
    print(json.dumps({"import": f"FAIL: {type(e).__name__}: {e}"[:300]}))
    sys.exit(0)


@check("detect")
def _():
    assert cuda.is_available()
    assert len(cuda.gpus) >= 1


@cuda.jit
def axpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


@check("jit_kernel")
def _():
    n = 100_000
    x = np.arange(n, dtype=np.float32)
    y = np.ones(n, dtype=np.float32)
    d_out = cuda.device_array_like(x)
    axpy[(n + 255) // 256, 256](d_out, np.float32(2.5), cuda.to_device(x), cuda.to_device(y))
    assert np.array_equal(d_out.copy_to_host(), np.float32(2.5) * x + y)


@cuda.jit(device=True)
def poly(v):
    return v * v + 3.0 * v + 1.0


@cuda.jit
def apply_poly(a):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = poly(a[i]) + math.sqrt(abs(a[i]))


@check("device_function_and_libdevice")
def _():
    a = np.linspace(-5, 5, 4096).astype(np.float64)
    d = cuda.to_device(a)
    apply_poly[16, 256](d)
    assert np.allclose(d.copy_to_host(), a * a + 3 * a + 1 + np.sqrt(np.abs(a)), rtol=1e-12)


@cuda.jit
def block_sum(x, out):
    buf = cuda.shared.array(256, dtype=np.float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    buf[t] = x[i] if i < x.size else 0.0
    cuda.syncthreads()
    s = 128
    while s > 0:
        if t < s:
            buf[t] += buf[t + s]
        cuda.syncthreads()
        s //= 2
    if t == 0:
        cuda.atomic.add(out, 0, buf[0])


@check("shared_memory_atomics_reduction")
def _():
    x = (np.arange(1 << 16) % 7).astype(np.float32)
    out = cuda.to_device(np.zeros(1, np.float32))
    block_sum[(x.size + 255) // 256, 256](cuda.to_device(x), out)
    assert out.copy_to_host()[0] == x.sum()


@check("streams_events_pinned")
def _():
    s = cuda.stream()
    h = cuda.pinned_array(1 << 20, dtype=np.int32)
    h[:] = np.arange(h.size, dtype=np.int32)
    d = cuda.to_device(h, stream=s)
    e0, e1 = cuda.event(), cuda.event()
    e0.record(s)
    axpy[(h.size + 255) // 256, 256, s](d, np.int32(2), d, d)
    e1.record(s)
    back = d.copy_to_host(stream=s)
    s.synchronize()
    assert np.array_equal(back, 3 * np.arange(h.size, dtype=np.int32))
    assert e0.elapsed_time(e1) >= 0.0


@check("memory_info")
def _():
    free, total = cuda.current_context().get_memory_info()
    assert 0 < free <= total


print(json.dumps(results))
