"""Driver-API client for tests/test_slab.py: small allocations placed by
the shim (interceptor/slab.c), exercised through the shim's libcuda.so.1
with ctypes. Run as `python slab_client.py SCENARIO [args]` under a
proxyd (the test gives the environment). Each scenario prints result lines
that the test checks; an unexpected CUresult raises (exit status 1).

Every value checked comes from the device (a memset or a copy through the
worker, read back with cuMemcpyDtoH), never from this script's own
bookkeeping, so a block that overlaps another or lost its bytes shows.
"""
from __future__ import annotations

import ctypes
import os
import random
import sys
import threading

from gpuproxy.interceptor import lib_dir

cu = ctypes.CDLL(os.path.join(lib_dir(), "libcuda.so.1"))
u64 = ctypes.c_uint64
cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(u64), ctypes.c_size_t]
cu.cuMemFree_v2.argtypes = [u64]
cu.cuMemsetD8_v2.argtypes = [u64, ctypes.c_ubyte, ctypes.c_size_t]
cu.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, u64, ctypes.c_size_t]
cu.cuMemcpyHtoD_v2.argtypes = [u64, ctypes.c_void_p, ctypes.c_size_t]
cu.cuMemcpyDtoD_v2.argtypes = [u64, u64, ctypes.c_size_t]
cu.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(u64), ctypes.POINTER(ctypes.c_size_t), u64]
cu.cuMemFreeAsync.argtypes = [u64, ctypes.c_void_p]
cu.cuPointerGetAttributes.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_void_p),
                                      u64]

CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3
CU_MEMORYTYPE_DEVICE = 2


def ok(rc, what):
    if rc != 0:
        raise SystemExit(f"{what} failed: CUresult {rc}")


def init():
    ctx = ctypes.c_void_p()
    dev = ctypes.c_int()
    ok(cu.cuInit(0), "cuInit")
    ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return ctx


def alloc(n):
    p = u64()
    rc = cu.cuMemAlloc_v2(ctypes.byref(p), n)
    return rc, p.value


def must_alloc(n):
    rc, p = alloc(n)
    ok(rc, f"cuMemAlloc_v2({n})")
    return p


def read(p, n):
    buf = ctypes.create_string_buffer(n)
    ok(cu.cuMemcpyDtoH_v2(buf, p, n), "cuMemcpyDtoH")
    return buf.raw


def fill(p, n, byte):
    ok(cu.cuMemsetD8_v2(p, byte, n), "cuMemsetD8")


def addr_range(p):
    base, size = u64(), ctypes.c_size_t()
    rc = cu.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), p)
    return rc, base.value, size.value


def byte_of(i):
    return (i * 37 + 11) & 0xFF


