"""The JIT linker (interceptor/link.c, proxyd/families/link.py) beyond
tests/programs/jit_link.cu (run by tests/test_corpus_emu.py and natively and
proxied by scripts/gpu-check): a dump while a link is open is refused and
changes nothing, the link then completes; an option whose value points into
the application is refused with one stderr line naming it; a finished
link's module survives a dump/restore.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import client_env  # noqa: E402

BACKEND = os.environ.get("GPUPROXY_TEST_BACKEND", "emu")
pytestmark = [pytest.mark.gpu] if BACKEND == "cuda" else []

PTX = (Path(__file__).parent / "programs" / "jit_link.cu").read_text()

_APP = r'''
import ctypes, sys
cu = ctypes.CDLL("libcuda.so.1")
P, U, I, S = ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_uint, ctypes.c_size_t
assert cu.cuInit(0) == 0
ctx = P()
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cu.cuCtxSetCurrent(ctx) == 0
ptx = sys.stdin.readline().encode().replace(b"\\n", b"\n") + b"\0"
# CU_JIT_GLOBAL_SYMBOL_NAMES (17): its value is an array of host pointers
opts = (ctypes.c_uint * 1)(17)
vals = (P * 1)(None)
st = P()
print("symbols", cu.cuLinkCreate_v2(I(1), opts, vals, ctypes.byref(st)), flush=True)
err = ctypes.create_string_buffer(512)
opts = (ctypes.c_uint * 2)(5, 6)
vals = (P * 2)(ctypes.cast(err, P), P(512))
assert cu.cuLinkCreate_v2(I(2), opts, vals, ctypes.byref(st)) == 0
assert cu.cuLinkAddData_v2(st, I(1), ptx, S(len(ptx)), b"k.ptx", I(0), None, None) == 0
print("open", flush=True)
sys.stdin.readline()                       # the test tries a dump here
img, n = P(), S()
assert cu.cuLinkComplete(st, ctypes.byref(img), ctypes.byref(n)) == 0
mod = P()
assert cu.cuModuleLoadData(ctypes.byref(mod), img) == 0
assert cu.cuLinkDestroy(st) == 0
print("linked", n.value > 0, flush=True)
sys.stdin.readline()                       # the test dumps and restores here
fn = P()
print("function", cu.cuModuleGetFunction(ctypes.byref(fn), mod, b"jit_apply"), flush=True)
'''


def _kernel_ptx() -> str:
    """The kernel unit of jit_link.cu (it calls no external function when
    linked alone on the emulated GPU, which does not resolve externals)."""
    body = PTX.split("static const char ptx_kernel[] =\n", 1)[1].split(";\n", 1)[0]
    lines = [ln.strip()[1:-1].encode().decode("unicode_escape") for ln in body.splitlines()]
    return "".join(lines)


@pytest.mark.skipif(BACKEND != "emu", reason="the GPU's linker resolves the external the emulated one ignores")
def test_dump_refused_while_a_link_is_open(shim_installed, fresh_daemon, tmp_path):
    from gpuproxy.proxyd.client import ControlClient, ControlError
    d = fresh_daemon(backend=BACKEND, emu_kernels=[str(Path(__file__).parent / "programs" / "jit_link_emu.py")])
    app = subprocess.Popen([sys.executable, "-c", _APP], env=client_env(d), stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        app.stdin.write(_kernel_ptx().replace("\n", "\\n") + "\n")
        app.stdin.flush()
        assert app.stdout.readline().split() == ["symbols", "801"]
        assert app.stdout.readline().strip() == "open"
        with pytest.raises(ControlError) as e:
            ControlClient(d.endpoint, timeout_s=60).call("dump", {"pid": app.pid, "dir": str(tmp_path / "img"),
                                                                   "leave_running": True})
        assert "JIT link" in str(e.value) and "retry" in str(e.value), str(e.value)
        assert not (tmp_path / "img" / "manifest").exists()
        app.stdin.write("\n")
        app.stdin.flush()
        assert app.stdout.readline().split() == ["linked", "True"]
        # the link is done: now the dump goes through, and after a restore
        # the module the link produced is still there
        ControlClient(d.endpoint, timeout_s=60).call("dump", {"pid": app.pid, "dir": str(tmp_path / "img2")})
        ControlClient(d.endpoint, timeout_s=60).call("restore", {"dir": str(tmp_path / "img2")})
        app.stdin.write("\n")
        app.stdin.flush()
        assert app.stdout.readline().split() == ["function", "0"]
        assert app.wait(30) == 0, app.stderr.read()
        err = app.stderr.read()
        lines = [ln for ln in err.splitlines() if "not supported" in ln]
        assert len(lines) == 1 and "JIT option 17" in lines[0] and "cuLinkCreate" in lines[0], err
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
