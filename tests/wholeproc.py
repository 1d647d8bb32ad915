"""What the whole-process checkpoint tests share (tests/test_whole_process.py,
test_whole_process_retry.py, test_contract.py, test_hostmem.py,
test_criu_plugin.py, test_pycuda.py): the programs, daemons stopped after
each test, proxy-cli runs, waiting for an app's calls or its end, an
uninterrupted run's output.

A test module takes the fixtures by importing them (programs, tmp,
_stop_daemons) and its marks by `pytestmark = wholeproc.pytestmark`
(GPUPROXY_TEST_BACKEND=cuda marks the tests `gpu`).
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import corpus  # noqa: E402
from conftest import short_dir  # noqa: E402
from proxy import Daemon  # noqa: E402

from gpuproxy.proxyd.checkpoint import criu  # noqa: E402
from test_criu import runner_session_visible  # noqa: E402

BACKEND = os.environ.get("GPUPROXY_TEST_BACKEND", "emu")
pytestmark = [pytest.mark.gpu] if BACKEND == "cuda" else []
EXTRA = Path(__file__).parent / "programs_extra"
ITER_N = "1500"          # iterative's iterations: long enough to dump mid-run
# the periodic test dumps three times a second apart while the app runs: on a
# GPU 1500 iterations are over before that (seen on the H100), and so they are
# on the emulated backend of an idle 2-core machine (about 4 s, seen
# 2026-11-27: the app ended before the third dump)
ITER_LONG = "60000" if os.environ.get("GPUPROXY_TEST_BACKEND") == "cuda" else "6000"


# ------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def programs(shim_installed, nvcc):
    out = {n: corpus.build(corpus.get_program(n), corpus.default_build_dir()) for n in ("counter", "iterative")}
    src = EXTRA / "mt_long.cu"
    prog = corpus.Program(name="mt_long", source=src.name, link=(), cubins=(), args=(), emu=None, expected="",
                          driver=None, pace=False, proxy_only=False, source_path=src)
    out["mt_long"] = corpus.build(prog, corpus.default_build_dir() / "programs_extra")
    return out


@pytest.fixture
def tmp():
    with short_dir("gwp") as d:         # ipc paths must stay short (conftest.short_dir)
        yield d


def kernels():
    return [str(corpus.PROGRAMS_DIR / p.emu) for p in corpus.load_corpus() if p.emu]   # cublas_gemm has no kernels


_started: list[Daemon] = []


@pytest.fixture(autouse=True)
def _stop_daemons():
    """Every daemon a test started is stopped, also when it skips or fails early."""
    yield
    while _started:
        _started.pop().cleanup()


def daemon(tmp, name="proxyd", endpoint=None):
    d = Daemon(backend=BACKEND, emu_kernels=kernels() if BACKEND == "emu" else (),
               endpoint=endpoint or f"ipc://{tmp}/proxyd.sock", log_path=str(Path(tmp) / f"{name}.log"))
    _started.append(d)
    return d.start()


def ctl(d, cmd, **args):
    from gpuproxy.proxyd.client import ControlClient
    return ControlClient(d.endpoint, timeout_s=120).call(cmd, args)


def require_park(d):
    """Whole-process dumps need proxyd's park/resume and the shim's side of
    parking (interceptor/park.c)."""
    from gpuproxy.proxyd.client import ControlError
    if not (Path(__file__).parent.parent / "interceptor" / "park.c").exists():
        pytest.skip("the shim cannot park yet (no interceptor/park.c): whole-process dumps need it")
    try:
        ctl(d, "park", pid=-1, timeout_s=0.1)
    except ControlError as e:
        if "unknown command" in str(e):
            pytest.skip(f"this proxyd cannot park its clients yet ({e}): whole-process dumps need it")


def cli(proxy_cli, d, *args, env=None, endpoint=None) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.pop("LD_PRELOAD", None)
    e.update(env or {})
    return subprocess.run([*proxy_cli, "--endpoint", endpoint or d.endpoint, *map(str, args)], env=e,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, f"proxy-cli failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r.stdout


def start(argv, d, out: Path, env: dict | None = None) -> subprocess.Popen:
    # an app inherits the runner's session (a shell job) where CRIU can dump
    # that, else it gets its own (see test_criu.runner_session_visible)
    return subprocess.Popen(argv, env=d.env_for_client(env), stdin=subprocess.DEVNULL, stdout=open(out, "w"),
                            stderr=open(str(out) + ".err", "w"), start_new_session=not runner_session_visible())


def wait_gone(pid: int, timeout: float = 600.0):
    """A restored app is not our child: wait until its pid is gone."""
    end = time.monotonic() + timeout
    while criu.pid_alive(pid):
        assert time.monotonic() < end, f"pid {pid} still runs after {timeout} s"
        time.sleep(0.05)


def kill(pid: int):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def session(d, pid):
    for s in ctl(d, "status")["sessions"]:
        if s["pid"] == pid:
            return s
    return None


def kill_and_forget(d, app) -> None:
    """Kills the app (its images are what a restore will use) and waits until
    proxyd has ended its session, as it must before a restore takes its pid."""
    app.kill()
    app.wait()
    end = time.monotonic() + 30
    while session(d, app.pid) is not None:           # proxyd notices the app is gone
        assert time.monotonic() < end, "proxyd kept the killed app's session"
        time.sleep(0.1)


def released(s) -> bool:
    """A session whose GPU state was dumped and released (status, before or
    after proxyd's split into supervisor and workers)."""
    return bool(s and (s.get("released") or s.get("state") == "released"))


def wait_calls(d, pid, n, timeout=120.0):
    """Until pid's session has made n CUDA calls (the program is well into its run)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        s = session(d, pid)
        if s and s["calls"] >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} did not reach {n} calls")


def dump_mid_run(d, proxy_cli, app, img, calls: int = 2000) -> None:
    """Once app has made `calls` CUDA calls, a whole-process dump into img;
    the app is gone afterwards (CRIU ended it)."""
    wait_calls(d, app.pid, calls)
    ok(cli(proxy_cli, d, "--dump", "--pid", app.pid, "--dir", img))
    app.wait(30)
    assert not criu.pid_alive(app.pid)


# uninterrupted runs' outputs by command line: the programs are deterministic
# (each test compares a restored run with it byte for byte), so one run serves
# every test of the pytest process that needs the same program and arguments
_references: dict[tuple, str] = {}


def reference(built, d, tmp, args=()) -> str:
    """The output of an uninterrupted run (of this pytest process: the
    first test that needs it runs it under d)."""
    argv = built.argv() + list(args)
    key = (BACKEND, *map(str, argv))
    if key not in _references:
        out = tmp / f"ref-{built.name}.out"
        p = start(argv, d, out)
        assert p.wait(600) == 0, out.read_text()
        _references[key] = out.read_text()
    return _references[key]


@contextlib.contextmanager
def iterative_app(programs, tmp, iters: str, calls: int | None = 500, ref_daemon: bool = False):
    """The iterative program (`iters` iterations) started under a daemon that
    can park, once it has made `calls` CUDA calls (None: at once); yields
    (daemon, app, its output file, an uninterrupted run's output). With
    ref_daemon the reference runs under a daemon of its own ("ref"), stopped
    before the app's ("first") starts. At the end the app's pid is killed (a
    restored app has the same pid) and the daemon stopped."""
    b = programs["iterative"]
    d = daemon(tmp, "ref" if ref_daemon else "proxyd")
    require_park(d)
    want = reference(b, d, tmp, [iters])
    if ref_daemon:
        d.cleanup()
        d = daemon(tmp, "first")
    out = tmp / "run.out"
    app = start(b.argv() + [iters], d, out)
    try:
        if calls is not None:
            wait_calls(d, app.pid, calls)
        yield d, app, out, want
    finally:
        kill(app.pid)
        d.cleanup()


@contextlib.contextmanager
def counter_app(programs, d, tmp):
    """The counter (a UDP service) under d, once it has answered its first
    request with 101; yields (app, its port). At the end the app's pid is
    killed (a restored app has the same pid), the app reaped and d stopped."""
    port = corpus.free_udp_port()
    app = start(programs["counter"].argv() + [str(port)], d, tmp / "counter.out")
    try:
        assert ask(port) == "101"
        yield app, port
    finally:
        kill(app.pid)
        app.wait()
        d.cleanup()


def ask(port: int, timeout: float = 60.0) -> str:
    """One request to the counter once its port is bound; its reply."""
    end = time.monotonic() + timeout
    while corpus._udp_port_bound(port) is False:
        assert time.monotonic() < end, "counter never bound its port"
        time.sleep(0.05)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(b"hello\n", ("127.0.0.1", port))
        return s.recvfrom(64)[0].decode().strip()


def assert_private(path: Path):
    for root, dirs, files in os.walk(path):
        assert stat.S_IMODE(os.stat(root).st_mode) == 0o700, root
        for f in files:
            p = Path(root) / f
            if not p.is_symlink():
                assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, p


# ------------------------------------------------------------------ checks without CRIU or parking


def park_files_left(d, pid: int) -> list[str]:
    """The /dev/shm files of pid's parks (parked, parkheld, the stall's ran
    file) still there; its public id (what the names carry) from proxyd's
    log, which names every session by it."""
    import glob
    import re
    ids = set(re.findall(r"session id ([0-9a-f]+)-%d:" % pid, d.log()))
    assert ids, f"no session of pid {pid} in proxyd's log"
    return [f for i in ids for kind in ("parked", "parkheld", "ran")
            for f in glob.glob(f"/dev/shm/gpuproxy-{kind}-{i}-*") + glob.glob(f"/dev/shm/gpuproxy-{kind}-{i}")]
