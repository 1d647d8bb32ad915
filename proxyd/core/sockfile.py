"""The socket file of an ipc endpoint: taken only when nobody serves it,
removed only by the daemon that made it.

A restart that overlaps (a systemd restart, a Kubernetes DaemonSet update:
SIGTERM to the old daemon and the new one started at once) must leave the
new daemon reachable:

 - take_stale (before bind): a socket file that a live process listens on is
   not touched. Liveness is asked of the kernel (a plain AF_UNIX connect is
   accepted by a listening socket whatever its owner is busy with) and then
   of the daemon (a ZeroMQ ping), so a busy daemon is never mistaken for a
   dead one. A file that stays connectable without answering is waited for
   up to TAKEOVER_WAIT_S, the time a stopping daemon needs to close its
   socket (Supervisor.close does that first); then the new daemon refuses
   to start, in one line.
 - claim (after bind) records the file's device and inode; release removes
   the file only if the path still names that inode. A daemon that stops
   after another one took its endpoint leaves the new socket alone.

Locking: none; called from the daemon's main thread at start and stop.
"""
from __future__ import annotations

import errno
import os
import socket
import time
import uuid

import msgpack
import zmq

TAKEOVER_WAIT_S = float(os.environ.get("GPUPROXY_TAKEOVER_WAIT_S", "10"))


class EndpointBusy(RuntimeError):
    pass


def _connectable(path: str) -> bool:
    """Whether a process listens on the Unix socket at path."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(path)
        return True
    except socket.timeout:
        return True                 # a full backlog: somebody listens
    except OSError as e:
        if e.errno in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK):
            return False
        return e.errno in (errno.EAGAIN,)
    finally:
        s.close()


def _answers(zctx, ep: str, timeout_ms: int) -> bool:
    s = zctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.ROUTING_ID, b"ctl:probe-" + uuid.uuid4().hex[:8].encode())
    try:
        s.connect(ep)
        s.send(msgpack.packb([10, 1, "ping", {}], use_bin_type=True))   # MSG_CTL ping (docs/protocol.md)
        return bool(s.poll(timeout_ms))
    except zmq.ZMQError:
        return False
    finally:
        s.close(0)


def take_stale(zctx, ep: str, path: str, wait_s: float | None = None) -> None:
    """Makes path free for our bind: removes a socket file nobody listens
    on; raises EndpointBusy (one line) if a daemon serves it, or something
    keeps listening there for wait_s without answering."""
    wait_s = TAKEOVER_WAIT_S if wait_s is None else wait_s
    deadline = time.monotonic() + wait_s
    while os.path.lexists(path):
        if not _connectable(path):
            try:
                os.unlink(path)     # left by a daemon that died
            except FileNotFoundError:
                pass
            return
        if _answers(zctx, ep, 300):
            raise EndpointBusy(f"another proxyd already serves {ep} (stop it first, or use another --endpoint)")
        if time.monotonic() > deadline:
            raise EndpointBusy(f"something listens on {path} and does not answer as proxyd within "
                               f"{wait_s:g} s; not taking {ep}")
        time.sleep(0.1)             # a daemon that is stopping closes it in a moment


def claim(ep: str):
    """The identity (device, inode) of the socket file just bound at ep, or
    None (tcp, or no file)."""
    if not ep.startswith("ipc://"):
        return None
    try:
        st = os.lstat(ep[len("ipc://"):])
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def release(ep: str, ident) -> bool:
    """Removes ep's socket file if it is still the one claimed; True if removed."""
    if ident is None or not ep.startswith("ipc://"):
        return False
    path = ep[len("ipc://"):]
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if (st.st_dev, st.st_ino) != tuple(ident):
        return False                # another daemon's now
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


WORKER_DIR_RE = r"gpuproxy-workers-([0-9]{1,10})(?:-[0-9a-f]{8})?"


def worker_dir_name() -> str:
    """A supervisor's folder for its workers' sockets: its pid (what the
    sweep below checks) and a random part, so that supervisors of the same
    pid in other pid namespaces sharing the parent folder never share it."""
    import secrets
    return f"gpuproxy-workers-{os.getpid()}-{secrets.token_hex(4)}"


def sweep_worker_dirs(parent: str) -> int:
    """Removes gpuproxy-workers-<pid> folders in parent (the folder of each
    supervisor's workers' sockets, Supervisor.__init__) left by a supervisor
    that was killed (SIGKILL: it could not remove its own): ours, their pid
    is not a live proxyd, and no socket in them accepts connections. The
    number removed."""
    import re
    import shutil
    removed = 0
    try:
        names = os.listdir(parent)
    except OSError:
        return 0
    for n in names:
        m = re.fullmatch(WORKER_DIR_RE, n)
        if not m or int(m[1]) == os.getpid():
            continue
        p = os.path.join(parent, n)
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if st.st_uid != os.geteuid() or not os.path.isdir(p) or os.path.islink(p):
            continue
        try:
            with open(f"/proc/{m[1]}/cmdline", "rb") as f:
                if b"proxyd" in f.read():
                    continue        # a live supervisor's
        except OSError:
            pass
        # a supervisor of another pid namespace sharing this folder is not
        # in our /proc: its workers' sockets still accept connections
        try:
            if any(_connectable(os.path.join(p, n)) for n in os.listdir(p)):
                continue
        except OSError:
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed += 1
    return removed
