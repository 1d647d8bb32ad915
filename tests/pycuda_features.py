"""pycuda driver features beyond the training example, one check per line
("name ok" or "name FAIL: ..."); tests/test_pycuda.py runs it under gpuproxy.
Each check compares with numpy what the GPU computed or copied."""
import sys

import numpy as np

import pycuda.autoinit  # noqa: F401
import pycuda.driver as cuda
from pycuda.compiler import SourceModule

SRC = r"""
__device__ int counter[4];
__global__ void add_to(float *a, float v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += v;
    if (i == 0) counter[0] += 1;
}
"""
failed = 0


def check(name):
    def deco(fn):
        global failed
        try:
            fn()
            print(f"{name} ok")
        except Exception as e:
            failed += 1
            print(f"{name} FAIL: {type(e).__name__}: {e}")
        return fn
    return deco


mod = SourceModule(SRC)
add_to = mod.get_function("add_to")


@check("context push/pop + device")
def _():
    ctx = cuda.Context.get_current()
    ctx.push()
    assert cuda.Context.get_device().name()
    cuda.Context.pop()
    assert cuda.Context.get_current() is not None


@check("mem_get_info")
def _():
    free, total = cuda.mem_get_info()
    assert 0 < free <= total


@check("launch + module global")
def _():
    a = np.arange(300, dtype=np.float32)
    g = cuda.to_device(a)
    add_to(g, np.float32(1.5), np.int32(300), block=(128, 1, 1), grid=(3, 1))
    assert np.array_equal(cuda.from_device_like(g, a), a + np.float32(1.5))
    ptr, size = mod.get_global("counter")
    c = np.zeros(4, np.int32)
    cuda.memcpy_dtoh(c, ptr)
    assert size == 16 and c[0] == 1, (size, c)


@check("prepared_call")
def _():
    a = np.zeros(64, np.float32)
    g = cuda.to_device(a)
    add_to.prepare("Pfi")
    add_to.prepared_call((1, 1), (64, 1, 1), g, np.float32(2), np.int32(64))
    assert np.array_equal(cuda.from_device_like(g, a), a + 2)


@check("function attributes")
def _():
    assert add_to.get_attribute(cuda.function_attribute.MAX_THREADS_PER_BLOCK) > 0
    assert add_to.num_regs >= 0


@check("mem_alloc_pitch + Memcpy2D")
def _():
    h = np.arange(7 * 33, dtype=np.float32).reshape(7, 33)
    d, pitch = cuda.mem_alloc_pitch(33 * 4, 7, 4)
    assert pitch >= 33 * 4
    c = cuda.Memcpy2D()
    c.set_src_host(h)
    c.set_dst_device(d)
    c.src_pitch, c.dst_pitch, c.width_in_bytes, c.height = 33 * 4, pitch, 33 * 4, 7
    c(aligned=True)
    back = np.zeros_like(h)
    c2 = cuda.Memcpy2D()
    c2.set_src_device(d)
    c2.set_dst_host(back)
    c2.src_pitch, c2.dst_pitch, c2.width_in_bytes, c2.height = pitch, 33 * 4, 33 * 4, 7
    c2(aligned=False)
    assert np.array_equal(back, h)
    cuda.memset_d2d8(d, pitch, 0x11, 5, 7)
    c2(aligned=True)
    assert np.all(back.view(np.uint8).reshape(7, -1)[:, :5] == 0x11)
    assert np.array_equal(back.view(np.uint8).reshape(7, -1)[:, 8:], h.view(np.uint8).reshape(7, -1)[:, 8:])


@check("Memcpy3D")
def _():
    h = np.arange(3 * 4 * 8, dtype=np.int32).reshape(3, 4, 8)
    d = cuda.mem_alloc(h.nbytes)
    c = cuda.Memcpy3D()
    c.set_src_host(h)
    c.set_dst_device(d)
    c.width_in_bytes = c.src_pitch = c.dst_pitch = 8 * 4
    c.height = c.src_height = c.dst_height = 4
    c.depth = 3
    c()
    assert np.array_equal(cuda.from_device_like(d, h), h)


@check("streams, events, async copies, page-locked memory")
def _():
    s = cuda.Stream()
    e1, e2 = cuda.Event(), cuda.Event()
    h = cuda.pagelocked_empty(1000, np.float32)
    h[:] = np.arange(1000)
    g = cuda.mem_alloc(h.nbytes)
    e1.record(s)
    cuda.memcpy_htod_async(g, h, s)
    add_to(g, np.float32(1), np.int32(1000), block=(256, 1, 1), grid=(4, 1), stream=s)
    out = cuda.pagelocked_empty_like(h)
    cuda.memcpy_dtoh_async(out, g, s)
    e2.record(s)
    e2.synchronize()
    assert e2.time_since(e1) >= 0 and s.is_done()
    assert np.array_equal(out, np.arange(1000, dtype=np.float32) + 1)


@check("memset_d32/d16/d8")
def _():
    g = cuda.mem_alloc(64)
    cuda.memset_d32(g, 0xDEADBEEF, 16)
    assert np.all(cuda.from_device(g, 16, np.uint32) == 0xDEADBEEF)
    cuda.memset_d16(g, 0x1234, 32)
    assert np.all(cuda.from_device(g, 32, np.uint16) == 0x1234)
    cuda.memset_d8(g, 7, 64)
    assert np.all(cuda.from_device(g, 64, np.uint8) == 7)


sys.exit(1 if failed else 0)
