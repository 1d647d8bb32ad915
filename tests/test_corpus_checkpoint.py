"""Every corpus program with `checkpoints:` in corpus.yaml is dumped after
each of those iterations, proxyd is killed, a fresh one restores the image,
and the program must end with exactly its expected output (state that a
restore loses -- stream attributes, limits, events, launch state -- makes
the program's own checks fail).

Emulated backend in CI; GPUPROXY_TEST_BACKEND=cuda (scripts/gpu-check) runs
the same on the GPU.
"""
from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import corpus  # noqa: E402
from paced import PacedRun  # noqa: E402
from proxy import Daemon  # noqa: E402

BACKEND = os.environ.get("GPUPROXY_TEST_BACKEND", "emu")
pytestmark = [pytest.mark.gpu] if BACKEND == "cuda" else []

PROGRAMS = [p for p in corpus.load_corpus() if p.checkpoints]


def _daemon(tmp: Path, name: str, devices: int = 1) -> Daemon:
    kernels = [str(corpus.PROGRAMS_DIR / p.emu) for p in corpus.load_corpus() if p.emu] if BACKEND == "emu" else ()
    extra = ["--emu-devices", str(devices)] if BACKEND == "emu" and devices > 1 else []
    return Daemon(backend=BACKEND, emu_kernels=kernels, endpoint=f"ipc://{tmp}/proxyd.sock",
                  extra_args=extra, log_path=str(tmp / f"{name}.log")).start()


def _ctl(d, cmd, **args):
    from gpuproxy.proxyd.client import ControlClient
    return ControlClient(d.endpoint, timeout_s=120).call(cmd, args)


@pytest.fixture
def tmp():
    d = Path(f"/tmp/gpc-{os.getpid()}-{time.monotonic_ns() % 10**9}")   # ipc paths must stay short
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("name", [p.name for p in PROGRAMS])
def test_program_survives_dump_and_restore(name, tmp, shim_installed):
    if not corpus.nvcc_path():
        pytest.skip("nvcc not found")
    prog = corpus.get_program(name)
    assert prog.pace, f"{name}: checkpoints need a paced program"
    b = corpus.build(prog, corpus.default_build_dir())
    if BACKEND == "cuda" and prog.devices > 1:
        from gpuproxy.proxyd.backends.cuda import CudaBackend
        if CudaBackend().device_count() < prog.devices:
            pytest.skip(f"{name} needs {prog.devices} GPUs")
    dump_restore_at_checkpoints(b, tmp)


def dump_restore_at_checkpoints(b, tmp: Path):
    """The built program b dumped at each of its checkpoints (corpus.yaml),
    proxyd killed each time and a fresh one restoring the image: the run ends
    with the program's expected output and only its expected error lines
    (also tests/test_static_runtime.py, for the static-runtime builds)."""
    prog = b.program
    d = _daemon(tmp, "proxyd", prog.devices)
    try:
        with PacedRun(b, d) as run:
            for i, k in enumerate(prog.checkpoints):
                run.step_to(k)
                img = tmp / f"img{k}"
                st = _ctl(d, "dump", pid=run.pid, dir=str(img))
                assert st["released"], st
                d.kill()
                d = _daemon(tmp, f"proxyd{i}", prog.devices)
                assert _ctl(d, "restore", dir=str(img))["pid"] == run.pid
            out = run.finish()
            assert out == prog.expected_output, f"{out}\n--- stderr\n{run.stderr()}\n--- proxyd\n{d.log()[-3000:]}"
            # only the lines of calls the program makes fail on purpose (corpus.yaml expected_errors)
            extra = [l for l in run.stderr().splitlines() if not any(x in l for x in prog.expected_errors)]
            assert extra == [], run.stderr()
    finally:
        d.cleanup()
