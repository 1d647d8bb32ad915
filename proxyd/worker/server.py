"""The message loop that serves client sessions: one ZeroMQ ROUTER socket.

This runs in a worker process (worker/entry.py), which serves exactly one client
session (worker=True); the supervisor (supervisor/daemon.py) owns the public
endpoint and hands each client to a worker. Every message is handled to
completion, in arrival order, on this thread (docs/protocol.md): HELLO opens
or re-attaches the session, CALL runs ops, BYE ends it (and the worker), CTL
is a control command forwarded by the supervisor. Long control work
(checkpoints) runs on helper threads that post their answers back through
`post`.

Reliability: the shim resends what is not answered; each session executes a
sequence number at most once (Session.last_seq) and answers a duplicate from
its record, or with KEEPALIVE while frozen for a checkpoint.

Locking: sessions and the socket belong to this thread. Helper threads touch
a session only while it is frozen, and hand results back through the
thread-safe outbox.
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import queue
import threading
import time
import uuid

import msgpack
import zmq

from .. import __version__
from ..core import curve
from ..families import hostmap
from ..core import protocol as P
from .._generated import FUNCTIONS

from ..core.endpoint import OWN_PIDNS, EndpointInUse, remove_client_segments, serve_router  # noqa: F401  (tests, main.py)
from ..core.arena import ARENA_BASE, MAX_SLOTS, SLOT_SIZE, Arena  # noqa: F401  (tests read the first three here)
from ..core.channel import Channel, ChannelError, fence
from ..core import shm_names
from .dispatch import Dispatcher
from ..core.ratelog import RATE
from ..core.session import Session
from ..core.shm import ShmError, ShmMap

log = logging.getLogger("proxyd")
_packb = msgpack.packb


ORPHAN_GRACE_S = float(os.environ.get("GPUPROXY_ORPHAN_GRACE_S", "60"))
REAP_INTERVAL_S = 2.0
# Functions whose work may print (device printf): the driver writes a
# kernel's output at a later synchronisation point (CUDA C Programming
# Guide, "Formatted Output"), so the worker drains its stdout at sync replies
# only while a session has launched something since its last context-wide
# synchronisation (StdoutCapture.take costs a flush and a read per reply).
PRINTING_FIDS = frozenset(fid for fid, f in FUNCTIONS.items() if "Launch" in f.name)


class StdoutCapture:
    """The worker's fd 1 is a pipe drained here. The CUDA driver writes a
    kernel's printf output to the process's stdout when the context
    synchronises (CUDA C Programming Guide, "Formatted Output": the buffer is
    flushed at synchronisation points); the worker sends what arrived with the
    next synchronous reply, and the shim writes it to the app's own stdout,
    where a native process would have printed it.

    Locking: a drain thread empties the pipe whenever it has data (so a large
    output never blocks the writer), and take() empties it on the loop
    thread; both read under one lock, so bytes keep their order."""

    def __init__(self, rfd: int):
        self.rfd = rfd
        self.buf = bytearray()
        self.lock = threading.Lock()
        self.native = None      # libgpxd, once the C serving loop shares the pipe (use_native)
        os.set_blocking(rfd, False)
        import ctypes
        self._fflush = ctypes.CDLL(None).fflush
        self._fflush.argtypes = [ctypes.c_void_p]
        threading.Thread(target=self._drain, name="gpuproxy-stdout", daemon=True).start()

    @classmethod
    def install(cls) -> "StdoutCapture":
        r, w = os.pipe()
        os.dup2(w, 1)
        os.close(w)
        import sys
        sys.stdout = open(1, "w", closefd=False, buffering=1)
        return cls(r)

    def _read(self):
        while True:
            try:
                chunk = os.read(self.rfd, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                return
            self.buf += chunk

    def use_native(self, nat):
        """From now on the pipe is read into libgpxd's buffer (gpx_out_*),
        which the C serving loop takes from at its synchronous answers, so
        that its bytes and ours stay one stream in order. What was read
        already goes over first."""
        with self.lock:
            self._read()
            pending = bytes(self.buf)
            self.buf.clear()
            nat.lib.gpx_out_init(self.rfd, pending, len(pending))
            self.native = nat

    def _drain(self):
        import select
        p = select.poll()
        p.register(self.rfd, select.POLLIN)
        while True:
            if p.poll(1000):
                with self.lock:
                    if self.native is not None:
                        self.native.lib.gpx_out_drain()
                    else:
                        self._read()
                time.sleep(0.001)

    def take(self) -> bytes:
        import sys
        try:
            sys.stdout.flush()
        except Exception:
            pass
        nat = self.native
        if nat is not None:
            p = nat.ffi.new("const uint8_t **")
            n = nat.lib.gpx_out_take(p)     # flushes C stdio itself
            return bytes(nat.ffi.buffer(p[0], n)) if n else b""
        self._fflush(None)    # C stdio of the driver and of emulated kernels
        with self.lock:
            self._read()
            if not self.buf:
                return b""
            out = bytes(self.buf)
            self.buf.clear()
            return out


class SpinBudget:
    """How long the loop keeps polling after a request (adaptive, bounded
    by --spin-us). A client calling back to back finds the worker polling;
    one that pauses longer than the budget makes the spin a waste of a CPU
    that other sessions may need, so each spin that runs out without a
    request halves the next one (down to a floor), and each request doubles
    it back (up to the bound).

    Locking: the main loop's only."""

    FLOOR_S = 20e-6

    def __init__(self, max_s: float):
        self.max_s = max_s
        self.cur = max_s

    def hit(self) -> float:
        if self.cur < self.max_s:
            self.cur = min(self.max_s, self.cur * 2)
        return self.cur

    def miss(self):
        self.cur = max(min(self.FLOOR_S, self.max_s), self.cur / 2)


