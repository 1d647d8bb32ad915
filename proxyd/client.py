"""Talking to proxyd's control interface (CTL messages, docs/protocol.md).

Every call is bounded by its timeout, and fails with one line that names the
endpoint. ZeroMQ connects in the background and retries forever, so before a
command is sent the endpoint is probed with a plain socket: that tells a
missing socket file, a refused connection and a permission refusal (EACCES
on an ipc socket of another user) apart, at once. While a long command runs
(a dump), the probe is repeated every few seconds, so a daemon that dies
meanwhile ends the wait at once instead of at the timeout.

A tcp endpoint is keyed (proxyd/core/curve.py): the socket is a CURVE client with
this user's key, and a socket monitor reports a refused key at once
("permission denied: proxyd refused this client's CURVE key ...") instead of
letting ZeroMQ retry in silence until the timeout.
"""
from __future__ import annotations

import os
import errno
import socket
import time
import uuid

import msgpack
import zmq

from gpuproxy.proxyd.core import curve
from gpuproxy.proxyd.core import protocol as P

PROBE_EVERY_S = 2.0


class ControlError(Exception):
    pass


def probe(endpoint: str, timeout_s: float) -> None:
    """Raises ControlError (one line, naming the endpoint) if nothing accepts
    connections at endpoint; returns when something does."""
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://"):]
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(max(timeout_s, 0.001))
        try:
            s.connect(path)
        except FileNotFoundError:
            raise ControlError(f"no proxyd at {endpoint} (no socket {path}; is proxyd running?)") from None
        except PermissionError:
            raise ControlError(f"permission denied: cannot connect to proxyd at {endpoint} (the socket {path} "
                               f"or its directory is not accessible to this user)") from None
        except ConnectionRefusedError:
            raise ControlError(f"connection refused at {endpoint}: nothing listens on {path} "
                               f"(is proxyd running?)") from None
        except socket.timeout:
            raise ControlError(f"no answer from proxyd at {endpoint} within {timeout_s:g} s") from None
        except OSError as e:
            raise ControlError(f"cannot connect to proxyd at {endpoint}: {e.strerror}") from None
        finally:
            s.close()
    elif endpoint.startswith("tcp://"):
        hostport = endpoint[len("tcp://"):]
        host, _, port = hostport.rpartition(":")
        host = host.strip("[]")
        if host in ("*", "0.0.0.0", ""):
            host = "127.0.0.1"
        try:
            socket.create_connection((host, int(port)), timeout=max(timeout_s, 0.001)).close()
        except ValueError:
            raise ControlError(f"bad endpoint {endpoint} (expected tcp://HOST:PORT)") from None
        except ConnectionRefusedError:
            raise ControlError(f"connection refused at {endpoint} (is proxyd running?)") from None
        except PermissionError:
            raise ControlError(f"permission denied: cannot connect to proxyd at {endpoint}") from None
        except socket.timeout:
            raise ControlError(f"no answer from proxyd at {endpoint} within {timeout_s:g} s") from None
        except OSError as e:
            if e.errno == errno.EACCES:
                raise ControlError(f"permission denied: cannot connect to proxyd at {endpoint}") from None
            raise ControlError(f"cannot connect to proxyd at {endpoint}: {e.strerror or e}") from None


PROOF_DIR = "/tmp"


def make_proof() -> tuple[str | None, dict]:
    """Who is asking, proved the way a same-host peer can (docs/security.md,
    "Authorisation"): a new file, owned by us, readable by us only, holding a
    random nonce; proxyd checks its owner and content, which no other user
    can fake. (path, the CTL message's auth field)."""
    import secrets
    nonce = secrets.token_hex(16)
    path = os.path.join(PROOF_DIR, f"gpuproxy-proof-{secrets.token_hex(8)}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(nonce)
    except OSError:
        return None, {}
    return path, {"proof": path, "nonce": nonce}


def drop_proof(path: str | None):
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


class ControlClient:
    def __init__(self, endpoint: str, timeout_s: float = 10.0):
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.ctx = zmq.Context.instance()
        self.seq = 0

    def call(self, cmd: str, args: dict | None = None, timeout_s: float | None = None):
        """Sends one command and returns its result; raises ControlError with
        one clear line when proxyd is unreachable, refuses us, stops
        answering, or the command failed. Never waits longer than the
        timeout."""
        t = self.timeout_s if timeout_s is None else timeout_s
        why = P.endpoint_problem(self.endpoint)      # $GPUPROXY_ENDPOINT is not checked by argparse
        if why:
            raise ControlError(why)
        deadline = time.monotonic() + t
        probe(self.endpoint, t)
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.ROUTING_ID, b"ctl:" + uuid.uuid4().hex.encode())
        mon = None
        try:
            curve.secure_client(s, self.endpoint)
            if curve.is_tcp(self.endpoint):
                mon = s.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                                           | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        except curve.CurveError as e:
            s.close(0)
            raise ControlError(f"cannot connect to proxyd at {self.endpoint}: {e}") from None
        # a proof file means something on ipc only: over tcp the key says who we are
        proof = make_proof() if not curve.is_tcp(self.endpoint) else (None, {})
        try:
            try:
                s.connect(self.endpoint)
            except zmq.ZMQError as e:
                raise ControlError(f"cannot connect to proxyd at {self.endpoint}: {e}") from None
            self.seq += 1
            s.send(msgpack.packb([P.MSG_CTL, self.seq, cmd, args or {}, proof[1]], use_bin_type=True))
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ControlError(f"no answer from proxyd at {self.endpoint} within {t:g} s "
                                       f"(command {cmd!r}; --timeout sets the limit)")
                if mon is not None:
                    poller = zmq.Poller()
                    poller.register(s, zmq.POLLIN)
                    poller.register(mon, zmq.POLLIN)
                    ev = dict(poller.poll(int(min(left, PROBE_EVERY_S) * 1000) + 1))
                    if mon in ev:
                        why = curve.handshake_failure(mon)
                        if why:
                            raise ControlError(f"permission denied: {why} (at {self.endpoint})")
                    if s in ev:
                        break
                    if mon in ev:
                        continue
                elif s.poll(int(min(left, PROBE_EVERY_S) * 1000) + 1):
                    break
                if deadline - time.monotonic() > 0:
                    try:
                        probe(self.endpoint, min(PROBE_EVERY_S, max(deadline - time.monotonic(), 0.001)))
                    except ControlError as e:
                        raise ControlError(f"proxyd went away while running {cmd!r}: {e}") from None
            try:
                reply = msgpack.unpackb(s.recv(), raw=False, strict_map_key=False)
            except Exception as e:
                raise ControlError(f"garbled answer from proxyd at {self.endpoint}: {e}") from None
        finally:
            if mon is not None:
                s.disable_monitor()
                mon.close(0)
            s.close(0)
            drop_proof(proof[0])
        if isinstance(reply, list) and len(reply) >= 3 and reply[1] == 0:
            return reply[2]
        if isinstance(reply, list) and len(reply) >= 3:
            raise ControlError(str(reply[2]))
        raise ControlError(f"bad answer from proxyd at {self.endpoint}: {reply!r}"[:300])
