"""A failed whole-process restore releases its GPU session at once, so the
restore can be retried right away (issue 26): CRIU's restore fails (a
stand-in criu that refuses `restore` and passes everything else on to the
real one), proxy-cli says so in one line, and the retry with the real CRIU
restores the app, which ends with the output of an uninterrupted run.

Needs a usable CRIU; skips with the reason otherwise."""
from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import wholeproc  # noqa: E402
from wholeproc import (dump_mid_run, iterative_app, ITER_N, _stop_daemons, cli, ok, programs,  # noqa: E402,F401
                       tmp, wait_gone)
from gpuproxy.proxyd.checkpoint import criu  # noqa: E402

pytestmark = wholeproc.pytestmark    # gpu with GPUPROXY_TEST_BACKEND=cuda, as test_whole_process.py


def failing_criu(tmp: Path, real: str) -> str:
    p = tmp / "criu-refuses-restore"
    p.write_text("#!/bin/sh\n"
                 "for a in \"$@\"; do [ \"$a\" = restore ] && { echo 'Error (test): restore refused' >&2; exit 1; }; done\n"
                 f"exec '{real}' \"$@\"\n")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


def test_failed_restore_can_be_retried_at_once(programs, usable_criu, proxy_cli, tmp):
    with iterative_app(programs, tmp, ITER_N, calls=None, ref_daemon=True) as (d, app, out, want):
        pid = app.pid
        dump_mid_run(d, proxy_cli, app, tmp / "img")
        r = cli(proxy_cli, d, "--restore", "--dir", tmp / "img",
                env={"GPUPROXY_CRIU": failing_criu(tmp, usable_criu.path)})
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and "criu restore failed" in lines[0] and "released again" in lines[0], r.stderr
        assert not criu.pid_alive(pid)
        ok(cli(proxy_cli, d, "--restore", "--dir", tmp / "img"))    # at once: not refused as live
        wait_gone(pid)
        assert out.read_text() == want
