"""proxyd's C serving loop (proxyd/native/gpxd.c, gpx_serve) against the
Python message path: the same messages (msgpack, as the shim encodes them)
go to an in-process worker Server on the emulated backend and, through a
real fast-channel segment, to gpx_serve over a stand-in driver library
(tests/native/fake_cuda_serve.c) whose handles and memory mirror the
session's; the answers must be the same bytes. Messages the loop must not
serve come back to Python untouched. No GPU needed."""
import ctypes
import os
import shutil
import struct
import subprocess
import tempfile

import msgpack
import pytest

from gpuproxy.proxyd.core import channel as C
from gpuproxy.proxyd._generated import FUNCTIONS

FID = {f.name: i for i, f in FUNCTIONS.items()}
HERE = os.path.dirname(os.path.abspath(__file__))
IDLE, HANDOFF, FAILED, REPLY_ZMQ, REPLY_PY = 0, 1, 2, 3, 4


class PyWorker:
    """The Python path: a worker Server with the emulated backend, replies captured."""

    def __init__(self):
        from gpuproxy.proxyd.backends.select import pick_backend
        from gpuproxy.proxyd.worker.server import Server
        self.srv = Server(pick_backend("emu", 1), f"ipc://{tempfile.mkdtemp()}/w.sock", worker=True)
        self.token = f"nserve-{os.getpid()}"
        self.rid = b"c:" + self.token.encode()
        self.seq = 0
        self.sent = []
        self.srv.sock.send_multipart = lambda frames, **kw: self.sent.append(frames)
        # what the supervisor's "expect" does before the client's HELLO (proxyd/worker/gate.py)
        self.srv.expected = {"token": self.token, "uid": os.geteuid()}
        self.srv.gate.expect(os.geteuid())
        self.request(0, [{"token": self.token, "pid": os.getpid(), "exe": "nserve"}])
        self.sess = self.srv.sessions[self.token]

    def raw(self, mtype, body, seq=None):
        return msgpack.packb([mtype, self.seq + 1 if seq is None else seq, body], use_bin_type=True)

    def request(self, mtype, body) -> bytes:
        m = self.raw(mtype, body)
        self.seq += 1
        n = len(self.sent)
        self.srv.handle(self.rid, [m])
        assert len(self.sent) == n + 1
        r = self.sent[-1][1]
        return bytes(r)

    def call(self, ops):
        r = msgpack.unpackb(self.request(1, ops))
        assert r[1] == 0, r
        return r[2]

    def close(self):
        self.srv.close()


@pytest.fixture
def env(tmp_path):
    from gpuproxy.proxyd.backends import native as nat
    if not os.path.exists(nat.LIB) or not shutil.which("cc"):
        pytest.skip("native helper not built or no C compiler")
    lib = tmp_path / "libfakecuda.so"
    subprocess.run(["cc", "-shared", "-fPIC", os.path.join(HERE, "native", "fake_cuda_serve.c"), "-o", str(lib)],
                   check=True)
    fake = ctypes.CDLL(str(lib))
    n = nat.Native(str(lib), [f for f, fn in FUNCTIONS.items() if fn.handler == "launch_kernel"])
    assert n.lib.gpx_serve_ready() == 1
    n.lib.gpx_note_current(0)      # libgpxd's cache of the current context is the process's (other tests)
    assert n.lib.gpx_serve_state_size() == n.ffi.sizeof("gpx_serve_state")
    from gpuproxy.proxyd.worker.native_serve import fid_classes
    for fid, cls in fid_classes().items():
        n.lib.gpx_add_fid_class(fid, cls)
    name = f"gpuproxy-nserve-{os.getpid()}-chan"
    path = "/dev/shm/" + name
    with open(path, "wb") as f:
        f.truncate(C.SIZE)
        f.seek(0)
        f.write(b"GPXCHAN1")
    ch = C.Channel(name, C.SIZE)
    py = PyWorker()
    yield n, fake, ch, py
    n.lib.gpx_clear_slot(py.sess.slot)      # the tables and the current context are the
    n.lib.gpx_note_current(0)               # process's: leave none to other tests
    py.close()
    ch.close()
    os.unlink(path)


