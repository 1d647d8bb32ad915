"""The cuda backend's checkpoint copy paths (lanes, fences, background
pinning, batched device hashing) against a recording stand-in for the
driver: the driver calls they make, in which order and how often. Runs
without a GPU; the GPU run (scripts/gpu-check, bench suite checkpoint)
checks the data."""
from __future__ import annotations

import threading

import pytest

cffi = pytest.importorskip("cffi")
from gpuproxy.proxyd.backends import cuda as CB  # noqa: E402


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
    from gpuproxy.proxyd.backends import pinned_pool
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


# ---- restore by DMA from the image's mapping (checkpoint/direct_upload.py)

def _fake_image(size):
    from types import SimpleNamespace as NS
    data = bytearray(size)
    im = NS(memory_size=lambda: size, _memory=lambda populate=False: data, _file=lambda name: "/nowhere/" + name)
    return NS(chain=[im]), data


def _refs(addr, n, chunk):
    from types import SimpleNamespace as NS
    from gpuproxy.proxyd.checkpoint.engine import Piece
    refs = [NS(addr=addr + o, offset=o, length=chunk, image=0, compressed=False, disk_length=chunk)
            for o in range(0, n, chunk)]
    return refs, {r.addr: Piece(r.addr, chunk, 0, addr) for r in refs}


def test_direct_upload_registers_read_only_segments_and_unregisters_after_their_fences(backend, monkeypatch):
    from gpuproxy.proxyd.checkpoint import direct_upload as DU
    b = backend
    M = 1 << 20
    monkeypatch.setenv("GPUPROXY_RESTORE_DIRECT", "1")
    monkeypatch.setenv("GPUPROXY_RESTORE_REG_MB", "4")
    monkeypatch.setenv("GPUPROXY_RESTORE_REG_THREADS", "3")
    img, data = _fake_image(16 * M)
    refs, pieces = _refs(0x7f0000000000, 16 * M, 2 * M)
    rest, st = DU.upload(b, img, refs, pieces, span=False, lanes=2)
    assert rest == [] and st["segments"] == 4 and st["bytes"] == 16 * M and st["failed_segments"] == 0
    base = int(b.ffi.cast("uintptr_t", b.ffi.from_buffer(data)))
    regs = names(b, "cuMemHostRegister_v2")
    assert sorted((int(b.ffi.cast("uintptr_t", a[0])) - base, a[1]) for a in regs) == \
        [(k * 4 * M, 4 * M) for k in range(4)]
    assert all(a[2] == CB.CU_MEMHOSTREGISTER_PORTABLE | CB.CU_MEMHOSTREGISTER_READ_ONLY for a in regs)
    # one copy per segment (four 2 MiB chunks contiguous in file and memory), each inside its segment
    h2d = names(b, "cuMemcpyHtoDAsync_v2")
    assert sorted((a[0] - 0x7f0000000000, int(b.ffi.cast("uintptr_t", a[1])) - base, a[2]) for a in h2d) == \
        [(k * 4 * M, k * 4 * M, 4 * M) for k in range(4)]
    # every segment unregistered, after the wait for the event recorded behind its copy
    order = [n for n, _ in b.calls]
    unregs = [i for i, n in enumerate(order) if n == "cuMemHostUnregister"]
    assert len(unregs) == 4
    syncs = [i for i, n in enumerate(order) if n == "cuEventSynchronize"]
    assert len(syncs) == 4 and min(unregs) > min(syncs)


def test_direct_upload_refused_registration_leaves_everything_to_the_ring(backend, monkeypatch):
    from gpuproxy.proxyd.checkpoint import direct_upload as DU
    b = backend
    real = b.lib
    b.err_name = lambda r: f"CUDA_ERROR_{r}"

    class Refuse:
        def __getattr__(self, name):
            if name == "cuMemHostRegister_v2":
                return lambda *a: 801        # CUDA_ERROR_NOT_SUPPORTED
            return getattr(real, name)
    b.lib = Refuse()
    monkeypatch.setenv("GPUPROXY_RESTORE_DIRECT", "1")
    monkeypatch.setenv("GPUPROXY_RESTORE_REG_MB", "1")
    img, _ = _fake_image(8 << 20)
    refs, pieces = _refs(0x7f0000000000, 8 << 20, 2 << 20)
    rest, st = DU.upload(b, img, refs, pieces, span=False, lanes=2)
    assert sorted(r.addr for r in rest) == sorted(r.addr for r in refs)
    assert st["refused"] and st["bytes"] == 0 and st["failed_segments"] == st["segments"] == 8
    assert names(b, "cuMemcpyHtoDAsync_v2") == [] and names(b, "cuMemHostUnregister") == []


