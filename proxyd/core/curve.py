"""Keyed tcp: ZeroMQ CURVE encryption and authentication of every tcp://
endpoint (the supervisor's public one and the workers'), and the ZAP
handler that admits client keys and tells proxyd which user each key is.

CURVE (ZeroMQ RFC 26, CurveZMQ) encrypts a connection and proves that each
side holds the secret key of its public key; ZAP (ZeroMQ RFC 27) lets the
server decide, per connecting public key, whether to admit it, and attach a
"User-Id" to every message that arrives on the connection. Keys are the
40-character Z85 text of 32-byte Curve25519 keys (ZeroMQ RFC 32).

Files, all in the key directory of keys.py (0700, files 0600):

  curve-server.key    proxyd's key pair ("public Z85" and "secret Z85" lines),
                      made on the first tcp start; every worker uses it too,
                      so clients need to know one server key.
  curve-server.pub    its public key alone: give it to clients (a client
                      finds it in its own key directory under this name, or
                      in $GPUPROXY_CURVE_SERVERKEY).
  curve-client.key    a client key pair (`proxy-cli keygen` makes one).
  authorized_keys     the client keys proxyd admits: one per line,
                      "Z85-PUBLIC-KEY USER [comment]" (USER a name or a uid);
                      must belong to proxyd's user and be private (0600).
                      Re-read when it changes: no restart needed.

proxyd's own user needs no authorized_keys line: the client key in proxyd's
own key directory (curve-client.key, made with the server key when missing)
is admitted as that user.

Client side (proxy-cli, tests; the shim does the same in C, interceptor/curve.c):
the server key from $GPUPROXY_CURVE_SERVERKEY or curve-server.pub, the
client pair from $GPUPROXY_CURVE_PUBLICKEY and $GPUPROXY_CURVE_SECRETKEY, or
the file $GPUPROXY_CURVE_KEY_FILE, or curve-client.key.

Threads: ZapHandler runs on a thread of its own, with its own socket (ZeroMQ
sockets are not shared between threads); the key table it reads is replaced
whole (one reference assignment) when the file changes, so it needs no lock.
"""
from __future__ import annotations

import logging
import os
import pwd
import stat
import threading

import zmq
from zmq.utils import z85

from . import keys
from .ratelog import RATE

log = logging.getLogger("proxyd")

SERVER_KEY_FILE = "curve-server.key"
SERVER_PUB_FILE = "curve-server.pub"
CLIENT_KEY_FILE = "curve-client.key"
AUTHORIZED_KEYS_FILE = "authorized_keys"
ZAP_DOMAIN = b"gpuproxy"
ZAP_ENDPOINT = "inproc://zeromq.zap.01"      # fixed by RFC 27
SUPERVISOR_USER = "supervisor"               # the User-Id of the supervisor's connections to workers
Z85_LEN = 40
LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")   # peers on this host (their pids are ours)


class CurveError(Exception):
    """Keys missing, malformed or not private: one line saying which and where."""


def is_tcp(endpoint: str) -> bool:
    return endpoint.startswith("tcp://")


def available() -> bool:
    return bool(zmq.has("curve"))


def _check_z85(text: str, what: str) -> bytes:
    t = text.strip()
    if len(t) != Z85_LEN:
        raise CurveError(f"{what}: expected a {Z85_LEN}-character Z85 key, got {len(t)} characters")
    try:
        raw = z85.decode(t.encode())
    except Exception:
        raise CurveError(f"{what}: not a Z85 key") from None
    if len(raw) != 32:
        raise CurveError(f"{what}: not a 32-byte key")
    return t.encode()


def _read_private(path: str) -> str:
    """A key file's text; refused unless it is a regular file of this user
    that nobody else can read (as ssh treats its identity files)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise CurveError(f"no key file {path}") from None
    except OSError as e:
        raise CurveError(f"cannot read key file {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise CurveError(f"key file {path} must be a regular file of this user with mode 0600 "
                             f"(it has mode {st.st_mode & 0o777:o}, owner uid {st.st_uid})")
        return os.read(fd, 65536).decode(errors="replace")
    finally:
        os.close(fd)


def _parse_pair(text: str, path: str) -> tuple[bytes, bytes]:
    fields = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in ("public", "secret"):
            fields[parts[0]] = parts[1]
    if "public" not in fields or "secret" not in fields:
        raise CurveError(f"key file {path} needs a 'public Z85' and a 'secret Z85' line")
    pub = _check_z85(fields["public"], f"{path} (public)")
    sec = _check_z85(fields["secret"], f"{path} (secret)")
    if zmq.curve_public(sec) != pub:
        raise CurveError(f"key file {path}: the public key is not the secret key's")
    return pub, sec


def _write_private(path: str, text: str):
    """Writes a new 0600 file atomically; an existing file is kept (first
    writer wins when several processes start at once)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


def _pair_text(pub: bytes, sec: bytes, what: str) -> str:
    return (f"# gpuproxy {what} (ZeroMQ CURVE, Z85): keep this file private\n"
            f"public {pub.decode()}\nsecret {sec.decode()}\n")


