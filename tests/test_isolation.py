"""One worker process per session (proxyd/supervisor/daemon.py): a client's long
kernel, crash or failing kernel never reaches another client of the same
proxyd, and device printf output reaches the client's own stdout.

Runs on the emulated backend in CI; with GPUPROXY_TEST_BACKEND=cuda (as
scripts/gpu-check sets for its GPU pass) the same tests run on the GPU, where
the failing kernel is a real device-side assert (a sticky error that used to
poison every later session of the daemon).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import corpus  # noqa: E402
from test_checkpoint import BACKEND, ctl, tmp  # noqa: E402,F401
from proxy import Daemon  # noqa: E402

pytestmark = [pytest.mark.gpu] if BACKEND == "cuda" else []
EXTRA = Path(__file__).parent / "programs_extra"
ITER_OUT = "".join(f"iter {i} ok\n" for i in range(1, 31))


@pytest.fixture(scope="module")
def prog():
    if not corpus.nvcc_path():
        pytest.skip("nvcc not found")
    src = EXTRA / "isolation.cu"
    p = corpus.Program(name="isolation", source=src.name, link=(), cubins=(), args=(), emu=None, expected="",
                       driver=None, pace=False, proxy_only=False, source_path=src)
    return corpus.build(p, corpus.default_build_dir() / "programs_extra").binary


@pytest.fixture
def d(tmp):
    kernels = [str(EXTRA / "isolation_emu.py")] if BACKEND == "emu" else []
    dm = Daemon(backend=BACKEND, emu_kernels=kernels, endpoint=f"ipc://{tmp}/proxyd.sock",
                log_path=str(tmp / "proxyd.log"))
    dm.start()
    yield dm
    dm.cleanup()


def start(prog, d, *args):
    return subprocess.Popen([str(prog), *args], env=d.env_for_client(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def run(prog, d, *args, timeout=120):
    return subprocess.run([str(prog), *args], env=d.env_for_client(), capture_output=True, text=True,
                          timeout=timeout)


def session_of(d, pid, timeout=30):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for s in ctl(d, "status")["sessions"]:
            if s["pid"] == pid and s["state"] in ("running", "busy"):
                return s
        time.sleep(0.05)
    raise AssertionError(f"no running session of pid {pid}: {ctl(d, 'status')}")


def test_a_long_synchronisation_does_not_delay_another_client(prog, d):
    slow = start(prog, d, "spin", "12000")
    try:
        assert slow.stdout.readline() == "spinning\n"       # inside cudaDeviceSynchronize from now on
        fast = run(prog, d, "iterate", "30")
        assert fast.returncode == 0 and fast.stdout == ITER_OUT, fast.stderr
        # the other client ran its whole program while the first was still
        # inside its synchronising call
        assert slow.poll() is None, "the long kernel finished before the other client could run"
        out, err = slow.communicate(timeout=120)
        assert slow.returncode == 0 and out == "spun\n", err
    finally:
        if slow.poll() is None:
            slow.kill()


def test_a_killed_worker_fails_only_its_own_client(prog, d):
    victim = start(prog, d, "spin", "60000")
    other = start(prog, d, "iterate", "30")
    try:
        assert victim.stdout.readline() == "spinning\n"     # inside cudaDeviceSynchronize from now on
        w = session_of(d, victim.pid)["worker_pid"]
        assert w and w != victim.pid
        os.kill(w, signal.SIGKILL)
        t0 = time.monotonic()
        out, err = victim.communicate(timeout=30)     # the rest of its stdout
        waited = time.monotonic() - t0
        assert victim.returncode == 1 and "FAIL cudaDeviceSynchronize()" in out, (out, err)
        assert "lost this session" in err and "SIGKILL" in err, err
        assert waited < 15, f"the client learnt of its worker's death only after {waited:.1f} s"
        o_out, o_err = other.communicate(timeout=120)
        assert other.returncode == 0 and o_out == ITER_OUT, o_err
        late = run(prog, d, "iterate", "30")          # the daemon serves new clients as before
        assert late.returncode == 0 and late.stdout == ITER_OUT, late.stderr
        st = ctl(d, "status")
        assert all(s["pid"] != victim.pid or s["state"] == "dead" for s in st["sessions"])
    finally:
        for p in (victim, other):
            if p.poll() is None:
                p.kill()


def test_a_failing_kernel_poisons_nobody_else(prog, d):
    bad = run(prog, d, "assert")
    assert bad.returncode == 0, (bad.stdout, bad.stderr)
    want = "cudaErrorAssert" if BACKEND == "cuda" else "cudaErrorLaunchFailure"
    assert bad.stdout.strip() == f"after assert: {want}", bad.stdout
    for _ in range(2):
        good = run(prog, d, "iterate", "30")
        assert good.returncode == 0 and good.stdout == ITER_OUT, good.stderr


def test_device_printf_reaches_the_clients_stdout_in_order(prog, d):
    r = run(prog, d, "printf")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "host before\nkernel says 42\nhost between\nkernel says 43\nhost after\n"
    assert "kernel says" not in d.log()
