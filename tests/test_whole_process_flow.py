"""The order of proxyd/checkpoint/orchestrate/whole_process.py's steps and its recovery from failures,
with real CRIU on a plain (non-CUDA) process and a stand-in for proxyd's
control interface that records the commands it gets (the real proxyd is
exercised by tests/test_whole_process.py). Skips where CRIU cannot be used.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gpuproxy.proxyd.checkpoint.orchestrate import whole_process as W
from gpuproxy.proxyd.client import ControlError
from gpuproxy.proxyd.checkpoint import criu
from gpuproxy.proxyd.checkpoint.image import Image, ImageWriter

sys.path.insert(0, str(Path(__file__).parent))
from test_criu import (lines, start_counter, wait_lines, kill_and_wait,  # noqa: E402
                       SHELL_JOB_ENV)


class Proxyd:
    """Answers the control commands the flow sends, as proxyd's interface
    says, writing a real (small) GPU image on dump; records every command."""

    def __init__(self, pid: int, fail_on: str | None = None, background: bool = False, hooks=None):
        self.pid = pid
        self.calls: list[tuple[str, dict]] = []
        self.fail_on = fail_on
        self.background = background      # answer a leave-running dump once captured; write at dump-wait
        self.hooks = hooks or {}          # command -> f(args), run when it arrives

    def call(self, cmd, args=None, timeout_s=None):
        args = dict(args or {})
        self.calls.append((cmd, args))
        if cmd in self.hooks:
            self.hooks[cmd](args)
        if cmd == self.fail_on:
            raise ControlError(f"{cmd} failed (test)")
        if cmd == "dump" and self.background and args.get("background"):
            self.pending = args
            return {"captured": True, "background": True, "stop_ms": 1.0}
        if cmd == "dump-wait":
            args, self.pending = self.pending, None
            cmd = "dump"
        if cmd == "resume" and args.get("wait_ran"):
            return {"resumed": True, "held_ns": 1, "ran_ns": 2000001, "app_stopped_ms": 2.0}
        if cmd == "status":
            return {"sessions": [{"pid": self.pid, "frozen": False, "released": False}]}
        if cmd == "park":
            return {"token": "tok-1", "parked": True}
        if cmd in ("dump", "pre-dump"):
            w = ImageWriter(args["dir"], cmd, {"backend": "emu"})
            w.add_chunk(1 << 40, b"\1" * 4096)
            w.finish({"pid": self.pid, "token": "tok-1"}).close()
            return {"path": args["dir"], "bytes": 4096, "chunks": 1, "total_ms": 1.0,
                    "released": cmd == "dump" and not args.get("leave_running")}
        if cmd == "restore":
            return {"token": "tok-1", "pid": self.pid, "bytes": 4096, "total_ms": 1.0, "check_ms": 0.1}
        if cmd == "resume":
            return {"resumed": True}
        raise ControlError(f"unknown command {cmd!r}")

    def names(self):
        return [c for c, _ in self.calls]


def args(pid, d, leave=False, parent=None):
    """The library's arguments as proxy-cli passes them."""
    return dict(pid=pid, dir=str(d), leave_running=leave, concurrent=False, parent=parent)


@SHELL_JOB_ENV
def test_dump_then_restore_order(usable_criu, tmp_path):
    p, out = start_counter(tmp_path, new_session=False)
    px = Proxyd(p.pid)
    img = tmp_path / "img"
    res = W.dump(px, "ipc://test", **args(p.pid, img))
    # parked before anything is dumped; proxyd seals CRIU's record after
    assert px.names() == ["status", "park", "dump", "record-criu"]
    assert px.calls[2][1]["leave_running"] is False
    p.wait(10)
    assert not criu.pid_alive(p.pid)
    with Image.open(img) as im:
        rec = im.manifest["criu"]
        assert rec == res["criu"] and rec["complete"] and rec["pids"] == [p.pid] and rec["options"]["shell_job"]
        assert im.verify() == []
    n = len(lines(out))
    px.calls.clear()
    st = W.restore_state(str(img))
    r = W.restore(px, "ipc://test", str(img), {}, st)
    try:
        assert r["pid"] == p.pid
        # the resume names the process CRIU restored (its /dev/shm gets the file)
        assert px.names() == ["restore", "resume"] and px.calls[1][1] == {"token": "tok-1", "pid_here": p.pid}
        wait_lines(out, n + 3)
        assert [i for _, i in lines(out)] == list(range(1, len(lines(out)) + 1))
    finally:
        kill_and_wait(p.pid)


