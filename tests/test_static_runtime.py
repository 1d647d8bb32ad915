"""Programs that carry NVIDIA's static CUDA runtime (`nvcc -cudart static`,
libcudart_static.a) under the shim, on the emulated backend.

That runtime is NVIDIA's own code inside the program: it reaches the shim's
libcuda.so.1 through dlopen, the documented driver API and the private
tables of cuGetExportTable (interceptor/export_tables.c). Its integrity
check compares the shim's answer with its own computation, so a run that
passes also checks the shim's HMAC-MD2. CuPy 14, cuBLAS, cuFFT and cuSPARSE
embed the same runtime.

* every corpus program built with -cudart static prints its expected output,
  with nothing on stderr;
* the paced programs with `checkpoints:` survive dump, proxyd restart and
  restore, like their shared-runtime builds (tests/test_corpus_checkpoint.py);
* MD2 against RFC 1319's test suite;
* CuPy on the emulated backend, where the cupy-cuda13x wheel is installed.

GPUPROXY_TEST_BACKEND=cuda (scripts/gpu-check's pytest step) runs the same
against the GPU.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

import corpus
from conftest import client_env
from proxy import Daemon
from test_corpus_checkpoint import dump_restore_at_checkpoints, tmp  # noqa: F401  (tmp is a fixture)

PROGRAMS = [p for p in corpus.load_corpus() if p.driver is None]
BACKEND = os.environ.get("GPUPROXY_TEST_BACKEND", "emu")
pytestmark = [pytest.mark.gpu] if BACKEND == "cuda" else []


@pytest.fixture(scope="module")
def daemon(shim_installed, emu_kernel_files):
    d = Daemon(backend=BACKEND, emu_kernels=emu_kernel_files if BACKEND == "emu" else ())
    try:
        d.start()
        yield d
    finally:
        d.cleanup()


@pytest.fixture(scope="module")
def static_built(nvcc, shim_installed) -> dict:
    built = corpus.build_all(jobs=max(2, os.cpu_count() or 2), programs=PROGRAMS, cudart="static")
    for b in built:
        # the runtime is inside the binary: no libcudart in its dynamic section
        needed = subprocess.run(["readelf", "-d", str(b.binary)], capture_output=True, text=True).stdout
        assert "libcudart" not in needed, f"{b.name} links libcudart dynamically:\n{needed}"
    return {b.name: b for b in built}


@pytest.mark.parametrize("name", [p.name for p in PROGRAMS])
def test_static_runtime_program_under_emu(name, static_built, daemon, request):
    built = static_built[name]
    _skip_without_devices(built)
    if built.program.devices > 1 and BACKEND == "emu":     # a daemon with that many emulated GPUs
        daemon = request.getfixturevalue("fresh_daemon")(extra_args=["--emu-devices", str(built.program.devices)])
    r = corpus.run_program(built, env=client_env(daemon), timeout=120)
    what = f"exit {r.returncode}\n--- stdout\n{r.stdout[-2000:]}\n--- stderr\n{r.stderr[-3000:]}"
    assert r.returncode == 0, what
    assert r.stdout == built.program.expected_output, what
    if name != "unsupported":
        extra = [l for l in r.stderr.splitlines() if not any(x in l for x in built.program.expected_errors)]
        assert extra == [], what
    else:
        # the same two unsupported calls, named once each, and nothing else
        assert len([l for l in r.stderr.splitlines() if l.strip()]) == 2, what


@pytest.mark.parametrize("name", [p.name for p in PROGRAMS if p.checkpoints])
def test_static_runtime_program_survives_dump_and_restore(name, static_built, tmp):
    """The runtime's state in the process (its context-local storage, loaded
    libraries = modules, kernels = functions) must match the restored
    session: the handles stay the same, so the program goes on unchanged."""
    _skip_without_devices(static_built[name])
    dump_restore_at_checkpoints(static_built[name], tmp)


def _skip_without_devices(built):
    """A program for more GPUs than the machine has (peer_copy on one H100)
    skips on the GPU, as in test_corpus_checkpoint."""
    if BACKEND == "cuda" and built.program.devices > 1:
        from gpuproxy.proxyd.backends.cuda import CudaBackend
        if CudaBackend().device_count() < built.program.devices:
            pytest.skip(f"{built.name} needs {built.program.devices} GPUs")


def test_md2_rfc1319_vectors(shim_installed):
    """MD2 under the integrity check, against RFC 1319's test suite (A.5)."""
    lib = ctypes.CDLL(str(Path(shim_installed.__path__[0]) / "lib" / "libcuda.so.1"))
    vectors = {
        b"": "8350e5a3e24c153df2275c9f80692773",
        b"a": "32ec01ec4a6dac72c0ab96fb34c0b5d1",
        b"abc": "da853b0d3f88d99b30283a69e6ded6bb",
        b"message digest": "ab4f496bfb2a530b219ff33031fe06b0",
        b"abcdefghijklmnopqrstuvwxyz": "4e8ddff3650292ab5a4108c3aa47940b",
        b"1234567890" * 8: "d5976f79d83d3a0dc9806c3c66f3efd8",
    }
    out = ctypes.create_string_buffer(16)
    for msg, want in vectors.items():
        lib.gp_md2(msg, ctypes.c_size_t(len(msg)), out)
        assert out.raw.hex() == want, msg


CUPY_SCRIPT = r"""
import numpy, cupy
n = cupy.cuda.runtime.getDeviceCount()
a = cupy.asarray(numpy.arange(10, dtype=numpy.int64))
b = cupy.empty_like(a)
b.set(numpy.arange(10, 20, dtype=numpy.int64))
free, total = cupy.cuda.runtime.memGetInfo()
s = cupy.cuda.Stream()
with s:
    c = cupy.asarray(numpy.full(4, 7, dtype=numpy.float32))
s.synchronize()
print(n, a.get().tolist(), b.get().tolist(), c.get().tolist(), total > 0)
"""


def test_cupy_arrays_under_emu(daemon):
    """CuPy 14 embeds the static runtime (cupy_backends' runtime module has no
    libcudart dependency). Device count, memory info, allocation through its
    pool, host<->device copies and a stream work on the emulated backend;
    kernels (NVRTC-compiled) cannot run there."""
    # $GPUPROXY_CUPY_PYTHON: an interpreter with cupy-cuda13x and numpy (the
    # wheel is cp312-only); default: the one running the tests
    python = os.environ.get("GPUPROXY_CUPY_PYTHON", sys.executable)
    probe = subprocess.run([python, "-c", "import cupy, numpy"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cupy is not importable by {python}: " + (probe.stderr.strip().splitlines() or ["?"])[-1])
    r = subprocess.run([python, "-c", CUPY_SCRIPT], env=client_env(daemon),
                       capture_output=True, text=True, timeout=120)
    what = f"exit {r.returncode}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr[-3000:]}\n{daemon.log()[-2000:]}"
    assert r.returncode == 0, what
    assert r.stdout.strip() == ("1 [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] [10, 11, 12, 13, 14, 15, 16, 17, 18, 19] "
                                "[7.0, 7.0, 7.0, 7.0] True"), what
    assert r.stderr.strip() == "", what
