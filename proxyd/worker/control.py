"""proxy-cli commands served by proxyd (message type CTL).

Each handler answers through Server.ctl_reply. Commands that take long
(checkpoints) run on a worker thread and answer with threaded=True.
"""
from __future__ import annotations

import os
import time

from .. import __version__


def register(server):
    def ctl(name):
        def deco(fn):
            server.ctl_handlers[name] = fn
            return fn
        return deco

    @ctl("ping")
    def ping(rid, seq, args):
        server.ctl_reply(rid, seq, {"version": __version__, "pid": os.getpid()})

    from ..families.nccl import status as nccl_status

    @ctl("status")
    def status(rid, seq, args):
        sessions = []
        for s in sorted(server.sessions.values(), key=lambda s: s.slot):
            sessions.append({
                "token": s.token,
                "pid": s.pid,
                "exe": s.exe,
                "slot": s.slot,
                "device_memory": s.arena.bytes_in_use(),
                "device_memory_mapped": s.arena.bytes_mapped(),
                "objects": s.counts(),
                "calls": s.calls,
                "frozen": s.frozen,
                "released": s.released,
                "checkpoint": s.ckpt_phase,
                "age_s": round(time.time() - s.created, 1),
                "shared_memory": bool(getattr(s, "shm_ok", False)),
                # the message order as the worker sees it (a client that
                # waits for an answer: did its message run, or does it wait?)
                "last_seq": s.last_seq,
                **({"queued": [q[1] for q in s.queued][:16]} if s.queued else {}),
                **({"out_of_order": sorted(s.reorder)[:16]} if s.reorder else {}),
                **nccl_status(s),
            })
        b = server.backend
        devices = []
        for d in range(b.device_count()):
            devices.append({"index": d, "name": b.device_name(d), "memory": b.device_total_mem(d)})
        server.ctl_reply(rid, seq, {
            "version": __version__,
            "pid": os.getpid(),
            "endpoint": server.endpoint,
            "backend": b.name,
            "driver_version": b.driver_version(),
            "devices": devices,
            "uptime_s": round(time.time() - server.started, 1),
            "sessions": sessions,
        })

    @ctl("quiesce")
    def quiesce(rid, seq, args):
        """Waits until the device has done all work of this worker's sessions
        (a shim about to park for a whole-process checkpoint asks for it)."""
        for s in server.sessions.values():
            for c in s.contexts.values():
                server.backend.make_current(c.real)
                server.backend.ctx_sync(c.real)
        server.ctl_reply(rid, seq, {"idle": True})

    @ctl("expect")
    def expect(rid, seq, args):
        """The supervisor gives this worker to a session (keyed tcp): only a
        HELLO with this token and a key of this user may open it. A worker's
        tcp port can be found by anyone; without this, a client with any
        admitted key could take a spare worker past the supervisor."""
        server.expected = {"token": str(args.get("token", "")), "uid": args.get("uid")}
        if server.gate is not None:
            server.gate.expect(args.get("uid"))
            s = server.sessions.get(str(args.get("token", "")))
            if s is not None:
                s.owner_uid = server.gate.owner      # a restored session: its user again
        server.ctl_reply(rid, seq, {"expecting": True})

    @ctl("shutdown")
    def shutdown(rid, seq, args):
        server.ctl_reply(rid, seq, {"stopping": True})
        server.stopping = True

    from ..families.nccl_cut import register_ctl as nccl_cut_ctl
    nccl_cut_ctl(server, ctl)      # the consistent cut of a multi-rank job, this rank's part

    try:
        from ..checkpoint import commands
    except ImportError:
        return
    commands.register(server, ctl)