def make_pair_file(path: str, what: str) -> tuple[bytes, bytes]:
    """A new key pair in path (0600), or the one already there."""
    if not os.path.exists(path):
        pub, sec = zmq.curve_keypair()
        _write_private(path, _pair_text(pub, sec, what))
    return _parse_pair(_read_private(path), path)


def server_keypair(create: bool = True) -> tuple[bytes, bytes]:
    """proxyd's key pair (made on first use with its public file, and a
    client key of proxyd's own user, admitted without a listing)."""
    try:
        d = keys.key_dir(create)
    except keys.KeyError_ as e:
        raise CurveError(str(e)) from None
    path = os.path.join(d, SERVER_KEY_FILE)
    if not create and not os.path.exists(path):
        raise CurveError(f"no server key {path} (proxyd makes it when it first serves a tcp endpoint)")
    pub, sec = make_pair_file(path, "proxyd server key pair")
    pub_path = os.path.join(d, SERVER_PUB_FILE)
    if create and not os.path.exists(pub_path):
        _write_private(pub_path, pub.decode() + "\n")
    if create:
        make_pair_file(os.path.join(d, CLIENT_KEY_FILE), "client key pair")
    return pub, sec


# ----------------------------------------------------------------- clients

def client_keys() -> tuple[bytes, bytes, bytes]:
    """(server public, client public, client secret) for a tcp connection,
    from the environment or the key directory (module docstring). Raises
    CurveError naming what is missing."""
    d = None
    try:
        d = keys.key_dir(create=False)
    except keys.KeyError_ as e:
        raise CurveError(str(e)) from None
    env = os.environ
    if env.get("GPUPROXY_CURVE_SERVERKEY"):
        server = _check_z85(env["GPUPROXY_CURVE_SERVERKEY"], "GPUPROXY_CURVE_SERVERKEY")
    else:
        p = os.path.join(d, SERVER_PUB_FILE)
        try:
            with open(p) as f:
                lines = [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]
        except OSError:
            raise CurveError(f"tcp endpoints need proxyd's public key: set GPUPROXY_CURVE_SERVERKEY or put it in {p} "
                             f"(proxyd --server-key prints it)") from None
        server = _check_z85(lines[0] if lines else "", p)
    if env.get("GPUPROXY_CURVE_PUBLICKEY") or env.get("GPUPROXY_CURVE_SECRETKEY"):
        pub = _check_z85(env.get("GPUPROXY_CURVE_PUBLICKEY", ""), "GPUPROXY_CURVE_PUBLICKEY")
        sec = _check_z85(env.get("GPUPROXY_CURVE_SECRETKEY", ""), "GPUPROXY_CURVE_SECRETKEY")
        if zmq.curve_public(sec) != pub:
            raise CurveError("GPUPROXY_CURVE_PUBLICKEY is not the public key of GPUPROXY_CURVE_SECRETKEY")
        return server, pub, sec
    path = env.get("GPUPROXY_CURVE_KEY_FILE") or os.path.join(d, CLIENT_KEY_FILE)
    try:
        pub, sec = _parse_pair(_read_private(path), path)
    except CurveError as e:
        raise CurveError(f"tcp endpoints need a client key: {e} (proxy-cli keygen makes one)") from None
    return server, pub, sec


def secure_client(sock, endpoint: str, keypair: tuple[bytes, bytes, bytes] | None = None):
    """Sets a socket that will connect to endpoint up as a CURVE client when
    the endpoint is tcp (before connect); ipc sockets are left alone."""
    if not is_tcp(endpoint):
        return
    server, pub, sec = keypair or client_keys()
    sock.setsockopt(zmq.CURVE_SERVERKEY, server)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, pub)
    sock.setsockopt(zmq.CURVE_SECRETKEY, sec)


def secure_server(sock, endpoint: str, secret: bytes):
    """Sets a socket that will bind endpoint up as a CURVE server whose
    connections the ZAP handler admits (before bind). A peer without CURVE,
    or with a key the handler refuses, never gets a message through."""
    if not is_tcp(endpoint):
        return
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)


def handshake_failure(mon, wait_ms: int = 0) -> str | None:
    """Reads a socket monitor (zmq.Socket.get_monitor_socket) and says why
    the last CURVE handshake failed, or None."""
    from zmq.utils.monitor import recv_monitor_message
    why = None
    while mon.poll(wait_ms):
        wait_ms = 0
        ev = recv_monitor_message(mon)
        e, v = ev["event"], ev["value"]
        if e == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            why = f"proxyd refused this client's CURVE key (ZAP status {v}): its public key is not in proxyd's " \
                  f"{AUTHORIZED_KEYS_FILE}"
        elif e == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL or e == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            why = "the CURVE handshake with proxyd failed (wrong server key, or the endpoint is not a keyed proxyd)"
    return why


# ----------------------------------------------------------------- servers

