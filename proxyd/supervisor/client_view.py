"""Files a client's shim and proxyd exchange in /dev/shm (interceptor/park.c:
the "parked" marker, the "resume" file), found in the /dev/shm the client
sees.

A client in a container with its own IPC namespace (podman without --ipc
host; a pod) has a /dev/shm of its own, which proxyd's /dev/shm is not. The
kernel shows every process's file system view at /proc/PID/root, so proxyd
reaches the client's /dev/shm there, as long as it may look into that
process (root, or its own user). That is also what lets a container be
checkpointed by its runtime (`podman container checkpoint`, runc): with
--ipc host the runtime would take the node's whole /dev/shm into the
container's archive. And it is what lets the preemption contract restore
an app into a container of its own IPC namespace: the restored app waits
in its own /dev/shm for its resume (unreachable() says when proxyd cannot
look there).

Locking: none (pure functions of /proc)."""
from __future__ import annotations

import os

HOST_SHM = "/dev/shm"


def shm_dir(pid: int | None) -> str:
    """The /dev/shm of process pid (a pid of proxyd's namespace) as a path
    proxyd can use: /dev/shm itself when the process sees the same one (or
    cannot be looked at), else /proc/PID/root/dev/shm."""
    if not pid:
        return HOST_SHM
    p = f"/proc/{pid}/root{HOST_SHM}"
    try:
        a, b = os.stat(p), os.stat(HOST_SHM)
    except OSError:
        return HOST_SHM
    return HOST_SHM if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) else p


def unreachable(pid: int) -> str | None:
    """Why proxyd cannot reach the /dev/shm of live process pid (None: it
    can). A restored app waits there for its resume; proxyd looks into a
    container's own /dev/shm through /proc/PID/root, which the kernel shows
    only to root or to the process's own user (ptrace access)."""
    try:
        os.stat(f"/proc/{pid}/root{HOST_SHM}")
        return None
    except FileNotFoundError:
        return None         # gone, or no /dev/shm there: the caller's own errors say so
    except OSError as x:
        return (f"proxyd (uid {os.geteuid()}) cannot look into the /dev/shm of pid {pid} ({x.strerror}), where the "
                f"restored app waits for its resume: run proxyd as root or as the app's user, or give the app's "
                f"container the node's IPC namespace (--ipc host)")


def adopt_kernel_pid(e, cred, pid: int, pidns: str) -> None:
    """A client in another pid namespace (a container) that proxyd can see:
    its session goes under the pid the kernel gave proxyd for the sender
    (SO_PEERCRED, peercred.py; check_hello made sure that it is that
    namespace's process), so that parking (a signal), watching (a pidfd) and
    its user (/proc) reach that process and no other; what it calls itself
    is kept as e.ns_pid in e.client_pidns (pidview.py translates a
    container's proxy-cli's pids with it). Nothing changes for clients of
    proxyd's own namespace or ones proxyd cannot see (cred.pid 0)."""
    from ..core.pidview import OWN_PIDNS, pidns_of
    if cred is None or not cred.pid or not pidns or pidns == OWN_PIDNS:
        return
    if pidns_of(cred.pid) != pidns:
        return
    e.ns_pid, e.client_pidns = pid, pidns
    e.pid, e.pidns = cred.pid, OWN_PIDNS
