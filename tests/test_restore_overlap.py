"""A whole-process restore rebuilds the GPU state and the process at the same
time (proxyd/checkpoint/orchestrate/overlap.py; issue 23, target 4): the two
halves overlap, the app is resumed only after both, a failure of either
undoes the other, and an image that does not pass the checks proxyd makes
before restoring anything never reaches CRIU before proxyd saw it. Overlap
is shown by each half waiting for the other, never by timing."""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from gpuproxy.proxyd.checkpoint import criu
from gpuproxy.proxyd.checkpoint.image import ImageWriter
from gpuproxy.proxyd.checkpoint.orchestrate import overlap
from gpuproxy.proxyd.checkpoint.orchestrate import whole_process as W
from gpuproxy.proxyd.client import ControlError

sys.path.insert(0, str(Path(__file__).parent))
from test_criu import SHELL_JOB_ENV, kill_and_wait, lines, start_counter, wait_lines  # noqa: E402
from test_whole_process_flow import Proxyd, args  # noqa: E402


def test_halves_run_at_the_same_time(monkeypatch):
    monkeypatch.delenv("GPUPROXY_RESTORE_OVERLAP", raising=False)
    criu_started = threading.Event()

    def gpu():
        # returns only if the CRIU half started while this one runs
        assert criu_started.wait(10), "CRIU's half did not start while the GPU half ran"
        return {"token": "t"}

    def crui():
        criu_started.set()
        return 1234, 5.0
    out = overlap.run_both(gpu, crui)
    assert out["overlapped"] and out["gpu"] == {"token": "t"} and out["pid"] == 1234
    assert out["gpu_error"] is None and out["criu_error"] is None


def test_sequential_when_off_or_when_checks_fail(monkeypatch):
    order = []
    monkeypatch.setenv("GPUPROXY_RESTORE_OVERLAP", "0")
    out = overlap.run_both(lambda: order.append("gpu") or {"token": "t"},
                           lambda: (order.append("criu"), (1, 1.0))[1])
    assert order == ["gpu", "criu"] and not out["overlapped"]
    assert out["sequential_why"] == "GPUPROXY_RESTORE_OVERLAP=0"
    monkeypatch.delenv("GPUPROXY_RESTORE_OVERLAP")
    order.clear()

    def gpu_fails():
        order.append("gpu")
        raise ControlError("image refused: test")
    out = overlap.run_both(gpu_fails, lambda: (order.append("criu"), (1, 1.0))[1], sequential_why="checks")
    # proxyd refused the image first: CRIU never ran
    assert order == ["gpu"] and isinstance(out["gpu_error"], ControlError) and out["pid"] is None


def test_precheck_refuses_what_proxyd_would_refuse(tmp_path):
    w = ImageWriter(str(tmp_path / "img"), "dump", {"backend": "emu"})
    w.add_chunk(1 << 40, b"\1" * 4096)
    w.finish({"pid": 1, "token": "tok-1"}).close()     # no valid session description
    why = overlap.precheck(str(tmp_path / "img"), allow_foreign=False)
    assert why and "checks" in why
    assert overlap.precheck(str(tmp_path / "missing"), allow_foreign=True)


def _dumped_counter(tmp_path):
    p, out = start_counter(tmp_path, new_session=False)
    px = Proxyd(p.pid)
    W.dump(px, "ipc://test", **args(p.pid, tmp_path / "img"))
    p.wait(10)
    assert not criu.pid_alive(p.pid)
    return p, out


class WaitsForCriu(Proxyd):
    """Answers restore only once CRIU's half has brought the process back
    (or fails then, with fail_restore)."""

    def __init__(self, pid, fail_restore=False):
        super().__init__(pid)
        self.fail_restore = fail_restore
        self.alive_during_gpu = None

    def call(self, cmd, args=None, timeout_s=None):
        if cmd == "restore":
            end = time.monotonic() + 30
            while not criu.pid_alive(self.pid) and time.monotonic() < end:
                time.sleep(0.01)
            self.alive_during_gpu = criu.pid_alive(self.pid)
            if self.fail_restore:
                self.calls.append((cmd, dict(args or {})))
                raise ControlError("restore failed, nothing restored: test")
        return super().call(cmd, args, timeout_s)


@SHELL_JOB_ENV
@pytest.mark.slow
def test_restore_overlaps_criu_and_resumes_after_both(usable_criu, tmp_path, monkeypatch):
    monkeypatch.delenv("GPUPROXY_RESTORE_OVERLAP", raising=False)
    monkeypatch.setattr(overlap, "precheck", lambda path, allow_foreign: None)   # the stand-in's image is a stub
    p, out = _dumped_counter(tmp_path)
    px = WaitsForCriu(p.pid)
    n = len(lines(out))
    r = W.restore(px, "ipc://test", str(tmp_path / "img"), {}, W.restore_state(str(tmp_path / "img")))
    try:
        assert px.alive_during_gpu is True          # CRIU's process existed while the GPU half ran
        assert px.names() == ["restore", "resume"] and r["overlapped"] and r["pid"] == p.pid
        wait_lines(out, n + 3)
    finally:
        kill_and_wait(p.pid)


@SHELL_JOB_ENV
@pytest.mark.slow
def test_gpu_failure_ends_the_process_criu_restored(usable_criu, tmp_path, monkeypatch):
    monkeypatch.delenv("GPUPROXY_RESTORE_OVERLAP", raising=False)
    monkeypatch.setattr(overlap, "precheck", lambda path, allow_foreign: None)
    p, out = _dumped_counter(tmp_path)
    px = WaitsForCriu(p.pid, fail_restore=True)
    try:
        with pytest.raises(W.WholeProcessError) as e:
            W.restore(px, "ipc://test", str(tmp_path / "img"), {}, W.restore_state(str(tmp_path / "img")))
        assert "GPU restore failed" in str(e.value) and "was ended" in str(e.value)
        assert px.names() == ["restore"]             # never resumed
        end = time.monotonic() + 10
        while criu.pid_alive(p.pid) and time.monotonic() < end:
            time.sleep(0.02)
        assert not criu.pid_alive(p.pid)
    finally:
        kill_and_wait(p.pid)


def test_pids_that_are_not_free_are_named():
    """Before CRIU runs, a recorded pid still taken is refused with one line:
    a live process by its program, a zombie by the parent that owes its exit
    status (a container's PID 1 that never reaps keeps the orphans of a dump
    as zombies, CRIU's "Can't fork ...: File exists")."""
    import os
    import subprocess
    live = subprocess.Popen(["sleep", "30"])
    dead = subprocess.Popen(["true"])
    try:
        with pytest.raises(W.WholeProcessError, match=r"pid \d+ is in use \(.*sleep"):
            W._check_pids_free({"pids": [live.pid]})
        t = time.monotonic()
        while criu.pid_alive(dead.pid):     # not waited for: a zombie of ours
            assert time.monotonic() - t < 10
            time.sleep(0.01)
        with pytest.raises(W.WholeProcessError) as e:
            W._check_pids_free({"pids": [dead.pid]})
        assert f"pid {dead.pid} is a zombie its parent (pid {os.getpid()}, " in str(e.value), str(e.value)
        assert "--init" in str(e.value)
        dead.wait()
        W._check_pids_free({"pids": [dead.pid]})        # reaped: free
    finally:
        live.kill()
        live.wait()
        dead.wait()