class AuthorizedKeys:
    """The key -> user table of authorized_keys, re-read when the file
    changes. The file must belong to proxyd's user and be private: a file
    anyone else can write could admit anyone."""

    def __init__(self, path: str, own: dict[bytes, str] | None = None):
        self.path = path
        self.own = dict(own or {})
        self.table: dict[bytes, str] = dict(self.own)
        self.stamp = None
        self.load(first=True)

    def load(self, first: bool = False):
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self.table, self.stamp = dict(self.own), None
            return
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self.stamp:
            return
        try:
            text = _read_private(self.path)
        except CurveError as e:
            if first:
                raise
            RATE.event("authorized_keys refused", "%s: keeping the previous table", e)
            return
        table = dict(self.own)
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            try:
                key = _check_z85(parts[0], f"{self.path}:{n}")
                if len(parts) < 2:
                    raise CurveError(f"{self.path}:{n}: no user after the key")
                table[key] = str(_uid_of_user(parts[1]))
            except CurveError as e:
                log.warning("%s (line ignored)", e)
        self.table, self.stamp = table, stamp
        if not first:
            log.info("%s re-read: %d keys", self.path, len(table))

    def user_of(self, key: bytes) -> str | None:
        self.load()
        return self.table.get(key)


def _uid_of_user(name: str) -> int:
    if name.isdigit():
        return int(name)
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        raise CurveError(f"no user {name!r} on this host") from None


class ZapHandler:
    """Answers ZAP requests (RFC 27) for the sockets of one ZeroMQ context:
    CURVE connections whose client key is listed are admitted with the
    listed user's uid as User-Id; everything else is refused (status 400).
    Started before the secured socket binds; stopped before the context
    ends."""

    def __init__(self, zctx, users: AuthorizedKeys, extra: dict[bytes, str] | None = None):
        self.zctx = zctx
        self.users = users
        self.extra = dict(extra or {})
        self.sock = zctx.socket(zmq.REP)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(ZAP_ENDPOINT)
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="zap", daemon=True)
        self.thread.start()

    def _answer(self, req: list[bytes]) -> tuple[bytes, bytes, bytes]:
        # request frames (RFC 27): version, request id, domain, address,
        # identity, mechanism, credentials...
        if len(req) < 6 or req[0] != b"1.0":
            return b"500", b"malformed ZAP request", b""
        domain, address, mech = req[2], req[3], req[5]
        if domain != ZAP_DOMAIN or mech != b"CURVE" or len(req) < 7 or len(req[6]) != 32:
            RATE.event("tcp peer refused", "tcp peer %s refused: no CURVE security (mechanism %s)",
                       address.decode(errors="replace")[:60], mech.decode(errors="replace")[:20])
            return b"400", b"CURVE security required", b""
        key = z85.encode(req[6])
        user = self.extra.get(key) or self.users.user_of(key)
        if user is None:
            RATE.event("tcp peer refused", "tcp peer %s refused: CURVE key %s is not in %s",
                       address.decode(errors="replace")[:60], key.decode(), self.users.path)
            return b"400", b"unknown key", b""
        return b"200", b"OK", user.encode()

    def _run(self):
        while not self.stopping:
            try:
                if not self.sock.poll(100):
                    continue
                req = self.sock.recv_multipart()
            except zmq.ZMQError:
                break
            try:
                status, text, user = self._answer(req)
            except Exception as e:     # never leave a handshake unanswered
                RATE.internal_error("ZAP handler error", "ZAP handler", e)
                status, text, user = b"500", b"internal error", b""
            rid = req[1] if len(req) > 1 else b""
            try:
                self.sock.send_multipart([b"1.0", rid, status, text, user, b""])
            except zmq.ZMQError:
                break
        self.sock.close(0)

    def stop(self):
        self.stopping = True
        self.thread.join(2)


def start_server_security(zctx, endpoint: str, extra: dict[bytes, str] | None = None):
    """For a tcp endpoint: (server secret key, ZapHandler) of this process,
    or (None, None) for ipc. Raises CurveError when keys or the authorized
    keys file are not usable."""
    if not is_tcp(endpoint):
        return None, None
    if not available():
        raise CurveError("this libzmq has no CURVE support: tcp endpoints are refused")
    pub, sec = server_keypair(create=True)
    d = keys.key_dir(True)
    own_pub, _ = _parse_pair(_read_private(os.path.join(d, CLIENT_KEY_FILE)), os.path.join(d, CLIENT_KEY_FILE))
    users = AuthorizedKeys(os.path.join(d, AUTHORIZED_KEYS_FILE), own={own_pub: str(os.geteuid())})
    return sec, ZapHandler(zctx, users, extra)


def user_id(frame) -> str | None:
    """The User-Id ZAP gave the connection a message came on (None without)."""
    try:
        return frame.get("User-Id")
    except (zmq.ZMQError, AttributeError):
        return None


def peer_address(frame) -> str | None:
    try:
        return frame.get("Peer-Address")
    except (zmq.ZMQError, AttributeError):
        return None
