"""Host functions (cudaLaunchHostFunc, cudaStreamAddCallback,
cuLaunchHostFunc) at the two awkward moments: a dump requested while the
application's function is still running, and a client that dies with one
pending. The ordinary runs (natively, proxied, emulated, dumped between
iterations) are the corpus program tests/programs/host_callbacks.cu.

Emulated backend in CI; GPUPROXY_TEST_BACKEND=cuda (scripts/gpu-check) runs
the same on the GPU.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import corpus  # noqa: E402
from paced import PacedRun  # noqa: E402
from proxy import Daemon  # noqa: E402

BACKEND = os.environ.get("GPUPROXY_TEST_BACKEND", "emu")
pytestmark = [pytest.mark.gpu] if BACKEND == "cuda" else []


WAITING = "session dumped: waiting for a restore"


def _daemon(tmp: Path, name: str) -> Daemon:
    kernels = [str(corpus.PROGRAMS_DIR / "host_callbacks_emu.py")] if BACKEND == "emu" else ()
    return Daemon(backend=BACKEND, emu_kernels=kernels, endpoint=f"ipc://{tmp}/proxyd.sock",
                  log_path=str(tmp / f"{name}.log")).start()


def _ctl(d, cmd, **args):
    from gpuproxy.proxyd.client import ControlClient
    return ControlClient(d.endpoint, timeout_s=120).call(cmd, args)


def _wait_for(path: Path, run, what: str, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while not path.exists():
        assert run.proc.poll() is None, f"program ended before {what}: {run.stderr()}"
        assert time.monotonic() < end, f"no {what} within {timeout} s"
        time.sleep(0.02)


@pytest.fixture
def tmp():
    d = Path(f"/tmp/ghf-{os.getpid()}-{time.monotonic_ns() % 10**9}")   # ipc paths must stay short
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def built():
    if not corpus.nvcc_path():
        pytest.skip("nvcc not found")
    return corpus.build(corpus.get_program("host_callbacks"), corpus.default_build_dir())


def test_dump_waits_for_a_running_host_function_then_restores(tmp, built, shim_installed):
    """A dump requested while the app's host function runs completes only
    after it returned (it synchronises the stream, which the function
    blocks); the restored program ends with the uninterrupted output."""
    gate = tmp / "gate"
    d = _daemon(tmp, "proxyd")
    try:
        with PacedRun(built, d, env={"GPUPROXY_TEST_HOSTFN_GATE": str(gate)}) as run:
            run.step_to(1)
            run.release(1)                              # iteration 2: its first host function blocks on `gate`
            _wait_for(Path(str(gate) + ".started"), run, "host function start")
            result = {}

            def dump():
                try:
                    result["st"] = _ctl(d, "dump", pid=run.pid, dir=str(tmp / "img"))
                except Exception as e:   # reported below
                    result["error"] = e
            t = threading.Thread(target=dump)
            t.start()
            t.join(1.0)
            # the function has not returned, so the stream is not drained: no image yet
            assert t.is_alive(), f"dump finished while a host function was still running: {result}"
            gate.touch()
            t.join(120)
            assert not t.is_alive() and "error" not in result, result
            assert result["st"]["released"], result
            # Either proxyd answered the app's cudaStreamSynchronize before it
            # took the dump (the app then finishes iteration 2 and waits for
            # stdin, with no call in flight), or the app still waits in it and
            # learns that its session was released at its next WHERE probe
            # (one per second of silence, interceptor/transport.c). Killing
            # proxyd before either would leave it asking a daemon that never
            # heard of it.
            end = time.monotonic() + 30
            while WAITING not in run.stderr() and run.step < 2:
                assert time.monotonic() < end, run.stderr()
                time.sleep(0.05)
            d.kill()
            d = _daemon(tmp, "proxyd2")
            assert _ctl(d, "restore", dir=str(tmp / "img"))["pid"] == run.pid
            out = run.finish()
            assert out == built.program.expected_output, f"{out}\n--- stderr\n{run.stderr()}\n--- proxyd\n{d.log()[-3000:]}"
            assert [ln for ln in run.stderr().splitlines() if WAITING not in ln] == [], run.stderr()
    finally:
        d.cleanup()


def test_client_killed_with_a_pending_host_function_releases_its_session(tmp, built, shim_installed):
    """The worker waits for the client to run the function; a client that
    dies meanwhile must not leave the worker (and its GPU context) waiting."""
    gate = tmp / "gate"      # never created: the function never returns
    d = _daemon(tmp, "proxyd")
    try:
        with PacedRun(built, d, env={"GPUPROXY_TEST_HOSTFN_GATE": str(gate)}) as run:
            run.step_to(1)
            run.release(1)
            _wait_for(Path(str(gate) + ".started"), run, "host function start")
            os.kill(run.pid, signal.SIGKILL)
            run.proc.wait()
            deadline = time.monotonic() + 30
            while True:
                st = _ctl(d, "status")
                if not any(s.get("pid") == run.pid for s in st["sessions"]):
                    break
                assert time.monotonic() < deadline, f"session of killed pid {run.pid} still listed: {st['sessions']}"
                time.sleep(0.2)
            # the daemon still serves new clients
            with PacedRun(built, d) as run2:
                run2.release(10)
                assert run2.finish() == built.program.expected_output, run2.stderr()
    finally:
        d.cleanup()