def check_blocks(blocks) -> int:
    """Every live block still holds its byte, at both ends and the middle."""
    bad = 0
    for i, (p, n) in blocks.items():
        want = bytes([byte_of(i)])
        for off, m in ((0, min(n, 64)), (max(0, n - 64), min(n, 64)), (n // 2, 1)):
            if read(p + off, m) != want * m:
                bad += 1
                break
    return bad


def scenario_patterns():
    """Many small blocks: alignment, no overlap, contents, address ranges,
    frees (double, interior, unknown), reuse."""
    init()
    rnd = random.Random(13)
    blocks = {}
    for i in range(1500):
        n = rnd.choice((1, 4, 100, 256, 257, 1000, 4096, 5000, 65536, 200000))
        p = must_alloc(n)
        fill(p, n, byte_of(i))
        blocks[i] = (p, n)
    print("aligned", all(p % 256 == 0 for p, _ in blocks.values()))
    spans = sorted((p, p + n) for p, n in blocks.values())
    print("disjoint", all(a[1] <= b[0] for a, b in zip(spans, spans[1:])))
    print("bad after fill", check_blocks(blocks))
    # address ranges: base and requested size, from the start and from inside
    good = 0
    for i, (p, n) in list(blocks.items())[::50]:
        r0 = addr_range(p)
        r1 = addr_range(p + n - 1)
        good += r0 == (0, p, n) and r1 == (0, p, n)
    print("ranges", good, len(list(blocks.items())[::50]))
    # pointer attributes of a block: device memory, the pointer itself
    mt = ctypes.c_uint()
    dp = u64()
    attrs = (ctypes.c_int * 2)(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_POINTER)
    data = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.byref(mt), ctypes.c_void_p),
                                 ctypes.cast(ctypes.byref(dp), ctypes.c_void_p))
    ok(cu.cuPointerGetAttributes(2, attrs, data, blocks[3][0] + 8), "cuPointerGetAttributes")
    print("attributes", mt.value == CU_MEMORYTYPE_DEVICE, dp.value == blocks[3][0] + 8)
    # a copy crossing from one block into the next one is fine (one slab)
    a, b = must_alloc(256), must_alloc(256)
    if os.environ.get("GPUPROXY_SLAB") == "0":
        print("crossing", "refused by the worker without slabs")
    elif b == a + 256:
        fill(a, 512, 0x5A)
        print("crossing", read(a, 512) == b"\x5a" * 512)
    else:
        print("crossing", "not adjacent")
    ok(cu.cuMemFree_v2(a), "free a")
    ok(cu.cuMemFree_v2(b), "free b")
    # free every other block; errors as the driver gives them
    freed = [i for i in blocks if i % 2 == 0]
    for i in freed:
        ok(cu.cuMemFree_v2(blocks[i][0]), "cuMemFree_v2")
    p0 = blocks[freed[0]][0]
    print("double free", cu.cuMemFree_v2(p0))
    p1, n1 = blocks[1]
    print("interior free", cu.cuMemFree_v2(p1 + 256) if n1 > 256 else 1)
    print("range of freed", addr_range(p0)[0])
    print("free async of a block", cu.cuMemFreeAsync(blocks[1][0], None))
    del blocks[1]
    freed_addrs = {blocks[i][0] for i in freed}
    for i in freed:
        del blocks[i]
    print("bad after frees", check_blocks(blocks))
    # reuse: new blocks land in freed space, never on a live block
    fresh = {}
    for i in range(2000, 2600):
        n = rnd.choice((64, 512, 3000, 20000))
        p = must_alloc(n)
        fill(p, n, byte_of(i))
        fresh[i] = (p, n)
    blocks.update(fresh)
    spans = sorted((p, p + n) for p, n in blocks.values())
    print("disjoint after reuse", all(a[1] <= b[0] for a, b in zip(spans, spans[1:])))
    print("reused", sum(1 for p, _ in fresh.values() if p in freed_addrs) > 100)
    print("bad at end", check_blocks(blocks))
    for p, _ in blocks.values():
        ok(cu.cuMemFree_v2(p), "cuMemFree_v2")
    print("done")


def scenario_fence():
    """A free with no op since the last synchronisation stays local; one
    after queued work synchronises first (counted by the test in the call
    profile)."""
    init()
    # warm up: the slab exists and the first free's fence is behind us
    ok(cu.cuMemFree_v2(must_alloc(256)), "free")
    for _ in range(100):                 # no GPU work in between: no op at all
        ok(cu.cuMemFree_v2(must_alloc(256)), "free")
    stream = ctypes.c_void_p()
    ok(cu.cuStreamCreate(ctypes.byref(stream), 0), "cuStreamCreate")
    cu.cuMemsetD8Async.argtypes = [u64, ctypes.c_ubyte, ctypes.c_size_t, ctypes.c_void_p]
    for k in range(10):                  # queued work before each free: 10 synchronisations
        p = must_alloc(4096)
        ok(cu.cuMemsetD8Async(p, 0x11 + k, 4096, stream), "cuMemsetD8Async")
        ok(cu.cuMemFree_v2(p), "free")
        q = must_alloc(4096)             # the same range again: the memset finished before the free
        fill(q, 4096, 0x77)
        print("reuse", q == p, read(q, 4096) == b"\x77" * 4096)
        ok(cu.cuMemFree_v2(q), "free")
    for k in range(5):                   # the application synchronised itself: no second synchronisation
        p = must_alloc(4096)
        ok(cu.cuMemsetD8Async(p, 0x21 + k, 4096, stream), "cuMemsetD8Async")
        ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        ok(cu.cuMemFree_v2(p), "free")
    print("done")


def scenario_oom():
    """Out of memory reported by the cuMemAlloc that needs a slab (the
    daemon's emulated device is small)."""
    init()
    live = []
    rc = 0
    for _ in range(100000):
        rc, p = alloc(65536)
        if rc != 0:
            break
        live.append(p)
    print("oom", rc, len(live) > 0)
    # the blocks it did get are usable, and a free makes room again
    fill(live[-1], 65536, 0x42)
    print("last block", read(live[-1], 65536) == b"\x42" * 65536)
    ok(cu.cuMemFree_v2(live[0]), "free")
    rc2, p2 = alloc(65536)
    print("after free", rc2, p2 == live[0])
    print("done")


