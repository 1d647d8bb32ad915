"""Whole-process checkpoints (issue 9): proxy-cli --dump saves the GPU state
(proxyd) and the app's processes (CRIU) into one image; the app is gone; a
--restore brings both back, same pid, and the app continues.

The programs' standard streams are files (stdin /dev/null): CRIU restores
files at their offsets, while a pipe to the test runner would not reach the
restored process. Programs are plain children of the test, so CRIU's
--shell-job is chosen (their session leader is outside their tree), as in
seed 004's walkthrough.

Runs on the emulated backend in CI; GPUPROXY_TEST_BACKEND=cuda runs the same
tests on the GPU (scripts/gpu-check). Skips, with the reason, where CRIU
cannot be used (scripts/install-criu installs it) or where proxyd cannot
park its clients yet.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import wholeproc  # noqa: E402
from wholeproc import (kill_and_forget, counter_app, dump_mid_run, iterative_app, ITER_LONG, ITER_N, _stop_daemons, ask,  # noqa: E402,F401
                       assert_private, cli, daemon, kill, ok, park_files_left, programs, reference, released, require_park, session,
                       start, tmp, wait_calls, wait_gone)

from gpuproxy.proxyd.checkpoint import criu  # noqa: E402

pytestmark = wholeproc.pytestmark


def test_criu_missing_clear_error_app_untouched(programs, proxy_cli, tmp):
    d = daemon(tmp)
    with counter_app(programs, d, tmp) as (app, port):
        r = cli(proxy_cli, d, "--dump", "--pid", app.pid, "--dir", tmp / "img",
                env={"GPUPROXY_CRIU": str(tmp / "no" / "criu")})
        assert r.returncode == 1
        assert "whole-process dump impossible" in r.stderr and "no usable CRIU" in r.stderr
        assert "the app keeps running" in r.stderr and "--gpu-only" in r.stderr
        assert not (tmp / "img" / "manifest").exists()
        s = session(d, app.pid)
        assert s and not s["frozen"] and not released(s)
        assert ask(port) == "102" and app.poll() is None


def test_refuses_a_pid_that_is_not_a_client(programs, proxy_cli, tmp):
    d = daemon(tmp)
    try:
        for extra in ((), ("--gpu-only",)):
            r = cli(proxy_cli, d, "--dump", "--pid", os.getpid(), "--dir", tmp / "img", *extra)
            assert r.returncode == 1 and "is not a gpuproxy client" in r.stderr, r.stderr
        assert not (tmp / "img").exists()
    finally:
        d.cleanup()


# ------------------------------------------------------------------ whole-process

def test_seed_004_counter_walkthrough(programs, usable_criu, proxy_cli, tmp):
    """101, 102, dump (the process is gone), restore, 103."""
    d = daemon(tmp)
    require_park(d)
    with counter_app(programs, d, tmp) as (app, port):
        pid = app.pid
        assert ask(port) == "102"
        img = tmp / "demo"
        out = ok(cli(proxy_cli, d, "--dump", "--pid", pid, "--dir", img))
        assert "app gone" in out
        assert app.wait(30) == -signal.SIGKILL        # CRIU ended it
        assert not criu.pid_alive(pid)
        s = session(d, pid)
        assert s is None or released(s)                # its GPU resources are released
        assert_private(img)
        text = ok(cli(proxy_cli, d, "inspect", img))
        assert "process    CRIU dump in criu/: complete" in text and f"pids {pid}" in text
        out = ok(cli(proxy_cli, d, "--restore", "--dir", img))
        assert f"restored pid {pid}" in out
        assert criu.pid_alive(pid)
        assert ask(port) == "103"


def test_iterative_dumped_killed_daemon_restarted_restored(programs, usable_criu, proxy_cli, tmp):
    with iterative_app(programs, tmp, ITER_N, calls=None, ref_daemon=True) as (d, app, out, want):
        dump_mid_run(d, proxy_cli, app, tmp / "img")
        d.kill()                                       # the daemon dies too
        d = daemon(tmp, "second")
        ok(cli(proxy_cli, d, "--restore", "--dir", tmp / "img"))
        wait_gone(app.pid)
        assert out.read_text() == want


def test_threads_inside_cuda_calls_at_the_dump(programs, usable_criu, proxy_cli, tmp):
    b = programs["mt_long"]
    d = daemon(tmp)
    require_park(d)
    want = reference(b, d, tmp)
    assert want.rstrip().endswith("PASS mt_long")
    out = tmp / "mt.out"
    gate = tmp / "gate"
    # halfway, the threads go on making CUDA calls until the gate exists: the
    # dump finds them inside calls however fast the machine runs the app (on
    # an idle machine it ran to its end before it parked)
    app = start(b.argv(), d, out, env={"MT_LONG_GATE": str(gate)})
    pid = app.pid
    try:
        wait_calls(d, pid, 1000)
        assert len(os.listdir(f"/proc/{pid}/task")) >= 5      # main + 4 workers, all calling CUDA
        ok(cli(proxy_cli, d, "--dump", "--pid", pid, "--dir", tmp / "img"))
        app.wait(30)
        ok(cli(proxy_cli, d, "--restore", "--dir", tmp / "img"))
        gate.touch()
        wait_gone(pid)
        assert out.read_text() == want
    finally:
        kill(pid)
        d.cleanup()


def test_app_ending_before_it_parks_fails_the_park_at_once(programs, usable_criu, tmp):
    """A park whose app ends first is answered when its session ends, not
    at the park's time-out: CI once saw a dump wait 300 s for an app that
    had finished meanwhile. Here the app has no park handler
    (GPUPROXY_PARK_SIGNAL=0), so the park signal's default action ends it."""
    from gpuproxy.proxyd.client import ControlClient, ControlError
    b = programs["iterative"]
    d = daemon(tmp)
    require_park(d)
    app = subprocess.Popen(b.argv() + [ITER_LONG], env=d.env_for_client({"GPUPROXY_PARK_SIGNAL": "0"}),
                           stdin=subprocess.DEVNULL, stdout=open(tmp / "run.out", "w"), stderr=subprocess.STDOUT,
                           start_new_session=True)
    try:
        wait_calls(d, app.pid, 200)
        with pytest.raises(ControlError) as ei:
            # the park may wait 600 s; the answer must come long before the
            # client's own 60 s (a time-out there says something else)
            ControlClient(d.endpoint, timeout_s=60).call("park", {"pid": app.pid, "timeout_s": 600})
        assert "ended before it parked" in str(ei.value), str(ei.value)
        assert app.wait(30) < 0         # ended by the signal
    finally:
        kill(app.pid)


