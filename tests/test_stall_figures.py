"""Every stall figure is the one the app lived (issue 23, target 2).

stall_probe (tests/programs_extra/stall_probe.cu) logs, with CLOCK_MONOTONIC,
when each of its CUDA calls began and ended. A whole-process --leave-running
dump (plain and --concurrent) reports the window its shim held the app
(interceptor/park.c: from taking its lock for parking to giving it back);
the app's log must agree with it:
  - the app made no progress inside the reported window (no call of it
    began and ended there; the window opens when parking is asked for, so
    the one call in progress then may end inside): nothing is counted that
    the app did not wait for;
  - one call of it was held across the window's end, and the part of that
    call the window leaves out is no longer than the app's ordinary calls
    take (its own figures, no fixed threshold): nothing it waited for is
    left out;
  - the CLI's "app stopped" is that window.
Also: proxyd answers a background dump once captured, and dump-wait with
the written image. Emulated backend; skips where CRIU cannot be used.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import corpus  # noqa: E402
from wholeproc import (BACKEND, cli, ctl, daemon, kill, ok, require_park, start,  # noqa: E402,F401
                     tmp, wait_calls, _stop_daemons)

from gpuproxy.proxyd.checkpoint.image import Image  # noqa: E402

pytestmark = [pytest.mark.gpu] if BACKEND == "cuda" else []
EXTRA = Path(__file__).parent / "programs_extra"


@pytest.fixture(scope="module")
def probe(shim_installed, nvcc):
    src = EXTRA / "stall_probe.cu"
    prog = corpus.Program(name="stall_probe", source=src.name, link=(), cubins=(), args=(), emu=None, expected="",
                          driver=None, pace=False, proxy_only=False, source_path=src)
    return corpus.build(prog, corpus.default_build_dir() / "programs_extra")


def calls(log: Path) -> list[tuple[int, int]]:
    out = []
    for line in log.read_text().splitlines():
        p = line.split()
        if len(p) == 2:
            out.append((int(p[0]), int(p[1])))
    return out


def wait_after(log: Path, t_ns: int, n: int = 20, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if sum(1 for b, _e in calls(log) if b > t_ns) >= n:
            return
        time.sleep(0.05)
    raise AssertionError("the app made no calls after the dump")


@pytest.mark.parametrize("mode", [[], ["--concurrent"]], ids=["leave-running", "concurrent"])
def test_reported_stall_covers_what_the_app_saw(probe, usable_criu, proxy_cli, tmp, mode):
    d = daemon(tmp)
    require_park(d)
    log = tmp / "calls.log"
    app = start(probe.argv() + [str(log), "120"], d, tmp / "run.out")
    try:
        wait_calls(d, app.pid, 200)
        windows = []
        for i in range(2):            # a first dump and an incremental one into the same folder
            r = ok(cli(proxy_cli, d, "--dump", "--leave-running", *mode, "--pid", app.pid, "--dir", tmp / "img",
                       "--json"))
            res = json.loads(r)
            held, ran = res["stages_ms"]["app_window_ns"]
            assert held < ran and res["app_stopped_ms"] == pytest.approx((ran - held) / 1e6, abs=1e-3)
            windows.append((held, ran))
            wait_after(log, ran)
            assert app.poll() is None
        # the text output says the same figure
        t = ok(cli(proxy_cli, d, "--dump", "--leave-running", *mode, "--pid", app.pid, "--dir", tmp / "img"))
        m = re.search(r"app stopped ([0-9.]+) ms \(its own threads", t)
        assert m, t
        assert "written while the app ran" in t and "stages (ms): park" in t, t
    finally:
        kill(app.pid)
        app.wait()
    log_calls = calls(log)
    ordinary = [e - b for b, e in log_calls if not any(b <= r and e >= h for h, r in windows)]
    assert len(ordinary) > 100
    for held, ran in windows:
        # the window opens when parking is asked for: a call in progress then
        # may still end inside it (the shim parks once it has), no other
        inside = [(b, e) for b, e in log_calls if held < e < ran]
        assert all(b <= held for b, _e in inside) and len(inside) <= 1, \
            f"the app made {len(inside)} calls inside the reported stall: {inside}"
        across = [(b, e) for b, e in log_calls if b <= ran <= e]
        assert len(across) == 1, across          # the call it was held in
        b, e = across[0]
        left_out = (e - b) - (ran - max(held, b))
        assert left_out <= max(ordinary), (left_out, max(ordinary))
    with Image.open(tmp / "img") as im:
        assert im.manifest["criu"]["complete"] and im.verify() == []


def test_background_dump_answers_when_captured_then_dump_wait(probe, tmp):
    d = daemon(tmp)
    log = tmp / "calls.log"
    app = start(probe.argv() + [str(log), "120"], d, tmp / "run.out")
    try:
        wait_calls(d, app.pid, 100)
        got = ctl(d, "dump", pid=app.pid, dir=str(tmp / "g"), leave_running=True, background=True)
        assert got.get("captured") is True and "stop_ms" in got
        done = ctl(d, "dump-wait", pid=app.pid, dir=str(tmp / "g"))
        assert done["path"] == str(tmp / "g") and done["bytes"] > 0 and "write_ms" in done
        with Image.open(tmp / "g") as im:
            assert im.verify() == []
        from gpuproxy.proxyd.client import ControlError
        with pytest.raises(ControlError, match="no background write"):
            ctl(d, "dump-wait", pid=app.pid, dir=str(tmp / "g"))
        assert app.poll() is None
    finally:
        kill(app.pid)
        app.wait()
