"""The park lease: how a parked shim learns that the supervisor holding its
park is gone (interceptor/park.c, "lease").

A parked app waits for its resume file. If proxyd dies meanwhile (killed,
crashed, its node's daemon restarted) nobody will ever write it: the dump
that parked the app fails with proxyd, and the app would wait for good. The
developers' guide wants a dead daemon to fail the blocked call within
seconds, naming the endpoint. So for every park the supervisor creates
/dev/shm/gpuproxy-lease-<public id> in the client's /dev/shm, before it
signals the app:

  - its content is "<pid> <start ticks>" of the supervisor when the client
    shares proxyd's pid namespace (the shim then checks that the pid still
    exists: a kill -9 is seen within the shim's check interval), "0 0" when
    it does not (a container with its own pid namespace);
  - its modification time is renewed every RENEW_S while the park lasts
    (the supervisor's tick), so a shim that cannot see the pid gives up
    once it is older than its GPUPROXY_PARK_LEASE_S (default 10 s);
  - it is removed when the app is resumed, when its session ends, and when
    its GPU state is in an image and released (a final dump's GPU part is
    done): the app may then wait for a restore by whatever daemon comes,
    as a released session does (docs/checkpoint.md), so a lost lease must
    not end its wait.

The file is created afresh (O_EXCL, O_NOFOLLOW) after removing whatever
had its name, so a link left there by another user is never followed, and
handed to the client's user by its descriptor, as the resume file is: a
shim that finds its proxyd gone removes it itself (in the sticky /dev/shm
only its owner may), so a killed proxyd leaves no file behind. proxyd
still renews it (root may set any file's times; a proxyd of the client's
own user owns it). A client that touches its own lease only keeps itself
waiting. A shim finds no lease with an older proxyd and then waits as
before.

Nothing of this runs outside a park: the normal path costs nothing.
Main-loop only (the supervisor's tick), like the park waiters.
"""
from __future__ import annotations

import os
import time

from ..core import procinfo
from . import client_files

RENEW_S = 1.0


def lease_path(token: str, shm: str = "/dev/shm") -> str:
    from ..core.shm_names import public_id
    return f"{shm}/gpuproxy-lease-{public_id(token)}"


def sees_us(pid: int) -> bool:
    """Whether process pid is in proxyd's own pid namespace, so that
    proxyd's pid means proxyd to it. A client in a container proxyd
    adopted under its kernel pid (client_view.adopt_kernel_pid) is not:
    there proxyd's pid is no process or another one."""
    from ..core.pidview import OWN_PIDNS, pidns_of
    return bool(OWN_PIDNS) and pidns_of(pid) == OWN_PIDNS


def start(e, shm: str) -> None:
    """Creates e's lease in shm (the client's /dev/shm) before the park
    signal. A failure only leaves the shim without a lease (it then waits
    as with an older proxyd)."""
    path = lease_path(e.token, shm)
    stop(e, shm)
    body = f"{os.getpid()} {procinfo.start_time(os.getpid()) or 0}\n" if sees_us(e.pid) else "0 0\n"
    try:
        client_files.write(e.pid, path, body.encode(), mode=0o644)    # the client stats and reads it
    except OSError:
        return
    e.lease_renewed = time.monotonic()


def renew(e, shm: str, now: float) -> None:
    """Called each tick for an entry being parked or parked."""
    if now - getattr(e, "lease_renewed", 0.0) < RENEW_S:
        return
    e.lease_renewed = now
    try:
        os.utime(lease_path(e.token, shm), follow_symlinks=False)
    except OSError:
        pass


def stop(e, shm: str) -> None:
    """At the resume (the session's end removes it with its other park
    files: daemon._remove_park_files)."""
    e.lease_renewed = 0.0
    try:
        os.unlink(lease_path(e.token, shm))
    except OSError:
        pass
