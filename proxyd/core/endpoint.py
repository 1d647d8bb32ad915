"""What the supervisor and the workers share about their endpoints: binding
a ROUTER socket (refusing an endpoint a live daemon serves), and removing a
dead client's shared memory. Both processes use it; it sits at the bottom
so that the supervisor need not import the worker's serving loop.
"""
from __future__ import annotations

import os

import zmq

from .procinfo import OWN_PIDNS  # noqa: F401  (the supervisor reads it here)


def remove_client_segments(token: str):
    """The shared memory a dead client can no longer remove itself."""
    import glob
    from .shm_names import public_id      # segments carry the public id, not the token (issue 21)
    for path in glob.glob(f"/dev/shm/gpuproxy-{glob.escape(public_id(token))}-*"):
        try:
            os.unlink(path)
        except OSError:
            pass


class EndpointInUse(RuntimeError):
    pass


def bind_router(zctx, sock, ep: str) -> str:
    """Binds a ROUTER socket at ep (supervisor or worker) and returns the
    endpoint it got. An ipc socket file left behind by a daemon that died is
    removed; one that a live daemon serves is refused (EndpointInUse)."""
    if ep.startswith("ipc://"):
        path = ep[len("ipc://"):]
        from . import sockfile
        try:
            sockfile.take_stale(zctx, ep, path)     # a live daemon's socket is never taken (sockfile.py)
        except sockfile.EndpointBusy as e:
            raise EndpointInUse(str(e)) from None
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try:
        sock.bind(ep)
    except zmq.ZMQError as e:
        raise EndpointInUse(f"cannot bind {ep}: {e}") from e
    return sock.getsockopt(zmq.LAST_ENDPOINT).decode()

