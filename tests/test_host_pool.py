"""The shared host pool (proxyd/supervisor/host_pool.py, the worker's side
proxyd/backends/shared_pool.py; issue 23, target 4): the supervisor holds
staging memory as descriptors and lends it to one worker of the same user at
a time. On the emulated backend the memory is a memfd, so the descriptor
passing, ownership, isolation between users and clean-up are tested here."""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from gpuproxy.proxyd.backends import shared_pool
from gpuproxy.proxyd.core import host_pool_wire as W
from gpuproxy.proxyd.supervisor.host_pool import HostPools

sys.path.insert(0, str(Path(__file__).parent))


class FakeBackend:
    name = "emu"


class Supervisor:
    """HostPools served on a thread, as the supervisor's loop would."""

    def __init__(self, monkeypatch, limit=64 << 20, keep_s=300.0):
        self.mp = monkeypatch
        self.pools = HostPools(limit_bytes=limit, keep_s=keep_s)
        self.uid_of = {}
        self.kept = []
        self.stop = False
        self.mu = threading.Lock()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        import select
        while not self.stop:
            with self.mu:
                fds = {self.pools.fileno(wk): wk for wk in list(self.pools.chans)}
            r, _, _ = select.select([f for f in fds if f is not None], [], [], 0.02)
            for f in r:
                with self.mu:
                    wk = fds[f]
                    self.pools.on_message(wk, self.uid_of.get(wk))

    def worker(self, name, uid):
        """A worker's end, installed as this process's channel (as if we were it)."""
        with self.mu:
            fd = self.pools.channel_for(name)
            self.uid_of[name] = uid
        if shared_pool._chan is not None:
            self.kept.append(shared_pool._chan)     # the other worker lives on (its end stays open)
        shared_pool._chan = None
        # through monkeypatch: a variable left in the runner's environment
        # reached the workers of every later test's proxyd (adopt_channel)
        self.mp.setenv(W.ENV_FD, str(fd))
        shared_pool.adopt_channel()
        assert shared_pool._chan is not None and W.ENV_FD not in os.environ
        return fd

    def gone(self, name):
        with self.mu:
            self.pools.worker_gone(name)

    def close(self):
        self.stop = True
        self.t.join()
        self.pools.close()
        for c in self.kept:
            c.close()


@pytest.fixture
def sup(monkeypatch):
    monkeypatch.delenv(W.ENV_FD, raising=False)
    monkeypatch.delenv("GPUPROXY_SUPERVISOR_PID", raising=False)
    s = Supervisor(monkeypatch)
    yield s
    s.close()
    if shared_pool._chan is not None:
        shared_pool._chan.close()
    shared_pool._chan = None


def test_a_channel_number_not_from_the_supervisor_is_never_used(monkeypatch):
    """$GPUPROXY_HOST_POOL_FD naming a closed descriptor, another socket of
    the worker (an emulated collective's stream), or a packet socket whose
    peer is not the supervisor leaves the pool off and the descriptor open."""
    import socket
    monkeypatch.setattr(shared_pool, "_chan", None)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    c, d = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    os.close(w)
    try:
        for fd, sup_pid in ((w, None), (r, None), (a.fileno(), None), (c.fileno(), os.getpid() + 1)):
            monkeypatch.setenv(W.ENV_FD, str(fd))
            if sup_pid is not None:
                monkeypatch.setenv("GPUPROXY_SUPERVISOR_PID", str(sup_pid))
            shared_pool.adopt_channel()
            assert shared_pool._chan is None and W.ENV_FD not in os.environ
            assert shared_pool.lease(FakeBackend(), 4096) is None
        os.fstat(r)                     # still open: never closed by the worker
        a.send(b"x")
        assert b.recv(1) == b"x"        # the stream untouched
        c.send(b"y")
        assert d.recv(1) == b"y"
        monkeypatch.setenv(W.ENV_FD, str(c.fileno()))
        monkeypatch.setenv("GPUPROXY_SUPERVISOR_PID", str(os.getpid()))   # socketpair's creator: this process
        shared_pool.adopt_channel()
        assert shared_pool._chan is not None and not os.get_inheritable(c.fileno())
        shared_pool._chan.detach()
    finally:
        shared_pool._chan = None
        for s in (a, b, c, d):
            s.close()
        os.close(r)


