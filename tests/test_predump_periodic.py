"""Periodic whole-process dumps with CRIU's pre-dump before the park (issue
23, target 1; proxyd/checkpoint/orchestrate/predump.py): the app runs while
CRIU pre-dumps it, the dump made while it is parked writes only what changed
since, and the restore is exact (output equal to an uninterrupted run).

Real programs on the emulated backend (GPUPROXY_TEST_BACKEND=cuda: on the
GPU), real CRIU. Where this kernel does not track dirty memory, the pre-dump
test skips saying so, and the fallback test sees CRIU's pre-dump really fail
(it is forced); where it does, the fallback test makes it fail by a fault
injected into predump.run's CRIU call. No timing in any check.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import wholeproc  # noqa: E402
from wholeproc import (iterative_app, kill_and_forget, ITER_LONG, _stop_daemons, cli, ok, programs,  # noqa: E402,F401
                       tmp, wait_gone)

from gpuproxy.proxyd.checkpoint import criu  # noqa: E402
from gpuproxy.proxyd.checkpoint.image import read_manifest  # noqa: E402
from gpuproxy.proxyd.checkpoint.orchestrate import predump  # noqa: E402
from gpuproxy.proxyd.checkpoint.orchestrate import whole_process as W  # noqa: E402

pytestmark = wholeproc.pytestmark + [pytest.mark.slow]


def _dump(proxy_cli, d, pid, img, *extra) -> dict:
    return json.loads(ok(cli(proxy_cli, d, "--dump", "--leave-running", "--json", "--pid", pid, "--dir", img,
                             *extra)))


def _restore_last(proxy_cli, d, app, pid, img, out, want):
    kill_and_forget(d, app)
    ok(cli(proxy_cli, d, "--restore", "--rollback-files", "--dir", img))
    wait_gone(pid)
    assert out.read_text() == want


def test_periodic_dump_with_pre_dump_restores_exactly(programs, usable_criu, proxy_cli, tmp):
    if not usable_criu.mem_tracking():
        pytest.skip("this kernel does not track dirty memory (`criu check --feature mem_dirty_track` fails): "
                    "CRIU cannot pre-dump here, so periodic dumps are made without it (the fallback test covers "
                    "that)")
    img = tmp / "periodic"
    with iterative_app(programs, tmp, ITER_LONG) as (d, app, out, want):
        pid = app.pid
        for i in range(2):
            res = _dump(proxy_cli, d, pid, img)
            assert app.poll() is None
            assert "pre_dump_skipped" not in res, res.get("pre_dump_skipped")
            st = res["stages_ms"]
            assert "criu_pre_dump" in st and "criu_dump" in st, st       # each reported on its own
            assert isinstance(st["criu_pre_dump_frozen"], float), st       # CRIU's figure of its freeze
            assert list(st).index("criu_pre_dump") < list(st).index("park")
            m, _ = read_manifest(str(img))
            rec = m["criu"]
            assert rec["prev_images_dir"] == "../" + predump.SUBDIR and rec["pre_dump"]["dir"] == predump.SUBDIR
            assert any(n.startswith("pagemap") for n in os.listdir(img / predump.SUBDIR))
            assert not os.path.exists(predump.stage_dir(str(img)))
            if i == 1:      # the first image, moved into parent/, keeps its pre-dump beside it
                assert W.restore_state(str(img / "parent"))["complete"]
            time.sleep(0.5)
        o = ok(cli(proxy_cli, d, "--dump", "--leave-running", "--pid", pid, "--dir", tmp / "text"))
        assert "CRIU pre-dump" in o and "before the park" in o
        _restore_last(proxy_cli, d, app, pid, img, out, want)


def test_pre_dump_failure_falls_back_and_no_pre_dump_option(programs, usable_criu, proxy_cli, tmp, monkeypatch):
    img = tmp / "fallback"
    with iterative_app(programs, tmp, ITER_LONG) as (d, app, out, want):
        pid = app.pid
        res = _dump(proxy_cli, d, pid, img, "--no-pre-dump")
        assert res["pre_dump_skipped"].startswith("turned off") and "criu_pre_dump" not in res["stages_ms"]
        if usable_criu.mem_tracking():
            real = criu.dump

            def failing(c, pid_, image_dir, **kw):
                if kw.get("pre"):
                    raise criu.CriuError("criu pre-dump failed: injected by the test")
                return real(c, pid_, image_dir, **kw)
            monkeypatch.setattr(criu, "dump", failing)
        # forced: where the kernel lacks dirty tracking CRIU's pre-dump really fails
        from gpuproxy.proxyd.client import ControlClient
        res = W.dump(ControlClient(d.endpoint, timeout_s=120), d.endpoint, pid, str(img), leave_running=True,
                     pre_dump=True)
        assert app.poll() is None
        assert "pre_dump" not in res and "criu_pre_dump" in res["stages_ms"]
        assert res["pre_dump_skipped"].startswith("CRIU's pre-dump failed"), res["pre_dump_skipped"]
        if not usable_criu.mem_tracking():      # CRIU really ran and failed: its log is kept, and named
            log = str(img) + ".pre-dump.log"
            assert os.path.isfile(log) and log in res["pre_dump_skipped"], res["pre_dump_skipped"]
        assert not os.path.exists(predump.stage_dir(str(img))) and not (img / predump.SUBDIR).exists()
        rec = read_manifest(str(img))[0]["criu"]
        assert "pre_dump" not in rec and rec["complete"]
        assert isinstance(rec["frozen_ms"], float)       # read from CRIU's stats-dump of the parked dump
        _restore_last(proxy_cli, d, app, pid, img, out, want)
