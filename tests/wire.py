"""A minimal client of proxyd's wire protocol (docs/protocol.md) in Python,
for tests that must send exactly the messages they want: well-formed calls
by function name, or anything at all (the fuzz harness).

    with WireClient(endpoint) as c:
        c.hello()
        code, outs, msg = c.call("cuInit", 0)
"""
from __future__ import annotations

import os
import uuid

import msgpack
import zmq

from gpuproxy.proxyd.core import protocol as P
from gpuproxy.proxyd._generated import FUNCTIONS

FID = {fn.name: fid for fid, fn in FUNCTIONS.items()}


class WireClient:
    def __init__(self, endpoint: str, token: str | None = None, timeout_s: float = 10.0):
        self.endpoint = endpoint
        # the shim's token format: 16 hex digits, '-', the pid
        self.token = token or f"{uuid.uuid4().hex[:16]}-{os.getpid()}"
        self.timeout_ms = int(timeout_s * 1000)
        self.seq = 0
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTING_ID, b"c:" + self.token.encode())
        from gpuproxy.proxyd.core import curve
        curve.secure_client(self.sock, endpoint)      # keyed tcp: this user's keys
        self.sock.connect(endpoint)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.sock.close(0)

    def send_raw(self, frames) -> None:
        self.sock.send_multipart(frames)

    def request(self, mtype: int, payload) -> list:
        """Sends one message and waits for its answer (KEEPALIVEs skipped).
        After a second of silence it does what the shim does: asks the
        supervisor where the session is (a restore moves it to another
        worker), goes there and sends the message again."""
        import time
        self.seq += 1
        seq = self.seq
        raw = msgpack.packb([mtype, seq, payload], use_bin_type=True)
        self.sock.send(raw)
        end = time.monotonic() + self.timeout_ms / 1000
        while True:
            if self.sock.poll(1000):
                rep = msgpack.unpackb(self.sock.recv(), raw=False, strict_map_key=False)
                if rep[0] == seq and rep[1] != P.REPLY_KEEPALIVE:
                    return rep
                continue
            if time.monotonic() > end:
                raise TimeoutError(f"no answer to message {seq} from {self.endpoint}")
            if getattr(self, "worker_endpoint", None) and self._follow():
                self.sock.send(raw)

    def _follow(self) -> bool:
        """WHERE: True when the session moved to another worker (then the
        socket is connected there and the session re-attached)."""
        sup = self._dealer(self.endpoint)
        try:
            sup.send(msgpack.packb([P.MSG_WHERE, 0, {"pid": os.getpid()}], use_bin_type=True))
            if not sup.poll(2000):
                return False
            rep = msgpack.unpackb(sup.recv(), raw=False, strict_map_key=False)
        finally:
            sup.close(0)
        ep = rep[2][0].get("endpoint") if rep[1] == 0 and rep[2] else None
        if not ep or ep == self.worker_endpoint:
            return False
        self.worker_endpoint = ep
        self.sock.close(0)
        self.sock = self._dealer(ep)
        self.sock.send(msgpack.packb([P.MSG_HELLO, 0, [dict(self.info, attach=True)]], use_bin_type=True))
        return bool(self.sock.poll(10000)) and self.sock.recv() is not None

    def _dealer(self, endpoint: str):
        so = zmq.Context.instance().socket(zmq.DEALER)
        so.setsockopt(zmq.LINGER, 0)
        so.setsockopt(zmq.ROUTING_ID, b"c:" + self.token.encode())
        from gpuproxy.proxyd.core import curve
        curve.secure_client(so, endpoint)
        so.connect(endpoint)
        return so

    def hello(self) -> dict:
        """HELLO to the supervisor, which names the session's worker, then
        HELLO there: later messages go to the worker (docs/protocol.md)."""
        info = {"pid": os.getpid(), "token": self.token, "version": "test", "exe": "wire-test",
                "staging": None, "channel": None, "pidns": os.readlink("/proc/self/ns/pid")}
        self.info = info
        rep = self.request(P.MSG_HELLO, [info])
        assert rep[1] == 0, rep
        ep = rep[2][0]["endpoint"]
        self.sock.close(0)
        self.sock = self._dealer(ep)
        rep = self.request(P.MSG_HELLO, [info])
        self.worker_endpoint = ep
        assert rep[1] == 0, rep
        return rep[2][0]

    def call(self, name: str, *args, ctx: int = 0) -> tuple[int, list, str]:
        rep = self.request(P.MSG_CALL, [[FID[name], ctx, *args]])
        return rep[1], rep[2], rep[5] if len(rep) > 5 else ""

    def bye(self):
        self.request(P.MSG_BYE, [])

    def context(self) -> int:
        """cuInit + the primary context of device 0 (handle)."""
        assert self.call("cuInit", 0)[0] == 0
        code, outs, msg = self.call("cuDevicePrimaryCtxRetain", True, 0)
        assert code == 0, msg
        return outs[0]