class Loop:
    """Drives gpx_serve the way native_serve.NativeServe does, on one channel."""

    def __init__(self, n, ch, slot):
        self.n, self.ch = n, ch
        self.st = n.ffi.new("gpx_serve_state *")
        self.st.chan = ch.address(n.ffi)
        self.st.slot = slot
        self.st.spin_ns = 2_000_000
        self.st.max_ns = 50_000_000

    def send(self, seq, raw: bytes, last_seq=None, may_print=0, capture=0):
        mm = self.ch.mm
        mm[C.REQ_DATA:C.REQ_DATA + len(raw)] = raw
        struct.pack_into("<I", mm, C.REQ_LEN, len(raw))
        struct.pack_into("<Q", mm, C.REQ_SEQ, seq)
        st = self.st
        st.taken = self.ch.taken
        st.last_seq = seq - 1 if last_seq is None else last_seq
        st.may_print = may_print
        st.capture = capture
        st.spin_ns = 0              # one request, then back
        rc = self.n.lib.gpx_serve(st)
        self.ch.taken = st.taken
        return rc

    def reply(self) -> tuple[int, bytes]:
        mm = self.ch.mm
        seq = struct.unpack_from("<Q", mm, C.REP_SEQ)[0]
        n = struct.unpack_from("<I", mm, C.REP_LEN)[0]
        return seq, bytes(mm[C.REP_DATA:C.REP_DATA + n])


def setup_session(n, fake, py):
    """Objects in the Python session, and the same handles in C's tables
    with stand-in driver values; device memory with the same bytes."""
    py.call([[FID["cuInit"], 0, 0]])
    ctx = py.call([[FID["cuDevicePrimaryCtxRetain"], 0, True, 0]])[0]
    dptr = py.call([[FID["cuMemAlloc_v2"], ctx, True, 4096]])[0]
    pattern = bytes((i * 7 + 3) & 0xFF for i in range(4096))
    py.call([[FID["cuMemcpyHtoD_v2"], ctx, dptr, pattern, 4096]])
    stream = py.call([[FID["cuStreamCreate"], ctx, True, 0]])[0]
    # named as the shim names events (bit 31 of the id: C keeps those apart)
    event = (5 << 32) | 0x80000001
    py.call([[FID["cuEventCreate"], ctx, event, 0], [FID["cuCtxSynchronize"], ctx]])
    assert (5, 0x80000001) in py.sess.objects
    slot = py.sess.slot
    for h, real in ((ctx, 0xC0), (stream, 0x5E), (event, 0xE7)):
        n.lib.gpx_set(slot, h >> 32, h & 0xFFFFFFFF, real)
    n.lib.gpx_set(slot, 3, 9, 0xF9)          # a function for the launches
    ctypes.c_uint64.in_dll(fake, "dev_base").value = dptr
    ctypes.memmove(ctypes.addressof(ctypes.c_ubyte.in_dll(fake, "mem")), pattern, len(pattern))
    a, off = py.sess.arena.find(dptr)
    n.lib.gpx_range_add(slot, dptr - off, dptr - off + max(a.extent, a.size))
    return ctx, dptr, stream, event, slot


