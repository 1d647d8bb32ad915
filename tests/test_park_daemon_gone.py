"""A parked app whose proxyd dies mid-dump goes on (interceptor/park.c's
lease, proxyd/supervisor/park_lease.py).

A whole-process dump parks the app, then proxyd captures its GPU state and
CRIU its process. Here the GPU part is made to stall
(GPUPROXY_TEST_DUMP_DELAY_S) and proxyd is killed with SIGKILL while the app
is parked: nobody will ever resume it. Its workers die with it, so the GPU
state is gone: the app must not wait for good but go on within seconds, as
any client of a dead daemon does: one stderr line naming the endpoint, its
next CUDA call failing. For a --leave-running dump that is what the user
asked for (the app runs on); for a final dump too, since nothing was dumped
and the app was never ended. proxy-cli's dump fails with one line and no
image.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import wholeproc as W  # noqa: E402
from proxy import Daemon  # noqa: E402
from wholeproc import _stop_daemons, programs, tmp  # noqa: E402,F401

pytestmark = W.pytestmark
BOUND_S = 20.0      # from the kill to the app's end: the pid check runs every ~0.25 s, the app then fails at once


def _wait_parked(d, pid: int, cli_proc, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        s = W.session(d, pid)
        if s and s.get("state") == "parked":
            return
        assert cli_proc.poll() is None, cli_proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} did not park")


@pytest.mark.slow
@pytest.mark.parametrize("leave_running", [True, False], ids=["leave-running", "final"])
def test_parked_app_goes_on_when_proxyd_dies_mid_dump(programs, usable_criu, proxy_cli, tmp, leave_running):
    b = programs["iterative"]
    ref_d = W.daemon(tmp, "ref")
    W.require_park(ref_d)
    want = W.reference(b, ref_d, tmp, [W.ITER_LONG])
    ref_d.cleanup()
    d = Daemon(backend=W.BACKEND, emu_kernels=W.kernels() if W.BACKEND == "emu" else (),
               endpoint=f"ipc://{tmp}/proxyd.sock", log_path=str(tmp / "proxyd.log"),
               env={"GPUPROXY_TEST_DUMP_DELAY_S": "300"})     # the GPU dump stalls until proxyd is killed
    W._started.append(d)
    d.start()
    out = tmp / "run.out"
    app = W.start(b.argv() + [W.ITER_LONG], d, out)
    img = tmp / "img"
    try:
        W.wait_calls(d, app.pid, 500)
        args = ["--dump", "--pid", app.pid, "--dir", img] + (["--leave-running"] if leave_running else [])
        env = dict(W.os.environ)
        env.pop("LD_PRELOAD", None)
        cli = subprocess.Popen([*proxy_cli, "--endpoint", d.endpoint, *map(str, args)], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        _wait_parked(d, app.pid, cli)
        time.sleep(1.0)                 # parked for a while: it must not give up on a live proxyd
        assert app.poll() is None, out.read_text()
        t_kill = time.monotonic()
        d.kill()                        # SIGKILL mid-dump: its workers die with it
        rc = app.wait(60)
        took = time.monotonic() - t_kill
        assert took < BOUND_S, f"the parked app went on only {took:.1f} s after proxyd died"
        # it went on and its next CUDA call failed as with any dead daemon
        got = out.read_text().splitlines()
        assert rc == 1 and got and got[-1].startswith("FAIL iterative:"), got[-3:]
        assert "cudaErrorDevicesUnavailable" in got[-1] or "unavailable" in got[-1].lower(), got[-1]
        assert want.splitlines()[:len(got) - 1] == got[:-1], "what it printed before is the uninterrupted run's"
        err = Path(str(out) + ".err").read_text()
        lines = [ln for ln in err.splitlines() if "ended while this process was parked" in ln]
        assert len(lines) == 1 and d.endpoint in lines[0], err
        # proxy-cli: its dump failed, with a line, no traceback, and no image was left as complete
        cout, cerr = cli.communicate(timeout=120)
        assert cli.returncode != 0 and "Traceback" not in cerr, (cout, cerr)
        assert "no usable whole-process image" in cerr and d.endpoint in cerr, cerr
    finally:
        W.kill(app.pid)
