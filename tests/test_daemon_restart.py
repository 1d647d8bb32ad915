"""No job is lost to a daemon restart (issue 26), on the emulated backend:

 - a client whose session was dumped (GPU-only) keeps waiting for its
   restore whatever daemon answers meanwhile: proxyd killed, a new one
   started, the app calls CUDA, and only then the restore comes;
 - a stopping daemon removes only its own socket, so a daemon started while
   the old one stops stays reachable; a second daemon on a live endpoint
   refuses to start, in one line;
 - a killed proxyd fails the client's call with one message naming the
   endpoint (not one per later call);
 - what a killed daemon or a never-restored client leaves behind (workers'
   socket folders, session markers in /dev/shm) is swept at the next start.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from paced import PacedRun  # noqa: E402
from proxy import Daemon, children, ping  # noqa: E402
from test_checkpoint import BACKEND, ctl, daemon, expected, programs, tmp  # noqa: E402,F401

pytestmark = [pytest.mark.gpu] if BACKEND == "cuda" else []


@pytest.mark.parametrize("gap_s", [0, 4])
def test_waiting_client_survives_a_new_daemon_before_the_restore(programs, tmp, gap_s):
    """gap_s: how long no daemon runs at all (longer than the client's
    GPUPROXY_TIMEOUT_MS, 2 s here) while the app calls CUDA."""
    b = programs["iterative"]
    d = daemon(tmp)
    try:
        with PacedRun(b, d, env={"GPUPROXY_TIMEOUT_MS": "2000"}) as run:
            run.step_to(5)
            img = tmp / "img"
            st = ctl(d, "dump", pid=run.pid, dir=str(img))
            assert st["released"]
            d.kill()
            if gap_s:
                run.release(3)
                time.sleep(gap_s)
                assert run.proc.poll() is None, run.stderr()
            d = daemon(tmp, "proxyd2")
            # the app calls CUDA now (if it did not already): its worker is
            # gone, and the new daemon does not know its session until the restore
            run.release(0 if gap_s else 3)
            time.sleep(3)
            assert run.proc.poll() is None, run.stderr()
            r = ctl(d, "restore", dir=str(img))
            assert r["pid"] == run.pid
            out = run.finish()
            assert out == expected(b), run.stderr()
            assert "does not know this process's session" not in run.stderr()
        assert not [n for n in os.listdir("/dev/shm") if n.startswith("gpuproxy-released-") and
                    n.endswith(f"-{run.pid}")]
    finally:
        d.cleanup()


def test_released_marker_goes_when_the_client_ends(programs, tmp):
    b = programs["iterative"]
    d = daemon(tmp)
    try:
        run = PacedRun(b, d)
        run.step_to(2)
        ctl(d, "dump", pid=run.pid, dir=str(tmp / "img"))
        mine = [n for n in os.listdir("/dev/shm") if n.startswith("gpuproxy-released-") and n.endswith(f"-{run.pid}")]
        assert len(mine) == 1
        run.proc.kill()
        run.proc.wait()
        end = time.monotonic() + 10
        while os.path.exists(f"/dev/shm/{mine[0]}") and time.monotonic() < end:
            time.sleep(0.1)
        assert not os.path.exists(f"/dev/shm/{mine[0]}")
    finally:
        d.cleanup()


def test_killed_daemon_fails_the_client_with_one_message(programs, tmp):
    b = programs["iterative"]
    d = daemon(tmp)
    try:
        run = PacedRun(b, d)
        run.step_to(3)
        d.kill()
        run.release(50)
        rc = run.proc.wait(120)
        time.sleep(0.3)
        err = run.stderr()
        assert rc != 0
        mine = [line for line in err.splitlines() if line.startswith("gpuproxy:")]
        assert len(mine) == 1, err
        assert d.endpoint in mine[0] and "stopped answering" in mine[0], err
    finally:
        d.cleanup()


def _start(endpoint: str, log: Path) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    return subprocess.Popen([sys.executable, "-m", "gpuproxy.proxyd", "--backend", "emu", "--endpoint", endpoint],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _wait_ping(endpoint: str, s: float = 30) -> bool:
    end = time.monotonic() + s
    while time.monotonic() < end:
        if ping(endpoint):
            return True
        time.sleep(0.1)
    return False


def test_second_daemon_on_a_live_endpoint_refuses_in_one_line(tmp):
    d = daemon(tmp)
    try:
        p = _start(d.endpoint, tmp / "second.log")
        assert p.wait(60) != 0
        lines = [x for x in (tmp / "second.log").read_text().splitlines() if x.strip()]
        assert len(lines) == 1 and "already serves" in lines[0], lines
        assert ping(d.endpoint, 2.0)
    finally:
        d.cleanup()


def test_daemon_started_while_the_old_one_stops_stays_reachable(tmp):
    """SIGTERM to the old daemon and a new one started at once (a systemd
    restart, a DaemonSet update). The old one is held stopped (SIGSTOP)
    with its SIGTERM pending while the new one starts, so that the old one
    shuts down after the new one has taken the endpoint."""
    old = daemon(tmp)
    new = None
    try:
        os.kill(old.proc.pid, signal.SIGSTOP)
        os.kill(old.proc.pid, signal.SIGTERM)
        new = _start(old.endpoint, tmp / "new.log")
        time.sleep(2.0)                     # the new one finds the endpoint held
        os.kill(old.proc.pid, signal.SIGCONT)
        old.proc.wait(30)                   # the old one has shut down completely
        assert _wait_ping(old.endpoint), (tmp / "new.log").read_text()
        assert new.poll() is None
        time.sleep(0.5)
        assert ping(old.endpoint, 2.0), "the stopping daemon removed the new daemon's socket"
    finally:
        if new is not None:
            new.terminate()
            new.wait(30)
        old.cleanup()


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def test_killed_daemons_workers_folder_is_swept_at_the_next_start(tmp):
    d = daemon(tmp)
    pid = d.proc.pid
    wdirs = list(tmp.glob(f"gpuproxy-workers-{pid}-*"))       # (sockfile.worker_dir_name)
    assert len(wdirs) == 1 and wdirs[0].is_dir(), wdirs
    wdir = wdirs[0]
    workers = children(pid)
    d.kill()
    assert wdir.is_dir()
    # its workers notice the supervisor's death and exit; a socket still served
    # by one is never swept (a loaded machine took longer than the restart)
    end = time.monotonic() + 30
    while any(os.path.exists(f"/proc/{w}") and _state(w) != "Z" for w in workers):
        assert time.monotonic() < end, "the killed supervisor's workers did not exit"
        time.sleep(0.1)
    d = daemon(tmp, "proxyd2")
    try:
        assert not wdir.exists()
    finally:
        d.cleanup()
    assert not list(tmp.glob("gpuproxy-workers-*"))


def test_markers_of_gone_clients_are_swept(tmp):
    from gpuproxy.proxyd.supervisor import markers
    dead = subprocess.Popen(["true"])
    dead.wait()
    names = [f"gpuproxy-{k}-0123456789abcdef-{dead.pid}" for k in ("parked", "resume", "released")]
    live = f"gpuproxy-released-0123456789abcdef-{os.getpid()}"
    for n in names + [live]:
        (tmp / n).write_text("x")
        os.utime(tmp / n, (time.time() - 60, time.time() - 60))
    (tmp / "gpuproxy-parked-fedcba9876543210-999999999").write_text("x")   # new: kept (it may be starting)
    assert markers.sweep(str(tmp)) == 3
    left = sorted(os.listdir(tmp))
    assert left == sorted([live, "gpuproxy-parked-fedcba9876543210-999999999"])


def test_restoring_an_older_image_than_the_session_is_refused(programs, tmp):
    """dump A (the app runs on), more calls, dump B (released), restore A:
    refused in one line; B is then restored and the app ends as it should."""
    from gpuproxy.proxyd.client import ControlError
    b = programs["iterative"]
    d = daemon(tmp)
    try:
        with PacedRun(b, d) as run:
            run.step_to(4)
            ctl(d, "dump", pid=run.pid, dir=str(tmp / "a"), leave_running=True)
            run.step_to(9)
            assert ctl(d, "dump", pid=run.pid, dir=str(tmp / "b"))["released"]
            for daemon_now in ("same", "restarted"):
                if daemon_now == "restarted":
                    d.kill()
                    d = daemon(tmp, "proxyd2")
                with pytest.raises(ControlError) as e:
                    ctl(d, "restore", dir=str(tmp / "a"))
                msg = str(e.value)
                assert "older than the session's state" in msg and "\n" not in msg, msg
            r = ctl(d, "restore", dir=str(tmp / "b"))
            assert r["pid"] == run.pid
            assert run.finish() == expected(b), run.stderr()
    finally:
        d.cleanup()


def test_app_killed_during_a_dump_leaves_one_line_and_no_hang(programs, tmp):
    """The app is killed at various moments of a dump: the command answers
    (an image, or one line saying the session ended) instead of waiting
    for ever, and proxyd's log holds no traceback."""
    import threading
    from gpuproxy.proxyd.client import ControlClient, ControlError
    b = programs["iterative"]
    d = daemon(tmp)
    try:
        for i in range(8):
            run = PacedRun(b, d)
            run.step_to(3)
            res = {}

            def dump():
                try:
                    res["ok"] = ControlClient(d.endpoint, timeout_s=60).call(
                        "dump", {"pid": run.pid, "dir": str(tmp / f"img{i}"), "leave_running": i % 2 == 1})
                except ControlError as e:
                    res["error"] = str(e)
            t = threading.Thread(target=dump)
            t.start()
            time.sleep(0.01 * (i // 2))
            run.kill()
            t.join(90)
            assert res, "the dump command never ended"
            assert "no answer" not in res.get("error", ""), res
        time.sleep(0.5)
        assert "Traceback" not in d.log(), d.log()[-3000:]
    finally:
        d.cleanup()


def _in_own_pid_namespace(tmp: Path, name: str) -> subprocess.Popen:
    """proxyd as pid 2 of a pid namespace of its own (a container's, or a
    test runner's namespace beside another's; pid 1 is a shell waiting for
    it), its endpoint in tmp."""
    log = open(tmp / f"{name}.log", "ab")
    cmd = f"{sys.executable} -m gpuproxy.proxyd --backend emu --endpoint ipc://{tmp}/{name}.sock; true"
    return subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", cmd],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _supervisor(p: subprocess.Popen) -> int:
    """The host pid of the proxyd under unshare and its shell."""
    sh = children(p.pid)
    sup = [c for s in sh for c in children(s)]
    assert len(sup) == 1, (sh, sup)
    return sup[0]


def _their_sockets(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("gpuproxy-workers-2*/*.sock"))


def test_daemons_of_one_pid_in_two_pid_namespaces_keep_their_workers_sockets_apart(tmp):
    """Two supervisors of one pid (each in its own pid namespace) with
    their endpoints in one folder: each has its own workers' folder, so the
    one that stops removes only its own. Before, both used
    gpuproxy-workers-2, and the first to stop removed the other's workers'
    sockets: its clients could not reach their workers again (a whole-process
    job dump's ranks, reconnecting after their park, hung)."""
    from gpuproxy.proxyd.core.sockfile import _connectable
    if subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode:
        pytest.skip("unshare(1) cannot make a pid namespace here (needs root)")
    a = _in_own_pid_namespace(tmp, "a")
    b = _in_own_pid_namespace(tmp, "b")
    try:
        end = time.monotonic() + 60
        while not (ping(f"ipc://{tmp}/a.sock", 1.0) and ping(f"ipc://{tmp}/b.sock", 1.0)
                   and len(_their_sockets(tmp)) >= 2):
            assert a.poll() is None and b.poll() is None and time.monotonic() < end, \
                (tmp / "a.log").read_text() + (tmp / "b.log").read_text()
            time.sleep(0.1)
        os.kill(_supervisor(a), signal.SIGTERM)        # a stops
        a.wait(30)
        assert ping(f"ipc://{tmp}/b.sock", 2.0)
        left = _their_sockets(tmp)
        assert left and all(_connectable(str(p)) for p in left), \
            f"the stopping daemon removed the other's workers' sockets: {left}"
    finally:
        for p in (a, b):
            if p.poll() is None:
                try:
                    os.kill(_supervisor(p), signal.SIGTERM)
                except (AssertionError, OSError):
                    pass
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()


def test_worker_of_a_supervisor_that_is_pid_1_stays():
    """proxyd as a container's entrypoint is pid 1: its workers' parent is
    pid 1 and they must not take that for a supervisor already gone
    (worker/entry.py); a worker whose named supervisor is not its parent
    (re-parented after the supervisor died) ends at once."""
    code = ("import os, sys; os.environ['GPUPROXY_SUPERVISOR_PID'] = sys.argv[1]; "
            "from gpuproxy.proxyd.worker.entry import _supervisor_gone; print(_supervisor_gone())")
    # in a new pid namespace the child's parent, the namespace's first process, is pid 1
    r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c",
                        f'"{sys.executable}" -c "{code}" 1; "{sys.executable}" -c "{code}" 2'],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0 and "Operation not permitted" in r.stderr:
        pytest.skip("no pid namespaces here: " + r.stderr.strip())
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True"], r.stdout + r.stderr
