"""Facts about a local process from /proc (proc(5)): is it alive, when did
it start, whose is it, which pid namespace is ours. A pid means something
only within one pid namespace; callers compare namespaces first.
"""
from __future__ import annotations

import os

try:
    OWN_PIDNS = os.readlink("/proc/self/ns/pid")
except OSError:
    OWN_PIDNS = ""


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (proc(5)): [0]
    is field 3 (state), [1] the parent pid, [19] the start time; None if
    the process does not exist."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: fields
    # after it start behind the last ')'
    return raw[raw.rfind(b")") + 2:].split()


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: the start time in clock ticks after boot
    (a pid reused by another process has another start time); None if the
    process does not exist."""
    rest = stat_fields(pid)
    try:
        return int(rest[19])          # field 22 is the 20th after the name
    except (IndexError, TypeError, ValueError):
        return None


def owner(pid: int) -> tuple[int, int] | None:
    """(real uid, real gid) of a process (the Uid:/Gid: lines of
    /proc/PID/status), None if it does not exist."""
    uid = gid = None
    try:
        with open(f"/proc/{int(pid)}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    uid = int(line.split()[1])
                elif line.startswith("Gid:"):
                    gid = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None if uid is None or gid is None else (uid, gid)


def name(pid: int) -> str:
    """The command name of a process (/proc/PID/comm), "?" if unreadable."""
    try:
        with open(f"/proc/{int(pid)}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def alive(pid: int) -> bool:
    return pid > 0 and os.path.exists(f"/proc/{int(pid)}")
