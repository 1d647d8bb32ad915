"""Who sent a message: the kernel's credentials of a ZeroMQ peer, and the
checks that the supervisor and the workers make with them
(docs/security.md, "Threat model").

ipc: libzmq reads SO_PEERCRED (socket(7): the pid, uid and gid of the peer
process at the time it called connect(2)) when it accepts a Unix-socket
connection and appends them to the connection's "Peer-Address" property as
":uid:gid:pid" (libzmq built with ZMQ_HAVE_SO_PEERCRED, as Linux builds and
pyzmq's wheels are; checked on libzmq 4.3.5). Every message frame of that
connection carries the property, so a ROUTER learns the sender of each
message without a system call, and no peer can forge it. The pid is
translated into the receiver's pid namespace (0 when the peer's process is
not visible there).
Why this and not the alternatives: ZMQ_IPC_FILTER_UID/PID were removed from
libzmq (deprecated in 4.2) and refuse connections without telling who sent
a message; a ZAP handler sees only the NULL mechanism's "Address" (the same
string) once per connection, with no per-message tag; and a per-session
socket in a 0700 folder owned by the client's user needs a root supervisor
to chown it and cannot move with a spare worker. The per-message property
works for every supervisor user and costs one lookup per message.

tcp: the CURVE key is the identity; the ZAP handler (curve.py) tags every
message with the key's user ("User-Id").

Locking: none (pure functions of a message frame)."""
from __future__ import annotations

import os
from dataclasses import dataclass

try:
    OWN_PIDNS = os.readlink("/proc/self/ns/pid")
except OSError:
    OWN_PIDNS = ""


@dataclass(frozen=True)
class Peer:
    uid: int
    gid: int
    pid: int        # in proxyd's pid namespace; 0: not visible from here


def ipc_peer(frame) -> Peer | None:
    """The credentials of the ipc peer that sent frame (a zmq.Frame received
    with copy=False), or None when libzmq did not record them (not an ipc
    connection, or a libzmq without SO_PEERCRED): callers then refuse."""
    try:
        addr = frame.get("Peer-Address")
    except Exception:
        return None
    if not isinstance(addr, str):
        return None
    parts = addr.rsplit(":", 3)
    if len(parts) != 4:
        return None
    try:
        return Peer(int(parts[1]), int(parts[2]), int(parts[3]))
    except ValueError:
        return None


def pidns_of(pid: int) -> str | None:
    """The pid namespace of a process of ours (None: not readable)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def check_hello(peer: Peer, claimed_pid: int, claimed_pidns: str) -> str | None:
    """None when a HELLO's claim (pid, pid namespace) is the sender's own
    process, else why not. The claimed pid must be the connecting process:
    in proxyd's pid namespace it must equal the kernel's pid; a client of
    another namespace (a container) must be that namespace's process as far
    as proxyd can see it."""
    if claimed_pidns == OWN_PIDNS:
        if peer.pid == 0:
            return "the HELLO claims proxyd's pid namespace, but its sender is not in it"
        if claimed_pid != peer.pid:
            return f"the HELLO claims pid {claimed_pid}, but its sender is pid {peer.pid}"
        return None
    if peer.pid:
        ns = pidns_of(peer.pid)
        if ns is not None and ns != claimed_pidns:
            return "the HELLO's pid namespace is not its sender's"
    return None


def message_user(frame, tcp: bool) -> int | None:
    """The uid that sent a message: on tcp the key's user (curve.py's
    User-Id tag, when it is a uid), on ipc the kernel's; None: unknown."""
    if tcp:
        from . import curve
        u = curve.user_id(frame)
        return int(u) if u and u.isdigit() else None
    p = ipc_peer(frame)
    return p.uid if p is not None else None
