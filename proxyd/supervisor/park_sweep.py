"""Removes the park files of clients that are gone, left when proxyd died.

Which module removes which /dev/shm/gpuproxy-* file of a client that is gone
(while proxyd lives, Supervisor._end removes a session's files when its
client goes; what follows is for files left by a proxyd that died, or by a
proxyd and its client that both died):

    gpuproxy-<id>-<n>, -<id>-chan      segments        shm_sweep.py, at start
    gpuproxy-released|parked|resume-<id>  markers      markers.py, at start
    gpuproxy-parkheld|ran|lease-<id>   park files      here, at start

<id> is the session's public id: 16 hex digits, '-', the client's pid as
its own pid namespace sees it (core/shm_names.py; the shim's gp_shm_id).

Rule for the park files (a file is removed only when all hold):

  * it is in proxyd's own /dev/shm (a container's /dev/shm is another
    mount: its files are its own proxyd's and its shim's business);
  * it is older than MIN_AGE_S (a park being set up; a lease is renewed
    every park_lease.RENEW_S while its park lasts, so a lease that old has
    no live supervisor renewing it);
  * it is proxyd's own user's file, or proxyd is root (the sticky /dev/shm
    would refuse another's unlink anyway; such a file is not even tried);
  * its client is gone: the pid is no process of proxyd's pid namespace, or
    the process there started after the file was last written (a reused
    pid: every park file is written after its client started, by the
    client or by its supervisor, so a younger process is not its client).
    A CRIU-restored client is such a younger process too; that is safe
    here: parkheld is taken (unlinked) by the shim before the park, so one
    left is stale; ran and the lease are written or renewed after the
    restored copy started (the resume, ctl_resume; the lease's renewal);
  * and, when the client has a staging segment (gpuproxy-<id>-0), nobody
    holds its lock (shm_sweep.py: a client in another pid namespace holds it
    for as long as it lives, whatever its pid means here). Without a
    staging segment the pid check alone decides, as markers.py does.

A lease whose writer (its content: "<supervisor pid> <start ticks>",
park_lease.py) is a live process with those start ticks belongs to a
running proxyd's park and is kept whatever its age.

Resume files (markers.py) stay the markers sweep's: a parked client
restored by CRIU later reads a resume that proxyd writes after the restore
(ctl_resume), so none left from before the restore is needed.

Locking: none; called once by proxyd's main before it serves.
"""
from __future__ import annotations

import logging
import os
import re
import time

from ..core import procinfo
from . import markers, shm_sweep
from .shm_sweep import _lock_is_free

log = logging.getLogger("proxyd")

SHM_DIR = "/dev/shm"
MIN_AGE_S = 10.0
# wall-clock slack between a process's start (from boot time and ticks,
# whole seconds from /proc/stat) and a file's modification time
START_SLACK_S = 5.0
NAME = re.compile(r"gpuproxy-(?P<kind>parkheld|ran|lease)-(?P<token>[0-9a-f]{16}-(?P<pid>[0-9]{1,10}))(\.tmp)?")


def _boot_time() -> float | None:
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def started_at(pid: int, boot: float | None = None) -> float | None:
    """Wall-clock start time of pid (proc(5): field 22 of stat, ticks after
    boot), None if it does not exist or cannot be told."""
    ticks = procinfo.start_time(pid)
    boot = _boot_time() if boot is None else boot
    if ticks is None or boot is None:
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def client_gone(pid: int, mtime: float, boot: float | None = None) -> bool:
    """pid is no process here, or one that started after mtime (a reused pid)."""
    if not procinfo.alive(pid):
        return True
    t = started_at(pid, boot)
    return t is not None and t > mtime + START_SLACK_S


def _lease_writer_alive(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        words = os.read(fd, 64).split()
        pid, ticks = int(words[0]), int(words[1])
    except (OSError, ValueError, IndexError):
        return False
    finally:
        os.close(fd)
    return pid > 0 and ticks > 0 and procinfo.start_time(pid) == ticks


def stale(shm_dir: str = SHM_DIR, min_age_s: float = MIN_AGE_S) -> list[str]:
    """The names of park files in shm_dir whose client is gone (the rule above)."""
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return []
    now, boot, me = time.time(), _boot_time(), os.geteuid()
    out = []
    for n in names:
        m = NAME.fullmatch(n)
        if not m:
            continue
        p = os.path.join(shm_dir, n)
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if me != 0 and st.st_uid != me:
            continue
        if now - st.st_mtime < min_age_s or not client_gone(int(m["pid"]), st.st_mtime, boot):
            continue
        staging = os.path.join(shm_dir, f"gpuproxy-{m['token']}-0")
        if os.path.lexists(staging) and not _lock_is_free(staging):
            continue
        if m["kind"] == "lease" and _lease_writer_alive(p):
            continue
        out.append(n)
    return out


def sweep(shm_dir: str = SHM_DIR, min_age_s: float = MIN_AGE_S) -> int:
    """Removes the park files of clients that are gone; the number removed."""
    removed = 0
    for n in stale(shm_dir, min_age_s):
        try:
            os.unlink(os.path.join(shm_dir, n))
            removed += 1
        except OSError:
            pass
    if removed:
        log.info("removed %d park files of clients that are gone", removed)
    return removed


def sweep_gone_clients(min_age_s: float | None = None) -> int:
    """All three sweeps of the table above, in its order (proxyd's start;
    the test suite's end, with min_age_s 0); the number of files removed.
    min_age_s None: each module's own MIN_AGE_S."""
    age = {} if min_age_s is None else {"min_age_s": min_age_s}
    return shm_sweep.sweep(**age) + markers.sweep(**age) + sweep(**age)