def test_answers_are_the_python_paths_bytes(env):
    n, fake, ch, py = env
    ctx, dptr, stream, event, slot = setup_session(n, fake, py)
    loop = Loop(n, ch, slot)
    fn = (3 << 32) | 9
    launch = [FID["cuLaunchKernel"], ctx, fn, 2, 1, 1, 64, 1, 1, 0, stream, b"\x01\x02\x03\x04", None]
    values = (ctypes.c_int * 256).in_dll(fake, "attr_values")
    attrs = (1, 16, 75, 76, 39)
    for a in attrs:      # the stand-in driver answers what the emulated device does
        values[a] = py.call([[FID["cuDeviceGetAttribute"], ctx, True, a, 0]])[0]
    cases = [[[FID["cuDeviceGetAttribute"], ctx, True, a, 0]] for a in attrs] + [
        [[FID["cuDeviceGetAttribute"], 0, True, 16, 0]],
        [[FID["cuStreamQuery"], ctx, stream]],
        [[FID["cuStreamQuery"], ctx, 0]],
        [[FID["cuStreamQuery"], 0, 1]],
        [[FID["cuEventQuery"], ctx, event]],
        [[FID["cuStreamSynchronize"], ctx, stream]],
        [[FID["cuEventSynchronize"], ctx, event]],
        [[FID["cuCtxSynchronize"], ctx]],
        [[FID["cuMemcpyDtoH_v2"], ctx, None, dptr, 4]],
        [[FID["cuMemcpyDtoH_v2"], ctx, None, dptr + 1000, 3000]],
    ]
    for ops in cases:
        seq = py.seq + 1
        raw = py.raw(1, ops)
        want = py.request(1, ops)
        rc = loop.send(seq, raw)
        assert rc == IDLE and loop.st.served == 1, (ops, rc)
        got_seq, got = loop.reply()
        assert got_seq == seq
        assert got == want, (ops, msgpack.unpackb(got), msgpack.unpackb(want))
        assert loop.st.last_seq == seq and loop.st.reply_state == 1
    # a driver failure in a generic call: the code alone, as the cuda
    # backend's generic path answers it (CudaBackend.call; the emulated
    # device adds a message of its own)
    seq = py.seq + 1
    py.seq += 1
    assert loop.send(seq, py.raw(1, [[FID["cuDeviceGetAttribute"], ctx, True, 16, 1]], seq=seq)) == IDLE
    assert msgpack.unpackb(loop.reply()[1]) == [seq, 101, None, 0, 0, ""]
    py.sess.last_seq = seq
    # launches before the synchronous op: they run in C (recorded by the
    # stand-in driver), and the answer is the synchronous op's, as Python's
    # answer to that op alone
    before = ctypes.c_int.in_dll(fake, "nlaunches").value
    sync_op = [FID["cuMemcpyDtoH_v2"], ctx, None, dptr + 8, 4]
    seq = py.seq + 1
    raw = py.raw(1, [launch, launch, sync_op])
    want = py.request(1, [sync_op])
    assert loop.send(seq, raw) == IDLE
    assert loop.reply() == (seq, want)
    assert loop.st.calls == 3 and loop.st.may_print == 1
    assert ctypes.c_int.in_dll(fake, "nlaunches").value == before + 2
    rec = (ctypes.c_size_t * 3).from_address(ctypes.addressof(ctypes.c_ubyte.in_dll(fake, "launches")))
    assert (rec[0], rec[1], rec[2]) == (0xF9, 0x5E, 0xC0)
    # a message of launches alone, as it came through the channel: Python's
    # answer (the emulated session has no such function: the failure waits
    # for a synchronous answer there, which is why this case comes last)
    seq = py.seq + 1
    raw = py.raw(1, [launch], seq=seq)
    py.srv.handle(py.rid, [raw], via_chan=True)
    want = bytes(py.sent[-1][1])
    assert loop.send(seq, raw) == IDLE
    assert loop.reply() == (seq, want)
    # ... and none when the client's next request already waits in the slot
    # (Server.execute: the next answer settles it)
    mm = ch.mm
    assert loop.send(seq + 1, raw.replace(bytes([seq]), bytes([seq + 1]), 1)) == IDLE
    struct.pack_into("<Q", mm, C.REQ_SEQ, seq + 2)
    loop.st.taken = ch.taken
    assert loop.reply()[0] == seq + 1


def test_writes_have_the_python_paths_effect(env):
    """Copies to the device, memsets and event records: the same answers,
    and the same device bytes afterwards (read back by both paths)."""
    n, fake, ch, py = env
    ctx, dptr, stream, event, slot = setup_session(n, fake, py)
    loop = Loop(n, ch, slot)
    F = FID
    messages = [
        [[F["cuMemcpyHtoD_v2"], ctx, dptr + 100, bytes(range(40, 56)), 16]],
        [[F["cuMemsetD8Async"], ctx, dptr + 200, 0xAB, 10, stream],
         [F["cuMemsetD32_v2"], ctx, dptr + 300, 0x11223344, 4],
         [F["cuMemsetD16_v2"], ctx, dptr + 400, -2, 3],
         [F["cuMemsetD8_v2"], ctx, dptr + 4090, 0x1FF, 6],
         [F["cuEventRecord"], ctx, event, stream],
         [F["cuStreamSynchronize"], ctx, stream]],
        [[F["cuEventRecord"], ctx, event, 0], [F["cuEventQuery"], ctx, event]],
        [[F["cuMemcpyDtoH_v2"], ctx, None, dptr, 4096]],
    ]
    for ops in messages:
        seq = py.seq + 1
        raw = py.raw(1, ops)
        want = py.request(1, ops)
        assert loop.send(seq, raw) == IDLE and loop.st.served == 1, ops
        assert loop.reply() == (seq, want), (ops, msgpack.unpackb(loop.reply()[1])[:2], msgpack.unpackb(want)[:2])
    recs = (ctypes.c_size_t * 32).in_dll(fake, "records")
    assert ctypes.c_int.in_dll(fake, "nrecords").value == 2 and recs[0:4] == [0xE7, 0x5E, 0xE7, 0]
    assert loop.st.nrecorded == 0      # listed per gpx_serve call, for Python to mark (test_worker_loop_glue)


