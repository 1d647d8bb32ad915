"""Keyed tcp (docs/security.md, "Remote clients"; proxyd/core/curve.py,
interceptor/curve.c): every tcp endpoint is CURVE-encrypted and a ZAP
handler admits only listed client keys, each as a user.

* a program with the right keys runs over tcp with the same output;
* unknown, missing or wrong keys, and plaintext peers, are refused, and the
  program's first CUDA call fails within seconds naming the endpoint;
* remote control: the key's user sees and checkpoints its own sessions over
  tcp (dump, restore: the program goes on with identical output), another
  key's user sees none and is refused;
* key files are private (0600 in a 0700 folder)."""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest
import zmq

sys.path.insert(0, str(Path(__file__).parent))
import corpus  # noqa: E402
from conftest import client_env  # noqa: E402
from paced import PacedRun  # noqa: E402
from test_checkpoint import expected, programs  # noqa: E402,F401

REPO = Path(__file__).resolve().parents[1]
NOBODY = 65534
OTHER = 65533          # a second non-admin user (a uid needs no passwd entry)


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_zmq_header_matches_libzmq():
    """interceptor/gp_zmq.h declares libzmq's constants itself (the pyzmq
    wheel ships no zmq.h): they must be libzmq's."""
    text = (REPO / "interceptor" / "gp_zmq.h").read_text()
    defs = dict(re.findall(r"#define (ZMQ_\w+) (0x[0-9a-fA-F]+|\d+)", text))
    assert len(defs) > 20
    for name, value in defs.items():
        attr = name[len("ZMQ_"):]
        if attr == "IO_THREADS":
            want = zmq.IO_THREADS
        else:
            want = getattr(zmq, attr)
        assert int(value, 0) == int(want), name


