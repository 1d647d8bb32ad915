"""pycuda under gpuproxy, emulated backend (no GPU): the MLP example trains
with the right loss curve, and a checkpoint in the middle of training changes
nothing of the rest of the curve.

Needs pycuda built against gpuproxy's libcuda.so.1 (scripts/install-pycuda;
.ci/run installs it) and nvcc (SourceModule compiles at run time).

With GPUPROXY_TEST_BACKEND=cuda (scripts/gpu-check's GPU pass) the same tests
run on the GPU: the curve must still match the float64 reference within the
tolerance (CUDA's expf/logf differ from numpy's by an ulp or two).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import train_mlp_reference as reference
from conftest import REPO, client_env
from proxy import Daemon

EXAMPLE = REPO / "examples" / "train_mlp_pycuda.py"
EMU_KERNELS = Path(__file__).resolve().parent / "train_mlp_emu.py"
EPOCHS = 12
BACKEND = os.environ.get("GPUPROXY_TEST_BACKEND", "emu")
pytestmark = [pytest.mark.gpu] if BACKEND == "cuda" else []
LINE = re.compile(r"^epoch (\d+) loss (\S+)$")


@pytest.fixture(scope="module")
def pycuda_ready(shim_installed, nvcc):
    r = subprocess.run([sys.executable, "-c", "import pycuda.driver"], capture_output=True, text=True,
                       env={**os.environ, "LD_PRELOAD": shim_installed.preload_value()})
    if r.returncode != 0:
        pytest.skip(f"pycuda is not installed in this environment (scripts/install-pycuda): {r.stderr[-300:]}")
    # SourceModule finds nvcc on PATH
    return {"PATH": os.path.dirname(nvcc) + os.pathsep + os.environ.get("PATH", "")}


@pytest.fixture
def tmp():
    d = Path(f"/tmp/gpx-pc-{os.getpid()}-{time.monotonic_ns() % 10**9}")   # ipc paths stay short
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _daemon(tmp: Path, name: str) -> Daemon:
    return Daemon(backend=BACKEND, emu_kernels=[EMU_KERNELS] if BACKEND == "emu" else (), endpoint=f"ipc://{tmp}/proxyd.sock",
                  log_path=str(tmp / f"{name}.log")).start()


def _curve(stdout: str) -> list[float]:
    vals = []
    for line in stdout.splitlines():
        m = LINE.match(line)
        if m:
            assert int(m.group(1)) == len(vals) + 1, stdout
            vals.append(float(m.group(2)))
    return vals


@pytest.fixture(scope="module")
def uninterrupted(pycuda_ready, tmp_path_factory):
    tmp = Path(f"/tmp/gpx-pcu-{os.getpid()}")
    tmp.mkdir(exist_ok=True)
    d = _daemon(tmp, "proxyd")
    try:
        r = subprocess.run([sys.executable, str(EXAMPLE), "--epochs", str(EPOCHS)], capture_output=True,
                           text=True, timeout=600, env=client_env(d, pycuda_ready))
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{d.log()[-3000:]}"
        assert r.stderr == "", r.stderr
        return r.stdout
    finally:
        d.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


def test_training_loss_curve_matches_numpy_reference(uninterrupted):
    curve = _curve(uninterrupted)
    assert len(curve) == EPOCHS, uninterrupted
    assert all(b < a for a, b in zip(curve, curve[1:])), f"loss does not decrease: {curve}"
    assert curve[-1] < curve[0] / 10, curve
    ref = reference.train(EPOCHS)
    for e, (got, want) in enumerate(zip(curve, ref), 1):
        assert got == pytest.approx(want, rel=2e-5), f"epoch {e}: {got} vs reference {want}\n{curve}\n{ref}"


@pytest.mark.parametrize("k", [4])
def test_checkpoint_mid_training_is_invisible(pycuda_ready, uninterrupted, proxy_cli, tmp, k):
    """proxy-cli --dump of the training process after epoch k, proxyd killed, a
    fresh proxyd restores the image: the printed curve is byte-identical to
    the uninterrupted run's."""
    d = _daemon(tmp, "proxyd-a")
    proc = subprocess.Popen([sys.executable, str(EXAMPLE), "--epochs", str(EPOCHS), "--wait-at-epoch", str(k)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=client_env(d, pycuda_ready))
    err: list[str] = []
    threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True).start()
    cli_env = {**os.environ, "GPUPROXY_ENDPOINT": d.endpoint}
    out = []
    try:
        for line in proc.stdout:
            out.append(line)
            if line == "waiting\n":
                break
        assert out and out[-1] == "waiting\n", "".join(out)
        img = tmp / "img"
        r = subprocess.run([*proxy_cli, "--dump", "--gpu-only", "--pid", str(proc.pid), "--dir", str(img)], capture_output=True,
                           text=True, timeout=120, env=cli_env)
        assert r.returncode == 0, r.stdout + r.stderr + d.log()[-2000:]
        d.kill()
        d2 = _daemon(tmp, "proxyd-b")
        try:
            r = subprocess.run([*proxy_cli, "--restore", "--gpu-only", "--dir", str(img)], capture_output=True, text=True,
                               timeout=120, env=cli_env)
            assert r.returncode == 0, r.stdout + r.stderr + d2.log()[-2000:]
            proc.stdin.write("\n")
            proc.stdin.flush()
            rest, _ = proc.communicate(timeout=600)
            assert proc.returncode == 0, "".join(err) + d2.log()[-3000:]
        finally:
            d2.cleanup()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        d.cleanup()
    printed = "".join(out[:-1]) + rest
    assert printed == uninterrupted, f"--- after checkpoint\n{printed}\n--- uninterrupted\n{uninterrupted}"


