"""Programs built for CUDA 12.4 and 11.8 checkpointed mid-run (issue 24):
GPU-only (the app keeps running; proxyd killed, a fresh one restores) and
the whole process with CRIU, each with the output of an uninterrupted run.
On the emulated backend in CI; on the GPU with GPUPROXY_TEST_BACKEND=cuda
(scripts/gpu-check --oldcuda runs this file so), where the uninterrupted
run is also the native one.

The program is the corpus's `iterative` built against that version's
headers and linked against NVIDIA's runtime of it (tests/oldcuda_kit.py).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import corpus
import oldcuda_kit
from wholeproc import (BACKEND, _stop_daemons, cli, daemon, dump_mid_run, kill, ok, require_park,  # noqa: F401
                       start, tmp, wait_calls, wait_gone)

pytestmark = [pytest.mark.slow] + ([pytest.mark.gpu] if BACKEND == "cuda" else [])
VERSIONS = ["12.4", "11.8"]
# whole-process: long enough to dump mid-run (after 2000 calls: about 650
# iterations) on the GPU too, short enough for the program's own host check
# (it recomputes every iteration on the CPU: 60000 took about 30 s a run, and
# the file makes six runs)
ITER_WHOLE = "12000" if BACKEND == "cuda" else "1500"


def _iterative(version):
    prog = corpus.get_program("iterative")
    try:
        oldcuda_kit.kit(version)
    except oldcuda_kit.KitUnavailable as e:
        pytest.skip(f"NVIDIA's CUDA {version} runtime wheel unavailable: {e}")
    out = Path(os.environ.get("GPUPROXY_OLDCUDA_BUILD_DIR") or corpus.default_build_dir()) / "oldcuda"
    exe = oldcuda_kit.build(version, prog.source_path, out, nvcc=corpus.nvcc_path(),
                            flags=[f"-arch={corpus.nvcc_arch()}", "-O2", *prog.compile_flags])
    return prog, exe


class _Built:
    def __init__(self, exe, args=()):
        self.exe, self.args, self.name = exe, list(args), Path(exe).name

    def argv(self):
        return [str(self.exe), *self.args]


def _native(exe, args=()):
    """The native run's output (GPU only; the emulated backend has no native)."""
    if BACKEND != "cuda":
        return None
    r = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.mark.parametrize("version", VERSIONS)
def test_gpu_only_dump_restore_mid_run(version, tmp, shim_installed):
    """Paced; dumped after iterations 20 and 40 (GPU state only, the app
    waits in its next call), proxyd killed and a fresh one restoring each
    time: the output of the uninterrupted (native) run."""
    if BACKEND != "cuda":
        pytest.skip("on the emulated backend: tests/test_oldcuda.py::test_program_across_dump_and_restore")
    from paced import PacedRun
    prog, exe = _iterative(version)
    native = _native(exe, prog.args)
    if native is not None:
        assert native == prog.expected_output, native
    d = daemon(tmp, "first")
    from wholeproc import ctl
    with PacedRun(_Built(exe, prog.args), d) as run:
        for k in (20, 40):
            run.step_to(k)
            st = ctl(d, "dump", pid=run.pid, dir=str(tmp / f"img{k}"))
            assert st["released"], st
            d.kill()
            d = daemon(tmp, f"after{k}")
            assert ctl(d, "restore", dir=str(tmp / f"img{k}"))["pid"] == run.pid
        out = run.finish()
        assert out == prog.expected_output, f"{out}\n--- stderr\n{run.stderr()}\n{d.log()[-3000:]}"
        assert run.stderr() == ""


@pytest.mark.parametrize("version", VERSIONS)
def test_whole_process_dump_restore_mid_run(version, usable_criu, proxy_cli, tmp):
    """The whole process (NVIDIA's 12.4 / 11.8 runtime in it) dumped by CRIU
    mid-run, proxyd killed, a fresh one restoring GPU state and process: the
    output of an uninterrupted proxied run (and, on the GPU, the native one)."""
    prog, exe = _iterative(version)
    b = _Built(exe)
    d = daemon(tmp, "ref")
    require_park(d)
    ref = tmp / "ref.out"
    p = start(b.argv() + [ITER_WHOLE], d, ref)
    assert p.wait(600) == 0, ref.read_text() + Path(str(ref) + ".err").read_text()
    want = ref.read_text()
    native = _native(exe, [ITER_WHOLE])
    if native is not None:
        assert want == native
    d.cleanup()
    d = daemon(tmp, "first")
    out = tmp / "run.out"
    app = start(b.argv() + [ITER_WHOLE], d, out)
    pid = app.pid
    try:
        dump_mid_run(d, proxy_cli, app, tmp / "img")
        assert out.read_text() != want, "the program ended before the dump"
        d.kill()
        d = daemon(tmp, "second")
        ok(cli(proxy_cli, d, "--restore", "--dir", tmp / "img"))
        wait_gone(pid)
        assert out.read_text() == want, Path(str(out) + ".err").read_text()
    finally:
        kill(pid)
        d.cleanup()
