"""Where a worker's time goes per message (issue 13, target 4): a stage
profile of the round-trip path, for bench/roundtrip_profile.py.

    GPUPROXY_RT_PROFILE=FILE proxyd ...

With the variable set, each worker wraps the functions of its message path
in timers when it starts (install) and writes a JSON summary to FILE.<pid>
when it ends (dump). Without it nothing here is imported, so the normal path
carries no timing code at all.

Stages (each the inclusive time of one function, per call):
  chan_poll    Channel.poll of a request that was there (copy out of the slot)
  decode       protocol.decode (msgpack -> Python objects)
  handle       Server.handle: everything done for one message, reply included
  handle_zmq   the same, of the messages that came by ZeroMQ instead of the
               channel (a doorbell, or a request that found the slot busy)
  run_ops      Dispatcher.run_ops: dispatch, handler and the backend's work
  backend      the backend functions a round trip uses (call, dtoh, launch, ...)
  pack         packing the reply (Packer.pack, or execute()'s one msgpack call)
  chan_reply   Channel.reply (copy into the slot, fence)
  gap          loop time between the end of one handle() and the start of the
               next: the client's part of the round trip plus the worker's
               own polling (wake-up latency lands here)

Locking: the timers are touched by the worker's main loop only.
"""
from __future__ import annotations

import json
import os
import time

_ns = time.perf_counter_ns


class Stage:
    __slots__ = ("n", "total", "samples")

    def __init__(self):
        self.n = 0
        self.total = 0
        self.samples: list[int] = []

    def add(self, dt: int):
        self.n += 1
        self.total += dt
        if len(self.samples) < 200000:
            self.samples.append(dt)

    def summary(self) -> dict:
        s = sorted(self.samples)
        if not s:
            return {"n": 0}
        q = lambda f: s[int(f * (len(s) - 1))] / 1000.0   # noqa: E731
        return {"n": self.n, "mean_us": round(self.total / self.n / 1000.0, 3), "min_us": round(s[0] / 1000.0, 3),
                "median_us": round(q(0.5), 3), "p90_us": round(q(0.9), 3), "p99_us": round(q(0.99), 3)}


STAGES: dict[str, Stage] = {}
_path = None
_last_end = [0]


def _timed(name: str, fn, only_hits=False):
    st = STAGES.setdefault(name, Stage())

    def wrapper(*a, **kw):
        t0 = _ns()
        r = fn(*a, **kw)
        if not only_hits or r is not None:
            st.add(_ns() - t0)
        return r
    wrapper.__wrapped__ = fn
    return wrapper


def install(server, path: str):
    """Wraps the message path of this worker's server in timers."""
    global _path
    _path = path
    from ..core import channel, protocol
    from . import server as srv_mod
    protocol.decode = _timed("decode", protocol.decode)
    channel.Channel.poll = _timed("chan_poll", channel.Channel.poll, only_hits=True)
    channel.Channel.reply = _timed("chan_reply", channel.Channel.reply)
    server.packer.pack = _timed("pack", server.packer.pack)
    srv_mod._packb = _timed("pack", srv_mod._packb)        # execute()'s one-call packing of small replies
    d = server.dispatcher
    d.run_ops = _timed("run_ops", d.run_ops)
    b = server.backend
    for name in ("call", "dtoh", "htod", "launch", "ctx_sync", "stream_sync", "map_chunk", "unmap_chunk",
                 "make_current"):
        if hasattr(b, name):
            setattr(b, name, _timed("backend", getattr(b, name)))
    handle = server.handle
    st_handle = STAGES.setdefault("handle", Stage())
    st_gap = STAGES.setdefault("gap", Stage())

    st_zmq = STAGES.setdefault("handle_zmq", Stage())

    def timed_handle(rid, frames, via_chan=False):
        t0 = _ns()
        if _last_end[0]:
            st_gap.add(t0 - _last_end[0])
        handle(rid, frames, via_chan)
        t1 = _ns()
        st_handle.add(t1 - t0)
        if not via_chan:
            st_zmq.add(t1 - t0)     # messages that came by ZeroMQ (doorbells, fallbacks)
        _last_end[0] = t1
    server.handle = timed_handle
    srv_mod.log.info("round-trip profile on: %s", path)


def dump():
    if not _path:
        return
    out = {name: st.summary() for name, st in STAGES.items()}
    with open(f"{_path}.{os.getpid()}", "w") as f:
        json.dump(out, f, indent=1)
