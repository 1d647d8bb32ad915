"""A CUDA 12.4 / 11.8 program (NVIDIA's own runtime inside it) whose
`__device__` variable comes back at another address after a restore: the
runtime's symbol calls (cudaMemcpyFromSymbol at the program's end) must keep
working. On the H100 such a move (a GPU-only restore of the 12.4 build, and
a whole-process restore of the 11.8 one) made cudaMemcpyFromSymbol answer
cudaErrorInvalidSymbol. Here the restoring daemon's emulated backend places
variables 1 MiB further (GPUPROXY_EMU_GLOBALS_SKEW), which moves them
every time."""
from __future__ import annotations

import pytest

from wholeproc import BACKEND, cli, daemon, dump_mid_run, kill, ok, require_park, start, tmp, wait_gone  # noqa: F401
from test_oldcuda_checkpoint import VERSIONS, _Built, _iterative

pytestmark = [pytest.mark.slow]

# Known gap (issue 24): with the variable moved, NVIDIA's 12.4 and 11.8
# runtimes answer cudaMemcpyFromSymbol with cudaErrorInvalidSymbol before
# sending anything (the call profile shows no op after the restore's last
# copy, and no call failed in proxyd: GPUPROXY_LOG_CALL_ERRORS=1), so a check
# inside the runtime on an answer the shim gives locally fails; not found
# yet. The placement fixes (core/addrspace.py) keep variables from moving.
KNOWN_GAP = pytest.mark.xfail(strict=True, reason="NVIDIA's runtime refuses a moved __device__ variable "
                                                  "(docs/compatibility.md, issue 24)")


@KNOWN_GAP
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
