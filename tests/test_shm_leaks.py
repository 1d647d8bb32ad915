"""Shared memory never outlives its session (proxyd/supervisor/shm_sweep.py,
interceptor/hostmem.c): a client removes its segments at exit and at once
when no daemon answers; proxyd removes those of provably dead clients when it
starts, and never those of a live one."""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpuproxy.proxyd.supervisor.shm_sweep import dead_tokens, sweep


def segs_of(pid: int) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("gpuproxy-") and f"-{pid}-" in n)


def make_token(d: Path, pid: int, age_s: float = 60, names=("0", "chan")) -> str:
    token = f"{os.urandom(8).hex()}-{pid}"
    old = time.time() - age_s
    for n in names:
        p = d / f"gpuproxy-{token}-{n}"
        p.write_bytes(b"\0" * 64)
        os.utime(p, (old, old))
    return token


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_sweep_removes_only_the_provably_dead(tmp_path):
    dead = make_token(tmp_path, dead_pid())
    fresh = make_token(tmp_path, dead_pid(), age_s=0)               # between creation and lock: kept
    alive = make_token(tmp_path, os.getpid())                       # a live pid here (an older shim): kept
    no_proof = make_token(tmp_path, dead_pid(), names=("chan",))    # no staging segment, no proof: kept
    locked = make_token(tmp_path, dead_pid())                       # pid means nothing (another namespace) but locked
    holder = subprocess.Popen(["python3", "-c", "import fcntl,os,sys,time; fd=os.open(sys.argv[1], os.O_RDONLY); "
                               "fcntl.flock(fd, fcntl.LOCK_SH); print('ok', flush=True); time.sleep(60)",
                               str(tmp_path / f"gpuproxy-{locked}-0")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ok"
        assert set(dead_tokens(str(tmp_path))) == {dead}
        assert sweep(str(tmp_path)) == 2
        left = {p.name for p in tmp_path.iterdir()}
        assert not any(dead in n for n in left)
        for t in (fresh, alive, no_proof, locked):
            assert any(t in n for n in left), t
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: now the locked token is dead too
    assert set(dead_tokens(str(tmp_path))) == {locked}


@pytest.fixture
def counter(corpus_built):
    return corpus_built["counter"].binary


def test_client_that_never_reached_a_daemon_leaves_nothing(counter, tmp_path):
    from proxy import preload
    env = dict(os.environ, LD_PRELOAD=preload(), GPUPROXY_ENDPOINT=f"ipc://{tmp_path}/nobody.sock",
               GPUPROXY_CONNECT_TIMEOUT_MS="300")
    p = subprocess.Popen([str(counter)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=60)
    assert "cannot reach proxyd" in err
    assert segs_of(p.pid) == []


def test_killed_client_of_a_killed_daemon_is_swept_at_the_next_start(counter, fresh_daemon, tmp_path):
    """The client holds its lock while it lives (a new daemon keeps its
    segments), and its segments go when the next daemon starts after it died."""
    from conftest import client_env
    d = fresh_daemon(endpoint=f"ipc://{tmp_path}/p.sock")
    env = client_env(d)
    port = 20000 + os.getpid() % 20000
    p = subprocess.Popen([str(counter), str(port)], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while len(segs_of(p.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        mine = segs_of(p.pid)
        assert len(mine) >= 2, mine
        d.kill()
        # a new daemon while the client lives: its segments stay (locked)
        old = time.time() - 60
        for n in mine:
            os.utime(f"/dev/shm/{n}", (old, old))
        d2 = fresh_daemon(endpoint=f"ipc://{tmp_path}/p2.sock")
        assert segs_of(p.pid) == mine
        d2.stop()
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert segs_of(p.pid) == mine           # killed: it could not clean up
    for n in mine:
        os.utime(f"/dev/shm/{n}", (old, old))
    fresh_daemon(endpoint=f"ipc://{tmp_path}/p3.sock")
    assert segs_of(p.pid) == []
