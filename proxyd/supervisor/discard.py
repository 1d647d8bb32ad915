"""The `discard` control command: ends a restored session whose process
never came back.

A whole-process restore puts the GPU state into a fresh worker first, then
has CRIU restore the processes. When CRIU fails, nothing will ever attach to
that session; without this command it stayed "live" until ATTACH_GRACE_S
(120 s) passed, and every retry of the restore was refused meanwhile
("session ... is live in this proxyd"). proxy-cli (proxyd/checkpoint/orchestrate/whole_process.py)
sends `discard` with the session's token right after the failure, so a
retry can follow at once.

Only a session that waits for its restored process is ended this way: one
whose client has attached (or was never restored) is refused, so a stray
token cannot end a running program.

Runs on the supervisor's loop (supervisor.py), like every control command.
"""
from __future__ import annotations

import logging

log = logging.getLogger("proxyd")


def ctl_discard(sup, rid, seq, args) -> None:
    token = args.get("token")
    e = sup.entries.get(str(token)) if isinstance(token, str) and token else None
    if e is None:
        sup.reply(rid, seq, error="no such session in this proxyd")
        return
    if e.restored_at is None or e.pidfd is not None:
        sup.reply(rid, seq, error=f"session of pid {e.pid} is not a restore waiting for its process: not discarded")
        return
    log.info("restored session of pid %s discarded: its process was not restored", e.pid)
    sup._end(e)
    sup.reply(rid, seq, {"discarded": True, "pid": e.pid})
