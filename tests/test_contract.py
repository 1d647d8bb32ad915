"""The preemption contract, `proxy-cli run --checkpoint-dir DIR` (issue 25,
proxyd/checkpoint/orchestrate/contract.py), on a bare machine: SIGTERM checkpoints the
job and exits 143; the same command line restores it into a fresh proxyd
and exits with the app's status; its output, concatenated over the runs, is
exactly an uninterrupted run's. Runs on the emulated backend; skips where
CRIU cannot be used. (tests/test_cluster_slurm.py and test_cluster_podman.py
run the same contract on namespace "nodes".)
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from wholeproc import (programs, tmp, daemon, require_park, reference, session, kill,  # noqa: E402,F401
                       _stop_daemons, ITER_N, BACKEND)

from gpuproxy.proxyd.checkpoint.orchestrate import contract as C  # noqa: E402
from gpuproxy.proxyd.checkpoint import criu  # noqa: E402

# GPUPROXY_TEST_BACKEND=cuda runs them on the GPU (as tests/test_whole_process.py),
# with runs long enough to be interrupted there
pytestmark = [pytest.mark.slow] + ([pytest.mark.gpu] if BACKEND == "cuda" else [])
SHORT = "60000" if BACKEND == "cuda" else ITER_N
LONG = "60000" if BACKEND == "cuda" else "2400"
_refs: dict = {}


def ref_output(b, d, tmp, n: str) -> str:
    """An uninterrupted run's output, computed once per program and length."""
    key = (str(b.argv()[0]), n)
    if key not in _refs:
        _refs[key] = reference(b, d, tmp, [n])
    return _refs[key]


def wrapper(proxy_cli, d, ckpt: Path, argv, out: Path, *extra, env=None) -> subprocess.Popen:
    """`proxy-cli run --checkpoint-dir` in the background; its stdout is
    appended to out (as a job log is), its stderr to out.err."""
    e = dict(os.environ)
    e.pop("LD_PRELOAD", None)
    e.update(env or {})
    return subprocess.Popen([*proxy_cli, "--endpoint", d.endpoint, "run", "--checkpoint-dir", str(ckpt), *extra,
                             "--", *map(str, argv)], env=e, stdin=subprocess.DEVNULL, stdout=open(out, "a"),
                            stderr=open(str(out) + ".err", "a"), start_new_session=True)


def app_pid(d, timeout=60.0, calls=1) -> int:
    """The pid of the one session of d once it made `calls` CUDA calls."""
    from gpuproxy.proxyd.client import ControlClient
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for s in ControlClient(d.endpoint, timeout_s=30).call("status")["sessions"]:
            if s["calls"] >= calls:
                return int(s["pid"])
        time.sleep(0.05)
    raise AssertionError(f"no session with {calls} calls in {d.endpoint}")


def errlines(out: Path) -> list[str]:
    return Path(str(out) + ".err").read_text().splitlines()


def test_sigterm_checkpoints_then_a_new_daemon_restores(programs, usable_criu, proxy_cli, tmp):
    """The preemption: SIGTERM -> dump, 143; proxyd gone; the same command on
    a fresh proxyd restores and finishes; output exact; `latest` goes once
    the job is done."""
    b = programs["iterative"]
    d = daemon(tmp, "ref")
    require_park(d)
    want = ref_output(b, d, tmp, SHORT)
    d.cleanup()
    d = daemon(tmp, "first")
    ckpt, out = tmp / "ckpt", tmp / "job.out"
    argv = b.argv() + [SHORT]
    w = wrapper(proxy_cli, d, ckpt, argv, out)
    pid = app_pid(d, calls=2000)
    try:
        assert w.poll() is None
        w.send_signal(signal.SIGTERM)
        assert w.wait(120) == 143, errlines(out)
        assert not criu.pid_alive(pid)
        err = errlines(out)
        assert len(err) == 1 and err[0].startswith(f"proxy-cli run: SIGTERM: checkpointed pid {pid} into "), err
        assert os.readlink(ckpt / "latest") == "ckpt-1" and sorted(os.listdir(ckpt)) == [".lock", "ckpt-1",
                                                                                          "latest"]
        job = json.loads((ckpt / "ckpt-1" / "job.json").read_text())
        assert job["argv"] == argv and job["uid"] == os.geteuid() and job["kind"] == "final"
        # the stall recorded is the one the app's shim measured, not the orchestrator's
        assert job["stall_from"] == "app" and job["stall_ms"] >= 0, job
        assert out.read_text() != want          # interrupted mid-run
        d.kill()                                 # the node is gone: a fresh proxyd
        d = daemon(tmp, "second", endpoint=d.endpoint)
        w = wrapper(proxy_cli, d, ckpt, argv, out)
        assert w.wait(300) == 0, errlines(out)
        assert out.read_text() == want
        err = errlines(out)
        assert len(err) == 2 and err[1].startswith("proxy-cli run: restored ") and f"(pid {pid}," in err[1]
        assert not (ckpt / "latest").exists()    # done: a rerun starts afresh
    finally:
        w.kill()
        kill(pid)


