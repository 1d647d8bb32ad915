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

import glob
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


def _park_files(pid: int) -> str:
    """What the shim's park loop goes by, for a failure's message: the lease
    files (content, age) and the app's park files in /dev/shm (one such
    failure under load, 2026-11-28, left no clue)."""
    now = time.time()
    seen = []
    for f in sorted(glob.glob("/dev/shm/gpuproxy-lease-*") + glob.glob(f"/dev/shm/gpuproxy-*-{pid}")):
        try:
            seen.append(f"{f} ({Path(f).read_text().strip()!r}, {now - Path(f).stat().st_mtime:.1f} s old)")
        except OSError as e:
            seen.append(f"{f} ({e})")
    return "files: " + ("; ".join(seen) or "none")


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
        try:
            rc = app.wait(60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the parked app did not go on within 60 s of proxyd's SIGKILL; "
                                 f"{_park_files(app.pid)}; its stderr: "
                                 f"{Path(str(out) + '.err').read_text()[-2000:]!r}") from None
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
        # nothing of its park is left in /dev/shm (the lease, the parked and "ran" files, segments)
        left = glob.glob(f"/dev/shm/gpuproxy-*-{app.pid}") + glob.glob(f"/dev/shm/gpuproxy-*-{app.pid}-*")
        assert left == [], left
        # proxy-cli: its dump failed, with a line, no traceback, and no image was left as complete
        cout, cerr = cli.communicate(timeout=120)
        assert cli.returncode != 0 and "Traceback" not in cerr, (cout, cerr)
        assert "no usable whole-process image" in cerr and d.endpoint in cerr, cerr
        assert "goes on by itself" in cerr and "(resumed)" not in cerr, cerr
    finally:
        W.kill(app.pid)


class _InPidNs:
    """A built program run in a pid namespace of its own (`unshare --pid
    --fork`), as in a container: proxyd's pid means nothing there, so the
    shim goes by the lease's age alone."""

    def __init__(self, built):
        self.built = built

    def argv(self):
        return ["unshare", "--pid", "--fork", "--kill-child", *self.built.argv()]


@pytest.mark.slow
def test_parked_app_in_its_own_pid_namespace_goes_by_the_lease_age(programs, tmp):
    import shutil

    from paced import PacedRun
    if shutil.which("unshare") is None or W.os.geteuid() != 0:
        pytest.skip("needs root and unshare (a pid namespace of its own)")
    b = programs["iterative"]
    d = W.daemon(tmp)
    W.require_park(d)
    lease_s = 3
    with PacedRun(_InPidNs(b), d, env={"GPUPROXY_PARK_LEASE_S": str(lease_s)}) as run:
        run.step_to(5)
        pid, = [s["pid"] for s in W.ctl(d, "status")["sessions"]]       # its pid as proxyd sees it
        assert pid != run.pid
        # parked longer than the lease's age limit while proxyd lives and renews it: it stays parked
        assert W.ctl(d, "park", pid=pid, timeout_s=20)["parked"]
        time.sleep(lease_s + 3)
        assert [s["state"] for s in W.ctl(d, "status")["sessions"]] == ["parked"]
        W.ctl(d, "resume", pid=pid)
        run.step_to(10)
        # parked again, proxyd killed: it goes on within the lease's age limit and a little
        assert W.ctl(d, "park", pid=pid, timeout_s=20)["parked"]
        run.release(50)
        t = time.monotonic()
        d.kill()
        rc = run.proc.wait(lease_s + 15)
        took = time.monotonic() - t
        assert rc == 1 and took < lease_s + 10, (rc, took)
        time.sleep(0.2)         # the reader threads take the last lines
        err = run.stderr()
        assert err.count("ended while this process was parked") == 1 and d.endpoint in err, err
        out = [ln for ln in run.lines if not ln.startswith("step ")]
        assert out and out[-1].startswith("FAIL iterative:"), out[-3:]
        assert b.program.expected_output.splitlines(keepends=True)[:len(out) - 1] == out[:-1], out
