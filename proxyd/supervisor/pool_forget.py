"""The `pool-forget` control command: drops the notes of dump memory kept in
the shared host pool for restores from host memory (host_pool.py;
proxyd/checkpoint/memory_restore.py), so the next restore of those images
reads their files. The pool itself stays (it is staging memory; it is
closed when idle, GPUPROXY_HOST_POOL_KEEP_S).

A user drops only the notes of their own pool; root or proxyd's own user
drops everyone's, or one user's with `uid`. Runs on the supervisor's loop
(daemon.py), like every control command.
"""
from __future__ import annotations

import logging

log = logging.getLogger("proxyd")


def ctl_pool_forget(sup, rid, seq, args) -> None:
    asker = sup.asker
    uid = args.get("uid")
    if uid is not None and not isinstance(uid, int):
        sup.reply(rid, seq, error="uid must be a number")
        return
    if not sup.is_admin(asker):
        if asker is None or (uid is not None and uid != asker):
            sup.reply(rid, seq, error="permission denied: only your own pool's kept memory can be dropped")
            return
        uid = asker
    n = sup.host_pools.forget(uid=uid)
    if n:
        log.info("host pool: %d kept image(s) dropped on request (uid %s)", n, "all" if uid is None else uid)
    sup.reply(rid, seq, {"dropped": n})
