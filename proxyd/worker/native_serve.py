"""The worker's C serving loop (proxyd/native/gpxd.c, gpx_serve): the glue
between it and the Python message loop (server.Server.serve_forever).

While the worker's one session talks through the fast channel and has
nothing that Python must track message by message (it is not frozen, not
capturing a graph, holds no unreported async error, no checkpoint works on
it, no restore moved its addresses, nothing waits out of order), the loop
hands the channel to gpx_serve, which spins on the request slot with the GIL
released and answers the hot messages itself: runs of kernel launches
memsets and event records, followed by at most one cuDeviceGetAttribute,
cuStreamQuery, cuEventQuery, cuStreamSynchronize, cuEventSynchronize, cuCtxSynchronize or
small inline cuMemcpyDtoH_v2 / cuMemcpyHtoD_v2; copies between the device
and the client's page-locked memory (cuMemcpyHtoD/DtoH _v2 and Async_v2
naming a segment Python copied with before: learn) anywhere in a run. It
returns with the first message it does not serve as it stands (handed to
Server.handle untouched), a message whose driver call failed (finished here:
the failure's message and the async-error bookkeeping stay Python's), an
answer the client must get by ZeroMQ (it sleeps), or after its spin bound or
1 ms in all, so that ZeroMQ, control commands and parking are never held up
for longer.

Bookkeeping kept exact: Session.last_seq, last_reply (for duplicates),
calls and may_print come back from C after each call; device ranges that C
may copy from are only ranges check_range accepted for this session (learned
from the arena after Python ran a copy, forgotten whenever Python runs any
message or control command, as those may free memory).

Off: GPUPROXY_NATIVE_SERVE=0 in proxyd's environment, the emulated backend,
a missing libgpxd.so, or the round-trip stage profile (rtprofile.py times
the Python path).

Locking: the worker's main loop only.
"""
from __future__ import annotations

import logging
import os
import time

import msgpack

from ..core import protocol as P
from .._generated import FUNCTIONS
from ..core.ratelog import RATE

log = logging.getLogger("proxyd")

IDLE, HANDOFF, FAILED, REPLY_ZMQ, REPLY_PY = 0, 1, 2, 3, 4
(C_LAUNCH, C_STREAM_QUERY, C_EVENT_QUERY, C_STREAM_SYNC, C_EVENT_SYNC, C_CTX_SYNC, C_DTOH, C_HTOD,
 C_MEMSET8, C_MEMSET16, C_MEMSET32, C_EVENT_RECORD, C_DEV_ATTR, C_HTOD_ASYNC, C_DTOH_ASYNC) = range(1, 16)
CLASSES = {"cuStreamQuery": C_STREAM_QUERY, "cuEventQuery": C_EVENT_QUERY, "cuStreamSynchronize": C_STREAM_SYNC,
           "cuEventSynchronize": C_EVENT_SYNC, "cuCtxSynchronize": C_CTX_SYNC, "cuMemcpyDtoH_v2": C_DTOH,
           "cuMemcpyHtoD_v2": C_HTOD, "cuMemsetD8_v2": C_MEMSET8, "cuMemsetD16_v2": C_MEMSET16,
           "cuMemsetD32_v2": C_MEMSET32, "cuMemsetD8Async": C_MEMSET8, "cuMemsetD16Async": C_MEMSET16,
           "cuMemsetD32Async": C_MEMSET32, "cuEventRecord": C_EVENT_RECORD, "cuDeviceGetAttribute": C_DEV_ATTR,
           "cuMemcpyHtoDAsync_v2": C_HTOD_ASYNC, "cuMemcpyDtoHAsync_v2": C_DTOH_ASYNC}
MEMSETS = (C_MEMSET8, C_MEMSET16, C_MEMSET32)
COPIES_ASYNC = (C_HTOD_ASYNC, C_DTOH_ASYNC)
ASYNC = (C_LAUNCH, C_EVENT_RECORD) + MEMSETS + COPIES_ASYNC
# the call a handler's failure message names (backends/cuda.py: CudaBackend.check)
FAILED_CALL = {C_STREAM_SYNC: "cuStreamSynchronize", C_EVENT_SYNC: "cuEventSynchronize",
               C_CTX_SYNC: "cuCtxSynchronize", C_DTOH: "cuMemcpyDtoH", C_HTOD: "cuMemcpyHtoD",
               C_MEMSET8: "cuMemset", C_MEMSET16: "cuMemset", C_MEMSET32: "cuMemset",
               C_HTOD_ASYNC: "cuMemcpyHtoDAsync", C_DTOH_ASYNC: "cuMemcpyDtoHAsync"}
