"""proxyd's supervisor: the public endpoint, the session table, the workers.

    app shim ──HELLO/WHERE/PARKED──▶ supervisor ──spawns, watches──▶ worker (one per session)
    app shim ──────────────CALL (ZeroMQ + fast channel)────────────▶ worker
    proxy-cli ──CTL──▶ supervisor ──CTL (forwarded)──▶ worker

The supervisor never touches the GPU and never waits on a worker: every
exchange with a worker is asynchronous (a request is sent, its answer is
picked up by the loop later), so one session's long synchronisation, crash
or sticky error never delays another session or the control interface.

 - HELLO: a new client gets a started worker (a spare when one is ready; the
   client hears KEEPALIVE meanwhile) and is told its endpoint; the client
   then opens its session there, directly.
 - WHERE: a client that heard nothing from its worker for a while asks what
   became of its session: running (at which endpoint: it moves after a
   restore), released (dumped, waiting for a restore), dead (why), unknown.
 - CTL: status (gathered from the workers, with a deadline), dump, pre-dump,
   migrate (forwarded to the session's worker), restore (into a fresh worker),
   park/resume (around a whole-process checkpoint).

A worker that exits while its session runs turns the session "dead" with
the reason (signal or exit code), which the client is told at its next
WHERE. A client that exits ends its worker.

Locking: single-threaded; everything here runs on the supervisor's loop.
Process ownership: workers are children of the supervisor and die with it
(worker/entry.py sets PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field

import msgpack
import zmq

from .. import __version__
from . import bounds as B
from . import stall
from . import park_lease
from ..core import curve
from ..core import peercred
from ..core import protocol as P
from ..core.ratelog import RATE
from ..core.endpoint import OWN_PIDNS, EndpointInUse, remove_client_segments, serve_router

log = logging.getLogger("proxyd")

TICK_S = 0.1
STATUS_DEADLINE_S = 0.5          # a worker busy in a long call is reported from its last status
ATTACH_GRACE_S = float(os.environ.get("GPUPROXY_ATTACH_GRACE_S", "120"))   # restored session, client not back yet
DEAD_KEEP_S = 60.0               # how long a dead session's reason stays for its client to read
MAX_START_FAILURES = 3
PARK_SIGNAL = int(os.environ.get("GPUPROXY_PARK_SIGNAL", str(signal.SIGRTMIN + 6)))
NCCL_CUT_COMMANDS = ("nccl-hold", "nccl-release", "nccl-uid", "nccl-recreate")   # families/nccl_cut.py


ADMIN_UIDS = {int(x) for x in os.environ.get("GPUPROXY_ADMIN_UIDS", "").split(",") if x.strip().isdigit()}


def _uid_of(pid: int) -> int | None:
    """The real uid of a process of our pid namespace."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def requester_uid(auth) -> int | None:
    """Who sent a control request: the owner of the proof file it names,
    provided the file holds its nonce (proxyd/client.py make_proof). A user can
    create files only as itself, and the file is readable by its owner only,
    so no one else can name it with the right nonce. None: not proved."""
    if not isinstance(auth, dict):
        return None
    path, nonce = auth.get("proof"), auth.get("nonce")
    if not isinstance(path, str) or not isinstance(nonce, str) or len(nonce) < 16:
        return None
    if os.path.dirname(path) != "/tmp" or not os.path.basename(path).startswith("gpuproxy-proof-"):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        import stat as _stat
        if not _stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_mode & 0o077:
            return None
        if os.read(fd, 64).decode(errors="replace") != nonce:
            return None
        return st.st_uid
    finally:
        os.close(fd)


def _owned_path(path: str, uid: int | None, create: bool) -> bool:
    """A folder the requester may have proxyd read (restore) or write
    (dump): it, or for a dump to be made the nearest existing folder above
    it, belongs to the requester."""
    if uid is None:
        return False
    p = os.path.abspath(path)
    while True:
        try:
            st = os.lstat(p)
            return st.st_uid == uid
        except FileNotFoundError:
            if not create or p == "/":
                return False
            p = os.path.dirname(p)
        except OSError:
            return False


def _fixed_layout():
    """Runs in the new worker before exec: no address-space randomisation
    (personality ADDR_NO_RANDOMIZE), so that the driver places module
    globals (__device__ variables) at the same addresses in the worker that
    restores a session as in the one that dumped it, given the same calls
    (a restore loads modules first, in their original order). Addresses a
    program kept in device memory then stay valid. GPUPROXY_WORKER_ASLR=1
    keeps randomisation (docs/architecture.md)."""
    import ctypes
    try:
        ctypes.CDLL(None).personality(0x0040000)
    except (OSError, AttributeError):
        pass


def _write_client_file(e, path: str, data: bytes) -> None:
    """A new file at path, made the client's own (it unlinks it in a sticky
    /dev/shm): client_files.write. Raises OSError."""
    from . import client_files
    client_files.write(e.pid, path, data)


@dataclass
class _PidOnly:
    """What _write_client_file needs of a client: its pid (a restored one
    proxyd knows by another pid until it calls back)."""
    pid: int


def _write_park_held(e, path: str) -> None:
    """park_held_path, owned by the client."""
    try:
        _write_client_file(e, path, b"")
    except OSError:
        pass        # the shim then parks after its call, as an ordinary park


def resume_path(token: str, shm: str = "/dev/shm") -> str:
    """The file whose appearance lets a parked shim go on (interceptor/park.c);
    shm: the client's /dev/shm (client_view.py)."""
    from ..core.shm_names import public_id
    return f"{shm}/gpuproxy-resume-{public_id(token)}"


def park_held_path(token: str, shm: str = "/dev/shm") -> str:
    """The file that lets a shim park inside a call its worker holds at a
    job's cut (interceptor/park.c, park_in_call; docs/multigpu.md)."""
    from ..core.shm_names import public_id
    return f"{shm}/gpuproxy-parkheld-{public_id(token)}"


def parked_path(token: str, shm: str = "/dev/shm") -> str:
    """The file a shim creates once it has parked (interceptor/park.c)."""
    from ..core.shm_names import public_id
    return f"{shm}/gpuproxy-parked-{public_id(token)}"


def _remove_park_files(e) -> None:
    """The small files of a session's parks (parked, parkheld, its park
    lease: park_lease.py, the stall figure's ran file: stall.py) once the
    session is gone; nothing else removes them where no resume asked for
    the figure or the app ended between the supervisor's parkheld and its
    park. The resume file is left: a restored copy of the process may be
    waiting for it."""
    dirs = {d for d in (e.park_shm, e.ran_shm, "/dev/shm") if d}
    for d in dirs:
        for path in (parked_path(e.token, d), park_held_path(e.token, d), stall.ran_path(e.token, d),
                     park_lease.lease_path(e.token, d)):
            try:
                os.unlink(path)
            except OSError:
                pass


def _client_shm(e) -> str:
    """The /dev/shm e's client sees, where proxyd can see its pid."""
    from .client_view import shm_dir
    return shm_dir(e.pid if e.pidns == OWN_PIDNS else None)


