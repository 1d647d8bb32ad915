"""The small files in /dev/shm that tell a client's shim about its session
across daemons: /dev/shm/gpuproxy-<what>-<public id of the token>.

    released  written here when a dump without --leave-running releases a
              session's GPU state. The client's shim (interceptor/transport.c,
              gp_released_marker) then knows it waits for a restore even if
              the daemon that released it is gone and a new one that does
              not know the session answers first; it removes the marker
              once its session runs again.
    parked    written by a parking shim (park.c), for the supervisor.
    resume    written by the supervisor (ctl_resume), for a parked shim.

A token is 16 hex digits, '-', the client's pid. Markers of a session are
removed when it ends in this daemon (Supervisor._end), and at start (sweep)
for clients that are gone: a pid that is not alive in our pid namespace, no
live holder of the lock on the client's staging segment (shm_sweep.py: a
client of another pid namespace holds it as long as it lives) and a marker
older than MIN_AGE_S. A whole-process image's client is gone too
until CRIU restores it; its restored shim needs none of these files (proxyd
writes `resume` again for it).

Locking: none; the supervisor's loop thread only.
"""
from __future__ import annotations

import logging
import os
import re
import time

from ..core import procinfo
from ..core.shm_names import public_id
from .shm_sweep import _lock_is_free

log = logging.getLogger("proxyd")

SHM_DIR = "/dev/shm"
KINDS = ("released", "parked", "resume")
MIN_AGE_S = 10.0
NAME = re.compile(r"gpuproxy-(?P<kind>released|parked|resume)-(?P<token>[0-9a-f]{16}-(?P<pid>[0-9]{1,10}))(\.tmp)?")


def path(kind: str, token: str) -> str:
    # named by the session's public id, never its token (issue 21: /dev/shm
    # can be listed by every local user; core/shm_names.py, the shim's
    # gp_shm_id). The id has the token's shape, which NAME and sweep parse.
    return os.path.join(SHM_DIR, f"gpuproxy-{kind}-{public_id(token)}")


def mark_released(token: str, pid: int, endpoint: str, last_seq: int | None = None) -> None:
    """The released marker of token's session, owned by its client's user
    (so that the shim can remove it); a failure is logged, not fatal: the
    client then learns of its release from the supervisor only. It also
    records the last call the released state holds (older_than_release)."""
    p = path("released", token)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(endpoint + "\n" + (f"last_seq {int(last_seq)}\n" if last_seq is not None else ""))
        try:
            st = os.stat(f"/proc/{pid}")
            os.chown(p, st.st_uid, st.st_gid)
        except OSError:
            pass
    except OSError as e:
        log.warning("cannot write %s (%s): the session of pid %s learns of its release from this daemon only",
                    p, e.strerror, pid)


def remove(token: str, kinds=KINDS) -> None:
    for k in kinds:
        for p in (path(k, token), path(k, token) + ".tmp"):
            try:
                os.unlink(p)
            except OSError:
                pass


def sweep(shm_dir: str = SHM_DIR, min_age_s: float = MIN_AGE_S) -> int:
    """Removes the markers of clients that are gone; the number removed."""
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return 0
    now = time.time()
    removed = 0
    for n in names:
        m = NAME.fullmatch(n)
        if not m or procinfo.alive(int(m["pid"])):
            continue
        staging = os.path.join(shm_dir, f"gpuproxy-{m['token']}-0")
        if os.path.exists(staging) and not _lock_is_free(staging):
            continue
        p = os.path.join(shm_dir, n)
        try:
            if now - os.lstat(p).st_mtime < min_age_s:
                continue
            os.unlink(p)
            removed += 1
        except OSError:
            pass
    if removed:
        log.info("removed %d session markers of clients that are gone", removed)
    return removed


def older_than_release(session: dict) -> str | None:
    """Why an image's session must not be restored, or None: its client is
    alive and waits for the state of a later dump than this image (dump A,
    more calls, dump B releasing the session, restore A). The client's calls
    after A have been answered already; a worker restored from A would wait
    forever for calls the client will never send again, so the restore is
    refused (docs/checkpoint.md). The client's process being gone (a
    whole-process image: CRIU brings it back as it was at the image) is no
    reason."""
    token, pid = session.get("token"), session.get("pid")
    if not isinstance(token, str) or not isinstance(pid, int) or not procinfo.alive(pid):
        return None
    try:
        with open(path("released", token)) as f:
            text = f.read(4096)
    except OSError:
        return None
    released = None
    for line in text.splitlines():
        if line.startswith("last_seq "):
            try:
                released = int(line.split()[1])
            except (IndexError, ValueError):
                pass
    have = session.get("last_seq")
    if released is None or not isinstance(have, int) or have >= released:
        return None
    return (f"image refused: it is older than the session's state (it holds pid {pid}'s calls up to {have}; the "
            f"session was released after call {released} by a later dump): restore the newest image")
