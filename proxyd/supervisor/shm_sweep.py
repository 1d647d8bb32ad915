"""Removes the shared memory of clients that are provably dead.

A client names its segments /gpuproxy-<id>-<n> and /gpuproxy-<id>-chan (the session's public id, shm_names.py)
(files in /dev/shm), the id being 16 hex digits, '-', the client's pid. It removes
them itself at exit (interceptor/hostmem.c), and proxyd's reaper removes
those of a session whose process ended; what is left after both died (a
daemon kill followed by a client kill, a client killed before it reached a
daemon) is removed here, when proxyd starts.

Proof of death: the client holds a shared flock(2) on its staging segment
for as long as it lives (hostmem.c). A token is dead when
  * proxyd can take that lock exclusively (no process holds it, in whatever
    pid namespace: locks belong to the kernel's open files), and
  * its pid is not a live process of proxyd's own pid namespace (a client
    of an older shim that holds no lock), and
  * none of its files changed in the last MIN_AGE_S seconds (a client
    between creating its segment and locking it).
Tokens without a staging segment (GPUPROXY_SHM=0 or GPUPROXY_STAGING_MB=0)
carry no proof and are left alone.
"""
from __future__ import annotations

import fcntl
import logging
import os
import re
import time

from ..core import procinfo

log = logging.getLogger("proxyd")

SHM_DIR = "/dev/shm"
MIN_AGE_S = 10.0
NAME = re.compile(r"gpuproxy-(?P<token>[0-9a-f]{16}-(?P<pid>[0-9]{1,10}))-(?P<seg>[0-9]{1,10}|chan)")


def _lock_is_free(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False               # somebody holds it: alive
    finally:
        os.close(fd)               # closing drops our lock
    return True


def dead_tokens(shm_dir: str = SHM_DIR, min_age_s: float = MIN_AGE_S) -> dict[str, list[str]]:
    """{token: [its files]} of clients that are provably dead."""
    groups: dict[str, list[str]] = {}
    pids: dict[str, int] = {}
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return {}
    for n in names:
        m = NAME.fullmatch(n)
        if m:
            groups.setdefault(m["token"], []).append(n)
            pids[m["token"]] = int(m["pid"])
    now = time.time()
    out = {}
    for token, files in groups.items():
        staging = f"gpuproxy-{token}-0"
        if staging not in files:
            continue
        try:
            newest = max(os.lstat(os.path.join(shm_dir, f)).st_mtime for f in files)
        except OSError:
            continue
        if now - newest < min_age_s:
            continue
        if procinfo.alive(pids[token]):
            continue
        if _lock_is_free(os.path.join(shm_dir, staging)):
            out[token] = files
    return out


def sweep(shm_dir: str = SHM_DIR, min_age_s: float = MIN_AGE_S) -> int:
    """Removes the segments of dead clients; the number of files removed."""
    removed = 0
    for token, files in dead_tokens(shm_dir, min_age_s).items():
        for f in files:
            try:
                os.unlink(os.path.join(shm_dir, f))
                removed += 1
            except OSError:
                pass
        log.info("removed %d shared memory segments of dead client %s", len(files), token)
    return removed