def test_periodic_leave_running_then_restore_last(programs, usable_criu, proxy_cli, tmp):
    img = tmp / "periodic"
    with iterative_app(programs, tmp, ITER_LONG) as (d, app, out, want):
        pid = app.pid
        calls = []
        for _ in range(3):
            o = ok(cli(proxy_cli, d, "--dump", "--leave-running", "--pid", pid, "--dir", img))
            assert "app running" in o and app.poll() is None
            calls.append(session(d, pid)["calls"])
            time.sleep(1.0)
        assert calls[0] < calls[1] < calls[2], calls      # it kept working between checkpoints
        # three whole-process images, nested: img -> img/parent -> img/parent/parent
        for p in (img, img / "parent", img / "parent" / "parent"):
            assert "complete" in ok(cli(proxy_cli, d, "inspect", "--no-verify", p))
        kill_and_forget(d, app)
        # its output file grew after the last checkpoint: refused, then rolled back
        r = cli(proxy_cli, d, "--restore", "--dir", img)
        assert r.returncode == 1 and "grew since the dump" in r.stderr and str(out) in r.stderr, r.stderr
        ok(cli(proxy_cli, d, "--restore", "--rollback-files", "--dir", img))
        wait_gone(pid)
        assert out.read_text() == want
        end = time.monotonic() + 30
        while session(d, pid) is not None:          # proxyd ends the restored app's session
            assert time.monotonic() < end, "proxyd kept the ended app's session"
            time.sleep(0.1)
        assert not park_files_left(d, pid)          # its parks' files went with it


