"""dlopen of the CUDA libraries by any name or path gets the shim
(interceptor/dlopen.c), under the emulated backend. No GPU needed.

CuPy and cuda-pathfinder dlopen NVIDIA's libcudart.so.13 by absolute path,
numba asks for "libcuda.so": without the wrapper the real runtime would be
loaded next to the shim (and fail: it reaches the driver through private
export tables). The control runs without LD_PRELOAD show that the test
program really does load NVIDIA's library when nothing intervenes.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import client_env

HERE = Path(__file__).resolve().parent / "dlopen"


def _real_cudart() -> str:
    for base in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if base:
            p = Path(base) / "lib64" / "libcudart.so.13"
            if p.exists():
                return str(p.resolve())
    pytest.skip("NVIDIA's libcudart.so.13 not found under $CUDA_HOME/lib64 or /usr/local/cuda/lib64")


def _cc(args):
    r = subprocess.run(["cc", "-O1", "-Wall", *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def progs(tmp_path_factory):
    d = tmp_path_factory.mktemp("dlopen")
    _cc([str(HERE / "dlopen_cuda.c"), "-o", str(d / "dlopen_cuda"), "-ldl"])
    (d / "sub").mkdir()
    _cc(["-shared", "-fPIC", str(HERE / "runpath_dep.c"), "-o", str(d / "sub" / "libdep.so")])
    # --enable-new-dtags: DT_RUNPATH, which (unlike DT_RPATH) applies to the
    # library's own dlopen calls only, through the caller address.
    _cc(["-shared", "-fPIC", str(HERE / "runpath_caller.c"), "-o", str(d / "libcaller.so"),
         "-Wl,--enable-new-dtags,-rpath,$ORIGIN/sub", "-ldl"])
    _cc([str(HERE / "runpath_main.c"), "-o", str(d / "runpath_main"), "-ldl"])
    return d


def _lines(stdout: str) -> dict:
    out = {}
    for line in stdout.splitlines():
        key, _, rest = line.partition(" ")
        out.setdefault(key, rest)
    return out


def test_absolute_path_runtime_gets_the_shim(progs, emu_daemon, shim_installed):
    real = _real_cudart()
    shim_dir = os.path.realpath(shim_installed.lib_dir())
    r = subprocess.run([str(progs / "dlopen_cuda"), real], capture_output=True, text=True, timeout=60,
                       env=client_env(emu_daemon))
    assert r.returncode == 0, r.stdout + r.stderr
    got = _lines(r.stdout)
    assert os.path.dirname(os.path.realpath(got["runtime"].split("from ", 1)[1])) == shim_dir, r.stdout
    assert got["cudaGetDeviceCount"] == "err=0 count=1", r.stdout
    assert got["alloc=0"] == "h2d=0 d2h=0 roundtrip=same memset=0/0 byte=0x5a free=0", r.stdout
    assert os.path.realpath(got["driver"].split("from ", 1)[1]) == os.path.join(shim_dir, "libcuda.so.1")
    assert got["cuInit=0"] == "cuDeviceGetCount=0 count=1", r.stdout
    # an older runtime major is not the shim's: RTLD_NOLOAD of libcudart.so.12
    # finds nothing loaded (NVIDIA's 12.x runtime runs on the shim's driver
    # API when a program loads it: tests/test_oldcuda.py)
    assert got["noload"] == "libcudart.so.12: not loaded", r.stdout
    assert os.path.dirname(os.path.realpath(got["dlmopen"].split(": ", 1)[1])) == shim_dir, r.stdout
    assert r.stderr == "", r.stderr


def test_control_without_preload_loads_nvidias_runtime(progs):
    """Without the shim the same program gets NVIDIA's library (and, on a
    machine without a driver, an error): the redirect above is the shim's doing."""
    real = _real_cudart()
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    r = subprocess.run([str(progs / "dlopen_cuda"), real], capture_output=True, text=True, timeout=60, env=env)
    got = _lines(r.stdout)
    assert os.path.realpath(got["runtime"].split("from ", 1)[1]) == real, r.stdout
    assert got["noload"] == "libcudart.so.12: not loaded", r.stdout


def test_other_names_keep_the_callers_runpath(progs, emu_daemon):
    """dlopen of a non-CUDA name resolves with the calling library's RUNPATH,
    as without the wrapper (the wrapper forwards by tail call)."""
    for env in (None, client_env(emu_daemon)):
        r = subprocess.run([str(progs / "runpath_main"), str(progs / "libcaller.so")], capture_output=True,
                           text=True, timeout=30, env=env)
        assert r.returncode == 0 and r.stdout == "dep value 4242\n", r.stdout + r.stderr


def test_python_ctypes_absolute_path(emu_daemon):
    """What CuPy's loader does: ctypes.CDLL on the runtime's full path."""
    real = _real_cudart()
    code = ("import ctypes, sys\n"
            f"rt = ctypes.CDLL({real!r})\n"
            "n = ctypes.c_int(-1)\n"
            "err = rt.cudaGetDeviceCount(ctypes.byref(n))\n"
            "p = ctypes.c_void_p()\n"
            "err2 = rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(4096))\n"
            "print(err, n.value, err2, bool(p.value), rt.cudaFree(p))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=client_env(emu_daemon))
    assert r.returncode == 0 and r.stdout == "0 1 0 True 0\n", r.stdout + r.stderr
