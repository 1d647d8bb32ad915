"""A worker reads messages of its session's owner only (docs/security.md,
"Threat model"; issue 21).

Every message that arrives on a worker's socket is looked at here before it
is decoded: who sent it (peercred.py: on ipc the kernel's credentials of the
connection, on tcp the CURVE key's user) decides whether the worker reads it
at all. A message from anyone else is dropped without an answer, so a
stolen session token confirms nothing and gets nothing.

 * client messages (routing id "c:<token>") are read when their sender is the
   session's owner: the uid the supervisor named in "expect" (the user of
   the process whose HELLO it checked, or of the image a restore came from);
   before that (a spare worker) nobody's are;
 * control messages ("ctl:...") are read from the supervisor: on tcp its own
   key (User-Id "supervisor"), on ipc a process of proxyd's own user (the
   worker still obeys only the routing id carrying the supervisor's secret,
   server.on_ctl, and answers others of that user "permission denied").

Locking: the worker's loop thread only."""
from __future__ import annotations

import logging
import os

from ..core import curve
from ..core.peercred import ipc_peer
from ..core.ratelog import RATE

log = logging.getLogger("proxyd")


class WorkerGate:
    def __init__(self, tcp: bool):
        self.tcp = tcp
        self.own_uid = os.geteuid()
        self.owner: int | None = None       # the session's user, from the supervisor
        self.dropped = 0

    def expect(self, uid) -> None:
        """The supervisor gives this worker's session to uid."""
        try:
            self.owner = int(uid) if uid is not None else None
        except (TypeError, ValueError):
            self.owner = None

    def admit(self, frames) -> bool:
        """True when the worker may read this message (frames as received,
        routing id first, copy=False)."""
        if len(frames) < 2:
            return False
        rid = frames[0].bytes
        meta = frames[1]
        if self.tcp:
            u = curve.user_id(meta)
            if u == curve.SUPERVISOR_USER:
                return rid.startswith(b"ctl:")
            uid = int(u) if u and u.isdigit() else None
        else:
            p = ipc_peer(meta)
            uid = p.uid if p is not None else None
            if uid is not None and uid == self.own_uid and rid.startswith(b"ctl:"):
                return True
        if uid is not None and self.owner is not None and uid == self.owner and rid.startswith(b"c:"):
            return True
        self.dropped += 1
        RATE.event("message from another user", "worker: dropped a message from uid %s (the session's user is %s)",
                   uid, self.owner)
        return False

    def opened(self, server, token: str) -> None:
        """Tells the supervisor that the client opened its session here (an
        unsolicited answer with id 0; bounds.py stops counting it as a
        pending HELLO)."""
        import msgpack
        s = server.sessions.get(token)
        if s is not None:
            s.owner_uid = self.owner          # recorded in images (checkpoint/engine.py)
        secret = os.environ.get("GPUPROXY_WORKER_SECRET", "")
        if not secret:
            return            # no supervisor (a worker run in-process by a test or bench)
        sup = b"ctl:sup-" + secret.encode()
        try:
            server.sock.send_multipart([sup, msgpack.packb([0, 0, {"opened": token}], use_bin_type=True)])
        except Exception as e:       # no supervisor connected (a worker run by hand): nothing to tell
            log.debug("cannot tell the supervisor that session opened: %s", e)