def _shm_ref(seg, off, length):
    from gpuproxy.proxyd.core import protocol as P
    return msgpack.ExtType(P.EXT_SHM, struct.pack(">IQQ", seg, off, length))


def test_copies_with_page_locked_client_memory(env):
    """cuMemcpyHtoD/DtoH (_v2 and Async_v2) naming a page-locked client
    segment (a ShmRef): C copies straight from and to the segment's mapping
    as h_memcpy_htod / h_memcpy_dtoh do, with the same answers and the same
    bytes on both sides; a segment C was not told of, or a reference past
    its end, goes to Python untouched. C's copy of each segment is a
    separate buffer here, so that each path's writes can be compared."""
    n, fake, ch, py = env
    ctx, dptr, stream, event, slot = setup_session(n, fake, py)
    loop = Loop(n, ch, slot)
    F = FID
    size = 8192
    src = bytes((i * 13 + 5) & 0xFF for i in range(size))
    paths = []
    for seg, data in ((7, src), (8, bytes(size))):
        path = py.sess.shm.path(seg)
        with open(path, "wb") as f:
            f.write(data)
        paths.append(path)
    c_src = (ctypes.c_ubyte * size).from_buffer_copy(src)        # C's view of segment 7
    c_dst = (ctypes.c_ubyte * size)()                             # ... and of segment 8
    n.lib.gpx_seg_add(slot, 7, ctypes.addressof(c_src), size)
    n.lib.gpx_seg_add(slot, 8, ctypes.addressof(c_dst), size)
    try:
        messages = [
            [[F["cuMemcpyHtoDAsync_v2"], ctx, dptr + 64, _shm_ref(7, 128, 256), 256, stream],
             [F["cuStreamSynchronize"], ctx, stream]],
            [[F["cuMemcpyHtoD_v2"], ctx, dptr + 1024, _shm_ref(7, 4096, 1000), 1000]],
            [[F["cuMemcpyDtoHAsync_v2"], ctx, _shm_ref(8, 0, 512), dptr, 512, stream],
             [F["cuStreamSynchronize"], ctx, stream]],
            [[F["cuMemcpyDtoH_v2"], ctx, _shm_ref(8, 2048, 2048), dptr + 1024, 2048]],
            [[F["cuMemcpyHtoDAsync_v2"], ctx, dptr + 3000, _shm_ref(7, 0, 16), 16, stream]],     # async alone
            [[F["cuMemcpyDtoH_v2"], ctx, None, dptr, 4096]],     # the device bytes both paths left
        ]
        before = ctypes.c_int.in_dll(fake, "async_copies").value
        for ops in messages:
            seq = py.seq + 1
            raw = py.raw(1, ops)
            want = py.request(1, ops)
            assert loop.send(seq, raw) == IDLE and loop.st.served == 1, ops
            assert loop.reply() == (seq, want), (ops, msgpack.unpackb(loop.reply()[1]), msgpack.unpackb(want))
        assert ctypes.c_int.in_dll(fake, "async_copies").value == before + 3
        assert ctypes.c_void_p.in_dll(fake, "last_copy_stream").value == 0x5E
        with open(paths[1], "rb") as f:
            python_wrote = f.read()
        assert bytes(c_dst) == python_wrote and python_wrote != bytes(size)
        # what C may not take as it stands: Python's
        for ops in ([[F["cuMemcpyHtoD_v2"], ctx, dptr, _shm_ref(9, 0, 16), 16]],            # unknown segment
                    [[F["cuMemcpyHtoD_v2"], ctx, dptr, _shm_ref(7, size - 8, 16), 16]],     # past its end
                    [[F["cuMemcpyHtoD_v2"], ctx, dptr, _shm_ref(7, 0, 8), 16]],             # fewer bytes than n
                    [[F["cuMemcpyDtoHAsync_v2"], ctx, None, dptr, 16, stream]]):            # inline answer, async
            seq = py.seq + 1
            assert loop.send(seq, py.raw(1, ops, seq=seq), last_seq=seq - 1) == HANDOFF, ops
            py.seq += 1
            py.sess.last_seq = seq
    finally:
        for path in paths:
            os.unlink(path)


