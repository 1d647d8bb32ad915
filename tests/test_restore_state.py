"""State set through API calls survives dump and restore (issue 7): function
attributes, context limits, stream priority and flags, event flags and
__device__ variables, with the restore_state corpus program; and a concurrent
dump that would release a running app is refused.

Runs on the emulated backend in CI; with GPUPROXY_TEST_BACKEND=cuda (as
scripts/gpu-check sets for its GPU pass) the same tests run on the GPU.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import corpus  # noqa: E402
from paced import PacedRun  # noqa: E402
from test_checkpoint import BACKEND, ctl, ctl_error, daemon, restart, tmp  # noqa: E402,F401

pytestmark = [pytest.mark.gpu] if BACKEND == "cuda" else []


@pytest.fixture(scope="module")
def built(nvcc, shim_installed):     # skips without nvcc or the installed shim
    return {n: corpus.build(corpus.get_program(n), corpus.default_build_dir()) for n in ("restore_state", "iterative")}


def test_attribute_and_limits_survive_restore_into_fresh_daemon(built, tmp):
    """The program raised its kernel's dynamic shared memory limit to 64 KiB
    and set two context limits before the dump; after a restore into a fresh
    proxyd the kernel still launches with 64 KiB (the emulated GPU refuses it
    without the attribute, as the program's first line shows) and the
    program reads the attribute, the limits, its stream's priority and flags
    and its event's flags back unchanged."""
    b = built["restore_state"]
    d = daemon(tmp)
    try:
        with PacedRun(b, d) as run:
            run.step_to(2)
            st = ctl(d, "dump", pid=run.pid, dir=str(tmp / "img"))
            assert st["released"]
            from gpuproxy.proxyd.checkpoint.image import Image
            recorded = Image.open(str(tmp / "img")).session["replay"]
            from gpuproxy.proxyd._generated import FUNCTIONS
            names = sorted(FUNCTIONS[fid].name for fid, _ctx, _args in recorded)
            # cudaFuncSetAttribute once, cudaDeviceSetLimit twice (two limits)
            assert names == ["cuCtxSetLimit", "cuCtxSetLimit", "cuFuncSetAttribute"], names
            d = restart(d, tmp, "fresh")
            r = ctl(d, "restore", dir=str(tmp / "img"))
            assert r["replayed"] == 3
            # a fresh proxyd: the module reloads first, its variable lands where it was
            assert r["globals"] >= 1, r
            if BACKEND == "emu":
                # the emulated driver places a module's variables by load order
                assert r["moved_globals"] == [], r
            else:
                # a real driver may place them elsewhere in a fresh process (its
                # own address space layout): then the restore must say so
                for g in r["moved_globals"]:
                    assert f"__device__ variable {g['name']} moved" in d.log()
            out = run.finish()
            assert out == b.program.expected_output, run.stderr()
    finally:
        d.cleanup()


@pytest.mark.skipif(BACKEND == "cuda", reason="on a GPU the driver decides where globals go")
def test_moved_global_is_reported_and_translated(built, tmp):
    """Restoring into a proxyd whose (emulated) driver places the module's
    __device__ variable elsewhere: the restore says so, and the app's API
    calls that name the variable (cudaMemcpyFromSymbol with the address it
    looked up before the dump) still reach it."""
    b = built["restore_state"]
    d = daemon(tmp)
    try:
        with PacedRun(b, d) as run:
            run.step_to(1)
            ctl(d, "dump", pid=run.pid, dir=str(tmp / "img"))
            d.kill()
            d = daemon(tmp, "skewed", env=dict(os.environ, GPUPROXY_EMU_GLOBALS_SKEW=str(1 << 20)))
            r = ctl(d, "restore", dir=str(tmp / "img"))
            assert [g["name"] for g in r["moved_globals"]] == ["launches"], r
            g = r["moved_globals"][0]
            assert g["old"] != g["new"]
            assert "__device__ variable launches moved" in d.log()
            out = run.finish()
            assert out == b.program.expected_output, run.stderr()
    finally:
        d.cleanup()


def test_concurrent_dump_without_leave_running_is_refused(built, tmp):
    """Releasing a session that runs on would lose its work (and used to kill
    the app): the engine refuses it, and the app goes on untouched."""
    b = built["iterative"]
    d = daemon(tmp)
    try:
        with PacedRun(b, d) as run:
            run.step_to(5)
            err = ctl_error(d, "dump", pid=run.pid, dir=str(tmp / "img"), concurrent=True)
            assert "leave_running" in err and "concurrent" in err, err
            s = ctl(d, "status")["sessions"][0]
            assert not s["frozen"] and s["checkpoint"] in (None, "")
            # the session can still be checkpointed afterwards
            ctl(d, "dump", pid=run.pid, dir=str(tmp / "ok"), concurrent=True, leave_running=True)
            out = run.finish()
            assert out == b.program.expected_output, run.stderr()
    finally:
        d.cleanup()
