"""gpuproxy's CRIU plugin (proxyd/checkpoint/criu_plugin.c, criu_hooks.py):
a plain `criu dump` of a gpuproxy client, with the plugin loaded (--libdir),
also saves its GPU state beside CRIU's images; a plain `criu restore` into a
fresh proxyd puts it back, and the app finishes with exactly the output of an
uninterrupted run. This is what podman/runc, CRI-O and the kubelet's
checkpoint API do: they run criu. Emulated backend; skips without CRIU.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from wholeproc import (programs, tmp, daemon, require_park, reference, wait_calls,  # noqa: E402,F401
                       wait_gone, kill, _stop_daemons, BACKEND)

# GPUPROXY_TEST_BACKEND=cuda runs them on the GPU, with runs long enough to interrupt
pytestmark = [pytest.mark.slow] + ([pytest.mark.gpu] if BACKEND == "cuda" else [])
N = "60000" if BACKEND == "cuda" else "1500"
LONG = "60000" if BACKEND == "cuda" else "3000"


def plugin_dir() -> str:
    import gpuproxy.proxyd.checkpoint as pkg
    d = os.path.dirname(pkg.__file__)
    if not os.path.exists(os.path.join(d, "gpuproxy_criu_plugin.so")):
        pytest.skip("gpuproxy's CRIU plugin is not built (pip install .)")
    return d


def criu(c, d, *args, **extra_env) -> subprocess.CompletedProcess:
    env = dict(os.environ, GPUPROXY_ENDPOINT=d.endpoint, **extra_env)
    env.pop("LD_PRELOAD", None)
    return subprocess.run(c.argv(*args), env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


def test_criu_dump_and_restore_carry_the_gpu_state(programs, usable_criu, tmp):
    b = programs["iterative"]
    d = daemon(tmp, "ref")
    require_park(d)
    want = reference(b, d, tmp, [N])
    d.cleanup()
    d = daemon(tmp, "first")
    out = tmp / "run.out"
    p = subprocess.Popen(b.argv() + [N], env=d.env_for_client(), stdin=subprocess.DEVNULL, stdout=open(out, "w"),
                         stderr=open(str(out) + ".err", "w"), start_new_session=True)
    pid = p.pid
    imgs = tmp / "imgs"
    imgs.mkdir()
    libdir = plugin_dir()
    try:
        wait_calls(d, pid, 1500)
        r = criu(usable_criu, d, "dump", "--tree", str(pid), "--images-dir", str(imgs), "--libdir", libdir,
                 "--log-file", "dump.log", "-v4")
        assert r.returncode == 0, (imgs / "dump.log").read_text()[-3000:]
        assert p.wait(30) == -signal.SIGKILL                  # CRIU ended it
        gpu = imgs / "gpuproxy" / str(pid)
        assert (gpu / "manifest").exists() and (gpu / "criu").exists() is False
        d.kill()                                               # another proxyd (as on another node)
        d = daemon(tmp, "second", endpoint=d.endpoint)
        r = criu(usable_criu, d, "restore", "--images-dir", str(imgs), "--libdir", libdir, "--restore-detached",
                 "--log-file", "restore.log", "-v4")
        assert r.returncode == 0, [ln for ln in (imgs / "restore.log").read_text().splitlines() if "rror" in ln or "gpuproxy" in ln][-8:]
        wait_gone(pid, 120)
        assert out.read_text() == want
    finally:
        kill(pid)


def test_failed_last_restore_step_ends_the_wait_with_an_error(programs, usable_criu, tmp):
    """The restore's last step (RESUME_DEVICES_LATE, which resumes the
    shim) fails; CRIU only logs that, so the restored app's shim would wait
    for its resume forever. Instead the restored copy (its start time
    differs from the dumped one's) gives up after GPUPROXY_RESTORE_WAIT_S:
    one stderr line naming the endpoint, its CUDA calls fail, and it ends.
    The failure is injected by the interpreter the plugin runs
    (GPUPROXY_PYTHON): a wrapper that fails the `restore` action."""
    b = programs["iterative"]
    d = daemon(tmp, "first")
    require_park(d)
    out = tmp / "run.out"
    env = dict(d.env_for_client(), GPUPROXY_RESTORE_WAIT_S="2")
    p = subprocess.Popen(b.argv() + [LONG], env=env, stdin=subprocess.DEVNULL, stdout=open(out, "w"),
                         stderr=open(str(out) + ".err", "w"), start_new_session=True)
    pid = p.pid
    imgs = tmp / "imgs"
    imgs.mkdir()
    libdir = plugin_dir()
    failing = tmp / "failing-python"
    failing.write_text("#!/bin/sh\n"
                       "if [ \"$3\" = restore ]; then echo 'injected failure of the restore step' >&2; exit 1; fi\n"
                       f"exec {sys.executable} \"$@\"\n")
    failing.chmod(0o755)
    try:
        wait_calls(d, pid, 1000)
        r = criu(usable_criu, d, "dump", "--tree", str(pid), "--images-dir", str(imgs), "--libdir", libdir,
                 "--log-file", "dump.log", "-v4")
        assert r.returncode == 0, (imgs / "dump.log").read_text()[-3000:]
        assert p.wait(30) == -signal.SIGKILL
        d.kill()
        d = daemon(tmp, "second", endpoint=d.endpoint)
        criu(usable_criu, d, "restore", "--images-dir", str(imgs), "--libdir", libdir, "--restore-detached",
             "--log-file", "restore.log", "-v4", GPUPROXY_PYTHON=str(failing))
        assert "injected failure of the restore step" in (imgs / "restore.log").read_text()
        wait_gone(pid, 60)                                     # bounded: 2 s, then its calls fail
        err = (tmp / "run.out.err").read_text()
        assert f"proxyd at {d.endpoint} did not resume this process within 2 s" in err, err[-2000:]
        assert "CUDA calls fail from now on" in err
    finally:
        kill(pid)


def test_failed_gpu_dump_fails_criu_never_the_app(programs, usable_criu, tmp):
    """proxyd cannot write the GPU state (here its image folder's name is
    taken by a file) after the plugin parked the app: CHECKPOINT_DEVICES
    fails, so CRIU fails the dump; the app is resumed and runs on, and no
    gpuproxy part stays in the images folder."""
    b = programs["iterative"]
    d = daemon(tmp)
    require_park(d)
    out = tmp / "run.out"
    p = subprocess.Popen(b.argv() + [LONG], env=d.env_for_client(), stdin=subprocess.DEVNULL,
                         stdout=open(out, "w"), stderr=subprocess.DEVNULL, start_new_session=True)
    imgs = tmp / "imgs"
    (imgs / "gpuproxy").mkdir(parents=True)
    (imgs / "gpuproxy" / str(p.pid)).write_text("not an image folder")
    try:
        wait_calls(d, p.pid, 1000)
        r = criu(usable_criu, d, "dump", "--tree", str(p.pid), "--images-dir", str(imgs), "--libdir", plugin_dir(),
                 "--log-file", "dump.log", "-v4", "--leave-running")
        log = (imgs / "dump.log").read_text()
        assert r.returncode != 0 and "Dumping FAILED" in log
        # the plugin writes into CRIU's log (runc keeps that, not criu's stderr)
        assert f"gpuproxy criu plugin: checkpoint {p.pid}: dump failed" in log, log[-3000:]
        assert not (imgs / "gpuproxy").exists()
        calls = [s for s in ctl_status(d) if s["pid"] == p.pid][0]["calls"]
        wait_calls(d, p.pid, calls + 500)                      # resumed: it goes on
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()


def ctl_status(d) -> list[dict]:
    from gpuproxy.proxyd.client import ControlClient
    return ControlClient(d.endpoint, timeout_s=30).call("status")["sessions"]
