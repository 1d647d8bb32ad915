"""Hostile input for proxyd: random, truncated, oversized and type-confused
messages on the data path (CALL ops with bad arguments, every message type)
and the control path (CTL commands with bad arguments). Used by
tests/test_fuzz.py (bounded, in CI) and bench/fuzz.py (long runs).

    stats = Fuzzer(endpoint, seed=1).run(200_000)

Messages go out in batches; after each batch the fuzzer waits until proxyd
answers a ping, so the daemon's queue (and memory) stays bounded and the
count measures messages proxyd actually handled.
"""
from __future__ import annotations

import os
import random
import struct
import tempfile
import time
import uuid

import msgpack
import zmq

from gpuproxy.proxyd.core import protocol as P
from gpuproxy.proxyd._generated import FUNCTIONS

FIDS = sorted(FUNCTIONS)
# control commands a fuzzer may send: everything but "shutdown", which
# would legitimately stop the daemon (authorisation decides who may)
CTL_CMDS = ["ping", "status", "dump", "pre-dump", "restore", "migrate", "inspect", "nonsense", ""]


def _ext_shm(r: random.Random) -> msgpack.ExtType:
    return msgpack.ExtType(P.EXT_SHM, struct.pack(">IQQ", r.randrange(8), r.choice([0, r.getrandbits(64)]),
                                                  r.choice([0, 16, r.getrandbits(64)])))