def test_pre_dump_then_dump_uses_both_parents(programs, usable_criu, proxy_cli, tmp):
    img = tmp / "chain"
    with iterative_app(programs, tmp, ITER_N) as (d, app, out, want):
        pid = app.pid
        o = ok(cli(proxy_cli, d, "--pre-dump", "--pid", pid, "--dir", img))
        if usable_criu.mem_tracking():
            assert "CRIU pre-dump" in o
        else:
            assert "does not track dirty memory" in o and o.count("track dirty memory") == 1
        ok(cli(proxy_cli, d, "--dump", "--pid", pid, "--dir", img))
        app.wait(30)
        from gpuproxy.proxyd.checkpoint.image import Image
        with Image.open(img) as im:
            assert im.parent is not None and im.parent.kind == "pre-dump"     # GPU parent
            rec = im.manifest["criu"]
            if usable_criu.mem_tracking():
                assert rec["prev_images_dir"] == "../parent/criu"          # CRIU parent
        ok(cli(proxy_cli, d, "--restore", "--dir", img))
        wait_gone(pid)
        assert out.read_text() == want


def test_image_moved_and_restored_at_another_endpoint(programs, usable_criu, proxy_cli, tmp):
    d = daemon(tmp, "here")
    require_park(d)
    with counter_app(programs, d, tmp) as (app, port):
        pid = app.pid
        ok(cli(proxy_cli, d, "--dump", "--pid", pid, "--dir", tmp / "a"))
        app.wait(30)
        d.kill()
        (tmp / "node2").mkdir()
        shutil.move(str(tmp / "a"), str(tmp / "node2" / "moved"))
        d = daemon(tmp, "there", endpoint=f"ipc://{tmp}/node2/other.sock")
        ok(cli(proxy_cli, d, "inspect", tmp / "node2" / "moved"))
        ok(cli(proxy_cli, d, "--restore", "--dir", tmp / "node2" / "moved"))
        assert ask(port) == "102"
        assert session(d, pid) is not None


def test_restore_refused_while_the_app_runs(programs, usable_criu, proxy_cli, tmp):
    d = daemon(tmp)
    require_park(d)
    with counter_app(programs, d, tmp) as (app, port):
        ok(cli(proxy_cli, d, "--dump", "--leave-running", "--pid", app.pid, "--dir", tmp / "img"))
        r = cli(proxy_cli, d, "--restore", "--dir", tmp / "img")
        assert r.returncode == 1 and f"pid {app.pid} is in use" in r.stderr, r.stderr
        assert ask(port) == "102"


def test_gpu_only_and_incomplete_process_part(programs, proxy_cli, tmp):
    """--gpu-only keeps the GPU-only checkpoint (the process waits); an image
    whose CRIU part did not finish is reported by inspect and refused by a
    whole-process restore."""
    d = daemon(tmp)
    img = tmp / "img"
    with counter_app(programs, d, tmp) as (app, port):
        o = ok(cli(proxy_cli, d, "--dump", "--gpu-only", "--pid", app.pid, "--dir", img))
        assert "released" in o and app.poll() is None
        assert_private(img)
        assert "process    none" in ok(cli(proxy_cli, d, "inspect", img))
        (img / "criu").mkdir()
        (img / "criu" / "inventory.img").write_bytes(b"\0" * 64)
        r = cli(proxy_cli, d, "inspect", img)
        assert r.returncode == 1 and "INCOMPLETE" in r.stdout and "did not finish" in r.stdout
        r = cli(proxy_cli, d, "--restore", "--dir", img)
        assert r.returncode == 1 and "not restorable" in r.stderr and "--gpu-only" in r.stderr
        assert released(session(d, app.pid))            # nothing restored
        ok(cli(proxy_cli, d, "--restore", "--gpu-only", "--dir", img))
        assert ask(port) == "102"