def test_sigterm_of_a_restored_app_checkpoints_it_again(programs, usable_criu, proxy_cli, tmp):
    """Preempted twice: the restored app (not a child of the second
    `proxy-cli run` but adopted by it) is dumped again; a third run ends it
    with its own exit status."""
    b = programs["iterative"]
    d = daemon(tmp, "ref")
    require_park(d)
    n = LONG
    want = ref_output(b, d, tmp, n)
    ckpt, out = tmp / "ckpt", tmp / "job.out"
    argv = b.argv() + [n]
    pids = []
    for i, calls in enumerate((1500, 4000)):
        if i:
            # the image waits (a node being replaced): CRIU brings the app back
            # with its monotonic clock where it stopped, 3 s behind the host's
            time.sleep(3)
        w = wrapper(proxy_cli, d, ckpt, argv, out)
        pids.append(app_pid(d, calls=calls))
        t = time.monotonic()
        w.send_signal(signal.SIGTERM)
        assert w.wait(120) == 143, errlines(out)
        took_ms = (time.monotonic() - t) * 1000
        assert os.readlink(ckpt / "latest") == f"ckpt-{i + 1}"
        # the app's stall lies inside SIGTERM -> exit, also for the restored
        # app (its shim gives its times in the host's clock: park.c)
        job = json.loads((ckpt / f"ckpt-{i + 1}" / "job.json").read_text())
        assert job["stall_from"] == "app" and 0 <= job["stall_ms"] <= took_ms, (job, took_ms)
    assert pids[0] == pids[1]
    assert sorted(os.listdir(ckpt)) == [".lock", "ckpt-1", "ckpt-2", "latest"]      # --keep 2
    w = wrapper(proxy_cli, d, ckpt, argv, out)
    assert w.wait(300) == 0, errlines(out)
    assert out.read_text() == want


def test_periodic_checkpoints_keep_and_a_node_loss(programs, usable_criu, proxy_cli, tmp):
    """--checkpoint-every: the app runs on; at most --keep images stay; when
    the whole node dies (SIGKILL of everything), the next run restores the
    newest complete one, and the app redoes only what followed it."""
    b = programs["iterative"]
    d = daemon(tmp, "ref")
    require_park(d)
    n = LONG
    want = ref_output(b, d, tmp, n)
    ckpt, out = tmp / "ckpt", tmp / "job.out"
    argv = b.argv() + [n]
    w = wrapper(proxy_cli, d, ckpt, argv, out, "--checkpoint-every", "1", "--keep", "2")
    pid = app_pid(d)
    try:
        end = time.monotonic() + 120
        while len(C.images(str(ckpt))) < 2 or C.images(str(ckpt))[-1][0] < 3:
            assert time.monotonic() < end and w.poll() is None, errlines(out)
            time.sleep(0.1)
        assert session(d, pid) is not None and w.poll() is None        # it runs on
        os.kill(w.pid, signal.SIGKILL)                                  # the node dies
        kill(pid)
        w.wait()
    finally:
        kill(pid)
    imgs = [p for _, p in C.images(str(ckpt))]
    assert len(imgs) <= 3               # two kept, plus perhaps one published as the node died
    assert os.path.realpath(ckpt / "latest") == imgs[-1]
    for p in imgs:
        assert json.loads((Path(p) / "job.json").read_text())["kind"] == "periodic"
    for ln in errlines(out):
        assert "checkpoint ckpt-" in ln and "written (the app runs on)" in ln, ln
    first = out.read_text()
    end = time.monotonic() + 60
    while os.path.exists(f"/proc/{pid}"):      # the orphaned app's zombie is reaped by init
        assert time.monotonic() < end, f"pid {pid} never reaped"
        time.sleep(0.1)
    d.kill()
    d = daemon(tmp, "second", endpoint=d.endpoint)
    out2 = tmp / "job2.out"
    w = wrapper(proxy_cli, d, ckpt, argv, out2)
    assert w.wait(300) == 0, errlines(out2)
    second = out2.read_text()
    # the restored app continues from the checkpoint: its output is the end
    # of an uninterrupted run, and the first run printed at least what it skips
    assert second and want.endswith(second) and first.startswith(want[:len(want) - len(second)])


def test_another_command_is_refused(programs, usable_criu, proxy_cli, tmp):
    b = programs["iterative"]
    d = daemon(tmp)
    require_park(d)
    ckpt, out = tmp / "ckpt", tmp / "job.out"
    w = wrapper(proxy_cli, d, ckpt, b.argv() + [SHORT], out)
    pid = app_pid(d, calls=500)
    w.send_signal(signal.SIGTERM)
    assert w.wait(120) == 143, errlines(out)
    out2 = tmp / "other.out"
    r = wrapper(proxy_cli, d, ckpt, b.argv() + ["7"], out2)
    assert r.wait(60) == 1
    err = errlines(out2)
    assert len(err) == 1 and "is of another command" in err[0] and "refusing" in err[0], err
    assert not criu.pid_alive(pid) and os.readlink(ckpt / "latest") == "ckpt-1"


