"""Pids across pid namespaces (a client or a proxy-cli in a container with a
pid namespace of its own, docs/cluster.md).

A process in a container knows itself, and names others, by the pids of its
own namespace; proxyd can signal, watch and read a process only by the pid
it has in proxyd's namespace. The kernel's socket credentials (peercred.py)
give proxyd the sender's pid in proxyd's namespace; /proc/PID/status's NSpid
line lists a process's pid in each namespace from proxyd's down to its own.
These functions translate with them:

  * in_ns(ns, pid): the pid (in proxyd's namespace) of the process that
    namespace ns calls pid;
  * own_ns_pid(pid): a process's pid in its own namespace, and that
    namespace.

Both read /proc only (no privileges beyond seeing the processes); a process
proxyd cannot see is None. Locking: none."""
from __future__ import annotations

import os

try:
    OWN_PIDNS = os.readlink("/proc/self/ns/pid")
except OSError:
    OWN_PIDNS = ""


def _nspids(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for ln in f:
                if ln.startswith("NSpid:"):
                    return [int(x) for x in ln.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def pidns_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def own_ns_pid(pid: int) -> tuple[int, str] | None:
    """(pid in its own innermost namespace, that namespace) of process pid."""
    ids, ns = _nspids(pid), pidns_of(pid)
    return (ids[-1], ns) if ids and ns else None


def in_ns(ns: str, pid: int) -> int | None:
    """The pid in proxyd's namespace of the process whose pid in namespace ns
    (its own, innermost one) is pid; None when there is none. Scans /proc:
    for control requests, not for every message."""
    if ns == OWN_PIDNS:
        return pid
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        ids = _nspids(int(name))
        if len(ids) > 1 and ids[-1] == pid and pidns_of(int(name)) == ns:
            return int(name)
    return None
