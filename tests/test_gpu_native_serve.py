"""The worker's C serving loop (proxyd/native/gpxd.c) on the GPU: a program
made of the messages it answers (tests/programs_extra/serve_mix.cu) prints
the same natively, under the proxy with the loop, and without it
(GPUPROXY_NATIVE_SERVE=0); the worker's count shows the loop answered most
of them. Marked `gpu`: scripts/gpu-check runs it."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from proxy import Daemon, run_proxied  # noqa: E402

pytestmark = pytest.mark.gpu
SRC = Path(__file__).parent / "programs_extra" / "serve_mix.cu"


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    if not shutil.which("nvcc"):
        pytest.skip("no nvcc")
    out = tmp_path_factory.mktemp("serve_mix") / "serve_mix"
    arch = os.environ.get("GPUPROXY_NVCC_ARCH", "sm_90")
    subprocess.run(["nvcc", "-cudart", "shared", f"-arch={arch}", "-O2", "-o", str(out), str(SRC)], check=True)
    return str(out)


@pytest.mark.parametrize("arg", ["", "fault"])
def test_same_output_with_and_without_the_c_loop(binary, arg):
    argv = [binary] + ([arg] if arg else [])
    native = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert native.returncode == 0, native.stderr
    outs = {}
    for mode in ("1", "0"):
        env = dict(os.environ, GPUPROXY_NATIVE_SERVE=mode)
        with Daemon("cuda", env=env) as d:
            r = run_proxied(argv, d, timeout=300)
            assert r.returncode == 0, (mode, r.stderr[-3000:], d.log()[-3000:])
            outs[mode] = r.stdout
            d.stop()
            counts = re.findall(r"C serving loop: (\d+) messages answered in C, (\d+) taken", d.log())
        if mode == "1" and not arg:
            assert counts, d.log()[-3000:]
            # one line per worker that ended; the program's is the busiest
            answered, to_python = max((int(a), int(t)) for a, t in counts)
            assert answered > 3000 and answered > 2 * to_python, counts
        if mode == "0":
            assert not counts
    assert outs["1"] == native.stdout
    assert outs["0"] == native.stdout