def test_first_dump_copies_are_queued_as_pool_segments_become_ready(backend, monkeypatch):
    """Segment 0 of the pool is pinned late (its registration waits until a
    copy into another segment has been queued): the copies do not wait
    for it in address order, and the one into segment 0 comes when it is
    ready."""
    from types import SimpleNamespace as NS
    from gpuproxy.proxyd.backends import pinned_pool
    from gpuproxy.proxyd.checkpoint.engine import Engine, Piece
    b = backend
    M = 1 << 20
    monkeypatch.setattr(pinned_pool, "SEGMENT", 2 * M)
    monkeypatch.setenv("GPUPROXY_PIN_THREADS", "2")
    first_copy = threading.Event()
    real = b.lib

    class Lib:
        def __getattr__(self, name):
            f = getattr(real, name)
            if name != "cuMemcpyDtoHAsync_v2":
                return f

            def copy(*a):
                first_copy.set()
                return f(*a)
            return copy
    b.lib = Lib()
    reg = b._register_pool_segment

    def slow_first(view):
        if int(b.ffi.cast("uintptr_t", b.ffi.from_buffer(view))) == base[0]:
            first_copy.wait(10)
        return reg(view)
    base = [None]
    b._register_pool_segment = slow_first
    eng = Engine(NS(backend=b, dispatcher=None))
    eng.cstats = {}
    A = 0x7f0000000000
    pieces = [Piece(A + o, 2 * M, 0, A) for o in range(0, 8 * M, 2 * M)]
    import gpuproxy.proxyd.backends.pinned_pool as PP
    # the pool's base address, read as its mapping is made (before any registration)
    orig_mmap = PP.mmap.mmap

    def mm(*a, **k):
        m = orig_mmap(*a, **k)
        base[0] = int(b.ffi.cast("uintptr_t", b.ffi.from_buffer(m)))
        return m
    monkeypatch.setattr(PP.mmap, "mmap", mm)
    try:
        pool_view = b.host_buffer(8 * M)
        eng._read_runs(pieces, pool_view, 0, lambda p: p.addr)
    finally:
        b.release_host_buffer()
    d2h = names(b, "cuMemcpyDtoHAsync_v2")
    offs = [int(b.ffi.cast("uintptr_t", a[0])) - base[0] for a in d2h]
    assert sorted(offs) == [0, 2 * M, 4 * M, 6 * M]
    assert offs[0] != 0                             # not in address order: segment 0 was not ready
    assert eng.cstats["order"] == "ready" and eng.cstats["copies"] == 4


def test_first_dump_copies_made_by_the_pinning_threads(backend, monkeypatch):
    """COPY_ORDER pinthread: each pool segment's copy is made (synchronously,
    no stream per thread) by the thread that pinned it, or by the caller
    for segments pinned already; every byte range exactly once."""
    from types import SimpleNamespace as NS
    from gpuproxy.proxyd.backends import pinned_pool
    from gpuproxy.proxyd.checkpoint.engine import Engine, Piece
    b = backend
    M = 1 << 20
    monkeypatch.setattr(pinned_pool, "SEGMENT", 2 * M)
    monkeypatch.setenv("GPUPROXY_PIN_THREADS", "2")
    monkeypatch.setattr(Engine, "COPY_ORDER", "pinthread")
    real = b.lib
    who = []
    gate = threading.Event()

    class Lib:
        def __getattr__(self, name):
            f = getattr(real, name)
            if name == "cuMemHostRegister_v2":
                def reg(*a):
                    gate.wait(10)            # nothing is pinned before the copies are asked for
                    return f(*a)
                return reg
            if name == "cuMemcpyDtoH_v2":
                def copy(*a):
                    who.append(threading.current_thread().name)
                    return f(*a)
                return copy
            return f
    b.lib = Lib()
    eng = Engine(NS(backend=b, dispatcher=None))
    eng.cstats = {}
    A = 0x7f0000000000
    pieces = [Piece(A + o, 2 * M, 0, A) for o in range(0, 8 * M, 2 * M)]
    view = b.host_buffer(8 * M)
    base = int(b.ffi.cast("uintptr_t", b.ffi.from_buffer(view)))
    threading.Timer(0.2, gate.set).start()
    try:
        eng._read_runs(pieces, view, 0, lambda p: p.addr)
    finally:
        b.release_host_buffer()
    copies = names(b, "cuMemcpyDtoH_v2")
    assert sorted(int(b.ffi.cast("uintptr_t", a[0])) - base for a in copies) == [0, 2 * M, 4 * M, 6 * M]
    assert sorted(a[1] - A for a in copies) == [0, 2 * M, 4 * M, 6 * M]
    assert all(w.startswith("gpuproxy-pin") for w in who), who
    assert names(b, "cuMemcpyDtoHAsync_v2") == []
    assert eng.cstats["order"] == "pinthread" and eng.cstats["copies"] == 4


def test_direct_upload_error_waits_for_queued_copies_then_unregisters_everything(backend, monkeypatch):
    from gpuproxy.proxyd.checkpoint import direct_upload as DU
    b = backend
    real = b.lib
    b.err_name = lambda r: f"CUDA_ERROR_{r}"
    n_copies = [0]

    class Lib:
        def __getattr__(self, name):
            f = getattr(real, name)
            if name != "cuMemcpyHtoDAsync_v2":
                return f

            def copy(*a):
                n_copies[0] += 1
                real.__getattr__(name)(*a)
                return 700 if n_copies[0] == 2 else 0      # CUDA_ERROR_ILLEGAL_ADDRESS
            return copy
    b.lib = Lib()
    monkeypatch.setenv("GPUPROXY_RESTORE_DIRECT", "1")
    monkeypatch.setenv("GPUPROXY_RESTORE_REG_MB", "2")
    monkeypatch.setenv("GPUPROXY_RESTORE_REG_THREADS", "2")
    img, _ = _fake_image(8 << 20)
    refs, pieces = _refs(0x7f0000000000, 8 << 20, 2 << 20)
    with pytest.raises(Exception, match="cuMemcpyHtoDAsync"):
        DU.upload(b, img, refs, pieces, span=False, lanes=2)
    order = [n for n, _ in b.calls]
    regs, unregs = order.count("cuMemHostRegister_v2"), order.count("cuMemHostUnregister")
    assert regs == unregs and regs >= 2                 # nothing stays registered
    first_unreg = order.index("cuMemHostUnregister")
    assert "cuStreamSynchronize" in order[:first_unreg]  # the queued copies were waited for first