@pytest.fixture
def keyed(fresh_daemon, tmp_path):
    """A proxyd on a tcp endpoint, its key directory, and a factory of
    client key sets: keys(user) -> environment that makes the shim and
    proxy-cli use a new key pair listed in authorized_keys for uid `user`
    (None: not listed)."""
    d = fresh_daemon(endpoint=f"tcp://127.0.0.1:{free_tcp_port()}")
    kdir = Path(os.environ["GPUPROXY_KEY_DIR"])
    server = (kdir / "curve-server.pub").read_text().strip()
    auth = kdir / "authorized_keys"
    made = []

    def keys(user: int | None) -> dict:
        n = len(made)
        out = tmp_path / f"client{n}.key"
        r = subprocess.run([sys.executable, "-m", "gpuproxy.cli", "keygen", "--out", str(out)], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        pub, who = r.stdout.split()
        assert who and len(pub) == 40 and oct(out.stat().st_mode & 0o777) == "0o600"
        if user is not None:
            with open(auth, "a") as f:
                f.write(f"{pub} {user}  # test client {n}\n")
            auth.chmod(0o600)
        made.append(out)
        return {"GPUPROXY_CURVE_SERVERKEY": server, "GPUPROXY_CURVE_KEY_FILE": str(out),
                "GPUPROXY_KEY_DIR": str(tmp_path / f"nokeys{n}")}   # nothing of the daemon's own keys
    yield d, keys
    if auth.exists():
        auth.unlink()


def cli(d, env: dict, *args, timeout=60) -> subprocess.CompletedProcess:
    e = {**os.environ, **env}
    e.pop("LD_PRELOAD", None)
    return subprocess.run([sys.executable, "-m", "gpuproxy.cli", "--endpoint", d.endpoint, *args], env=e,
                          capture_output=True, text=True, timeout=timeout)


def test_key_files_are_private(keyed):
    d, _ = keyed
    kdir = Path(os.environ["GPUPROXY_KEY_DIR"])
    assert kdir.stat().st_mode & 0o777 == 0o700
    for name in ("curve-server.key", "curve-client.key", "curve-server.pub"):
        st = (kdir / name).stat()
        assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.geteuid(), name
    assert "public " in (kdir / "curve-server.key").read_text()


def test_listed_key_runs_programs(keyed, corpus_built):
    """A client with its own listed key (another key directory, keys given by
    environment, as on a remote host) gets the same output as natively."""
    d, keys = keyed
    env = keys(os.geteuid())
    for name in ("vector_add", "streams_events"):
        b = corpus_built[name]
        r = corpus.run_program(b, env=client_env(d, env), timeout=120)
        assert r.returncode == 0 and r.stdout == b.program.expected_output, r.stderr[-2000:]


@pytest.mark.parametrize("case", ["unknown key", "no keys", "wrong server key"])
def test_refused_keys_fail_fast(keyed, corpus_built, case, tmp_path):
    d, keys = keyed
    if case == "unknown key":
        env = keys(None)
        why = "refused this client's CURVE key"
    elif case == "no keys":
        env = {"GPUPROXY_KEY_DIR": str(tmp_path / "empty")}
        why = "keyed (CURVE) tcp endpoint"
    else:
        env = keys(os.geteuid())
        env["GPUPROXY_CURVE_SERVERKEY"] = zmq.curve_keypair()[0].decode()
        why = "CURVE handshake failed"
    b = corpus_built["vector_add"]
    t0 = time.monotonic()
    r = corpus.run_program(b, env=client_env(d, env), timeout=60)
    wall = time.monotonic() - t0
    assert r.returncode != 0 and wall < 10, (wall, r.stderr)
    fails = [line for line in r.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1 and "cudaErrorDevicesUnavailable" in fails[0], r.stdout
    assert d.endpoint in r.stderr and why in r.stderr, r.stderr
    # proxy-cli: the same, in one line, quickly
    t0 = time.monotonic()
    c = cli(d, env, "status")
    assert c.returncode == 1 and time.monotonic() - t0 < 10, c.stderr
    assert d.endpoint in c.stderr and len(c.stderr.strip().splitlines()) == 1, c.stderr
    if case == "unknown key":
        assert "permission denied" in c.stderr and why in c.stderr, c.stderr


def test_plaintext_peer_gets_nothing(keyed, corpus_built):
    """A tcp peer without CURVE (any ZeroMQ client, or raw bytes) gets no
    answer from the supervisor, and proxyd goes on serving keyed clients."""
    d, keys = keyed
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(d.endpoint)
    try:
        token = f"{os.urandom(8).hex()}-{os.getpid()}"
        s.send(msgpack.packb([10, 1, "ping", {}]))
        s.send(msgpack.packb([0, 2, [{"pid": os.getpid(), "token": token}]]))
        assert not s.poll(1500), "a plaintext peer got an answer"
    finally:
        s.close(0)
    with socket.create_connection(("127.0.0.1", int(d.endpoint.rsplit(":", 1)[1])), timeout=5) as raw:
        raw.sendall(os.urandom(4096))
    b = corpus_built["vector_add"]
    r = corpus.run_program(b, env=client_env(d, keys(os.geteuid())), timeout=120)
    assert r.returncode == 0 and r.stdout == b.program.expected_output, r.stderr[-2000:]


def ctl_as(monkeypatch, d, env: dict, cmd: str, args: dict) -> str:
    """proxyd's answer to one control request made with env's keys (the
    result, or the error's text)."""
    from gpuproxy.proxyd.client import ControlClient, ControlError
    with monkeypatch.context() as m:
        for k, v in env.items():
            m.setenv(k, v)
        try:
            return str(ControlClient(d.endpoint, timeout_s=30).call(cmd, args))
        except ControlError as e:
            return str(e)


def test_remote_control_of_own_sessions_only(keyed, programs, tmp_path, monkeypatch):
    """Over tcp, the key's user controls its own session (status, dump that
    releases it, restore: the program goes on with identical output); the
    user of another key sees nothing and is refused."""
    d, keys = keyed
    mine, other = keys(NOBODY), keys(OTHER)
    folder = Path(f"/tmp/gpx-curve-{os.getpid()}-{time.monotonic_ns() % 10**9}")
    folder.mkdir()
    try:
        if os.geteuid() == 0:
            os.chown(folder, NOBODY, NOBODY)
        b = programs["iterative"]
        with PacedRun(b, d, env=mine) as run:
            run.step_to(4)
            st = cli(d, mine, "status", "--json")
            assert st.returncode == 0, st.stderr
            import json
            assert [s["pid"] for s in json.loads(st.stdout)["sessions"]] == [run.pid]
            st = cli(d, other, "status", "--json")
            assert st.returncode == 0 and json.loads(st.stdout)["sessions"] == [], st.stdout
            r = cli(d, other, "dump", "--gpu-only", "--pid", str(run.pid), "--dir", str(folder / "stolen"))
            assert r.returncode == 1 and "nothing was done" in r.stderr, r.stderr
            # proxy-cli stops at the status it sees; proxyd itself refuses too
            for cmd, args in (("dump", {"pid": run.pid, "dir": str(folder / "stolen")}),
                              ("pre-dump", {"pid": run.pid, "dir": str(folder / "stolen")}),
                              ("park", {"pid": run.pid}), ("shutdown", {})):
                assert "permission denied" in ctl_as(monkeypatch, d, other, cmd, args), cmd
            assert not (folder / "stolen").exists()
            if os.geteuid() != 0:
                return      # the rest needs a folder of NOBODY's
            img = folder / "img"
            r = cli(d, mine, "dump", "--gpu-only", "--pid", str(run.pid), "--dir", str(img))
            assert r.returncode == 0, r.stderr
            assert img.stat().st_uid == NOBODY and img.stat().st_mode & 0o777 == 0o700
            r = cli(d, other, "restore", "--gpu-only", "--dir", str(img))
            assert r.returncode == 1 and "permission denied" in r.stderr, r.stderr
            r = cli(d, mine, "restore", "--gpu-only", "--dir", str(img))
            assert r.returncode == 0, r.stderr
            out = run.finish()
            assert out == expected(b), run.stderr()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _listening_ports(pid: int) -> set[int]:
    """tcp ports a process listens on (its socket inodes in /proc/net/tcp)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            t = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if t.startswith("socket:["):
            inodes.add(t[8:-1])
    ports = set()
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            p = line.split()
            if p[3] == "0A" and p[9] in inodes:
                ports.add(int(p[1].split(":")[1], 16))
    return ports


def test_spare_worker_takes_only_its_session(keyed, corpus_built):
    """A worker's tcp port can be found by anyone on the host; a client with
    an admitted key that goes to a spare worker directly, past the
    supervisor, gets no answer, and the worker still serves the session the
    supervisor gives it."""
    from gpuproxy.proxyd.core import curve
    d, keys = keyed
    env = keys(os.geteuid())
    deadline = time.monotonic() + 20
    workers = []
    # the spare worker, started ahead of need, once the workers of earlier
    # tests' sessions have ended (one of those may be busy ending, and would
    # not answer as a spare does)
    ports = set()
    while (len(workers) != 1 or not ports) and time.monotonic() < deadline:
        with open(f"/proc/{d.proc.pid}/task/{d.proc.pid}/children") as f:
            workers = [int(c) for c in f.read().split()]
        ports = {p for w in workers for p in _listening_ports(w)}
        time.sleep(0.1)
    assert ports, "no worker listens on tcp"
    kp = (env["GPUPROXY_CURVE_SERVERKEY"].encode(), *curve._parse_pair(Path(env["GPUPROXY_CURVE_KEY_FILE"]).read_text(),
                                                                         "client key"))
    token = f"{os.urandom(8).hex()}-{os.getpid()}"
    for port in ports:
        s = zmq.Context.instance().socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.ROUTING_ID, b"c:" + token.encode())
        curve.secure_client(s, "tcp://", kp)
        s.connect(f"tcp://127.0.0.1:{port}")
        try:
            s.send(msgpack.packb([0, 1, [{"pid": os.getpid(), "token": token, "exe": "intruder"}]]))
            # a spare worker reads nobody's messages (proxyd/worker/gate.py): no answer at all
            assert not s.poll(2000), msgpack.unpackb(s.recv(), raw=False)
        finally:
            s.close(0)
    b = corpus_built["vector_add"]
    r = corpus.run_program(b, env=client_env(d, env), timeout=120)
    assert r.returncode == 0 and r.stdout == b.program.expected_output, r.stderr[-2000:]


def test_authorized_keys_must_be_private(tmp_path, shim_installed):
    """An authorized_keys file that others may read or write could admit
    anyone: proxyd refuses to serve tcp with it, in one line."""
    from proxy import Daemon
    kdir = tmp_path / "keys"
    kdir.mkdir(mode=0o700)
    (kdir / "authorized_keys").write_text(f"{zmq.curve_keypair()[0].decode()} {os.geteuid()}\n")
    (kdir / "authorized_keys").chmod(0o644)
    d = Daemon(backend="emu", endpoint=f"tcp://127.0.0.1:{free_tcp_port()}",
               env={**os.environ, "GPUPROXY_KEY_DIR": str(kdir)})
    try:
        with pytest.raises(RuntimeError) as e:
            d.start(timeout_s=20)
        assert "authorized_keys must be a regular file of this user with mode 0600" in str(e.value), str(e.value)
        assert d.proc.returncode != 0
    finally:
        d.cleanup()