def scenario_threads():
    """Threads allocating, filling, checking and freeing at once."""
    init()
    errors = []

    def work(t):
        ctx = ctypes.c_void_p()
        ok(cu.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        rnd = random.Random(t)
        mine = []
        for i in range(300):
            n = rnd.choice((16, 300, 4096, 30000))
            p = must_alloc(n)
            fill(p, n, (t * 50 + i) & 0xFF)
            mine.append((p, n, (t * 50 + i) & 0xFF))
            if len(mine) > 20:
                q, m, b = mine.pop(rnd.randrange(len(mine)))
                if read(q, m) != bytes([b]) * m:
                    errors.append((t, i))
                ok(cu.cuMemFree_v2(q), "free")
        for q, m, b in mine:
            if read(q, m) != bytes([b]) * m:
                errors.append((t, "end"))
            ok(cu.cuMemFree_v2(q), "free")

    ctx = ctypes.c_void_p()
    ok(cu.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")

    def run(t):
        ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        work(t)

    ts = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print("thread errors", len(errors))
    print("done")


def scenario_fork():
    """A forked child starts a session of its own: the parent's slabs are
    not there, its own blocks work; the parent's blocks are untouched."""
    init()
    blocks = {i: (must_alloc(1000), 1000) for i in range(20)}
    for i, (p, n) in blocks.items():
        fill(p, n, byte_of(i))
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            cu.cuCtxSetCurrent(None)
            init()
            p = must_alloc(1000)
            fill(p, 1000, 0x99)
            code = 0 if read(p, 1000) == b"\x99" * 1000 else 2
            ok(cu.cuMemFree_v2(p), "child free")
        except SystemExit as e:
            print("child:", e, flush=True)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status))
    print("bad in parent", check_blocks(blocks))
    print("done")


def scenario_runtime():
    """The runtime's allocation calls reach the slabs through cuMemAlloc:
    cudaMalloc, cudaMallocPitch, cudaFree (errors as cudaError_t)."""
    rt = ctypes.CDLL(os.path.join(lib_dir(), "libcudart.so.13"))
    vp = ctypes.c_void_p
    rt.cudaMalloc.argtypes = [ctypes.POINTER(vp), ctypes.c_size_t]
    rt.cudaFree.argtypes = [vp]
    rt.cudaMemset.argtypes = [vp, ctypes.c_int, ctypes.c_size_t]
    rt.cudaMemcpy.argtypes = [vp, vp, ctypes.c_size_t, ctypes.c_int]
    rt.cudaMallocPitch.argtypes = [ctypes.POINTER(vp), ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t,
                                   ctypes.c_size_t]
    ptrs = []
    for i in range(64):
        p = vp()
        ok(rt.cudaMalloc(ctypes.byref(p), 100 + i), "cudaMalloc")
        ok(rt.cudaMemset(p, i, 100 + i), "cudaMemset")
        ptrs.append(p.value)
    buf = ctypes.create_string_buffer(200)
    good = 0
    for i, p in enumerate(ptrs):
        ok(rt.cudaMemcpy(buf, p, 100 + i, 2), "cudaMemcpy")
        good += buf.raw[:100 + i] == bytes([i]) * (100 + i)
    print("runtime blocks", good, all(p % 256 == 0 for p in ptrs))
    pp, pitch = vp(), ctypes.c_size_t()
    ok(rt.cudaMallocPitch(ctypes.byref(pp), ctypes.byref(pitch), 100, 10), "cudaMallocPitch")
    rc, base, size = addr_range(pp.value)
    print("pitched", pitch.value, rc, base == pp.value, size == pitch.value * 10)
    ok(rt.cudaFree(pp), "cudaFree pitched")
    for p in ptrs:
        ok(rt.cudaFree(p), "cudaFree")
    print("double cudaFree", rt.cudaFree(ptrs[0]))
    big = vp()
    print("oom", rt.cudaMalloc(ctypes.byref(big), 1 << 50))
    print("done")


if __name__ == "__main__":
    globals()["scenario_" + sys.argv[1]]()