def test_sigterm_before_the_first_cuda_call(proxy_cli, shim_installed, tmp):
    """Nothing to checkpoint yet: one line, 143, no image."""
    from proxy import Daemon
    d = Daemon(backend="emu")
    d.start()
    try:
        ckpt, out = tmp / "ckpt", tmp / "job.out"
        w = wrapper(proxy_cli, d, ckpt, ["sh", "-c", "echo started; exec sleep 60"], out)
        end = time.monotonic() + 30
        while "started" not in out.read_text():
            assert time.monotonic() < end
            time.sleep(0.05)
        w.send_signal(signal.SIGTERM)
        assert w.wait(60) == 143
        err = errlines(out)
        assert len(err) == 1 and "SIGTERM before sh made its first CUDA call" in err[0] and "no image" in err[0]
        assert not (ckpt / "latest").exists() and not C.images(str(ckpt))
    finally:
        d.cleanup()


def test_failed_dump_leaves_the_previous_image(programs, usable_criu, proxy_cli, tmp):
    """A dump that fails (here: no CRIU) says so in one line, ends the app
    with 143, and `latest` still names the last complete image."""
    b = programs["iterative"]
    d = daemon(tmp)
    require_park(d)
    ckpt, out = tmp / "ckpt", tmp / "job.out"
    argv = b.argv() + [LONG]
    w = wrapper(proxy_cli, d, ckpt, argv, out, "--checkpoint-every", "1")
    pid = app_pid(d)
    end = time.monotonic() + 120
    while not (ckpt / "latest").exists():
        assert time.monotonic() < end and w.poll() is None, errlines(out)
        time.sleep(0.1)
    kill(pid)
    w.wait(60)
    before = os.readlink(ckpt / "latest")
    # a second job on the same directory whose CRIU is missing
    out2 = tmp / "job2.out"
    (ckpt / "latest").unlink()
    d = daemon(tmp, "second", endpoint=f"ipc://{tmp}/second.sock")
    w = wrapper(proxy_cli, d, ckpt, argv, out2, env={"GPUPROXY_CRIU": str(tmp / "no" / "criu")})
    pid = app_pid(d, calls=500)
    os.symlink(before, ckpt / ".l")
    os.replace(ckpt / ".l", ckpt / "latest")         # as if an earlier checkpoint had been published
    w.send_signal(signal.SIGTERM)
    assert w.wait(120) == 143
    err = errlines(out2)
    assert len(err) == 1 and "SIGTERM: the checkpoint failed" in err[0] and "no usable CRIU" in err[0], err
    assert f"keeps its image {before}" in err[0]
    assert os.readlink(ckpt / "latest") == before and not any(n.startswith(".tmp-") for n in os.listdir(ckpt))
    assert not criu.pid_alive(pid)


# ------------------------------------------------------------------ the directory, without processes

def test_publish_is_atomic_and_prune_keeps_latest(tmp):
    d = tmp / "c"
    d.mkdir()
    for seq in (1, 2, 3):
        t = d / f".tmp-{seq}"
        t.mkdir()
        (t / "manifest").write_text("x")
        C.publish(str(d), str(t), seq, {"version": 1, "argv": ["a"], "uid": 0})
        assert os.readlink(d / "latest") == f"ckpt-{seq}"
    assert [s for s, _ in C.images(str(d))] == [1, 2, 3]
    C.prune(str(d), 1)
    assert [s for s, _ in C.images(str(d))] == [3] and C.latest(str(d)) == str(d / "ckpt-3")
    (d / ".tmp-4").mkdir()
    assert C.clean_tmp(str(d)) == [".tmp-4"]
    (d / "latest").unlink()
    os.symlink("/etc", d / "latest")
    with pytest.raises(C.ContractError, match="not to a ckpt-<n> image"):
        C.latest(str(d))


def test_identity_refusals(tmp):
    img = tmp / "ckpt-1"
    img.mkdir()
    (img / "job.json").write_text(json.dumps({"version": 1, "argv": ["train", "--lr", "1"], "uid": 4242}))
    with pytest.raises(C.ContractError, match="made by uid 4242"):
        C.check_identity(str(img), {"argv": ["train", "--lr", "1"], "uid": 1000})
    with pytest.raises(C.ContractError, match="another command"):
        C.check_identity(str(img), {"argv": ["train", "--lr", "2"], "uid": 4242})
    assert C.check_identity(str(img), {"argv": ["train", "--lr", "1"], "uid": 4242})["uid"] == 4242


def test_cli_arguments(proxy_cli):
    r = subprocess.run([*proxy_cli, "run", "--keep", "2", "--", "true"], capture_output=True, text=True)
    assert r.returncode == 2 and "need --checkpoint-dir" in r.stderr
    r = subprocess.run([*proxy_cli, "run", "--checkpoint-dir", "/tmp/x", "--checkpoint-every", "-1", "--", "true"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "not a positive number" in r.stderr and "Traceback" not in r.stderr