def test_learn_names_page_locked_segments_not_the_staging_one(env):
    """native_serve.NativeServe.learn: after Python ran a copy with a
    page-locked segment, C is told where that segment is mapped; never of
    the staging segment (Python's copies from it stay synchronous)."""
    from types import SimpleNamespace

    from gpuproxy.proxyd.core import protocol as P
    from gpuproxy.proxyd.worker.native_serve import NativeServe
    n, fake, ch, py = env
    told = []
    shim = SimpleNamespace(lib=SimpleNamespace(gpx_range_add=lambda *a: None,
                                                gpx_seg_add=lambda *a: told.append(a)),
                           ffi=n.ffi, htod_fids=frozenset({FID["cuMemcpyHtoDAsync_v2"]}),
                           dtoh_fids=frozenset({FID["cuMemcpyDtoH_v2"]}),
                           dst_fids=frozenset({FID["cuMemcpyHtoDAsync_v2"]}),      # as NativeServe: htod ⊂ dst
                           _learn_segment=lambda s, seg: NativeServe._learn_segment(shim, s, seg))
    size = 4096
    for seg in (3, 4):
        with open(py.sess.shm.path(seg), "wb") as f:
            f.write(bytes(size))
    try:
        py.sess.staging_seg = 4
        NativeServe.learn(shim, py.sess, [[FID["cuMemcpyHtoDAsync_v2"], 0, 0, P.ShmRef(3, 0, 16), 16, 0],
                                          [FID["cuMemcpyDtoH_v2"], 0, P.ShmRef(4, 0, 16), 0, 16]])
        m = py.sess.shm.open(3)
        buf = n.ffi.from_buffer(m)
        assert told == [(py.sess.slot, 3, int(n.ffi.cast("uintptr_t", buf)), size)]
        del buf
    finally:
        py.sess.shm.close_all()
        for seg in (3, 4):
            os.unlink(py.sess.shm.path(seg))


def test_not_ready_and_failures(env):
    n, fake, ch, py = env
    ctx, dptr, stream, event, slot = setup_session(n, fake, py)
    loop = Loop(n, ch, slot)
    busy = (ctypes.c_size_t * 4).in_dll(fake, "busy")
    busy[0] = 0x5E
    seq = py.seq + 1
    assert loop.send(seq, py.raw(1, [[FID["cuStreamQuery"], ctx, stream]], seq=seq)) == IDLE
    # the generic path's answer to a failed call: its code, no outs, no message (dispatch.generic)
    assert msgpack.unpackb(loop.reply()[1]) == [seq, 600, None, 0, 0, ""]
    bad = (ctypes.c_size_t * 4).in_dll(fake, "bad")
    bad[0] = 0x5E
    fn = (3 << 32) | 9
    launch = [FID["cuLaunchKernel"], ctx, fn, 1, 1, 1, 1, 1, 1, 0, 0, None, None]
    ops = [launch, [FID["cuStreamSynchronize"], ctx, stream]]
    rep_before = loop.reply()
    assert loop.send(seq + 1, py.raw(1, ops, seq=seq + 1)) == FAILED
    assert (loop.st.done_ops, loop.st.fail_code, loop.st.fail_setctx) == (2, 700, 0)
    assert loop.st.last_seq == seq + 1 and loop.reply() == rep_before     # Python answers it
    bad[1] = 0xF9
    assert loop.send(seq + 2, py.raw(1, [launch, launch], seq=seq + 2)) == FAILED
    assert (loop.st.done_ops, loop.st.fail_code) == (1, 719)              # stops after the failed launch


