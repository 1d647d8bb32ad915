"""Shared fixtures of the test suite, and the `gpu` marker.

Fixtures (session-scoped unless said otherwise):

    shim_installed   the installed gpuproxy package with its built shim
                     (skips with a reason when `pip install .` was not run)
    nvcc             path of nvcc (skips with a reason when there is none)
    corpus_built     {name: corpus.BuiltProgram}: every program of
                     tests/programs, built once (corpus.build_all, cached)
    emu_kernel_files the emulated-kernel files of every corpus program
    emu_daemon       one proxyd (emulated backend, every corpus program's
                     kernels) on a private ipc endpoint, for the session
    fresh_daemon     (per test) factory: fresh_daemon(**Daemon kwargs) starts
                     a new proxyd, stopped and removed when the test ends
    proxy_cli        the argv prefix that runs the installed `proxy-cli`

Tests marked `gpu` are skipped ("no NVIDIA GPU on this machine") unless
`nvidia-smi -L` lists a GPU or GPUPROXY_TEST_GPU=1 is set (scripts/gpu-check
sets it on the GPU machine).
"""
from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO = TESTS_DIR.parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

import corpus  # noqa: E402
from proxy import Daemon  # noqa: E402

# A test run leaves no files behind: every temporary folder made in this
# process (tempfile: daemons' folders, keys, caches) goes under one root,
# removed when the run ends (pytest_unconfigure), also the folders of
# daemons a test killed without cleaning up. The corpus build cache stays
# where it is (shared between runs, by content hash).
import tempfile  # noqa: E402
import time  # noqa: E402
os.environ.setdefault(corpus.BUILD_DIR_ENV, str(corpus.default_build_dir()))
RUN_START = time.time()
RUN_TMP = tempfile.mkdtemp(prefix="gpx-run-")     # short: ipc socket paths hold 107 bytes
tempfile.tempdir = RUN_TMP
# proxyd and proxy-cli keep their keys (image seal) in a private directory
# (proxyd/core/keys.py): the tests use one of their own, not the user's
if not os.environ.get("GPUPROXY_KEY_DIR"):
    os.environ["GPUPROXY_KEY_DIR"] = os.path.join(tempfile.mkdtemp(prefix="keys-"), "keys")
# and their module cache (proxyd/families/modstore.py) too
if not os.environ.get("GPUPROXY_CACHE_DIR"):
    os.environ["GPUPROXY_CACHE_DIR"] = tempfile.mkdtemp(prefix="cache-")

GPU_SKIP_REASON = "no NVIDIA GPU on this machine"

_SHORT_DIRS: list[str] = []


@contextlib.contextmanager
def short_dir(prefix: str):
    """A new folder of a short path, /tmp/<prefix>-<pid>-<random>, removed
    at the end of the with block: an ipc socket path holds 107 bytes, and a
    supervisor keeps its workers' folder beside its endpoint only where that
    path stays within 64 (else in /tmp, which tests of that folder must not
    see). It is removed again when the run ends, since a daemon still
    stopping may write into it after the block's removal (which left empty
    folders in /tmp after every run)."""
    d = Path(tempfile.mkdtemp(prefix=f"{prefix}-{os.getpid()}-", dir="/tmp"))
    _SHORT_DIRS.append(str(d))
    d.chmod(0o755)              # as a plain mkdir made it: other users' tests reach sockets in it
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)

# --------------------------------------------------------------------------- gpu marker

def pytest_unconfigure(config):
    shutil.rmtree(RUN_TMP, ignore_errors=True)
    for d in _SHORT_DIRS:
        shutil.rmtree(d, ignore_errors=True)
    # shared memory of the clients the tests killed (SIGKILL leaves the
    # shim no chance to remove it): what the next proxyd's start would
    # sweep, swept now, only where the client is gone
    try:
        from gpuproxy.proxyd.supervisor.park_sweep import sweep_gone_clients
        sweep_gone_clients(min_age_s=0)
        left = [n for n in os.listdir("/dev/shm") if n.startswith("gpuproxy-")
                and os.lstat(os.path.join("/dev/shm", n)).st_mtime >= RUN_START]
        if left:                 # named, so that the test that left them can be found
            print(f"conftest: this run left {len(left)} file(s) in /dev/shm: {' '.join(sorted(left)[:20])}",
                  file=sys.stderr)
    except Exception as e:       # never the run's verdict
        print(f"conftest: /dev/shm not swept: {e}", file=sys.stderr)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU and driver (skipped where none is present)")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


@functools.lru_cache(maxsize=1)
def gpu_present() -> bool:
    """GPUPROXY_TEST_GPU=1, or `nvidia-smi -L` lists at least one GPU."""
    if os.environ.get("GPUPROXY_TEST_GPU") == "1":
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        r = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and any(line.startswith("GPU ") for line in r.stdout.splitlines())


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu_items and not gpu_present():
        skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
        for item in gpu_items:
            item.add_marker(skip)


