"""Who may open a session, and how many (docs/security.md, "Threat model";
issue 21): the supervisor's checks of a new HELLO and its per-user bounds.

 * The session's owner is the sender's kernel uid (ipc: SO_PEERCRED through
   peercred.py) or its CURVE key's user (tcp), never a claim of the message:
   nobody can open a session owned by another user.
 * On ipc the HELLO's claimed pid must be the sending process
   (peercred.check_hello), so nobody can open a session in another
   process's name (which the reaper would then keep while that process
   lives, and which its owner's status would list).
 * Per user: at most max_sessions sessions that are not dead (each holds a
   worker, so workers are bounded too) and at most max_pending HELLOs not
   yet opened at their worker. Defaults a workstation never reaches (64 and
   32); `proxyd --max-sessions-per-user/--max-pending-per-user` or
   GPUPROXY_MAX_SESSIONS_PER_USER / GPUPROXY_MAX_PENDING_PER_USER (0: no
   bound). Pods on a node that all run as one uid share one bound.
 * A session given a worker whose client does not open it there within
   hello_timeout_s (GPUPROXY_HELLO_TIMEOUT_S, default 10 s) is ended
   (reap_unopened): a HELLO costs a worker only for seconds unless its
   client really uses it.

Locking: the supervisor's loop only."""
from __future__ import annotations

import logging
import os
import time

from ..core.peercred import OWN_PIDNS, Peer, check_hello

log = logging.getLogger("proxyd")


def _env_int(name: str, default: int) -> int:
    try:
        return max(0, int(os.environ.get(name, default)))
    except ValueError:
        return default


class Bounds:
    def __init__(self, max_sessions: int | None = None, max_pending: int | None = None,
                 hello_timeout_s: float | None = None):
        self.max_sessions = max_sessions if max_sessions is not None else _env_int("GPUPROXY_MAX_SESSIONS_PER_USER", 64)
        self.max_pending = max_pending if max_pending is not None else _env_int("GPUPROXY_MAX_PENDING_PER_USER", 32)
        if hello_timeout_s is None:
            try:
                hello_timeout_s = float(os.environ.get("GPUPROXY_HELLO_TIMEOUT_S", "10"))
            except ValueError:
                hello_timeout_s = 10.0
        self.hello_timeout_s = hello_timeout_s

    def check_new(self, entries, owner: int | None, pid: int, pidns: str, cred: Peer | None,
                  tcp: bool) -> str | None:
        """None when a new session may be opened for this HELLO, else the one
        line the sender gets."""
        if not tcp:
            if cred is None:
                return "proxyd cannot tell which process sent this HELLO (no peer credentials)"
            why = check_hello(cred, pid, pidns)
            if why:
                return why
        mine = [e for e in entries.values() if e.owner == owner and e.state != "dead"]
        if self.max_sessions and len(mine) >= self.max_sessions:
            return f"this user has {len(mine)} sessions in this proxyd, its limit (--max-sessions-per-user)"
        pending = [e for e in mine if e.state == "starting" or (e.state == "running" and not e.opened)]
        if self.max_pending and len(pending) >= self.max_pending:
            return (f"this user has {len(pending)} sessions still opening in this proxyd, its limit "
                    f"(--max-pending-per-user)")
        return None


def sender_uid(tcp: bool, key_user: str | None, cred: Peer | None) -> int | None:
    """The user a message comes from: its key's user on tcp, the kernel's on ipc."""
    if tcp:
        return int(key_user) if key_user and key_user.isdigit() else None
    return cred.uid if cred is not None else None


def watch_peer(e, cred: Peer | None) -> None:
    """A client of another pid namespace that proxyd can see (the kernel gave
    its pid here): watched through a pidfd too, so that its session ends
    with it."""
    if e.pidfd is not None or cred is None or not cred.pid or e.pidns == OWN_PIDNS:
        return
    try:
        fd = os.pidfd_open(cred.pid)
    except (OSError, AttributeError):
        return
    try:
        if os.stat(f"/proc/{cred.pid}").st_uid != cred.uid:
            os.close(fd)        # the pid was reused meanwhile
            return
    except OSError:
        os.close(fd)
        return
    e.pidfd = fd


def reap_unopened(sup) -> None:
    """Ends the sessions whose client never opened them at their worker
    within hello_timeout_s (asks the worker first: its status lists the
    sessions opened there)."""
    now = time.monotonic()
    for e in list(sup.entries.values()):
        if e.state != "running" or e.opened or e.probing or e.given_at is None:
            continue
        if now - e.given_at < sup.bounds.hello_timeout_s or e.worker is None or e.worker.sock is None:
            continue
        e.probing = True

        def got(code, result, e=e):
            e.probing = False
            if code != 0 or not isinstance(result, dict):
                return          # busy: asked again at the next tick
            if any(s.get("token") == e.token for s in result.get("sessions", [])):
                e.opened = True
            elif sup.entries.get(e.token) is e and e.state == "running":
                log.info("session of pid %s: not opened at its worker within %g s; ending it", e.pid,
                         sup.bounds.hello_timeout_s)
                sup._end(e)
        sup.forward(e.worker, "status", {}, got, timeout_s=2)