def test_other_messages_go_back_to_python_untouched(env):
    n, fake, ch, py = env
    ctx, dptr, stream, event, slot = setup_session(n, fake, py)
    loop = Loop(n, ch, slot)
    q = [FID["cuStreamQuery"], ctx, stream]
    seq = 50
    cases = [
        [[FID["cuDeviceGetName"], ctx, 64, 64, 0]],                      # another function
        [[FID["cuDeviceGetAttribute"], ctx, None, 16, 0]],          # no out-value: the driver's own error, Python
        [q, q],                                                     # a synchronous op before the last
        [[FID["cuStreamQuery"], ctx, (4 << 32) | 99]],              # a stream the session does not have
        [[FID["cuStreamQuery"], ctx, True]],                        # a value of another type
        [[FID["cuStreamQuery"], (1 << 32) | 77, stream]],           # an unknown context
        [[FID["cuCtxSynchronize"], 0]],                             # no context: Python's error answer
        [[FID["cuMemcpyDtoH_v2"], ctx, None, dptr + 4094, 4]],      # past the range Python checked
        [[FID["cuMemcpyDtoH_v2"], ctx, None, dptr + (1 << 20), 4]],  # outside it
        [[FID["cuMemcpyDtoH_v2"], ctx, 4, dptr, 4]],                # not an inline answer
        [],
    ]
    rep_before = loop.reply()
    dtohs = ctypes.c_int.in_dll(fake, "dtohs").value
    for ops in cases:
        seq += 1
        raw = msgpack.packb([1, seq, ops], use_bin_type=True)
        assert loop.send(seq, raw) == HANDOFF, ops
        assert bytes(n.ffi.buffer(loop.st.msg, loop.st.msg_len)) == raw
        assert loop.st.served == 0 and loop.st.calls == 0 and ch.taken == seq
        assert loop.reply() == rep_before
    # out of order, a duplicate, another message type, trailing bytes
    seq += 1
    for raw, last in ((msgpack.packb([1, seq + 1, [q]]), seq - 1), (msgpack.packb([1, seq, [q]]), seq),
                      (msgpack.packb([2, seq, []]), seq - 1), (msgpack.packb([1, seq, [q]]) + b"\xc0", seq - 1)):
        assert loop.send(seq, raw, last_seq=last) == HANDOFF
        seq += 1
    assert ctypes.c_int.in_dll(fake, "dtohs").value == dtohs
    # nothing in the slot: back after the spin
    loop.st.spin_ns = 1_000_000
    loop.st.taken = ch.taken
    assert n.lib.gpx_serve(loop.st) == IDLE and loop.st.served == 0


def test_printed_output_travels_with_sync_answers(env):
    n, fake, ch, py = env
    ctx, dptr, stream, event, slot = setup_session(n, fake, py)
    loop = Loop(n, ch, slot)
    r, w = os.pipe()
    os.set_blocking(r, False)
    try:
        n.lib.gpx_out_init(r, b"early ", 6)
        os.write(w, b"from a kernel\n")
        seq = 7
        assert loop.send(seq, msgpack.packb([1, seq, [[FID["cuCtxSynchronize"], ctx]]]), may_print=1,
                         capture=1) == IDLE
        assert msgpack.unpackb(loop.reply()[1]) == [seq, 0, [], 0, 0, "", b"early from a kernel\n"]
        assert loop.st.may_print == 0        # cuCtxSynchronize: every kernel's printf is out
        os.write(w, b"x")
        seq += 1
        assert loop.send(seq, msgpack.packb([1, seq, [[FID["cuStreamQuery"], ctx, 0]]]), capture=1) == IDLE
        assert msgpack.unpackb(loop.reply()[1]) == [seq, 0, [], 0, 0, ""]     # may_print off: not looked at
    finally:
        n.lib.gpx_out_init(-1, b"", 0)
        os.close(r)
        os.close(w)