class Server:
    def __init__(self, backend, endpoint: str, spin_us: int = 200, worker: bool = False):
        self.backend = backend
        self.endpoint = endpoint
        self.worker = worker
        self.stdout_capture: StdoutCapture | None = None
        self.spin_s = spin_us / 1e6
        self.dispatcher = Dispatcher(backend)
        self.sessions: dict[str, Session] = {}
        self.reservations: dict[int, object] = {}
        self.orphans: dict[str, float] = {}
        self.started = time.time()
        self.outbox: queue.Queue = queue.Queue()
        self.closed = False                    # close() began: no call_in_loop is served any more
        self._closing = threading.Lock()       # orders call_in_loop against close()
        self.stopping = False
        self.packer = P.Packer()
        self.ctl_handlers = {}
        self.zctx = zmq.Context(io_threads=1)
        # tcp: CURVE, admitting the supervisor's key and the clients listed
        # in authorized_keys (curve.py); self.meta is the frame of the
        # message being handled, whose properties say who sent it
        self.meta = None
        self.expected: dict | None = None     # keyed tcp worker: the session the supervisor gave it (control.py)
        from .gate import WorkerGate
        self.gate = WorkerGate(curve.is_tcp(endpoint)) if worker else None   # its owner's messages only
        sup = os.environ.get("GPUPROXY_SUPERVISOR_CURVE_KEY", "").encode()
        try:
            served = serve_router(self.zctx, endpoint, extra_keys={sup: curve.SUPERVISOR_USER} if sup else None)
        except EndpointInUse:
            self.zctx.destroy(linger=0)
            raise
        self.sock, self.zap, self._sock_id = served.sock, served.zap, served.sock_id
        # with tcp://host:* the system picks the port: this is the real one
        self.bound_endpoint = served.bound
        mode = os.environ.get("GPUPROXY_WORKER_SOCKET_MODE") if self.worker else None
        if mode and endpoint.startswith("ipc://"):
            os.chmod(endpoint[len("ipc://"):], int(mode, 8))   # proxyd --users all: its clients are other users
        # workers wake the loop through this pair after posting to the outbox
        self.wake_addr = f"inproc://wake-{uuid.uuid4().hex}"
        self.wake_r = self.zctx.socket(zmq.PAIR)
        self.wake_r.bind(self.wake_addr)
        self._wake_w = threading.local()
        from . import control
        control.register(self)
        from .native_serve import NativeServe
        self.nserve = NativeServe.create(self)     # the C serving loop (worker, cuda backend)

    def close(self):
        # A checkpoint thread may wait for the loop (call_in_loop) while the
        # session's process exits and the worker stops: it gets an error
        # instead of waiting forever, and zctx.destroy below does not wait
        # for the sockets such threads opened (term() did, and the worker
        # never exited).
        with self._closing:
            self.closed = True
        self._fail_waiting_calls()
        for s in list(self.sessions.values()):
            self.close_session(s)
        self.sock.close(0)
        self.wake_r.close(0)
        if self.zap is not None:
            self.zap.stop()
        from ..core import sockfile
        sockfile.release(self.endpoint, getattr(self, "_sock_id", None))   # only if still ours
        self.zctx.destroy(linger=0)

    def _fail_waiting_calls(self):
        while True:
            try:
                item = self.outbox.get_nowait()
            except queue.Empty:
                return
            if item[0] == "call" and not item[2].done():
                item[2].set_exception(RuntimeError("the proxyd worker is stopping (its session ended)"))

    def post(self, rid: bytes, frames: list):
        """Thread-safe: queue a message to a peer and wake the loop."""
        self.outbox.put(("send", rid, frames))
        self._wake()

    def call_in_loop(self, fn) -> concurrent.futures.Future:
        """Thread-safe: run fn on the main loop; the future gets its result."""
        fut = concurrent.futures.Future()
        with self._closing:
            if self.closed:
                fut.set_exception(RuntimeError("the proxyd worker is stopping (its session ended)"))
                return fut
            self.outbox.put(("call", fn, fut))
        self._wake()
        return fut

    def _wake(self):
        try:
            w = getattr(self._wake_w, "s", None)
            if w is None:
                w = self.zctx.socket(zmq.PAIR)
                w.connect(self.wake_addr)
                self._wake_w.s = w
            w.send(b"", zmq.NOBLOCK)
        except zmq.Again:
            pass
        except zmq.ZMQError:
            # the loop has ended (the session's process exited during a
            # checkpoint and the worker is closing): nobody is left to wake
            pass

    def send(self, rid: bytes, obj) -> list:
        frames = self.packer.pack(obj)
        self.sock.send_multipart([rid] + frames, copy=False)
        return frames

    # ---------------------------------------------------------------- loop
    def serve_forever(self):
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.wake_r, zmq.POLLIN)
        spin_until = 0.0
        spin = SpinBudget(self.spin_s)
        next_reap = time.monotonic() + REAP_INTERVAL_S
        log.info("proxyd %s serving %s with the %s backend", __version__, self.endpoint, self.backend.name)
        k = 0
        sched_yield = os.sched_yield
        while not self.stopping:
            # The C serving loop (native_serve.py) spins on the channel itself
            # while the session qualifies, for what is left of the spin; it
            # returns at least every millisecond, so the socket and the
            # outbox below are still looked at.
            ns = self.nserve
            s1 = ns.session() if ns is not None else None
            if s1 is not None:
                busy = ns.serve(s1, spin_until - time.monotonic())
            else:
                busy = self.poll_channels()
            now = time.monotonic()
            if busy:
                spin_until = now + spin.hit()
            # Spin briefly after activity: the next call is then picked up
            # without the cost of waking a sleeping thread. The socket costs a
            # system call per look, the channels a memory read. Every eighth
            # look gives the CPU away if another process wants it
            # (sched_yield returns at once otherwise): on a machine with few
            # cores, a client and its worker spinning together must not keep
            # other sessions off the CPU.
            if now < spin_until:
                if s1 is None:
                    k += 1
                    if k % 8:
                        continue
                    sched_yield()
                events = dict(poller.poll(0))
            else:
                if spin_until:
                    spin.miss()      # the spin ran out without a request
                    spin_until = 0.0
                events = dict(poller.poll(0))
                if not events and not self.go_idle():
                    events = dict(poller.poll(500))
                    self.set_idle(False)
            if self.sock in events:
                while True:
                    try:
                        frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    if self.gate is not None and not self.gate.admit(frames):
                        continue             # another user's message: not read, not answered (worker_gate.py)
                    if self.zap is not None and len(frames) > 1:
                        self.meta = frames[1]
                    self.handle(frames[0].bytes, [f.buffer for f in frames[1:]])
                spin_until = time.monotonic() + spin.hit()
            if self.wake_r in events:
                while True:
                    try:
                        self.wake_r.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
            # Helper threads put into the outbox, then wake the loop (post,
            # call_in_loop); a wake-up can be lost (each thread has its own
            # PAIR socket to wake_r), so look at every pass that is not a
            # plain spin, without the queue's lock (a deque's length; an
            # item appended meanwhile is seen on the next pass).
            if self.outbox.queue:
                self.drain_outbox()
            if now >= next_reap:
                RATE.flush()
                self.reap()
                next_reap = now + REAP_INTERVAL_S

    def drain_outbox(self):
        while True:
            try:
                item = self.outbox.get_nowait()
            except queue.Empty:
                break
            if item[0] == "call":
                _, fn, fut = item
                if self.nserve is not None:
                    for s in self.sessions.values():
                        self.nserve.forget(s.slot)
                try:
                    fut.set_result(fn())
                except BaseException as e:   # handed to the waiting worker
                    fut.set_exception(e)
            else:
                _, rid, frames = item
                self.sock.send_multipart([rid] + frames, copy=False)

    # --------------------------------------------------------- fast channel
    def poll_channels(self) -> bool:
        busy = False
        for s in list(self.sessions.values()):
            ch = s.chan
            if ch is None:
                continue
            got = ch.poll()
            if got is not None:
                busy = True
                self.handle(b"c:" + s.token.encode(), [got[1]], via_chan=True)
        return busy

    def set_idle(self, idle: bool):
        for s in self.sessions.values():
            if s.chan is not None:
                s.chan.set_idle(idle)

    def go_idle(self) -> bool:
        """Marks every channel idle before sleeping; True if a request came in
        meanwhile (then the loop does not sleep)."""
        if not any(s.chan is not None for s in self.sessions.values()):
            return False
        self.set_idle(True)
        fence()
        if self.poll_channels():
            self.set_idle(False)
            return True
        return False

    # ------------------------------------------------------------ messages
    def handle(self, rid: bytes, frames: list, via_chan: bool = False):
        try:
            msg = P.decode(frames)
            mtype, seq = P.header(msg)
        except Exception as e:
            RATE.event("malformed message", "malformed message from %r: %s", rid[:40], e)
            return
        # the body's shape is checked here, so that a type-confused message
        # is a (rate-limited) malformed message, not an internal error with
        # a traceback (docs/protocol.md: CALL [1, seq, [op...]], HELLO
        # [0, seq, [info]], CTL [10, seq, cmd, args])
        body = msg[2] if len(msg) > 2 else None
        bad = None
        if mtype == P.MSG_CALL and not isinstance(body, list):
            bad = "CALL without a list of operations"
        elif mtype == P.MSG_HELLO and body and not (isinstance(body, list) and isinstance(body[0], dict)):
            bad = "HELLO without [info]"
        elif mtype == P.MSG_CTL and (not isinstance(body, str) or (len(msg) > 3 and not isinstance(msg[3], dict))):
            bad = "CTL without a command name and an argument map"
        if bad is not None:
            RATE.event("malformed message", "malformed message from %r: %s", rid[:40], bad)
            self.send(rid, [seq, P.REPLY_PROTOCOL_ERROR, f"malformed message: {bad}"])
            return
        if self.nserve is not None and mtype != P.MSG_CALL and mtype != P.MSG_DOORBELL:
            for s in self.sessions.values():
                self.nserve.forget(s.slot)     # control work may free memory the C loop copied from
        try:
            if mtype == P.MSG_CALL:
                self.on_call(rid, seq, body, via_chan, frames[0])
            elif mtype == P.MSG_DOORBELL:
                pass   # only wakes the loop; the request is in the channel
            elif mtype == P.MSG_HELLO:
                self.on_hello(rid, seq, body[0] if body else {})
            elif mtype == P.MSG_BYE:
                self.on_bye(rid, seq)
            elif mtype == P.MSG_CTL:
                self.on_ctl(rid, seq, msg[2], msg[3] if len(msg) > 3 else {})
            else:
                self.send(rid, [seq, P.REPLY_PROTOCOL_ERROR, f"unknown message type {mtype}"])
        except Exception as e:   # never let one bad message stop the daemon
            RATE.internal_error("internal error in a message", f"error handling message type {mtype} from {rid[:40]!r}", e)
            try:
                self.send(rid, [seq, P.REPLY_PROTOCOL_ERROR, f"proxyd internal error: {e}"[:1000]])
            except Exception as e2:   # the answer itself cannot be sent: the peer gets nothing
                RATE.internal_error("internal error in a message", "cannot answer a message", e2)

    def token_of(self, rid: bytes) -> str | None:
        return rid[2:].decode(errors="replace") if rid.startswith(b"c:") else None

    def free_slot(self) -> int:
        used = {s.slot for s in self.sessions.values()}
        for i in range(MAX_SLOTS):
            if i not in used:
                return i
        raise RuntimeError(f"all {MAX_SLOTS} session address slots are in use")

    def new_session(self, token: str, pid: int, exe: str, slot: int | None = None) -> Session:
        if slot is None:
            slot = self.free_slot()
        self._reserve_slot(slot)
        s = self._session_object(token, pid, exe, slot)
        self.sessions[token] = s
        self.orphans.pop(token, None)
        return s

    def make_session(self, token: str, pid: int, exe: str, slot: int, reuse: Session | None = None) -> Session:
        """A session that is not served yet (restore builds it on a worker
        thread). reuse: the released session it replaces, whose address
        reservation it takes over."""
        if reuse is None:
            self.call_in_loop(lambda: self._reserve_slot(slot)).result()
        return self._session_object(token, pid, exe, slot)

    def _session_object(self, token: str, pid: int, exe: str, slot: int) -> Session:
        base = ARENA_BASE + slot * SLOT_SIZE
        s = Session(token, pid, exe, slot, Arena(base, SLOT_SIZE, self.backend.map_chunk, self.backend.unmap_chunk,
                                                 on_reserve=getattr(self.backend, "vmm_reserve", None),
                                                 on_release=getattr(self.backend, "vmm_release", None)))
        s.shm = ShmMap(token)
        if self.gate is not None:
            s.shm.owner_of = lambda: self.gate.owner      # its segments are files of the session's user
        nat = getattr(self.backend, "native", None)
        if nat is not None:
            nat.clear(slot)
            s.observer = nat.observer(slot)
        return s

    def _reserve_slot(self, slot: int):
        if slot in self.reservations or any(x.slot == slot for x in self.sessions.values()):
            raise RuntimeError(f"address slot {slot} is in use by another session of this proxyd")
        if not 0 <= slot < MAX_SLOTS:
            raise RuntimeError(f"address slot {slot} out of range")
        self.reservations[slot] = self.backend.reserve(ARENA_BASE + slot * SLOT_SIZE, SLOT_SIZE)

    def discard_session(self, s: Session, keep: Session | None = None):
        """Tears down a session that was never installed (failed restore).
        keep: the released session it was to replace, which keeps the slot."""
        self._release(s, unreserve=keep is None)

    def _release(self, s: Session, unreserve: bool = True):
        """Frees everything a session holds in proxyd and on the device."""
        from ..families.contexts import destroy_context
        from ..families.hostfn import close_gates
        try:
            close_gates(s)      # first: a pending host function would hold the context's synchronisation
            from ..families import ipc
            ipc.release(self.dispatcher, s)
            for c in list(s.contexts.values()):
                destroy_context(self.dispatcher, s, c)
            s.arena.release_all()
            for tok in s.shm.registered.values():
                if tok is not None:
                    self.backend.host_unregister(tok)
            s.shm.registered.clear()
            s.shm.close_all()
            if s.chan is not None:
                s.chan.close()
                s.chan = None
        except Exception:
            log.exception("error releasing session %s", s.token)
        nat = getattr(self.backend, "native", None)
        if nat is not None:
            nat.clear(s.slot)
        if unreserve:
            res = self.reservations.pop(s.slot, None)
            if res is not None:
                self.backend.unreserve(res)

    def unreserve_checkpoint(self, s: Session):
        s.ckpt_busy = False

    def install_session(self, s: Session, old: Session | None):
        """Starts serving a restored session (main loop). Calls that waited on
        the session it replaces run now, in order."""
        if old is not None:
            s.queued, s.reorder = old.queued, old.reorder
            old.queued, old.reorder = [], {}
            if old.shm is not None:
                old.shm.close_all()
            if old.chan is not None:
                old.chan.close()
        self.sessions[s.token] = s
        self.orphans.pop(s.token, None)
        log.info("session %s (pid %s) restored in slot %d", s.token, s.pid, s.slot)
        s.frozen = True
        self.resume(s)

    def hello_info(self, s: Session, shm_ok: bool) -> dict:
        return {"arena": [s.arena.base, s.arena.size], "shm": bool(shm_ok), "session": s.token,
                "slot": s.slot, "driver_version": self.backend.driver_version(), "version": __version__}

    def on_hello(self, rid: bytes, seq: int, info: dict):
        token = str(info.get("token") or self.token_of(rid) or "")
        if not token or self.token_of(rid) != token:
            self.send(rid, [seq, P.REPLY_PROTOCOL_ERROR, "HELLO token does not match the routing id"])
            return
        s = self.sessions.get(token)
        if s is None and self.worker and self.sessions:
            # a worker serves one session (its supervisor hands it out once)
            self.send(rid, [seq, P.REPLY_PROTOCOL_ERROR, "this proxyd worker serves another session"])
            return
        if s is not None and info.get("attach"):
            # The client comes back after a restore or after parking for a
            # whole-process checkpoint: its shared memory was unmapped and
            # made anew (same names, new files), so map it again. The attach
            # takes no sequence number (seq 0).
            self.detach_shared(s)
        if s is None and self.worker and self.zap is not None:
            exp = self.expected or {}
            ku = curve.user_id(self.meta)
            if exp.get("token") != token or (exp.get("uid") is not None and str(exp["uid"]) != ku):
                RATE.event("unexpected session", "worker: HELLO for a session its supervisor did not give it (%r)",
                           rid[:40])
                self.send(rid, [seq, P.REPLY_PROTOCOL_ERROR, "this proxyd worker was not given to this session"])
                return
        if s is None and self.gate is not None and (self.expected or {}).get("token") != token:
            self.send(rid, [seq, P.REPLY_PROTOCOL_ERROR, "this proxyd worker was not given to this session"])
            return
        if s is None:
            try:
                s = self.new_session(token, int(info.get("pid", 0)), str(info.get("exe", "")))
            except Exception as e:
                log.error("cannot open a session for pid %s: %s", info.get("pid"), e)
                self.send(rid, [seq, P.REPLY_PROTOCOL_ERROR, f"cannot open a session: {e}"])
                return
            log.info("session %s: pid %s %s (slot %d)", token, s.pid, s.exe, s.slot)
            if self.gate is not None:
                self.gate.opened(self, token)
            s.pidns = str(info.get("pidns") or "")
            if self.zap is not None and curve.peer_address(self.meta) not in curve.LOOPBACK:
                # a client on another host has a pid of another kernel (and
                # the same name for its initial pid namespace): never looked
                # up here
                s.pidns = ""
        if self.zap is not None and s.key_uid is None:
            # keyed tcp: the session is its key's user's (a restored one:
            # from its client's attach)
            ku = curve.user_id(self.meta)
            s.key_uid = int(ku) if ku and ku.isdigit() else None
        # HELLO takes a sequence number of the session like any message
        s.last_seq = max(s.last_seq, seq)
        shm_ok = False
        st = info.get("staging")
        for seg in sorted(s.shm_pending):
            # pinned host segments to page-lock again (a restore, or an
            # attach after parking, found them unmapped)
            try:
                if seg in s.shm.fixed:
                    hostmap.map_again(self.backend, s, seg)      # at the client's address
                else:
                    s.shm.registered[seg] = self.backend.host_register(memoryview(s.shm.open(seg)))
                s.shm_pending.discard(seg)
            except Exception as e:
                log.warning("session %s: pinned segment %s not mapped again (%s)", token, seg, e)
        if st:
            try:
                seg = int(st[0])
                m = s.shm.open(seg, int(st[2]))
                s.staging_seg = seg
                if seg not in s.shm.registered:
                    # page-locked, so staged copies are DMA from this buffer
                    try:
                        s.shm.registered[seg] = self.backend.host_register(memoryview(m))
                    except Exception as e:
                        log.warning("session %s: cannot page-lock the staging segment (%s); copies will be slower",
                                    token, e)
                        s.shm.registered[seg] = None
                shm_ok = True
            except (ShmError, ValueError, IndexError) as e:
                log.info("session %s: no shared memory with the client (%s); data goes inline", token, e)
        s.shm_ok = shm_ok
        ch = info.get("channel")
        if ch and shm_ok and s.chan is None and os.environ.get("GPUPROXY_CHANNEL", "1") != "0":
            try:
                if str(ch[0]) != shm_names.channel_name(token):
                    raise ChannelError(f"{str(ch[0])[:80]!r} is not this session's channel")   # another's segment
                s.chan = Channel(str(ch[0]), int(ch[1]))
            except (ChannelError, ValueError, IndexError) as e:
                log.info("session %s: no fast channel (%s)", token, e)
        info_out = self.hello_info(s, shm_ok)
        info_out["channel"] = s.chan is not None
        self.send(rid, [seq, 0, [info_out], 0, 0, ""])

    def detach_shared(self, s: Session):
        """Drops this worker's mappings of the client's shared memory (the
        client re-creates it; on_hello maps the new files)."""
        from ..families.hostfn import close_gates
        close_gates(s)
        for seg, tok in list(s.shm.registered.items()):
            if tok is not None:
                try:
                    self.backend.host_unregister(tok)
                except Exception as e:
                    log.warning("session %s: unregistering segment %s: %s", s.token, seg, e)
            if seg != s.staging_seg:
                s.shm_pending.add(seg)
        s.shm.registered.clear()
        s.shm.close_all()
        if s.chan is not None:
            s.chan.close()
            s.chan = None

    def on_call(self, rid: bytes, seq: int, ops: list, via_chan: bool = False, raw=None):
        token = self.token_of(rid)
        s = self.sessions.get(token) if token else None
        if s is None:
            # A restore may be about to bring this session back (a client
            # that waited through a daemon restart): keep it waiting a while.
            first = self.orphans.setdefault(token or "?", time.monotonic())
            if time.monotonic() - first < ORPHAN_GRACE_S:
                self.send(rid, [seq, P.REPLY_KEEPALIVE])
            else:
                self.send(rid, [seq, P.REPLY_UNKNOWN_SESSION, f"unknown session {token}"])
            return
        s.last_active = time.time()
        if seq <= s.last_seq:
            if seq == s.last_seq and s.last_reply is not None:
                self.sock.send_multipart([rid] + s.last_reply, copy=False)
            else:
                self.send(rid, [seq, 0, None, 0, 0, ""])
            return
        if s.frozen or (s.nccl_hold is not None and s.nccl_hold(s, ops)):
            # frozen for a checkpoint, or held before a collective for a job's
            # consistent cut (families/nccl_cut.py): answered later, in order
            if all(q[1] != seq for q in s.queued):
                s.queued.append((rid, seq, ops, via_chan, bytes(raw) if raw is not None else None))
            self.send(rid, [seq, P.REPLY_KEEPALIVE])
            return
        if seq > s.last_seq + 1:
            s.reorder[seq] = (ops, via_chan, bytes(raw) if raw is not None else None)
            return
        self.execute(s, rid, seq, ops, via_chan, raw)
        while s.last_seq + 1 in s.reorder and not s.frozen:
            nxt = s.last_seq + 1
            ops2, vc, raw2 = s.reorder.pop(nxt)
            self.execute(s, rid, nxt, ops2, vc, raw2)

    def execute(self, s: Session, rid: bytes, seq: int, ops: list, via_chan: bool = False, raw=None):
        ns = self.nserve
        if ns is not None:
            ns.forget(s.slot)       # this message may free memory the C loop copied from
        code, outs, msg = self.dispatcher.run_ops(s, ops, raw)
        if ns is not None:
            ns.learn(s, ops)
        s.last_seq = seq
        self.answer(s, rid, seq, ops, via_chan, code, outs, msg)

    def answer(self, s: Session, rid: bytes, seq: int, ops: list, via_chan: bool, code: int, outs, msg: str,
               printed: bytes | None = None):
        """Answers message seq after its ops ran (execute, and the C serving
        loop's messages that need Python: native_serve.py). printed: what
        the C loop already took from the captured stdout."""
        lop = ops[-1] if ops else None
        last = FUNCTIONS.get(lop[0]) if type(lop) is list and lop and type(lop[0]) is int else None
        sync = last is not None and last.sync
        if via_chan and not sync:
            # The channel keeps only the newest answer, which may replace
            # this one unread: async failures wait for the next sync answer.
            ac, afid, amsg = 0, 0, ""
        elif s.async_error is None:
            ac, afid, amsg = 0, 0, ""
        else:
            ac, afid, amsg = s.take_async_error()
        reply = [seq, code, outs, ac, afid, msg or amsg]
        if printed is not None:
            reply.append(printed)     # taken by the C loop, which keeps may_print itself
        elif self.stdout_capture is not None:
            if not s.may_print:
                for op in ops:
                    if type(op) is list and op and op[0] in PRINTING_FIDS:
                        s.may_print = True
                        break
            if s.may_print and sync:
                printed = self.stdout_capture.take()
                if printed:
                    reply.append(printed)     # the shim writes it to the app's stdout
                if last.name == "cuCtxSynchronize":
                    # every kernel of the context has ended and the driver has
                    # flushed its printf buffer: nothing more can come until
                    # the next launch, so later sync calls skip the flush+read
                    s.may_print = False
        if via_chan and not sync and s.chan is not None and s.chan.pending():
            # The client's next request already waits in the slot, and the
            # answer to it settles this one too (a reply to sequence number s
            # acknowledges every earlier message: docs/protocol.md, "Fast
            # channel"). Not answering saves a pack and a slot write per
            # launch of a launch + sync-copy pair. A resend of this message
            # gets the empty answer of a duplicate (on_call).
            s.last_reply = None
            return
        if len(reply) == 6 and P.small_values(outs):
            frames = [_packb(reply, use_bin_type=True)]     # one frame: Packer.pack's result without its walk
        else:
            frames = self.packer.pack(reply)
        s.last_reply = frames
        if via_chan and s.chan is not None and len(frames) == 1 and s.chan.reply(seq, frames[0]):
            return
        self.sock.send_multipart([rid] + frames, copy=False)

    def resume(self, s: Session):
        """Runs the calls that arrived while s was frozen (main loop only)."""
        s.frozen = False
        queued, s.queued = sorted(s.queued, key=lambda q: q[1]), []
        for rid, seq, ops, vc, raw in queued:
            self.on_call(rid, seq, ops, vc, raw)

    def on_bye(self, rid: bytes, seq: int):
        token = self.token_of(rid)
        s = self.sessions.get(token) if token else None
        if s is not None and s.frozen:
            self.send(rid, [seq, P.REPLY_KEEPALIVE])   # a checkpoint holds it; ends after
            return
        if s is not None:
            log.info("session %s (pid %s) ended", token, s.pid)
            self.close_session(s)
        self.send(rid, [seq, 0, None, 0, 0, ""])

    def close_session(self, s: Session):
        self.sessions.pop(s.token, None)
        self._release(s)
        if self.worker:
            self.stopping = True      # a worker lives as long as its session

    def reap(self):
        """Ends sessions whose process is gone. A pid means something only in
        the client's pid namespace: sessions from another one (another
        container) are left alone."""
        if self.worker:
            return      # the supervisor watches the client and ends this worker
        for s in list(self.sessions.values()):
            # a released session (dumped, waiting for a restore) whose process
            # is gone waits for nothing: it goes too
            if not s.pid or (s.frozen and not s.released) or s.ckpt_busy or not s.pidns or s.pidns != OWN_PIDNS:
                continue
            if not os.path.exists(f"/proc/{s.pid}"):
                log.info("session %s: pid %s exited without saying goodbye; releasing it", s.token, s.pid)
                self.close_session(s)
                remove_client_segments(s.token)
        now = time.monotonic()
        for t, first in list(self.orphans.items()):
            if now - first > 10 * ORPHAN_GRACE_S:
                del self.orphans[t]

    # ------------------------------------------------------------- control
    def on_ctl(self, rid: bytes, seq: int, cmd: str, args: dict):
        if self.worker and rid != b"ctl:sup-" + os.environ.get("GPUPROXY_WORKER_SECRET", "").encode():
            # a worker obeys its supervisor only (which authorises requests)
            self.send(rid, [seq, 1, "permission denied: control commands go to proxyd's supervisor"])
            return
        h = self.ctl_handlers.get(cmd)
        if h is None:
            self.send(rid, [seq, 1, f"unknown command {cmd!r}"])
            return
        h(rid, seq, args or {})

    def ctl_reply(self, rid: bytes, seq: int, result=None, error: str | None = None, threaded=False):
        obj = [seq, 0, result] if error is None else [seq, 1, error]
        if threaded:
            self.post(rid, self.packer.pack(obj))
        else:
            self.send(rid, obj)
