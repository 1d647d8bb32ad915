"""Parking the shim (interceptor/park.c), the step a whole-process (CRIU)
checkpoint needs: the app's sockets to proxyd closed, its shared memory with
proxyd turned private, its CUDA calls waiting inside the shim; then going on,
at the same worker or at another one after a restore, with no call lost or
run twice. CRIU itself is exercised in test_whole_process.py; here the
process stays alive, so each step can be checked from outside.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from paced import PacedRun  # noqa: E402
from test_checkpoint import BACKEND, ctl, daemon, expected, programs, restart, tmp  # noqa: E402,F401

pytestmark = [pytest.mark.gpu] if BACKEND == "cuda" else []


def shared_with_daemon(pid: int) -> tuple[list[str], list[str]]:
    """The app's mappings of gpuproxy shared memory, and its socket fds."""
    maps = [ln for ln in Path(f"/proc/{pid}/maps").read_text().splitlines() if "/dev/shm/gpuproxy" in ln]
    socks = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                socks.append(fd)
        except OSError:
            pass
    return maps, socks


def test_park_leaves_nothing_shared_and_resume_goes_on(programs, tmp):
    b = programs["iterative"]
    d = daemon(tmp)
    try:
        with PacedRun(b, d) as run:
            run.step_to(8)
            maps, socks = shared_with_daemon(run.pid)
            assert maps and socks, "a running client shares memory and sockets with proxyd"
            r = ctl(d, "park", pid=run.pid, timeout_s=20)
            assert r["parked"]
            maps, socks = shared_with_daemon(run.pid)
            assert maps == [] and socks == [], (maps, socks)
            st = [s for s in ctl(d, "status")["sessions"] if s["pid"] == run.pid][0]
            assert st["state"] == "parked"
            run.release(4)                    # it may compute on the CPU, but its CUDA calls wait
            ctl(d, "resume", pid=run.pid)
            run.step_to(20)
            assert shared_with_daemon(run.pid)[0], "shared memory is used again after resuming"
            out = run.finish()
            assert out == expected(b), run.stderr()
    finally:
        d.cleanup()


@pytest.mark.parametrize("name", ["iterative", "iterative_streams"])
def test_park_dump_restore_elsewhere_resume(programs, tmp, name):
    """What a CRIU checkpoint does around the process: park, dump the GPU
    state (released), the daemon goes, another one restores the image and
    the app resumes there (told by its resume file)."""
    b = programs[name]
    d = daemon(tmp)
    try:
        with PacedRun(b, d) as run:
            for i, k in enumerate((6, 19)):
                run.step_to(k)
                run.release(3)                # work queued behind the park, in flight at the dump
                assert ctl(d, "park", pid=run.pid, timeout_s=20)["parked"]
                img = tmp / f"img{i}"
                st = ctl(d, "dump", pid=run.pid, dir=str(img))
                assert st["released"]
                d = restart(d, tmp, f"proxyd{i}")
                r = ctl(d, "restore", dir=str(img))
                assert r["pid"] == run.pid and r["worker_pid"]
                ctl(d, "resume", token=r["token"])
            out = run.finish()
            assert out == expected(b), run.stderr()
    finally:
        d.cleanup()


def test_park_of_unknown_pid_is_refused(tmp):
    d = daemon(tmp)
    try:
        from gpuproxy.proxyd.client import ControlError
        with pytest.raises(ControlError, match="no session of pid"):
            ctl(d, "park", pid=os.getpid())
    finally:
        d.cleanup()