def test_whole_process_checkpoint_mid_training(pycuda_ready, uninterrupted, usable_criu, proxy_cli, tmp):
    """The whole process: proxy-cli --dump (CRIU for the Python process,
    proxyd for its GPU state) while the example trains, which ends the app;
    proxyd killed; a fresh proxyd and proxy-cli --restore bring the process
    back: the curve it prints, before and after, is the uninterrupted one."""
    from gpuproxy.proxyd.checkpoint.criu import pid_alive
    from test_criu import runner_session_visible
    from wholeproc import require_park
    d = _daemon(tmp, "proxyd-a")
    require_park(d)
    out = tmp / "train.out"
    proc = subprocess.Popen([sys.executable, str(EXAMPLE), "--epochs", str(EPOCHS), "--pause", "0.4"],
                            env=client_env(d, pycuda_ready), stdin=subprocess.DEVNULL, stdout=open(out, "w"),
                            stderr=open(str(out) + ".err", "w"), start_new_session=not runner_session_visible())
    pid = proc.pid
    cli_env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    try:
        end = time.monotonic() + 300
        while "epoch 3 " not in out.read_text():
            assert proc.poll() is None and time.monotonic() < end, out.read_text() + open(str(out) + ".err").read()
            time.sleep(0.02)
        r = subprocess.run([*proxy_cli, "--endpoint", d.endpoint, "--dump", "--pid", str(pid), "--dir",
                            str(tmp / "img")], capture_output=True, text=True, timeout=300, env=cli_env,
                           stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stdout + r.stderr + d.log()[-3000:]
        proc.wait(30)
        assert "epoch 12 " not in out.read_text(), "the training ended before the dump"
        d.kill()
        d2 = _daemon(tmp, "proxyd-b")
        try:
            r = subprocess.run([*proxy_cli, "--endpoint", d2.endpoint, "--restore", "--dir", str(tmp / "img")],
                               capture_output=True, text=True, timeout=300, env=cli_env, stdin=subprocess.DEVNULL)
            assert r.returncode == 0, r.stdout + r.stderr + d2.log()[-3000:]
            end = time.monotonic() + 600
            while pid_alive(pid):
                assert time.monotonic() < end, "the restored training did not finish"
                time.sleep(0.05)
        finally:
            d2.cleanup()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        try:
            os.kill(pid, 9)
        except OSError:
            pass
        d.cleanup()
    assert out.read_text() == uninterrupted, f"--- after checkpoint\n{out.read_text()}\n--- uninterrupted\n{uninterrupted}"


def test_pycuda_driver_features(pycuda_ready, tmp):
    """Contexts, module globals, prepared calls, function attributes, pitched
    allocations, 2D/3D copies, 2D memsets, streams, events, page-locked
    memory: every check of tests/pycuda_features.py passes under the proxy."""
    here = Path(__file__).resolve().parent
    d = Daemon(backend=BACKEND, emu_kernels=[here / "pycuda_features_emu.py"] if BACKEND == "emu" else (),
               endpoint=f"ipc://{tmp}/proxyd.sock", log_path=str(tmp / "proxyd.log")).start()
    try:
        r = subprocess.run([sys.executable, str(here / "pycuda_features.py")], capture_output=True, text=True,
                           timeout=600, env=client_env(d, pycuda_ready))
    finally:
        d.cleanup()
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == 9 and all(x.endswith(" ok") for x in lines), r.stdout + r.stderr
    assert r.stderr == "", r.stderr