# how a worker is started (tests that inject faults start theirs otherwise)
WORKER_COMMAND = [sys.executable, "-m", "gpuproxy.proxyd.worker"]


@dataclass
class WorkerSpec:
    backend: str = "auto"
    emu_kernels: list = field(default_factory=list)
    emu_devices: int = 1
    spin_us: int = 200
    log_level: str = "INFO"


class Worker:
    """A worker process as the supervisor sees it."""

    def __init__(self, proc: subprocess.Popen, ready_fd: int, endpoint: str):
        self.proc = proc
        self.pid = proc.pid
        self.ready_fd = ready_fd
        self.ready_buf = b""
        self.endpoint = endpoint          # what it was asked to bind
        self.info: dict | None = None     # its ready line
        self.sock = None                  # DEALER to its endpoint, for forwarded CTL
        self.token: str | None = None     # the session it serves
        self.started = time.monotonic()
        self.exit_reason = ""

    @property
    def ready(self) -> bool:
        return self.info is not None and self.proc.poll() is None


@dataclass
class Entry:
    """One client session in the table."""
    token: str
    pid: int
    exe: str = ""
    pidns: str = ""
    state: str = "starting"          # starting, running, released, dead
    worker: Worker | None = None
    why: str = ""
    pidfd: int | None = None
    since: float = field(default_factory=time.monotonic)
    hello: list = field(default_factory=list)   # (rid, seq) of HELLOs waiting for a worker
    parked: bool = False
    restored_at: float | None = None     # restored, its client not seen yet
    uid: int | None = None               # the client's user (None: unknown, only admins control it)
    park_waiters: list = field(default_factory=list)   # (rid, seq, deadline) of park commands
    ran_waiters: list = field(default_factory=list)    # resumes waiting for the app's figure (stall.py)
    ran_shm: str = ""                    # where that figure's file appears (the client's /dev/shm)
    park_shm: str = ""                   # the client's /dev/shm as proxyd reaches it (client_view.py), while parking
    ns_pid: int = 0                      # a client of another pid namespace: its pid there (client_view.py)
    client_pidns: str = ""               # and that namespace
    last_status: dict | None = None
    owner: int | None = None             # the sender's kernel uid (ipc) or key user (tcp): bounds, worker gate
    opened: bool = False                 # the client opened it at its worker (bounds.reap_unopened)
    given_at: float | None = None        # when it got its worker
    probing: bool = False


def _describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with status {rc}"


