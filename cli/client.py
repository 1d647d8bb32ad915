"""Talking to proxyd's control interface (CTL messages, docs/protocol.md)."""
from __future__ import annotations

import uuid

import msgpack
import zmq

from gpuproxy.proxyd import protocol as P


class ControlError(Exception):
    pass


class ControlClient:
    def __init__(self, endpoint: str, timeout_s: float = 10.0):
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.ctx = zmq.Context.instance()
        self.seq = 0

    def call(self, cmd: str, args: dict | None = None, timeout_s: float | None = None):
        """Sends one command and returns its result; raises ControlError with
        a clear message when proxyd is unreachable or the command failed."""
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.ROUTING_ID, b"ctl:" + uuid.uuid4().hex.encode())
        try:
            s.connect(self.endpoint)
            self.seq += 1
            s.send(msgpack.packb([P.MSG_CTL, self.seq, cmd, args or {}], use_bin_type=True))
            t = self.timeout_s if timeout_s is None else timeout_s
            if not s.poll(int(t * 1000)):
                raise ControlError(f"no answer from proxyd at {self.endpoint} within {t:g} s (is proxyd running?)")
            reply = msgpack.unpackb(s.recv(), raw=False, strict_map_key=False)
        finally:
            s.close(0)
        if len(reply) >= 3 and reply[1] == 0:
            return reply[2]
        raise ControlError(str(reply[2]) if len(reply) >= 3 else f"bad answer {reply!r}")
