"""What the supervisor and the workers share about their endpoints: making,
securing and binding their ROUTER socket (serve_router: CURVE on tcp,
refusing an endpoint a live daemon serves, claiming the socket file), and
removing a dead client's shared memory. Both processes use it; it sits at the bottom
so that the supervisor need not import the worker's serving loop.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

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



@dataclass
class Served:
    """A bound ROUTER socket and what goes with it (serve_router)."""
    sock: object            # zmq ROUTER
    zap: object | None      # the ZAP handler of a tcp endpoint (curve.py), None otherwise; stop() it at close
    bound: str              # the endpoint bound (tcp://host:* gets its real port here)
    sock_id: object         # sockfile.claim's mark, for sockfile.release at close
    public: bytes | None = None     # tcp: the server's CURVE public key (z85), what clients are told


def serve_router(zctx, ep: str, extra_keys: dict | None = None) -> Served:
    """The serving socket of the supervisor or of a worker: a ROUTER that
    neither lingers nor drops (no high-water marks: a dropped message would
    leave a client waiting); on tcp secured with CURVE, whose ZAP handler
    admits the keys in authorized_keys plus extra_keys ({public key: user},
    curve.py); bound with bind_router; its socket file claimed (sockfile.py).
    Raises EndpointInUse, with nothing left open but zctx, which the caller
    owns."""
    from . import curve, sockfile
    sock = zctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    zap = public = None
    try:
        if curve.is_tcp(ep):
            try:
                secret, zap = curve.start_server_security(zctx, ep, extra=extra_keys)
            except curve.CurveError as e:
                raise EndpointInUse(f"cannot serve {ep}: {e}") from None
            curve.secure_server(sock, ep, secret)
            public = zmq.curve_public(secret)
        bound = bind_router(zctx, sock, ep)
    except BaseException:
        if zap is not None:
            zap.stop()
        sock.close(0)
        raise
    return Served(sock, zap, bound, sockfile.claim(ep), public)