def test_leave_running_resumes(usable_criu, tmp_path):
    p, out = start_counter(tmp_path, new_session=True)
    px = Proxyd(p.pid)
    try:
        W.dump(px, "ipc://test", **args(p.pid, tmp_path / "img", leave=True))
        assert px.names() == ["status", "park", "dump", "resume", "record-criu"]
        assert px.calls[3][1] == {"pid": p.pid, "wait_ran": True}
        n = len(lines(out))
        wait_lines(out, n + 3)
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()


def test_criu_failure_puts_gpu_state_back_and_resumes(usable_criu, tmp_path, monkeypatch):
    p, out = start_counter(tmp_path, new_session=True)
    px = Proxyd(p.pid)
    img = tmp_path / "img"
    real_dump = criu.dump

    def failing(c, pid, image_dir, **kw):
        os.makedirs(image_dir, exist_ok=True)
        return real_dump(c, 2 ** 22 + 7, image_dir, **kw)     # a pid that does not exist: CRIU fails
    monkeypatch.setattr(criu, "dump", failing)
    try:
        with pytest.raises(W.WholeProcessError) as e:
            W.dump(px, "ipc://test", **args(p.pid, img))
        assert "The app runs on" in str(e.value) and "criu dump failed" in str(e.value)
        # released by the GPU dump, so restored from the image, then resumed
        assert px.names() == ["status", "park", "dump", "restore", "resume"]
        assert px.calls[3][1]["dir"] == str(img)
        n = len(lines(out))
        wait_lines(out, n + 3)
        assert p.poll() is None
        # the failed dump's partial image went (there was none before it)
        with pytest.raises(W.WholeProcessError, match="image refused"):
            W.restore_state(str(img))
        assert not os.path.exists(str(img) + ".dump-in-progress")
    finally:
        p.kill()
        p.wait()


def test_gpu_dump_failure_resumes(usable_criu, tmp_path):
    p, out = start_counter(tmp_path, new_session=True)
    px = Proxyd(p.pid, fail_on="dump")
    try:
        with pytest.raises(W.WholeProcessError):
            W.dump(px, "ipc://test", **args(p.pid, tmp_path / "img"))
        assert px.names() == ["status", "park", "dump", "resume"]
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()


def test_undumpable_session_touches_nothing(usable_criu, tmp_path, monkeypatch):
    """An app whose session leader is outside its pid namespace is refused
    before it is parked (CRIU would fail on it after the GPU dump)."""
    p, out = start_counter(tmp_path, new_session=True)
    px = Proxyd(p.pid)
    real = criu._stat_fields

    def fake(pid):
        f = list(real(pid))
        if pid == p.pid:
            f[3] = "0"
        return f
    monkeypatch.setattr(criu, "_stat_fields", fake)
    try:
        with pytest.raises(W.WholeProcessError) as e:
            W.dump(px, "ipc://test", **args(p.pid, tmp_path / "img"))
        assert "outside this pid namespace" in str(e.value) and "Nothing was done" in str(e.value)
        assert px.names() == ["status"] and not (tmp_path / "img").exists()
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()


def test_unusable_criu_touches_nothing(tmp_path, monkeypatch):
    p, out = start_counter(tmp_path, new_session=True)
    px = Proxyd(p.pid)
    monkeypatch.setenv("GPUPROXY_CRIU", str(tmp_path / "none"))
    try:
        with pytest.raises(W.WholeProcessError) as e:
            W.dump(px, "ipc://test", **args(p.pid, tmp_path / "img"))
        assert "no usable CRIU" in str(e.value) and "Nothing was done" in str(e.value)
        assert px.names() == ["status"] and not (tmp_path / "img").exists()
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()


def test_pre_dump_without_memory_tracking_says_so(usable_criu, tmp_path, monkeypatch):
    p, out = start_counter(tmp_path, new_session=True)
    px = Proxyd(p.pid)
    monkeypatch.setattr(criu.Criu, "mem_tracking", lambda self: False)
    try:
        res = W.pre_dump(px, "ipc://test", p.pid, str(tmp_path / "img"))
        assert px.names() == ["status", "pre-dump"]
        assert "does not track dirty memory" in res["criu_skipped"] and res["criu"] is None
    finally:
        p.kill()
        p.wait()