# --------------------------------------------------------------------------- prerequisites

def _shim_problem() -> str | None:
    try:
        from gpuproxy.interceptor import check_built
    except ImportError as e:
        return f"the gpuproxy package is not installed (run `pip install .` in {REPO}): {e}"
    try:
        check_built()
    except (FileNotFoundError, OSError) as e:
        return f"the gpuproxy shim is not built: {e}"
    return None


@pytest.fixture(scope="session")
def shim_installed():
    """The installed gpuproxy.interceptor module (its shim libraries exist)."""
    problem = _shim_problem()
    if problem:
        pytest.skip(problem)
    import gpuproxy.interceptor
    return gpuproxy.interceptor


@pytest.fixture(scope="session")
def nvcc() -> str:
    path = corpus.nvcc_path()
    if path is None:
        pytest.skip("nvcc not found (set $NVCC, put it on PATH or install the CUDA toolkit in /usr/local/cuda)")
    return path


# --------------------------------------------------------------------------- corpus and daemons

@pytest.fixture(scope="session")
def corpus_built(nvcc, shim_installed) -> dict:
    """{name: BuiltProgram} for every corpus program (in manifest order).
    A build failure is an error of the tests, not a skip."""
    built = corpus.build_all(jobs=max(2, os.cpu_count() or 2))
    return {b.name: b for b in built}


@pytest.fixture(scope="session")
def emu_kernel_files() -> list[str]:
    return [str(p.emu_path) for p in corpus.load_corpus() if p.emu_path is not None]


@pytest.fixture(scope="session")
def emu_daemon(shim_installed, emu_kernel_files):
    """One proxyd with the emulated backend and every corpus program's kernels."""
    d = Daemon(backend="emu", emu_kernels=emu_kernel_files)
    try:
        d.start()
        yield d
    finally:
        d.cleanup()


@pytest.fixture
def fresh_daemon(shim_installed, emu_kernel_files):
    """Factory of daemons private to one test:

        d = fresh_daemon()                                  # emu, every corpus kernel
        d = fresh_daemon(endpoint="tcp://127.0.0.1:5555")   # any Daemon keyword

    Each is started before it is returned and cleaned up after the test."""
    daemons: list[Daemon] = []

    def make(**kwargs) -> Daemon:
        kwargs.setdefault("backend", "emu")
        kwargs.setdefault("emu_kernels", emu_kernel_files)
        d = Daemon(**kwargs)
        daemons.append(d)
        return d.start()

    yield make
    for d in daemons:
        d.cleanup()


def unexpected_stderr(stderr: str) -> list[str]:
    """The lines of a passing program's stderr (none are expected)."""
    return stderr.splitlines()


def client_env(daemon: Daemon, extra: dict | None = None) -> dict:
    """The environment of a program run under the shim against `daemon`,
    without test knobs that change a corpus program's output."""
    env = daemon.env_for_client()
    env.pop("GPUPROXY_TEST_PACE", None)
    env.update(extra or {})
    return env


def call_profile(path) -> dict[int, tuple[int, int]]:
    """A shim call profile (GPUPROXY_PROFILE, interceptor/profile.c):
    function id -> (calls sent, calls that waited); {} where the process
    sent nothing (no file is written then)."""
    rows = {}
    if os.path.exists(path):
        for line in open(path).read().splitlines():
            if not line.startswith("#"):
                fid, calls, sync_calls, _us = line.split()
                rows[int(fid)] = (int(calls), int(sync_calls))
    return rows


@pytest.fixture(scope="session")
def proxy_cli(shim_installed) -> list[str]:
    """argv prefix of the installed `proxy-cli` console script."""
    candidates = [Path(sysconfig.get_path("scripts")) / "proxy-cli", Path(sys.executable).parent / "proxy-cli"]
    for c in candidates:
        if c.exists():
            return [str(c)]
    found = shutil.which("proxy-cli")
    if found:
        return [found]
    # installed with `pip install --target` (scripts/gpu-check): a later
    # --target install of another package (pycuda's dependencies) replaces
    # the target's bin/ folder, console scripts included; the module stays
    import importlib.util
    if importlib.util.find_spec("gpuproxy.cli.__main__") is not None:
        return [sys.executable, "-m", "gpuproxy.cli"]
    pytest.fail("the proxy-cli console script is not installed next to this Python "
                f"(looked in {', '.join(str(c.parent) for c in candidates)} and on PATH)")


@pytest.fixture(scope="module")
def usable_criu():
    """A usable CRIU (proxyd/checkpoint/criu.py's choice), or a visible skip
    saying why there is none."""
    from gpuproxy.proxyd.checkpoint import criu
    try:
        return criu.usable()
    except criu.CriuError as e:
        pytest.skip(f"CRIU cannot be used on this machine: {e}")