def _shm():
    return sorted(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else []


def test_pool_outlives_its_worker_and_goes_to_the_next_of_the_same_user(sup):
    before = _shm()
    sup.worker("w1", 1000)
    p = shared_pool.lease(FakeBackend(), 1 << 20)
    assert p is not None and p.stats["shared"] == "made" and p.all_pinned()
    p.view[:5] = b"hello"
    p.free()
    sup.gone("w1")
    assert [x["uid"] for x in sup.pools.stats()["pools"]] == [1000]
    sup.worker("w2", 1000)
    q = shared_pool.lease(FakeBackend(), 1 << 20)
    assert q is not None and q.stats["shared"] == "lent"
    assert bytes(q.view[:5]) == b"hello"          # the same memory, kept by the supervisor alone
    q.free()
    assert _shm() == before                        # nothing named in /dev/shm


def test_another_user_never_gets_the_pages(sup):
    sup.worker("a", 1000)
    p = shared_pool.lease(FakeBackend(), 1 << 20)
    p.view[:6] = b"secret"
    p.free()
    sup.gone("a")
    sup.worker("b", 1001)
    q = shared_pool.lease(FakeBackend(), 1 << 20)
    assert q is not None and q.stats["shared"] == "made"      # a pool of its own
    assert bytes(q.view[:6]) == b"\0" * 6
    q.free()
    assert sorted(x["uid"] for x in sup.pools.stats()["pools"]) == [1000, 1001]


def test_one_worker_at_a_time_and_exit_ends_the_lease(sup):
    sup.worker("a", 1000)
    p = shared_pool.lease(FakeBackend(), 1 << 20)
    assert p is not None
    sup.worker("b", 1000)
    assert shared_pool.lease(FakeBackend(), 1 << 20) is None       # lent to a
    sup.gone("a")                                                   # a exits without returning it
    sup.worker("c", 1000)
    q = shared_pool.lease(FakeBackend(), 1 << 20)
    assert q is not None and q.stats["shared"] == "lent"


def test_bounded_unknown_user_refused_and_idle_pools_closed(sup):
    sup.worker("a", None)
    assert shared_pool.lease(FakeBackend(), 1 << 20) is None       # no known user: none
    sup.worker("b", 1000)
    assert shared_pool.lease(FakeBackend(), 128 << 20) is None      # over GPUPROXY_HOST_POOL_MB (64)
    assert sup.pools.held() == 0
    p = shared_pool.lease(FakeBackend(), 1 << 20)
    fd = sup.pools.pools[1000].fd
    p.free()
    with sup.mu:
        sup.pools.tick(now=sup.pools.pools[1000].idle_since + 301)
    assert sup.pools.held() == 0
    with pytest.raises(OSError):
        os.fstat(fd)                                                # the supervisor's descriptor is closed


def test_malformed_requests_are_refused(sup):
    import socket
    with sup.mu:
        fd = sup.pools.channel_for("x")
        sup.uid_of["x"] = 1000
    s = socket.socket(fileno=fd)
    r, w = os.pipe()
    W.send(s, {"op": "give", "kind": "memfd", "size": -5}, (r,))
    msg, fds = W.recv(s)
    assert msg["ok"] is False and fds == []
    W.send(s, {"op": "nonsense", "kind": "memfd", "size": 4096})
    msg, _ = W.recv(s)
    assert msg["ok"] is False and "unknown op" in msg["why"]
    s.close()
    os.close(r)
    os.close(w)


@pytest.mark.slow
def test_workers_of_a_daemon_share_the_pool(tmp_path):
    """A dump in one worker makes the pool; after the session was released
    (its worker gone) the restore's worker dumps into the pool the first
    made, page-locked already (on a GPU), through the supervisor."""
    import corpus
    from paced import PacedRun
    from test_checkpoint import BACKEND, ctl, daemon
    if BACKEND != "emu":
        pytest.skip("the GPU run is gpu_check_restlat's")
    if not corpus.nvcc_path():
        pytest.skip("nvcc not found")
    b = corpus.build(corpus.get_program("globals_table"), corpus.default_build_dir())
    d = daemon(tmp_path, env=dict(os.environ, GPUPROXY_HOST_POOL_MB="64"))
    try:
        with PacedRun(b, d) as run:
            run.step_to(1)
            st = ctl(d, "dump", pid=run.pid, dir=str(tmp_path / "img1"))
            assert st["released"] and st["host_pool"]["shared"] == "made", st.get("host_pool")
            ctl(d, "restore", dir=str(tmp_path / "img1"))
            st = ctl(d, "dump", pid=run.pid, dir=str(tmp_path / "img2"), leave_running=True)
            assert st["host_pool"]["shared"] == "lent", st.get("host_pool")
            out = run.finish()
            assert out == b.program.expected_output, run.stderr()
    finally:
        d.cleanup()