class Supervisor:
    def __init__(self, endpoint: str, spec: WorkerSpec, spares: int = 1, users: str = "self",
                 limits: B.Bounds | None = None):
        self.endpoint = endpoint
        self.bounds = limits or B.Bounds()
        self.spec = spec
        self.spares = max(0, spares)
        self.started = time.time()
        self.stopping = False
        self.zctx = zmq.Context(io_threads=1)
        # tcp: CURVE with a ZAP handler (curve.py) on this endpoint and the
        # workers'; the supervisor reaches its workers with a key pair of
        # its own, made here, which they admit as "supervisor".
        try:
            served = serve_router(self.zctx, endpoint)
        except EndpointInUse:
            self.zctx.destroy(linger=0)
            raise
        self.sock, self.zap, self._sock_id = served.sock, served.zap, served.sock_id
        self.curve_client = None
        if self.zap is not None:
            sup_pub, sup_sec = zmq.curve_keypair()
            self.curve_client = (served.public, sup_pub, sup_sec)
            log.info("tcp endpoint keyed with CURVE; server public key %s (clients: GPUPROXY_CURVE_SERVERKEY)",
                     served.public.decode())
        # Workers' sockets: in a folder others may pass through but not list
        # (0711), under names nobody can guess; a worker takes control
        # commands only from the routing id that carries this secret, which
        # it gets in its environment (readable by our user only).
        self.secret = uuid.uuid4().hex + uuid.uuid4().hex
        if endpoint.startswith("ipc://"):
            from ..core.sockfile import sweep_worker_dirs, worker_dir_name
            # gpuproxy-workers-<pid>-<random>: a pid alone is not unique
            # where supervisors of several pid namespaces share the folder
            # (containers sharing /tmp, or a test runner's namespace beside
            # another's): two of one pid shared a folder, and the first to
            # stop removed the other's workers' sockets (a parked rank of a
            # job could then not reach its worker again)
            self.worker_dir = os.path.join(os.path.dirname(endpoint[len("ipc://"):]) or ".", worker_dir_name())
            if len(self.worker_dir) > 64:
                # a Unix socket path holds at most 107 bytes (sun_path): a
                # deep endpoint folder leaves no room for the workers' names
                self.worker_dir = os.path.join("/tmp", worker_dir_name())
            sweep_worker_dirs(os.path.dirname(self.worker_dir))     # of supervisors that were killed
            os.makedirs(self.worker_dir)        # new: never another supervisor's
            os.chmod(self.worker_dir, 0o711)
            if users == "all":
                os.chmod(endpoint[len("ipc://"):], 0o666)
        self.users = users
        self.workers: list[Worker] = []
        from .host_pool import HostPools
        self.host_pools = HostPools()       # shared page-locked staging (host_pool.py); off by default
        self.entries: dict[str, Entry] = {}
        self.pending: dict[int, tuple] = {}      # forwarded CTL id -> (callback, deadline)
        self.next_fid = 1
        self.waiting_for_worker: list = []       # callbacks(worker) for HELLO/restore
        self.start_failures = 0
        self.worker_seq = 0
        self.backend_info: dict | None = None
        self.restoring = 0
        self._device_count: int | None = None     # (max_restores)
        self.asker: int | None = None      # uid of the control request being handled
        self.asker_ns: str | None = None   # its pid namespace, when it is not proxyd's (pidview.py)
        self.handlers = {
            "ping": self.ctl_ping, "status": self.ctl_status, "shutdown": self.ctl_shutdown,
            "dump": self.ctl_dump, "pre-dump": self.ctl_dump, "migrate": self.ctl_forward,
            "restore": self.ctl_restore, "park": self.ctl_park, "resume": self.ctl_resume,
            "dump-wait": self.ctl_dump,      # a background image write's end (checkpoint/background.py)
        }
        # the consistent cut of a multi-rank NCCL job: forwarded to the pid's
        # worker (proxyd/families/nccl_cut.py; proxyd/checkpoint/orchestrate/multirank.py)
        for cmd in NCCL_CUT_COMMANDS:
            self.handlers[cmd] = self.ctl_forward
        from .discard import ctl_discard
        self.handlers["discard"] = lambda rid, seq, args: ctl_discard(self, rid, seq, args)
        from .pool_forget import ctl_pool_forget     # restore-from-memory notes (host_pool.py)
        self.handlers["pool-forget"] = lambda rid, seq, args: ctl_pool_forget(self, rid, seq, args)
        from .record_criu import ctl_record_criu
        self.handlers["record-criu"] = lambda rid, seq, args: ctl_record_criu(self, rid, seq, args)

    # ------------------------------------------------------------- socket
    def send(self, rid: bytes, obj):
        self.sock.send_multipart([rid, msgpack.packb(obj, use_bin_type=True)])

    def reply(self, rid: bytes, seq: int, result=None, error: str | None = None):
        self.send(rid, [seq, 0, result] if error is None else [seq, 1, error])

    # ------------------------------------------------------------ workers
    def _worker_endpoint(self) -> str:
        self.worker_seq += 1
        if self.endpoint.startswith("ipc://"):
            return f"ipc://{self.worker_dir}/w{self.worker_seq}-{uuid.uuid4().hex[:20]}.sock"
        if self.endpoint.startswith("tcp://"):
            host = self.endpoint[len("tcp://"):].rsplit(":", 1)[0]
            return f"tcp://{host}:*"
        raise EndpointInUse(f"unsupported endpoint {self.endpoint}")

    def spawn_worker(self) -> Worker:
        s = self.spec
        ep = self._worker_endpoint()
        r, w = os.pipe()
        cmd = [*WORKER_COMMAND, "--ready-fd", str(w),
               "--backend", s.backend, "--emu-devices", str(s.emu_devices), "--spin-us", str(s.spin_us),
               "--log-level", s.log_level]
        if s.emu_kernels:
            cmd += ["--emu-kernels", *s.emu_kernels]
        env = dict(os.environ)
        env.pop("GPUPROXY_EMU_KERNELS", None) if s.emu_kernels else None
        env["GPUPROXY_WORKER_SECRET"] = self.secret
        env["GPUPROXY_WORKER_ENDPOINT"] = ep      # not in argv: ps shows arguments to every user
        env["GPUPROXY_SUPERVISOR_PID"] = str(os.getpid())   # the worker's parent (worker/entry.py)
        env["GPUPROXY_WORKER_SOCKET_MODE"] = "666" if self.users == "all" else ""
        if self.curve_client is not None:
            env["GPUPROXY_SUPERVISOR_CURVE_KEY"] = self.curve_client[1].decode()   # a public key
        # only a channel passed here is named: a variable inherited from the
        # supervisor's own environment names no descriptor of the worker
        env.pop("GPUPROXY_HOST_POOL_FD", None)
        key = object()
        pool_fd = self.host_pools.channel_for(key)
        if pool_fd is not None:
            env["GPUPROXY_HOST_POOL_FD"] = str(pool_fd)
        try:
            proc = subprocess.Popen(cmd, pass_fds=[w] + ([pool_fd] if pool_fd is not None else []),
                                    stdin=subprocess.DEVNULL, env=env,
                                    preexec_fn=None if os.environ.get("GPUPROXY_WORKER_ASLR") == "1" else _fixed_layout)
        except BaseException:
            self.host_pools.worker_gone(key)
            raise
        finally:
            os.close(w)
            if pool_fd is not None:
                os.close(pool_fd)
        os.set_blocking(r, False)
        wk = Worker(proc, r, ep)
        self.host_pools.rebind(key, wk)
        self.workers.append(wk)
        log.debug("started worker pid %d at %s", wk.pid, ep)
        return wk

    def _on_ready_data(self, wk: Worker):
        try:
            data = os.read(wk.ready_fd, 65536)
        except BlockingIOError:
            return
        if data:
            wk.ready_buf += data
            if b"\n" not in wk.ready_buf:
                return
        self._close_ready(wk)
        if not wk.ready_buf.strip():
            return      # it died before it was ready; _check_workers reports it
        try:
            wk.info = json.loads(wk.ready_buf.decode())
        except ValueError:
            log.error("worker %d sent an unreadable ready line", wk.pid)
            self._stop_worker(wk, hard=True)
            return
        ep = wk.info["endpoint"]
        if ep.startswith("tcp://0.0.0.0:") or ep.startswith("tcp://*:"):
            ep = "tcp://127.0.0.1:" + ep.rsplit(":", 1)[1]
        wk.sock = self.zctx.socket(zmq.DEALER)
        wk.sock.setsockopt(zmq.LINGER, 0)
        wk.sock.setsockopt(zmq.ROUTING_ID, b"ctl:sup-" + self.secret.encode())
        curve.secure_client(wk.sock, ep, self.curve_client)
        wk.sock.connect(ep)
        self.start_failures = 0
        if self.backend_info is None:
            self.backend_info = wk.info
            # every later worker uses what the first one found (auto -> cuda or emu)
            self.spec.backend = wk.info["backend"]
        log.debug("worker %d ready at %s", wk.pid, wk.info["endpoint"])
        self._hand_out()

    def _close_ready(self, wk: Worker):
        if wk.ready_fd >= 0:
            os.close(wk.ready_fd)
            wk.ready_fd = -1

    def _spare(self) -> Worker | None:
        for wk in self.workers:
            if wk.token is None and wk.ready and not wk.exit_reason:
                return wk
        return None

    def _hand_out(self):
        while self.waiting_for_worker:
            wk = self._spare()
            if wk is None:
                break
            cb = self.waiting_for_worker.pop(0)
            cb(wk)
        self._top_up()

    def _top_up(self):
        if self.stopping or self.start_failures >= MAX_START_FAILURES:
            return
        idle = sum(1 for wk in self.workers if wk.token is None and not wk.exit_reason)
        want = self.spares + len(self.waiting_for_worker)
        for _ in range(max(0, want - idle)):
            self.spawn_worker()

    def with_worker(self, cb):
        """Calls cb(worker) with a ready, unassigned worker, now or when one is."""
        self.waiting_for_worker.append(cb)
        self._hand_out()

    def _stop_worker(self, wk: Worker, hard: bool = False):
        if wk.proc.poll() is None:
            try:
                wk.proc.send_signal(signal.SIGKILL if hard else signal.SIGTERM)
            except ProcessLookupError:
                pass
        wk.exit_reason = wk.exit_reason or "stopped by the supervisor"

    def _check_workers(self):
        for wk in list(self.workers):
            rc = wk.proc.poll()
            if rc is None:
                continue
            self.workers.remove(wk)
            self.host_pools.worker_gone(wk)
            self._close_ready(wk)
            if wk.sock is not None:
                wk.sock.close(0)
            for fid, (cb, _dl, owner) in list(self.pending.items()):
                if owner is wk:
                    del self.pending[fid]
                    cb(1, "the session ended (its process exited) before the command was done"
                       if wk.exit_reason == "session ended" else
                       f"the session's worker (pid {wk.pid}) {_describe_exit(rc)}")
            e = self.entries.get(wk.token) if wk.token else None
            if e is not None and e.worker is wk:
                e.worker = None
                if rc == 0 or wk.exit_reason:
                    # the session ended (BYE, client gone) or the supervisor
                    # ended the worker on purpose (released, failed restore)
                    if e.state != "released":
                        self._drop(e)
                else:
                    e.state = "dead"
                    e.why = f"its proxyd worker (pid {wk.pid}) {_describe_exit(rc)}"
                    e.since = time.monotonic()
                    self._fail_park_waiters(e, f"session of pid {e.pid} lost: {e.why}")
                    log.warning("session of pid %s lost: %s", e.pid, e.why)
                    remove_client_segments(e.token)
            elif wk.info is None and not wk.exit_reason:
                self.start_failures += 1
                log.error("a worker (pid %d) %s before it was ready", wk.pid, _describe_exit(rc))
                if self.start_failures >= MAX_START_FAILURES:
                    why = "proxyd workers fail to start (see proxyd's log)"
                    for cb in self.waiting_for_worker:
                        cb(None, why)
                    self.waiting_for_worker = []
        self._top_up()

    # -------------------------------------------------------- forwarding
    def forward(self, wk: Worker, cmd: str, args: dict, cb, timeout_s: float | None = None):
        """Sends a CTL to a worker; cb(code, result) runs when it answers (or
        with an error if the worker dies or the deadline passes)."""
        fid = self.next_fid
        self.next_fid += 1
        dl = time.monotonic() + timeout_s if timeout_s else None
        self.pending[fid] = (cb, dl, wk)
        wk.sock.send(msgpack.packb([P.MSG_CTL, fid, cmd, args], use_bin_type=True))

    def _on_worker_msg(self, wk: Worker):
        while True:
            try:
                raw = wk.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = msgpack.unpackb(raw, raw=False, strict_map_key=False)
                fid, code, result = int(msg[0]), int(msg[1]), msg[2]
            except Exception as e:
                log.warning("unreadable answer from worker %d: %s", wk.pid, e)
                continue
            if fid == 0 and isinstance(result, dict) and wk.token and result.get("opened") == wk.token:
                e = self.entries.get(wk.token)
                if e is not None and e.worker is wk:
                    e.opened = True        # the worker says its client opened the session (worker_gate.py)
                continue
            item = self.pending.pop(fid, None)
            if item is not None:
                item[0](code, result)

    def _expire_pending(self):
        now = time.monotonic()
        for fid, (cb, dl, _wk) in list(self.pending.items()):
            if dl is not None and now > dl:
                del self.pending[fid]
                cb(-1, "no answer in time")

    # ------------------------------------------------------------ clients
    def _entry_of(self, rid: bytes) -> str | None:
        return rid[2:].decode(errors="replace") if rid.startswith(b"c:") else None

    def _open_pidfd(self, e: Entry):
        if e.pidfd is not None or not e.pid or e.pidns != OWN_PIDNS:
            return
        try:
            e.pidfd = os.pidfd_open(e.pid)
        except (OSError, AttributeError):
            e.pidfd = None

    def on_hello(self, rid: bytes, seq: int, info: dict, key_user: str | None = None, peer: str | None = None,
                 cred=None):
        token = self._entry_of(rid)
        if not token or str(info.get("token", "")) != token:
            self.send(rid, [seq, P.REPLY_PROTOCOL_ERROR, "HELLO token does not match the routing id"])
            return
        owner = B.sender_uid(self.zap is not None, key_user, cred)
        e = self.entries.get(token)
        if e is not None and (owner is None or owner != e.owner):
            return      # another user's session: no answer at all, nothing confirmed (bounds.py)
        if e is not None:
            if e.state == "running" and e.worker is not None and e.worker.ready:
                self._answer_hello(e, rid, seq)
            elif e.state == "starting":
                if all(s != seq for _, s in e.hello):
                    e.hello.append((rid, seq))
                self.send(rid, [seq, P.REPLY_KEEPALIVE])
            else:
                self.send(rid, [seq, P.REPLY_PROTOCOL_ERROR, f"session is {e.state} {e.why}".strip()])
            return
        try:
            pid = int(info.get("pid", 0))
        except (TypeError, ValueError):
            pid = 0
        why = self.bounds.check_new(self.entries, owner, pid, str(info.get("pidns") or ""), cred, self.zap is not None)
        if why:
            RATE.event("refused HELLO", "refused a HELLO from uid %s: %s", owner, why)
            self.send(rid, [seq, P.REPLY_PROTOCOL_ERROR, f"cannot open a session: {why}"])
            return
        e = Entry(token, pid, str(info.get("exe", "")), str(info.get("pidns") or ""))
        e.owner = owner
        if self.zap is not None:
            # keyed tcp: the session is the key's user's. A client on
            # another host has a pid of another kernel (and every host's
            # initial pid namespace has the same name): never look it up
            # here; its session ends with its BYE or its worker.
            e.uid = int(key_user) if key_user and key_user.isdigit() else None
            if peer not in curve.LOOPBACK:
                e.pidns = f"remote:{peer}"
        else:
            from .client_view import adopt_kernel_pid
            adopt_kernel_pid(e, cred, pid, e.pidns)
            e.uid = _uid_of(e.pid) if e.pidns == OWN_PIDNS else None
        e.hello.append((rid, seq))
        self.entries[token] = e
        self._open_pidfd(e)
        B.watch_peer(e, cred)
        self.send(rid, [seq, P.REPLY_KEEPALIVE])   # a worker may take a moment to start

        def got(wk, why=None):
            if wk is None:
                e.state, e.why = "dead", why
                for r, s in e.hello:
                    self.send(r, [s, P.REPLY_PROTOCOL_ERROR, f"cannot open a session: {why}"])
                e.hello = []
                return
            wk.token = token
            e.worker = wk
            e.given_at = time.monotonic()
            log.info("session of pid %s %s: worker pid %d", e.pid, e.exe, wk.pid)

            def answer():
                e.state = "running"
                for r, s in e.hello:
                    self._answer_hello(e, r, s)
                e.hello = []

            def expected(code, result):
                # the worker takes this session, of this user, only (control.py
                # "expect"; worker_gate.py)
                if code == 0:
                    answer()
                    return
                e.state, e.why = "dead", f"its worker did not take it: {result}"
                for r, s in e.hello:
                    self.send(r, [s, P.REPLY_PROTOCOL_ERROR, f"cannot open a session: {e.why}"])
                e.hello = []
            self.forward(wk, "expect", {"token": token, "uid": e.owner}, expected, timeout_s=10)
        self.with_worker(got)

    def _answer_hello(self, e: Entry, rid: bytes, seq: int):
        wk = e.worker
        self.send(rid, [seq, 0, [{"endpoint": wk.info["endpoint"], "worker_pid": wk.pid,
                                  "version": __version__}], 0, 0, ""])

    def on_where(self, rid: bytes, seq: int, info: dict, peer: str | None = None, asker: int | None = None,
                 cred=None):
        token = self._entry_of(rid)
        e = self.entries.get(token) if token else None
        if e is not None and e.owner is not None and asker != e.owner:
            e = None             # another user's session: as if there were none
        if e is None:
            ans = {"state": "unknown"}
        else:
            remote = self.zap is not None and peer not in curve.LOOPBACK
            if remote:
                e.restored_at = None     # a restored remote client is back (it cannot be watched by pid)
            if e.pidfd is None and info.get("pid") and not remote:
                # a restored session's client is back: watch it from now on
                try:
                    e.pid = int(info["pid"])
                except (TypeError, ValueError):
                    pass
                e.pidns = str(info.get("pidns") or e.pidns)
                from .client_view import adopt_kernel_pid
                adopt_kernel_pid(e, cred, e.pid, e.pidns)
                self._open_pidfd(e)
                if e.pidfd is not None:
                    e.restored_at = None
            ans = {"state": e.state}
            if e.state == "running" and e.worker is not None and e.worker.ready:
                ans["endpoint"] = e.worker.info["endpoint"]
            elif e.state == "running":
                ans["state"] = "starting"
            if e.why:
                ans["why"] = e.why
        self.send(rid, [seq, 0, [ans], 0, 0, ""])

    def on_quiesce(self, rid: bytes, seq: int, asker: int | None = None):
        """A parking shim asks that its worker finish all device work (so no
        copy lands in memory it is about to turn private)."""
        token = self._entry_of(rid)
        e = self.entries.get(token) if token else None
        if e is not None and e.owner is not None and asker != e.owner:
            e = None
        if e is None or e.worker is None or e.worker.sock is None:
            self.send(rid, [seq, P.REPLY_UNKNOWN_SESSION, "no running session to quiesce"])
            return

        def done(code, result):
            if code == 0:
                self.send(rid, [seq, P.REPLY_QUIESCED])
            else:
                self.send(rid, [seq, P.REPLY_PROTOCOL_ERROR, f"quiesce failed: {result}"])
        self.forward(e.worker, "quiesce", {}, done)

    def _end(self, e: Entry):
        """Ends a session whose client is gone: its worker releases the GPU
        state and exits; its shared memory goes."""
        if e.worker is not None:
            e.worker.exit_reason = "session ended"
            self._stop_worker(e.worker)
        remove_client_segments(e.token)
        from . import markers
        markers.remove(e.token)
        self._drop(e)

    def _drop(self, e: Entry):
        self.entries.pop(e.token, None)
        _remove_park_files(e)        # every way a session goes (its client gone, its BYE, dead)
        self._fail_park_waiters(e, f"pid {e.pid} ended before it parked (its session is gone): nothing to dump")
        if e.pidfd is not None:
            os.close(e.pidfd)
            e.pidfd = None

    def _fail_park_waiters(self, e: Entry, why: str) -> None:
        """Answers every park command still waiting on e: a session that ends
        or dies never parks, and its askers must not wait for their own
        time-outs (a dump would block for minutes on an app that finished)."""
        waiters, e.park_waiters = e.park_waiters, []
        for r, s, _dl in waiters:
            self.reply(r, s, error=why)

    def _reap_clients(self):
        """Ends the sessions whose client process is gone (pidfds: no pid
        reuse confusion; sessions of another pid namespace have none and are
        left to their BYE or their worker)."""
        B.reap_unopened(self)
        fds = {e.pidfd: e for e in self.entries.values() if e.pidfd is not None}
        now = time.monotonic()
        if fds:
            p = select.poll()
            for fd in fds:
                p.register(fd, select.POLLIN)
            for fd, _ev in p.poll(0):
                e = fds[fd]
                log.info("session of pid %s: the process exited; ending its session", e.pid)
                self._end(e)
        for e in list(self.entries.values()):
            if e.state == "dead" and now - e.since > DEAD_KEEP_S:
                self._drop(e)
            elif e.restored_at is not None and e.pidfd is None and now - e.restored_at > ATTACH_GRACE_S:
                log.info("restored session of pid %s: its process did not come back within %g s; ending it",
                         e.pid, ATTACH_GRACE_S)
                self._end(e)
            if e.park_waiters and os.path.exists(parked_path(e.token, e.park_shm or "/dev/shm")):
                e.parked = True
                held = stall.read_held(parked_path(e.token, e.park_shm or "/dev/shm"))
                for r, s, _dl in e.park_waiters:
                    self.reply(r, s, {"token": e.token, "pid": e.pid, "parked": True, "held_ns": held})
                e.park_waiters = []
            stall.tick(self, e, now)
            if e.parked or e.park_waiters:
                park_lease.renew(e, e.park_shm or "/dev/shm", now)
            for r, s, dl in list(e.park_waiters):
                if now > dl:
                    e.park_waiters.remove((r, s, dl))
                    self.reply(r, s, error=f"pid {e.pid} did not park in time (is it a gpuproxy client "
                                           f"that is not stopped?)")

    # ------------------------------------------------------------ control
    def _find_pid(self, args) -> Entry:
        try:
            pid = int(args["pid"])
        except (KeyError, TypeError, ValueError):
            raise LookupError("the command needs a pid") from None
        # pids are not unique across pid namespaces and hosts (tcp clients):
        # the asker's own session of that pid comes first
        found = [e for e in self.entries.values() if e.pid == pid and e.state != "dead"]
        for e in found:
            if self.may_control(self.asker, e):
                return e
        if found:
            return found[0]
        raise LookupError(f"no session of pid {pid} in this proxyd (see proxy-cli status)")

    # -------------------------------------------------------- authorisation
    def is_admin(self, uid: int | None) -> bool:
        """root and the daemon's own user see and control every session."""
        return uid is not None and (uid == 0 or uid == os.geteuid() or uid in ADMIN_UIDS)

    def may_control(self, uid: int | None, e: Entry) -> bool:
        return self.is_admin(uid) or (uid is not None and e.uid == uid)

    def authorise(self, cmd: str, args: dict) -> str | None:
        """None when self.asker may run cmd with args, else why not
        (docs/security.md, "Authorisation")."""
        uid = self.asker
        if self.is_admin(uid) or cmd in ("ping", "status"):
            return None        # status shows each user only their own sessions
        if cmd == "shutdown":
            return "only root or proxyd's own user may stop proxyd"
        if cmd in ("dump", "pre-dump", "migrate", "park", "resume", "discard", "dump-wait") or cmd in NCCL_CUT_COMMANDS:
            e = None
            if cmd in ("resume", "discard") and args.get("token"):
                e = self.entries.get(str(args["token"]))
            else:
                try:
                    e = self._find_pid(args)
                except LookupError:
                    return None        # the handler says there is no such session
            if e is None or not self.may_control(uid, e):
                return "that session belongs to another user"
        for key in ("dir", "parent"):
            d = args.get(key)
            if isinstance(d, str) and d and not _owned_path(d, uid, create=cmd in ("dump", "pre-dump")):
                return f"{d} (or the folder it would go in) is not yours"
        return None

    def ctl_ping(self, rid, seq, args):
        self.reply(rid, seq, {"version": __version__, "pid": os.getpid(), "role": "supervisor"})

    def ctl_shutdown(self, rid, seq, args):
        self.reply(rid, seq, {"stopping": True})
        self.stopping = True

    def ctl_status(self, rid, seq, args):
        asker = self.asker
        asker_ns = getattr(self, "asker_ns", None)
        live = [e for e in self.entries.values() if e.worker is not None and e.worker.sock is not None]
        state = {"left": len(live)}
        log.debug("status: asking %d workers", len(live))

        def finish():
            info = self.backend_info or {}
            sessions = []
            for e in sorted(self.entries.values(), key=lambda e: e.since):
                if not self.may_control(asker, e):
                    continue         # another user's session: not even its existence is shown
                if asker_ns is not None and e.client_pidns != asker_ns:
                    continue         # an asker in a container sees the sessions of its own pid namespace
                pid = e.ns_pid if asker_ns is not None else e.pid
                # a session that got its worker after this round began has
                # not been asked yet: it is still starting
                s = dict(e.last_status or {"connecting": True})
                s.pop("token", None)     # a session's token is its identity: never shown
                s.update({"pid": pid, "exe": e.exe or s.get("exe", ""),
                          "worker_pid": e.worker.pid if e.worker else None,
                          "state": self._state_word(e, s), "why": e.why or None,
                          "released": e.state == "released"})
                s.setdefault("device_memory", 0)
                s.setdefault("objects", {k: 0 for k in (*P.KIND_CODES, "allocation")})
                s.setdefault("calls", 0)
                s.setdefault("frozen", False)
                sessions.append(s)
            self.reply(rid, seq, {
                "version": __version__, "pid": os.getpid(), "endpoint": self.endpoint,
                "backend": info.get("backend", self.spec.backend), "driver_version": info.get("driver_version", 0),
                "devices": info.get("devices", []), "uptime_s": round(time.time() - self.started, 1),
                "workers": len(self.workers), "max_restores": self.max_restores, "sessions": sessions})

        if not live:
            finish()
            return
        for e in live:
            def got(code, result, e=e):
                if code == 0 and isinstance(result, dict):
                    mine = [s for s in result.get("sessions", []) if s.get("token") == e.token]
                    # none yet: the client has its worker's endpoint but has
                    # not opened the session there
                    e.last_status = mine[0] if mine else {"connecting": True}
                    e.last_status["busy"] = False
                elif e.last_status is not None:
                    e.last_status["busy"] = True
                else:
                    e.last_status = {"busy": True}
                state["left"] -= 1
                if state["left"] == 0:
                    finish()
            self.forward(e.worker, "status", {}, got, timeout_s=STATUS_DEADLINE_S)

    @staticmethod
    def _state_word(e: Entry, s: dict) -> str:
        if e.state != "running":
            return e.state
        if s.get("connecting"):
            return "starting"
        if e.parked:
            return "parked"
        if s.get("frozen"):
            return "frozen"
        if s.get("busy"):
            return "busy"
        return "running"

    def _running(self, args) -> Entry:
        e = self._find_pid(args)
        if e.state != "running" or e.worker is None or e.worker.sock is None:
            raise LookupError(f"session of pid {e.pid} is {e.state}: nothing to do")
        return e

    def ctl_forward(self, rid, seq, args, cmd=None, after=None):
        try:
            e = self._running(args)
        except LookupError as x:
            self.reply(rid, seq, error=str(x))
            return

        def got(code, result):
            if code == 0 and after is not None:
                after(e, result)
            self.reply(rid, seq, result if code == 0 else None, None if code == 0 else str(result))
        if e.ns_pid and args.get("pid") == e.pid:
            args = dict(args, pid=e.ns_pid)     # the worker knows its client as the client calls itself
        self.forward(e.worker, cmd or self._cmd, args, got)

    def ctl_dump(self, rid, seq, args):
        cmd = self._cmd

        def after(e, result):
            if isinstance(result, dict) and result.get("captured"):
                return        # written in the background: dump-wait's answer says when it is released
            if (cmd == "dump" and not args.get("leave_running")) or \
                    (cmd == "dump-wait" and isinstance(result, dict) and result.get("released")):
                # its GPU state is in the image and released: the worker goes
                # (and with it the CUDA context); the client waits for a restore
                e.state, e.since = "released", time.monotonic()
                if e.park_shm:      # a parked app now waits for a restore, by whatever daemon (park_lease.py)
                    park_lease.stop(e, e.park_shm)
                from . import markers
                if self.entries.get(e.token) is e:      # (not if its process ended meanwhile)
                    markers.mark_released(e.token, e.pid, self.endpoint,    # survives this daemon (markers.py)
                                          result.get("last_seq") if isinstance(result, dict) else None)
                wk = e.worker
                e.worker = None
                if wk is not None:
                    wk.exit_reason = "session released"
                    self._stop_worker(wk)
        self.ctl_forward(rid, seq, args, cmd=cmd, after=after)

    @property
    def max_restores(self) -> int:
        """Restores in flight at once (each holds a fresh worker): one per GPU
        of this node, at least 2, or GPUPROXY_MAX_RESTORES. It was 2, and a
        4-rank job on 4 H100s came back two ranks at a time (8.4 s for 43 GB,
        2026-11-28). The supervisor never opens a GPU: it counts the
        /dev/nvidiaN nodes (the emulated backend: its --emu-devices)."""
        v = os.environ.get("GPUPROXY_MAX_RESTORES", "")
        if v.isdigit() and int(v) > 0:
            return int(v)
        if self._device_count is None:
            if self.spec.backend == "emu":
                n = self.spec.emu_devices
            else:
                try:
                    n = sum(1 for f in os.listdir("/dev") if f.startswith("nvidia") and f[6:].isdigit())
                except OSError:
                    n = 0
            self._device_count = n
        return min(16, max(2, self._device_count))

    @staticmethod
    def precheck_image(args) -> tuple[str | None, int | None, int | None]:
        """The structural checks of a restore, done here before a worker is
        taken for it (cheap: manifests, parents, file sizes; no chunk data),
        so that a bad image costs no process. None when it may go on."""
        from ..checkpoint.image import Image, ImageError
        from ..checkpoint.manifest_schema import SchemaError, validate_session
        d = args.get("dir")
        if not isinstance(d, str) or not d:
            return "restore needs an image directory (dir)", None, None
        try:
            img = Image.open(d)
            try:
                img.check_restorable()
                validate_session(img.session, strict=True)
                uid = img.session.get("uid")
                owner = img.session.get("owner_uid")      # whose process talked to the worker
                from .markers import older_than_release
                stale = older_than_release(img.session)
            finally:
                img.close()
            if stale:
                return stale, None, None
        except ImageError as e:
            return f"image refused: {e}", None, None
        except SchemaError as e:
            return f"image refused: {d}/manifest: {e}", None, None
        except Exception as e:       # an image is untrusted input: never more than one line
            return f"image refused: {d}: {type(e).__name__}: {e}", None, None
        return None, uid, owner

    def ctl_restore(self, rid, seq, args):
        asker = self.asker
        why, image_uid, image_owner = self.precheck_image(args)
        if why is None and not self.is_admin(self.asker) and image_uid is not None and image_uid != self.asker:
            why = "permission denied: the image is of another user's session"
        if why is None and self.restoring >= self.max_restores:
            why = f"{self.restoring} restores are running; try again when they are done"
        if why is not None:
            self.reply(rid, seq, error=why)
            return
        self.restoring += 1

        def finish_restore():
            self.restoring -= 1

        def got_worker(wk, why=None):
            if wk is None:
                finish_restore()
                self.reply(rid, seq, error=f"restore: {why}")
                return
            wk.token = "restoring-" + uuid.uuid4().hex   # taken: no client gets it meanwhile
            wk.pool_uid = image_uid if image_uid is not None else asker    # whose staging memory (host_pool.py)

            def done(code, result):
                finish_restore()
                if code != 0 or not isinstance(result, dict) or "token" not in result:
                    wk.exit_reason = "restore failed"
                    self._stop_worker(wk)
                    self.reply(rid, seq, error=str(result))
                    return
                token = str(result["token"])
                old = self.entries.get(token)
                if old is not None and old.state == "running" and old.worker is not None:
                    wk.exit_reason = "restore refused"
                    self._stop_worker(wk)
                    self.reply(rid, seq, error=f"session of pid {old.pid} is live in this proxyd; dump it "
                                               f"without --leave-running first")
                    return
                pid = int(result.get("pid") or 0)
                other = next((x for t, x in self.entries.items() if t != token and pid and x.pid == pid
                              and x.state in ("running", "released")), None)
                if other is not None:
                    # the image names another session than the one this pid
                    # has here (an edited token, or another process's image):
                    # two sessions for one pid would make --pid ambiguous
                    wk.exit_reason = "restore refused"
                    self._stop_worker(wk)
                    self.reply(rid, seq, error=f"the image's session {token} is not the session of pid {pid} in "
                                               f"this proxyd ({other.token}, {other.state})")
                    return
                wk.token = token
                e = Entry(token, pid, str(result.get("exe", "")))
                e.uid = image_uid if image_uid is not None else asker
                e.owner, e.opened = e.uid, True
                if image_owner is not None and self.is_admin(asker):
                    e.owner = image_owner      # e.g. a container's session (no uid for control), restored by an admin
                if old is not None:
                    e.exe, e.pidns, e.pidfd = old.exe or e.exe, old.pidns, old.pidfd
                    e.owner = old.owner if old.owner is not None else e.owner
                    old.pidfd = None
                # the restored session's worker reads its owner's messages only
                # (worker_gate.py); sent before anyone is told the endpoint
                self.forward(wk, "expect", {"token": token, "uid": e.owner}, lambda code, res: None, timeout_s=10)
                self.entries[token] = e
                e.worker, e.state = wk, "running"
                if e.pidfd is None:
                    e.restored_at = time.monotonic()   # watched from the client's first WHERE on
                from . import markers
                markers.remove(token, ("released",))
                log.info("session of pid %s restored into worker pid %d", e.pid, wk.pid)
                result["worker_pid"] = wk.pid
                self.reply(rid, seq, result)
            self.forward(wk, "restore", args, done)
        self.with_worker(got_worker)

    def ctl_park(self, rid, seq, args):
        """Asks the client's shim to park (interceptor/park.c) and answers
        once it has: its sockets closed, its shared memory with the daemon
        unmapped, its CUDA-calling threads waiting inside the shim."""
        try:
            e = self._running(args)
            timeout = float(args.get("timeout_s", 10))
        except (LookupError, TypeError, ValueError) as x:
            self.reply(rid, seq, error=str(x))
            return
        if e.pidns.startswith("remote:"):
            self.reply(rid, seq, error=f"session of pid {e.pid} is a client on another host ({e.pidns[7:]}): "
                                       f"it cannot be parked from here (use --gpu-only)")
            return
        if e.parked:
            self.reply(rid, seq, {"token": e.token, "pid": e.pid, "parked": True})
            return
        e.park_shm = _client_shm(e)
        for path in (resume_path(e.token, e.park_shm), parked_path(e.token, e.park_shm),
                     park_held_path(e.token, e.park_shm)):
            try:
                os.unlink(path)
            except OSError:
                pass
        park_lease.start(e, e.park_shm)     # before the signal: the shim reads it
        if args.get("in_call"):
            _write_park_held(e, park_held_path(e.token, e.park_shm))
        try:
            os.kill(e.pid, PARK_SIGNAL)
        except PermissionError:
            self.reply(rid, seq, error=f"permission denied signalling pid {e.pid}")
            return
        except ProcessLookupError:
            self.reply(rid, seq, error=f"pid {e.pid} is not running")
            return
        e.park_waiters.append((rid, seq, time.monotonic() + timeout))

    def ctl_resume(self, rid, seq, args):
        """Lets a parked client (the original, or the one CRIU restored) go on:
        it reconnects to this daemon and re-attaches its session."""
        e = None
        if args.get("token"):
            e = self.entries.get(str(args["token"]))
        else:
            try:
                e = self._find_pid(args)
            except LookupError as x:
                self.reply(rid, seq, error=str(x))
                return
        if e is None:
            self.reply(rid, seq, error="no such session in this proxyd")
            return
        shm = _client_shm(e)
        here = args.get("pid_here")
        if here and isinstance(here, int) and self.asker_ns:
            # a container's proxy-cli names the app it restored by its own
            # namespace's pid (whole_process.restore; pidview.py)
            from ..core.pidview import in_ns
            here = in_ns(self.asker_ns, here)
        owner = e
        if here and isinstance(here, int) and here > 0 and (self.is_admin(self.asker) or _uid_of(here) == self.asker):
            # a restored client that proxyd does not know by pid yet (CRIU's
            # plugin names the task it restored, as proxyd's namespace sees it)
            from .client_view import shm_dir, unreachable
            why = unreachable(here)
            if why:
                self.reply(rid, seq, error=why)
                return
            shm, owner = shm_dir(here), _PidOnly(here)     # (the file is that process's user's)
        path = resume_path(e.token, shm)
        e.ran_shm = shm
        stall.forget_ran(e.token, shm)
        try:
            # written whole, then named: the parked shim never reads half of it
            _write_client_file(owner, path + ".tmp", (self.endpoint + "\n").encode())
            os.rename(path + ".tmp", path)
        except OSError as x:
            self.reply(rid, seq, error=f"cannot write {path}: {x}")
            return
        e.parked = False
        park_lease.stop(e, e.park_shm or shm)
        if args.get("wait_ran"):      # answer with the app's own stall figure (stall.py)
            stall.wait_ran(e, rid, seq, {"token": e.token, "pid": e.pid, "resumed": True})
            return
        self.reply(rid, seq, {"token": e.token, "pid": e.pid, "resumed": True})

    # ---------------------------------------------------------------- loop
    def handle(self, rid: bytes, raw: bytes, key_user: str | None = None, peer: str | None = None, cred=None):
        """One message from the public endpoint. On a keyed tcp endpoint,
        key_user is what the ZAP handler made of the sender's key (a uid) and
        peer its address."""
        try:
            msg = msgpack.unpackb(raw, raw=False, strict_map_key=False)
            mtype, seq = P.header(msg)
        except Exception as e:
            RATE.event("malformed message", "malformed message from %r: %s", rid[:40], e)
            return
        try:
            if mtype == P.MSG_HELLO:
                p = msg[2] if len(msg) > 2 else None
                self.on_hello(rid, seq, p[0] if isinstance(p, list) and p and isinstance(p[0], dict) else {},
                              key_user, peer, cred)
            elif mtype == P.MSG_WHERE:
                self.on_where(rid, seq, msg[2] if len(msg) > 2 and isinstance(msg[2], dict) else {}, peer,
                              B.sender_uid(self.zap is not None, key_user, cred), cred)
            elif mtype == P.MSG_QUIESCE:
                self.on_quiesce(rid, seq, B.sender_uid(self.zap is not None, key_user, cred))
            elif mtype == P.MSG_CTL:
                cmd = msg[2] if len(msg) > 2 else None
                args = msg[3] if len(msg) > 3 and isinstance(msg[3], dict) else {}
                h = self.handlers.get(cmd) if isinstance(cmd, str) else None
                if h is None:
                    self.reply(rid, seq, error=f"unknown command {str(cmd)[:80]!r}")
                    return
                if self.zap is not None:
                    # keyed tcp: the key is the identity (a proof file would
                    # name a file on the requester's host, not ours)
                    self.asker = int(key_user) if key_user and key_user.isdigit() else None
                else:
                    self.asker = requester_uid(msg[4] if len(msg) > 4 else None)
                    if self.asker is None and cred is not None:
                        # no proof file proxyd can see (a container without the
                        # node's /tmp): the kernel's credentials of the sender
                        self.asker = cred.uid
                if cmd != "ping" and self.asker is None:
                    self.reply(rid, seq, error="permission denied: proxyd could not tell who is asking (proxy-cli "
                                               "proves it with a file in /tmp or its socket's credentials, or on "
                                               "tcp with its CURVE key)")
                    return
                self.asker_ns = None
                if cred is not None and cred.pid and self.zap is None:
                    from ..core.pidview import OWN_PIDNS as _own, in_ns, pidns_of
                    ns = pidns_of(cred.pid)
                    if ns and ns != _own:
                        # proxy-cli in a container names pids of its own
                        # namespace: proxyd's are those (pidview.py)
                        self.asker_ns = ns
                        if args.get("pid") not in (None, 0):
                            try:
                                here = in_ns(ns, int(args["pid"]))
                            except (TypeError, ValueError):
                                here = None
                            if here is None:
                                self.reply(rid, seq, error=f"no process of pid {args['pid']} in the asker's pid "
                                                           f"namespace")
                                return
                            args = dict(args, pid=here)
                why = self.authorise(cmd, args)
                if why:
                    self.reply(rid, seq, error=f"permission denied: {why}")
                    return
                self._cmd = cmd
                h(rid, seq, args)
            elif mtype in (P.MSG_CALL, P.MSG_BYE, P.MSG_DOORBELL):
                self.send(rid, [seq, P.REPLY_UNKNOWN_SESSION, "calls go to the session's worker, not the supervisor"])
            else:
                self.send(rid, [seq, P.REPLY_PROTOCOL_ERROR, f"unknown message type {mtype}"])
        except Exception as e:   # never let one bad message stop the daemon
            RATE.internal_error("internal error in a message", f"error handling message type {mtype} from {rid[:40]!r}", e)
            try:
                self.send(rid, [seq, P.REPLY_PROTOCOL_ERROR, f"proxyd internal error: {e}"[:1000]])
            except Exception as e2:   # the answer itself cannot be sent: the peer gets nothing
                RATE.internal_error("internal error in a message", "cannot answer a message", e2)

    def serve_forever(self):
        log.info("proxyd %s supervising at %s (%s backend, one worker per session)", __version__, self.endpoint,
                 self.spec.backend)
        self._top_up()
        next_tick = 0.0
        while not self.stopping:
            poller = zmq.Poller()
            poller.register(self.sock, zmq.POLLIN)
            socks = {}
            for wk in self.workers:
                if wk.ready_fd >= 0:
                    poller.register(wk.ready_fd, zmq.POLLIN)
                if wk.sock is not None:
                    poller.register(wk.sock, zmq.POLLIN)
                    socks[wk.sock] = wk
                pfd = self.host_pools.fileno(wk)
                if pfd is not None:
                    poller.register(pfd, zmq.POLLIN)
            tick_s = stall.tick_s(self, TICK_S)      # short while a park is awaited: the app waits too
            events = dict(poller.poll(max(1, int(tick_s * 1000))))
            if self.stopping:
                break       # told to stop (SIGTERM) while waiting: answer nothing more (sockfile.py)
            if self.sock in events:
                while True:
                    try:
                        frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    if len(frames) >= 2:
                        key_user = peer = cred = None
                        if self.zap is not None:
                            key_user, peer = curve.user_id(frames[1]), curve.peer_address(frames[1])
                        else:
                            cred = peercred.ipc_peer(frames[1])     # the kernel's: who sent it
                        self.handle(frames[0].bytes, frames[1].bytes, key_user, peer, cred)
            for wk in list(self.workers):
                if wk.ready_fd >= 0 and wk.ready_fd in events:
                    self._on_ready_data(wk)
                if wk.sock is not None and wk.sock in events:
                    self._on_worker_msg(wk)
                pfd = self.host_pools.fileno(wk)
                if pfd is not None and pfd in events:
                    self.host_pools.on_message(wk, self._pool_uid(wk))
            now = time.monotonic()
            if now >= next_tick or tick_s < TICK_S:
                next_tick = now + tick_s
                self._check_workers()
                self._expire_pending()
                self._reap_clients()
                self.host_pools.tick(now)

    def _pool_uid(self, wk: Worker) -> int | None:
        """The user whose shared host pool a worker may use: its session's
        (host_pool.py), or, while it restores, the image's."""
        e = self.entries.get(wk.token) if wk.token else None
        if e is not None and e.worker is wk:
            return e.uid
        return getattr(wk, "pool_uid", None)

    def close(self):
        # the public endpoint goes first: a daemon started to replace this
        # one may take it while the workers stop (sockfile.py)
        from ..core import sockfile
        self.sock.close(0)
        self.host_pools.close()
        sockfile.release(self.endpoint, getattr(self, "_sock_id", None))
        for wk in list(self.workers):
            self._stop_worker(wk)
        deadline = time.monotonic() + 10
        for wk in list(self.workers):
            try:
                wk.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                wk.proc.kill()
                wk.proc.wait()
            self._close_ready(wk)
            if wk.sock is not None:
                wk.sock.close(0)
        for e in self.entries.values():
            if e.pidfd is not None:
                os.close(e.pidfd)
        if self.zap is not None:
            self.zap.stop()
        if self.endpoint.startswith("ipc://"):
            import shutil
            shutil.rmtree(self.worker_dir, ignore_errors=True)
        self.zctx.term()