class Fuzzer:
    def __init__(self, endpoint: str, seed: int = 0, batch: int = 500, worker_probe: str = "ctl"):
        self.endpoint = endpoint
        # how the fuzzer learns that the worker worked through a batch: "ctl"
        # (a ping the worker answers "permission denied": proxyd's own user
        # only) or "hello" (the session's HELLO again, answered in order on
        # the data socket: any user, proxyd/worker/gate.py reads no one
        # else's control messages)
        self.worker_probe = worker_probe
        self.r = random.Random(seed)
        self.batch = batch
        self.ctx = zmq.Context.instance()
        self.ctl = self._sock(b"ctl:fuzz-" + uuid.uuid4().hex[:8].encode())
        self.probe = self._sock(b"ctl:fuzz-probe-" + uuid.uuid4().hex[:8].encode())
        self.tmp = tempfile.mkdtemp(prefix="gpx-fuzz-")
        self.seq = 0
        self.sent = {"data": 0, "ctl": 0}
        self.sessions = 0
        self.data = self.sup_data = self.wprobe = None
        self._open_session()

    def _sock(self, rid: bytes, endpoint: str | None = None):
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.ROUTING_ID, rid)
        from gpuproxy.proxyd.core import curve
        curve.secure_client(s, endpoint or self.endpoint)     # keyed tcp: this user's keys
        s.connect(endpoint or self.endpoint)
        return s

    def _open_session(self):
        """A real session (HELLO to the supervisor, then to the worker it
        names): data messages go to that worker, which executes calls; some
        go to the supervisor itself. A fuzzed BYE may end the session (and
        its worker): then another is opened."""
        for s in (self.data, self.sup_data, self.wprobe):
            if s is not None:
                s.close(0)
        self.token = f"{uuid.uuid4().hex[:16]}-{os.getpid()}"
        rid = b"c:" + self.token.encode()
        self.sup_data = self._sock(rid)
        info = {"pid": os.getpid(), "token": self.token, "version": "fuzz", "exe": "fuzz", "staging": None,
                "channel": None, "pidns": os.readlink("/proc/self/ns/pid")}
        self.info = info
        self.seq += 1
        self.sup_data.send(msgpack.packb([P.MSG_HELLO, self.seq, [info]], use_bin_type=True))
        end = time.monotonic() + 60
        ep = None
        while ep is None:
            if time.monotonic() > end:
                raise TimeoutError(f"proxyd at {self.endpoint} gave the fuzzer no worker")
            if self.sup_data.poll(200):
                rep = msgpack.unpackb(self.sup_data.recv(), raw=False, strict_map_key=False)
                if rep[1] == 0:
                    ep = rep[2][0]["endpoint"]
        self.data = self._sock(rid, ep)
        self.seq += 1
        self.data.send(msgpack.packb([P.MSG_HELLO, self.seq, [info]], use_bin_type=True))
        self.wprobe = self._sock(b"ctl:fuzz-wprobe-" + uuid.uuid4().hex[:8].encode(), ep)
        self.sessions += 1

    def close(self):
        for s in (self.data, self.sup_data, self.ctl, self.probe, self.wprobe):
            s.close(0)

    # ------------------------------------------------------------- values
    def value(self, depth: int = 0):
        r = self.r
        k = r.randrange(14 if depth < 2 else 10)
        if k == 0:
            return None
        if k == 1:
            return r.choice([True, False])
        if k == 2:
            return r.choice([0, 1, 2, -1, 255, 256, 4096, 1 << 20, 1 << 31, (1 << 32) + 1, (1 << 63) - 1,
                             -(1 << 63), (1 << 64) - 1, 0x2000_0000_0000 + r.randrange(1 << 30)])
        if k == 3:
            return r.getrandbits(r.choice([8, 32, 64]))
        if k == 4:
            return r.random() * r.choice([1, 1e9, -1e300])
        if k == 5:
            return r.randbytes(r.choice([0, 1, 8, 64, 300]))
        if k == 6:
            return "".join(r.choice("ab/.-\x00é") for _ in range(r.randrange(12)))
        if k == 7:
            return _ext_shm(r)
        if k == 8:
            return msgpack.ExtType(P.EXT_FRAME, struct.pack(">I", r.randrange(4)))
        if k == 9:
            return msgpack.ExtType(r.randrange(3, 127), r.randbytes(r.randrange(9)))
        if k in (10, 11):
            return [self.value(depth + 1) for _ in range(r.randrange(5))]
        return {str(self.value(depth + 1))[:8]: self.value(depth + 1) for _ in range(r.randrange(4))}

    def op(self):
        r = self.r
        fid = r.choice(FIDS) if r.random() < 0.9 else self.value(1)
        fn = FUNCTIONS.get(fid) if isinstance(fid, int) else None
        n = len(fn.params) if fn is not None and r.random() < 0.8 else r.randrange(15)
        return [fid, r.choice([0, (1 << 32) | 1, self.value(1)]), *[self.value(1) for _ in range(n)]]

    # ----------------------------------------------------------- messages
    def data_message(self) -> list[bytes]:
        r = self.r
        self.seq += 1
        kind = r.randrange(10)
        if kind == 1 and r.random() > 0.01:
            kind = 0                                    # oversized ones are rare: they cost bandwidth, not variety
        if kind == 0:                                   # random bytes
            return [r.randbytes(r.randrange(1, 64))]
        if kind == 1:                                   # oversized: 1-4 MiB of garbage or a huge CALL
            n = r.randrange(1 << 20, 4 << 20)
            if r.random() < 0.5:
                return [r.randbytes(n)]
            return [msgpack.packb([P.MSG_CALL, self.seq, [[r.choice(FIDS), 0, b"\0" * n]]], use_bin_type=True)]
        if kind == 2:                                   # a truncated well-formed message
            full = msgpack.packb([P.MSG_CALL, self.seq, [self.op() for _ in range(r.randrange(1, 4))]],
                                 use_bin_type=True)
            return [full[:r.randrange(len(full))]]
        if kind == 3:                                   # extra frames, frame refs out of range
            return [msgpack.packb([P.MSG_CALL, self.seq, [self.op()]], use_bin_type=True),
                    *[r.randbytes(r.randrange(64)) for _ in range(r.randrange(3))]]
        if kind == 4:                                   # any message type, any payload
            return [msgpack.packb([self.value(1), self.value(1), self.value(1), self.value(1)][:r.randrange(5)],
                                  use_bin_type=True)]
        # type-confused CALL ops: the common case
        ops = [self.op() for _ in range(r.randrange(1, 5))]
        seq = self.seq if r.random() < 0.9 else self.value(1)
        return [msgpack.packb([P.MSG_CALL, seq, ops], use_bin_type=True)]

    def ctl_message(self) -> list[bytes]:
        r = self.r
        self.seq += 1
        cmd = r.choice(CTL_CMDS) if r.random() < 0.9 else self.value(1)
        if r.random() < 0.5:
            args = self.value(1)
        else:
            args = {}
            for key in ("pid", "dir", "parent", "leave_running", "concurrent", "device_map", "to_device",
                        "allow_foreign"):
                if r.random() < 0.5:
                    args[key] = self.value(1)
            if "dir" in args and r.random() < 0.5:
                args["dir"] = os.path.join(self.tmp, r.choice(["a", "b", "../x", "img"]))
            if "pid" in args and isinstance(args["pid"], int) and abs(args["pid"]) < 1 << 22:
                args["pid"] = (1 << 22) + r.randrange(1000)     # never a real session: pids end below 2^22
        body = [P.MSG_CTL, self.seq, cmd, args]
        raw = msgpack.packb(body[:r.randrange(2, 5)] if r.random() < 0.1 else body, use_bin_type=True)
        if r.random() < 0.05:
            raw = raw[:r.randrange(len(raw))]
        return [raw]

    # ---------------------------------------------------------------- run
    def _drain(self):
        for s in ((self.sup_data, self.ctl) if self.worker_probe == "hello" else (self.data, self.sup_data, self.ctl)):
            while True:
                try:
                    s.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break

    def wait_served(self, timeout_s: float = 60.0) -> float:
        """Waits until proxyd answers a ping (it has worked through what was
        sent before it); the seconds it took."""
        t0 = time.monotonic()
        self.seq += 1
        self.probe.send(msgpack.packb([P.MSG_CTL, self.seq, "ping", {}]))
        if self.worker_probe == "hello":
            self.data.send(msgpack.packb([P.MSG_HELLO, self.seq, [self.info]], use_bin_type=True))
        else:
            self.wprobe.send(msgpack.packb([P.MSG_CTL, self.seq, "ping", {}]))
        sup = worker = False
        while not (sup and worker):
            self._drain()
            if not sup and self.probe.poll(50):
                self.probe.recv()
                sup = True
            if not worker and self.worker_probe == "hello":
                while not worker and self.data.poll(50):
                    try:
                        rep = msgpack.unpackb(self.data.recv(), raw=False, strict_map_key=False)
                        worker = rep[0] == self.seq and rep[1] == 0
                    except Exception:
                        pass
            elif not worker and self.wprobe.poll(50):
                self.wprobe.recv()
                worker = True
            waited = time.monotonic() - t0
            if sup and not worker and waited > 5:
                self._open_session()      # its session ended (a fuzzed BYE): the worker is gone
                worker = True
            if waited > timeout_s:
                raise TimeoutError(f"proxyd at {self.endpoint} stopped answering after {self.sent} messages")
        return time.monotonic() - t0

    def run(self, count: int, ctl_share: float = 0.05, progress=None) -> dict:
        t0 = time.monotonic()
        done = 0
        while done < count:
            n = min(self.batch, count - done)
            for _ in range(n):
                if self.r.random() < ctl_share:
                    self.ctl.send_multipart(self.ctl_message())
                    self.sent["ctl"] += 1
                else:
                    # most data messages to the session's worker, some to the supervisor
                    (self.data if self.r.random() < 0.9 else self.sup_data).send_multipart(self.data_message())
                    self.sent["data"] += 1
            done += n
            self.wait_served()
            if progress is not None:
                progress(done, count)
        return {"messages": done, **self.sent, "sessions": self.sessions, "seconds": round(time.monotonic() - t0, 2)}
