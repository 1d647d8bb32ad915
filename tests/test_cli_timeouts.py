"""proxy-cli never hangs: every command honours --timeout and fails with one
line naming the endpoint; a permission refusal says so."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
import zmq

CLI = [sys.executable, "-m", "gpuproxy.cli"]

COMMANDS = [
    ["status"],
    ["--dump", "--pid", "1", "--dir", "/tmp/gpx-never"],
    ["--pre-dump", "--pid", "1", "--dir", "/tmp/gpx-never"],
    ["--restore", "--dir", "/tmp/gpx-never"],
    ["migrate", "--pid", "1", "--to-device", "0"],
]


def cli(args, timeout=30, user=None) -> tuple[int, str, float]:
    cmd = CLI + args
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] + cmd
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd="/")
    return r.returncode, r.stderr.strip(), time.monotonic() - t0


@pytest.fixture
def sockdir():
    d = f"/tmp/gpx-cli-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    os.mkdir(d)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0].lstrip("-"))
def test_no_daemon_fails_at_once(args, sockdir):
    ep = f"ipc://{sockdir}/none.sock"
    code, err, took = cli(args + ["--endpoint", ep, "--timeout", "20"])
    assert code == 1 and took < 10, (took, err)
    assert len(err.splitlines()) == 1 and ep in err and "is proxyd running" in err, err


class Silent:
    """A ROUTER that takes messages and never answers (a hung daemon)."""

    def __init__(self, ep):
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(ep)

    def close(self):
        self.sock.close(0)


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0].lstrip("-"))
def test_timeout_is_honoured(args, sockdir):
    ep = f"ipc://{sockdir}/silent.sock"
    s = Silent(ep)
    try:
        code, err, took = cli(args + ["--endpoint", ep, "--timeout", "1.5"])
    finally:
        s.close()
    assert code == 1 and 1.4 < took < 8, (took, err)
    assert len(err.splitlines()) == 1 and ep in err and "within 1.5 s" in err, err


def test_daemon_dying_during_a_command_ends_the_wait(sockdir):
    ep = f"ipc://{sockdir}/dies.sock"
    s = Silent(ep)
    threading.Timer(1.0, lambda: (s.close(), os.unlink(f"{sockdir}/dies.sock"))).start()
    code, err, took = cli(["--dump", "--pid", "1", "--dir", "/tmp/gpx-never", "--endpoint", ep])
    assert code == 1 and took < 10, (took, err)
    assert "went away" in err and ep in err, err


def as_user(uid: int, fn) -> str:
    """fn() run in a child process that has become uid (modules already
    imported here: the other user may not be able to read the installation);
    returns what it returned, or its exception's text."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            try:
                out = str(fn())
            except Exception as e:
                out = f"{type(e).__name__}: {e}"
            os.write(w, out.encode())
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to act as another user)")
def test_permission_denied_is_reported_as_such(sockdir):
    """Another user's private socket: "permission denied", not "is proxyd running?"."""
    from gpuproxy.proxyd.client import ControlClient
    os.chmod(sockdir, 0o755)
    ep = f"ipc://{sockdir}/root.sock"
    s = Silent(ep)
    os.chmod(f"{sockdir}/root.sock", 0o600)
    try:
        t0 = time.monotonic()
        err = as_user(65534, lambda: ControlClient(ep, timeout_s=5).call("status"))
        took = time.monotonic() - t0
    finally:
        s.close()
    assert err.startswith("ControlError") and took < 5, (took, err)
    assert "permission denied" in err and ep in err and "running" not in err, err