def test_worker_loop_glue(env):
    """native_serve.NativeServe between gpx_serve and the Server: session
    bookkeeping after C answered, a message handed back and run by Python
    (answered in the slot, device ranges forgotten and learned again), and
    a failed driver call finished by Python with its message."""
    import threading
    from gpuproxy.proxyd.worker.native_serve import NativeServe
    n, fake, ch, py = env
    ctx, dptr, stream, event, slot = setup_session(n, fake, py)
    srv, s = py.srv, py.sess
    srv.backend._tls = threading.local()                       # what the cuda backend has
    srv.backend.err_name = lambda code: f"CUDA_ERROR_{code}"
    ns = NativeServe(srv, n)
    srv.nserve = ns
    s.chan = ch
    assert ns.session() is s

    def put(ops):
        seq = s.last_seq + 1
        raw = msgpack.packb([1, seq, ops], use_bin_type=True)
        mm = ch.mm
        mm[C.REQ_DATA:C.REQ_DATA + len(raw)] = raw
        struct.pack_into("<I", mm, C.REQ_LEN, len(raw))
        struct.pack_into("<Q", mm, C.REQ_SEQ, seq)
        return seq

    def slot_reply():
        n_ = struct.unpack_from("<I", ch.mm, C.REP_LEN)[0]
        return struct.unpack_from("<Q", ch.mm, C.REP_SEQ)[0], msgpack.unpackb(bytes(ch.mm[C.REP_DATA:C.REP_DATA + n_]))

    calls = s.calls
    seq = put([[FID["cuMemcpyDtoH_v2"], ctx, None, dptr + 16, 4]])
    assert ns.serve(s, 0.0) and ns.served == 1
    assert slot_reply() == (seq, [seq, 0, [bytes((i * 7 + 3) & 0xFF for i in range(16, 20))], 0, 0, ""])
    assert s.last_seq == seq and s.calls == calls + 1 and msgpack.unpackb(s.last_reply[0])[0] == seq
    # a message for Python: run there, answered in the slot; it forgets the
    # ranges (it may have freed memory), and learns those of its own copies
    seq = put([[FID["cuDeviceGetName"], ctx, 64, 64, 0]])
    assert ns.serve(s, 0.0) and ns.served == 1
    got = slot_reply()
    assert got[0] == seq and got[1][1] == 0 and s.last_seq == seq
    seq = put([[FID["cuMemcpyDtoH_v2"], ctx, None, dptr + 16, 4]])
    assert ns.serve(s, 0.0) and ns.served == 1                  # handed back: no checked range any more
    assert slot_reply()[1][:3] == [seq, 0, [bytes((i * 7 + 3) & 0xFF for i in range(16, 20))]]
    seq = put([[FID["cuMemcpyDtoH_v2"], ctx, None, dptr + 32, 4]])
    assert ns.serve(s, 0.0) and ns.served == 2                  # learned from the one Python ran
    # an event recorded in C is marked as streams.h_event_record marks it
    ev = s.get(5, event)
    ev.info.pop("recorded", None)
    seq = put([[FID["cuEventRecord"], ctx, event, stream], [FID["cuEventQuery"], ctx, event]])
    assert ns.serve(s, 0.0) and ns.served == 3 and ev.info.get("recorded") is True
    # a failing synchronisation: Python's message, no async error left behind
    (ctypes.c_size_t * 4).in_dll(fake, "bad")[0] = 0x5E
    seq = put([[FID["cuStreamSynchronize"], ctx, stream]])
    assert ns.serve(s, 0.0)
    assert slot_reply() == (seq, [seq, 700, None, 0, 0, "cuStreamSynchronize: CUDA_ERROR_700"])
    assert s.last_seq == seq and s.async_error is None and msgpack.unpackb(s.last_reply[0])[1] == 700
    # a failing launch before a query: reported with the query's answer, as
    # Dispatcher.run_ops reports an async failure
    (ctypes.c_size_t * 4).in_dll(fake, "bad")[0] = 0xF9
    launch = [FID["cuLaunchKernel"], ctx, (3 << 32) | 9, 1, 1, 1, 1, 1, 1, 0, 0, None, None]
    seq = put([launch, [FID["cuStreamQuery"], ctx, 0]])
    assert ns.serve(s, 0.0)
    assert slot_reply() == (seq, [seq, 0, [], 719, FID["cuLaunchKernel"], "cuLaunchKernel failed: CUDA_ERROR_719"])
    assert s.async_error is None and s.may_print
    # a failing memset: the handler's message, with the next answer
    (ctypes.c_size_t * 4).in_dll(fake, "bad")[1] = 0x5E
    seq = put([[FID["cuMemsetD8Async"], ctx, dptr, 1, 4, stream], [FID["cuCtxSynchronize"], ctx]])
    assert ns.serve(s, 0.0)
    assert slot_reply() == (seq, [seq, 0, [], 700, FID["cuMemsetD8Async"], "cuMemset: CUDA_ERROR_700"])
    # nothing more: back within the spin
    assert not ns.serve(s, 0.001)
    s.chan = None
