"""A CUDA 12.4 / 11.8 program (NVIDIA's own runtime inside it) whose
`__device__` variable comes back at another address after a restore: the
runtime's symbol calls (cudaMemcpyFromSymbol at the program's end) must keep
working. On the H100 such a move (a GPU-only restore of the 12.4 build, and
a whole-process restore of the 11.8 one) made cudaMemcpyFromSymbol answer
cudaErrorInvalidSymbol: the runtime looks the variable up again
(cuModuleGetGlobal, found with gdb on the emulated backend) and refuses an
address other than the one it kept; proxyd now answers the app's address
(Session.app_address). Here the restoring daemon's emulated backend places
variables 1 MiB further (GPUPROXY_EMU_GLOBALS_SKEW), which moves them
every time."""
from __future__ import annotations

import pytest

from wholeproc import BACKEND, cli, daemon, dump_mid_run, kill, ok, require_park, start, tmp, wait_gone  # noqa: F401
from test_oldcuda_checkpoint import VERSIONS, _Built, _iterative

pytestmark = [pytest.mark.slow]


@pytest.mark.parametrize("version", VERSIONS)
def test_whole_process_restore_with_moved_globals(version, usable_criu, proxy_cli, tmp, monkeypatch):
    if BACKEND != "emu":
        pytest.skip("the move is forced on the emulated backend")
    prog, exe = _iterative(version)
    b = _Built(exe)
    d = daemon(tmp, "first")
    require_park(d)
    out = tmp / "run.out"
    app = start(b.argv() + ["1500"], d, out)
    pid = app.pid
    try:
        dump_mid_run(d, proxy_cli, app, tmp / "img")
        d.kill()
        monkeypatch.setenv("GPUPROXY_EMU_GLOBALS_SKEW", str(1 << 20))    # the new daemon's workers inherit it
        d = daemon(tmp, "skewed")
        monkeypatch.delenv("GPUPROXY_EMU_GLOBALS_SKEW")
        ok(cli(proxy_cli, d, "--restore", "--dir", tmp / "img"))
        wait_gone(pid)
        text = out.read_text()
        assert text.endswith(prog.expected_output.splitlines()[-1] + "\n") and "FAIL" not in text, \
            text[-600:] + d.log()[-3000:]
    finally:
        kill(pid)
        d.cleanup()


@pytest.mark.parametrize("version", VERSIONS)
def test_gpu_only_restore_with_moved_globals(version, tmp, shim_installed, monkeypatch):
    """The same for GPU-only dumps: the app waits in its next call while a
    fresh, skewed proxyd restores, twice, then runs to its end."""
    if BACKEND != "emu":
        pytest.skip("the move is forced on the emulated backend")
    from paced import PacedRun
    from wholeproc import ctl
    prog, exe = _iterative(version)
    d = daemon(tmp, "first")
    with PacedRun(_Built(exe, prog.args), d) as run:
        # twice, moved further each time: after the second restore the
        # variable is known by three addresses, and the app by its first
        for k, skew in ((20, 1 << 20), (40, 2 << 20)):
            run.step_to(k)
            assert ctl(d, "dump", pid=run.pid, dir=str(tmp / f"img{k}"))["released"]
            d.kill()
            monkeypatch.setenv("GPUPROXY_EMU_GLOBALS_SKEW", str(skew))
            d = daemon(tmp, f"skewed{k}")
            monkeypatch.delenv("GPUPROXY_EMU_GLOBALS_SKEW")
            assert ctl(d, "restore", dir=str(tmp / f"img{k}"))["pid"] == run.pid
            assert "moved" in d.log()          # the variable did move
        out = run.finish()
        assert out == prog.expected_output, out[-500:] + run.stderr() + d.log()[-2000:]
