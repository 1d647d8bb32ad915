"""Authorisation (docs/security.md): on a node daemon that serves every local
user (`proxyd --users all`), a user sees and controls only their own
sessions; another user's status, dump, park, restore and shutdown requests
are refused while the owner's app finishes with identical output. Runs as
root (CI does), with `setpriv` to act as the unprivileged user nobody."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from paced import PacedRun  # noqa: E402
from conftest import short_dir  # noqa: E402
from proxy import Daemon  # noqa: E402
from test_checkpoint import ctl, expected, kernels, programs  # noqa: E402,F401

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")


def call_as(uid: int, endpoint: str, cmd: str, args: dict | None = None):
    """A control request from user uid: its proof file (proxyd/client.py
    make_proof) is that user's, as when uid runs proxy-cli itself; the
    answer, or the ControlError's text."""
    import msgpack
    import zmq
    from gpuproxy.proxyd.client import drop_proof, make_proof
    path, proof = make_proof()
    os.chown(path, uid, uid)
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    try:
        s.send(msgpack.packb([10, 1, cmd, args or {}, proof], use_bin_type=True))
        assert s.poll(60000), f"no answer to {cmd}"
        rep = msgpack.unpackb(s.recv(), raw=False, strict_map_key=False)
    finally:
        s.close(0)
        drop_proof(path)
    return rep[2] if rep[1] == 0 else f"error: {rep[2]}"


@pytest.fixture
def node_daemon(tmp_path_factory):
    with short_dir("gpx-auth") as d:        # 0755: the user nobody connects to its socket
        dm = Daemon(backend="emu", emu_kernels=kernels(), endpoint=f"ipc://{d}/proxyd.sock",
                    log_path=str(d / "proxyd.log"), extra_args=["--users", "all"])
        dm.start()
        yield dm, d
        dm.cleanup()


def test_another_user_sees_and_controls_nothing(programs, node_daemon):
    d, tmp = node_daemon
    b = programs["iterative"]
    assert os.stat(d.endpoint[len("ipc://"):]).st_mode & 0o777 == 0o666   # every local user may connect
    mine = Path("/tmp") / f"gpx-auth-nobody-{os.getpid()}"
    mine.mkdir(exist_ok=True)
    os.chown(mine, NOBODY, NOBODY)
    try:
        with PacedRun(b, d) as run:
            run.step_to(5)
            st = call_as(NOBODY, d.endpoint, "status")
            assert st["sessions"] == [], "another user's session is listed"
            assert [s["pid"] for s in call_as(0, d.endpoint, "status")["sessions"]] == [run.pid]
            for cmd, args in (("dump", {"pid": run.pid, "dir": str(mine / "img")}),
                              ("pre-dump", {"pid": run.pid, "dir": str(mine / "img")}),
                              ("park", {"pid": run.pid}), ("migrate", {"pid": run.pid, "to_device": 0})):
                r = call_as(NOBODY, d.endpoint, cmd, args)
                assert isinstance(r, str) and "permission denied" in r, (cmd, r)
            assert not (mine / "img").exists()
            # a folder that is not the requester's is refused even for its own sessions' dumps
            r = call_as(NOBODY, d.endpoint, "dump", {"pid": run.pid, "dir": str(tmp / "x")})
            assert "permission denied" in r, r
            # root's own dump; nobody may neither restore it nor stop proxyd
            st = ctl(d, "dump", pid=run.pid, dir=str(tmp / "rootimg"), leave_running=True)
            assert not st.get("released")
            r = call_as(NOBODY, d.endpoint, "restore", {"dir": str(tmp / "rootimg")})
            assert "permission denied" in r, r
            # nor have proxyd add a CRIU record to it and seal it again
            before = (tmp / "rootimg" / "manifest").read_bytes()
            r = call_as(NOBODY, d.endpoint, "record-criu", {"dir": str(tmp / "rootimg"), "record": {
                "dir": "criu", "kind": "dump", "complete": True, "root_pid": run.pid, "pids": [run.pid]}})
            assert "permission denied" in r, r
            assert (tmp / "rootimg" / "manifest").read_bytes() == before
            r = call_as(NOBODY, d.endpoint, "shutdown")
            assert "permission denied" in r, r
            assert call_as(NOBODY, d.endpoint, "ping")["version"]
            out = run.finish()
            assert out == expected(b), run.stderr()
    finally:
        shutil.rmtree(mine, ignore_errors=True)


def test_requests_without_proof_are_the_kernels_user(node_daemon):
    """A control request that names no proof file (proxy-cli in a container
    that has the node's socket but not its /tmp, a hand-made message) is the
    user the kernel's socket credentials name: another user's gets nothing
    but what that user may have (its own, empty, status; no shutdown, no dump
    of pid 1, no restore of a folder it does not own)."""
    import json
    import msgpack
    import zmq
    d, _ = node_daemon
    r, w = os.pipe()
    child = os.fork()
    if child == 0:           # a process of user nobody (not even a python it could exec: /work is private)
        code = 1
        try:
            os.close(r)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            ctx = zmq.Context()
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(d.endpoint)
            out = []
            for i, cmd in enumerate(("status", "shutdown", "dump", "restore", "ping")):
                s.send(msgpack.packb([10, i, cmd, {"pid": 1, "dir": "/tmp/x"}]))
                if not s.poll(10000):
                    break
                out.append(msgpack.unpackb(s.recv(), raw=False))
            os.write(w, json.dumps(out).encode())
            s.close(0)
            ctx.term()
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        got = json.loads(f.read() or "[]")
    assert os.waitpid(child, 0)[1] == 0 and len(got) == 5, got
    status, shutdown, dump, restore, ping = got
    assert status[1] == 0 and status[2]["sessions"] == [], status
    for rep in (shutdown, restore):
        assert rep[1] == 1 and "permission denied" in rep[2], rep
    # no session of pid 1 is this user's: as if there were none
    assert dump[1] == 1 and ("permission denied" in dump[2] or "no session of pid 1" in dump[2]), dump
    assert ping[1] == 0
    assert d.proc.poll() is None


def test_a_worker_obeys_only_its_supervisor(programs, node_daemon):
    """Workers' sockets live in a folder nobody can list, under unguessable
    names; even a peer that finds one gets no control command through."""
    import msgpack
    import zmq
    d, tmp = node_daemon
    b = programs["iterative"]
    wdirs = list(tmp.glob("gpuproxy-workers-*"))
    assert len(wdirs) == 1 and wdirs[0].stat().st_mode & 0o777 == 0o711
    with PacedRun(b, d) as run:
        run.step_to(2)
        from gpuproxy.proxyd.client import make_proof, drop_proof
        for sock in wdirs[0].glob("*.sock"):
            s = zmq.Context.instance().socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.ROUTING_ID, b"ctl:supervisor")
            s.connect(f"ipc://{sock}")
            path, proof = make_proof()
            try:
                s.send(msgpack.packb([10, 1, "dump", {"pid": run.pid, "dir": str(tmp / "stolen")}, proof]))
                assert s.poll(10000)
                rep = msgpack.unpackb(s.recv(), raw=False)
                assert rep[1] == 1 and "permission denied" in rep[2], rep
            finally:
                s.close(0)
                drop_proof(path)
        assert not (tmp / "stolen").exists()
        assert run.finish() == expected(b)
