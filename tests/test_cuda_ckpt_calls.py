"""The cuda backend's checkpoint copy paths (lanes, fences, background
pinning, batched device hashing) against a recording stand-in for the
driver: the driver calls they make, in which order and how often. Runs
without a GPU; the GPU run (scripts/gpu-check, bench suite checkpoint)
checks the data."""
from __future__ import annotations

import threading

import pytest

cffi = pytest.importorskip("cffi")
from gpuproxy.proxyd import cuda_backend as CB  # noqa: E402


@pytest.fixture
def backend():
    ffi = cffi.FFI()
    ffi.cdef(CB.HAND_CDEF)
    calls = []
    handles = iter(range(0x1000, 0x100000, 0x10))

    class Lib:
        def __getattr__(self, name):
            def f(*a):
                calls.append((name, a))
                if name in ("cuEventCreate", "cuStreamCreate"):
                    a[0][0] = ffi.cast("void *", next(handles))
                if name == "cuMemAlloc_v2":
                    a[0][0] = 0x7000000
                return 0
            return f
    b = object.__new__(CB.CudaBackend)
    b.ffi, b.lib, b.mgmt, b._tls = ffi, Lib(), {0: 0x55, 1: 0x66}, threading.local()
    b._hash_fns = {0: 0x99, 1: 0x98}
    b.calls = calls
    return b


def names(b, name):
    return [a for n, a in b.calls if n == name]


def test_fences_wait_on_their_event_and_events_are_reused_per_device(backend):
    b = backend
    f = b.lane_fence(0, 1)
    b.wait_fence(f)
    g = b.lane_fence(0, 1)
    assert g == f                                    # the event came back from the free list
    h = b.lane_fence(1, 0)
    assert h[0] == 1 and h[1] != f[1]                # another device's context: its own event
    assert len(names(b, "cuEventCreate")) == 2
    rec = names(b, "cuEventRecord")
    assert int(b.ffi.cast("uintptr_t", rec[0][0])) == f[1]
    b.wait_fence(g)
    b.wait_fence(h)
    assert len(names(b, "cuEventSynchronize")) == 3


def test_copies_go_on_lane_streams_and_sync_covers_all_lanes(backend):
    b = backend
    buf = memoryview(bytearray(8192))
    b.read_device_async(0, 0x100, 4096, buf[:4096], lane=0)
    b.write_device_async(0, 0x200, buf[4096:], lane=1)
    d2h, h2d = names(b, "cuMemcpyDtoHAsync_v2")[0], names(b, "cuMemcpyHtoDAsync_v2")[0]
    assert d2h[1:3] == (0x100, 4096) and h2d[0] == 0x200 and h2d[2] == 4096
    assert d2h[3] != h2d[3]                          # two lanes, two streams
    b.sync_copies(0)
    synced = {int(b.ffi.cast("uintptr_t", a[0])) for a in names(b, "cuStreamSynchronize")}
    assert synced == {int(b.ffi.cast("uintptr_t", d2h[3])), int(b.ffi.cast("uintptr_t", h2d[3]))}


def test_hash_many_is_one_launch_per_span_and_one_sync(backend):
    b = backend
    out = b.hash_device_many(0, [(0x1000, 5 << 20), (0x900000, 4096), (0xA00000, 0)], 2 << 20)
    assert [len(x) for x in out] == [3, 1, 0]
    launches = names(b, "cuLaunchKernel")
    assert [a[1] for a in launches] == [3, 1]          # grid: one block per chunk
    assert len(names(b, "cuStreamSynchronize")) == 1 and len(names(b, "cuMemcpyDtoH_v2")) == 1


def test_pool_pins_in_segments_and_gives_them_back(backend, monkeypatch):
    from gpuproxy.proxyd import pinned_pool
    b = backend
    monkeypatch.setattr(pinned_pool, "SEGMENT", 1 << 20)
    view = b.host_buffer(3 << 20)
    assert len(view) >= 3 << 20
    assert b.wait_pinned(0, 3 << 20) >= 0
    assert b.segment_end(5) == 1 << 20 and b.segment_end(1 << 20) == 2 << 20
    st = b.pool_stats()
    assert st["all_pinned"] and st["segments"] == 3 and st["failed"] is None
    regs = names(b, "cuMemHostRegister_v2")
    assert sorted(a[1] for a in regs) == [1 << 20] * 3
    b.release_host_buffer()
    assert len(names(b, "cuMemHostUnregister")) == 3 and b.pool_stats() is None


def test_pool_segment_that_cannot_be_pinned_stays_usable(backend):
    b = backend
    real = b.lib

    class Refuse:
        def __getattr__(self, name):
            if name == "cuMemHostRegister_v2":
                return lambda *a: 2        # CUDA_ERROR_OUT_OF_MEMORY
            return getattr(real, name)
    b.lib = Refuse()
    view = b.host_buffer(1 << 20)
    b.wait_pinned(0, 1 << 20)
    assert "cuMemHostRegister" in b.pool_stats()["failed"]
    view[:4] = b"abcd"                             # pageable, but memory all the same
    b.release_host_buffer()