MAX_NS = 1_000_000


def fid_classes() -> dict[int, int]:
    out = {fid: C_LAUNCH for fid, f in FUNCTIONS.items() if f.handler == "launch_kernel"}
    for fid, f in FUNCTIONS.items():
        if f.name in CLASSES:
            out[fid] = CLASSES[f.name]
    return out


class NativeServe:
    def __init__(self, server, nat):
        self.server = server
        self.nat = nat
        self.lib, self.ffi = nat.lib, nat.ffi
        self.classes = fid_classes()
        for fid, cls in self.classes.items():
            self.lib.gpx_add_fid_class(fid, cls)
        self.dtoh_fids = frozenset(f for f, c in self.classes.items() if c in (C_DTOH, C_DTOH_ASYNC))
        self.htod_fids = frozenset(f for f, c in self.classes.items() if c in (C_HTOD, C_HTOD_ASYNC))
        self.dst_fids = self.htod_fids | frozenset(f for f, c in self.classes.items() if c in MEMSETS)
        self.st = self.ffi.new("gpx_serve_state *")
        self._p = self.ffi.new("const uint8_t **")
        self._seq = self.ffi.new("uint64_t *")
        self.capture = False     # the worker's stdout capture reads through gpx_out_* (StdoutCapture.use_native)
        self.served = 0          # messages answered in C (the worker logs both counts when it ends)
        self.to_python = 0       # messages gpx_serve took and gave to Python

    @classmethod
    def create(cls, server) -> "NativeServe | None":
        nat = getattr(server.backend, "native", None)
        if not server.worker or nat is None or os.environ.get("GPUPROXY_NATIVE_SERVE", "1") == "0":
            return None
        if not nat.lib.gpx_serve_ready():
            return None
        if nat.lib.gpx_serve_state_size() != nat.ffi.sizeof("gpx_serve_state"):
            log.error("libgpxd.so and native.py disagree on gpx_serve_state: C serving loop off")
            return None
        return cls(server, nat)

    def session(self):
        """The session gpx_serve may serve now, or None."""
        sessions = self.server.sessions
        if len(sessions) != 1:
            return None
        for s in sessions.values():
            if (s.chan is None or s.frozen or s.capture or s.async_error is not None or s.addr_map or s.reorder
                    or s.queued or s.ckpt_busy or s.released):
                return None
            if self.server.stdout_capture is not None and not self.capture:
                return None
            return s
        return None

    # ------------------------------------------------- checked device ranges
    def forget(self, slot: int):
        self.lib.gpx_range_clear(slot)

    def learn(self, s, ops):
        """Ranges of the inline device-to-host copies Python just ran (and
        check_range accepted): the allocation each starts in, up to its
        reserved extent, as check_range allows; and the page-locked client
        segments those copies read or wrote (not the staging segment, whose
        copies Python keeps synchronous: memory._pinned), with their
        address in this worker, so that C copies from and to them as
        h_memcpy_htod / h_memcpy_dtoh do."""
        for op in ops:
            if type(op) is not list or len(op) < 5:
                continue
            # [fid, ctx, dst, src, n, ...]: the device side and the host side
            if op[0] in self.dtoh_fids:
                addr, ref = op[3], op[2]
            elif op[0] in self.dst_fids:
                addr, ref = op[2], op[3] if op[0] in self.htod_fids else None
            else:
                continue
            if isinstance(ref, P.ShmRef) and ref.seg != s.staging_seg:
                self._learn_segment(s, ref.seg)
            if type(addr) is int:
                hit = s.arena.find(addr)
                if hit is not None:
                    a, off = hit
                    lo = addr - off
                    self.lib.gpx_range_add(s.slot, lo, lo + max(a.extent, a.size))

    def _learn_segment(self, s, seg: int):
        try:
            m = s.shm.open(seg)                  # the whole mapping (already open: Python just copied with it)
            buf = self.ffi.from_buffer(m)
            base, size = int(self.ffi.cast("uintptr_t", buf)), len(m)
            del buf                              # no export left behind (ClientShm.close releases the mapping)
        except Exception:       # not mapped, or not a buffer cffi can point at: Python keeps serving it
            return
        self.lib.gpx_seg_add(s.slot, seg, base, size)

    # ------------------------------------------------------------------ serve
    def serve(self, s, spin_s: float) -> bool:
        """Runs gpx_serve once; True when a request came."""
        st, lib, ffi = self.st, self.lib, self.ffi
        ch = s.chan
        st.chan = ch.address(ffi)
        st.slot = s.slot
        st.capture = 1 if self.capture else 0
        st.spin_ns = int(spin_s * 1e9) if spin_s > 0 else 0
        st.max_ns = MAX_NS
        st.taken = ch.taken
        st.last_seq = s.last_seq
        st.may_print = 1 if s.may_print else 0
        b = self.server.backend
        tls = b._tls
        lib.gpx_note_current(getattr(tls, "cur", None) or 0)
        rc = lib.gpx_serve(st)
        tls.cur = int(lib.gpx_current()) or None
        ch.taken = st.taken
        s.calls += st.calls
        s.may_print = bool(st.may_print)
        for i in range(st.nrecorded):
            # streams.h_event_record's mark: a restore makes a recorded event complete
            s.get(P.K_EVENT, st.recorded[i]).info["recorded"] = True
        if st.served:
            self.served += st.served
            s.last_seq = st.last_seq
            s.last_active = time.time()
            if st.reply_state == 1:
                n = lib.gpx_last_reply(self._p, self._seq)
                s.last_reply = [bytes(ffi.buffer(self._p[0], n))]
            elif st.reply_state == 2:
                s.last_reply = None
        if rc == IDLE:
            return st.served > 0
        rid = b"c:" + s.token.encode()
        if rc == REPLY_ZMQ:
            # the client sleeps: the answer goes by ZeroMQ too (Channel.reply's rule)
            self.server.sock.send_multipart([rid] + s.last_reply, copy=False)
            return True
        raw = bytes(ffi.buffer(st.msg, st.msg_len))
        self.to_python += 1
        if rc == HANDOFF:
            self.server.handle(rid, [raw], via_chan=True)
        elif rc == FAILED:
            self._finish_failed(s, rid, raw)
        elif rc == REPLY_PY:
            outs = msgpack.unpackb(bytes(ffi.buffer(st.outs, st.outs_len)))
            printed = bytes(ffi.buffer(st.printed, st.printed_len))
            s.last_seq = st.last_seq
            ops = P.decode([raw])[2]
            self.server.answer(s, rid, st.last_seq, ops, True, st.code, outs, "", printed=printed)
        return True

    def _finish_failed(self, s, rid: bytes, raw: bytes):
        """gpx_serve ran ops [0, done_ops) of this message and the last of
        them failed: what Dispatcher.run_ops does after such a failure, then
        Server.execute's answer."""
        st = self.st
        msg = P.decode([raw])
        seq, ops = msg[1], msg[2]
        k = st.done_ops - 1
        op = ops[k]
        err = st.fail_code
        cls = self.classes.get(op[0])
        name = self.server.backend.err_name(err)
        if st.fail_setctx:
            text = f"cuCtxSetCurrent: {name}"            # backend.make_current's failure
        elif cls == C_LAUNCH:
            text = f"cuLaunchKernel failed: {name}"      # the native launch path's (run_ops)
        elif cls == C_EVENT_RECORD:
            text = f"cuEventRecord failed with error {err}"    # the generic path carries no message (run_ops)
        else:
            text = f"{FAILED_CALL[cls]}: {name}"
        if cls in ASYNC:
            s.note_async_error(err, op[0], text)
            if cls in MEMSETS or cls in COPIES_ASYNC or (cls == C_EVENT_RECORD and st.fail_setctx):
                RATE.event("failed call", "session %s: %s", s.token, text)    # as run_ops logs a handler's failure
            rest = ops[k + 1:]
            code, outs, m = self.server.dispatcher.run_ops(s, rest, None) if rest else (0, None, "")
        else:
            code, outs, m = err, None, text              # the last op, synchronous
        s.last_seq = seq
        self.server.answer(s, rid, seq, ops, True, code, outs, m)
