"""The consistent cut of a multi-rank NCCL job (issue 22, part 4), on the
emulated backend with emulated collectives between the ranks' workers.

tests/programs_extra/nccl_loop.cu forks N ranks (each its own process,
session and worker) that loop over all-reduces on a communicator and on a
split of it, with their state in device memory. A run is checkpointed in
the middle with `proxy-cli dump --job ROOT --gpu-only` (every rank held at
one collective boundary, then dumped); the daemon is killed and a new one
started while the ranks wait; `proxy-cli restore --dir` brings every rank
back (optionally onto other devices) and makes the communicators again; the
job's printed checksums must equal those of an uninterrupted run of the
same program (the reference is that run, not anything computed here).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import corpus  # noqa: E402
from proxy import Daemon, children  # noqa: E402

EXTRA = Path(__file__).parent / "programs_extra"
CLI = [sys.executable, "-m", "gpuproxy.cli"]
STEPS = 36


@pytest.fixture(scope="module")
def loop_prog(shim_installed, nvcc):
    src = EXTRA / "nccl_loop.cu"
    prog = corpus.Program(name="nccl_loop", source=src.name, link=("-lnccl",), cubins=(), args=(), emu=None,
                          expected="", driver=None, pace=False, proxy_only=False, source_path=src)
    return corpus.build(prog, corpus.default_build_dir() / "programs_extra")


def _daemon(tmp: Path, name: str) -> Daemon:
    return Daemon(backend="emu", endpoint=f"ipc://{tmp}/proxyd.sock", extra_args=["--emu-devices", "2"],
                  log_path=str(tmp / f"{name}.log")).start()


def _cli(d: Daemon, *args) -> dict:
    r = subprocess.run(CLI + ["--endpoint", d.endpoint, *args, "--json"], capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, f"proxy-cli {' '.join(args)}: {r.stdout}\n{r.stderr}\n{d.log()[-3000:]}"
    return json.loads(r.stdout)


class Job:
    """The launcher running under proxyd; stderr read on a thread (rank 0's
    step lines)."""

    def __init__(self, prog, d: Daemon, n: int, pace_us: int, gate: Path | None = None, env: dict | None = None):
        env = d.env_for_client({"GPUPROXY_TIMEOUT_MS": "2000", **({"NCCL_LOOP_GATE": str(gate)} if gate else {}),
                                **(env or {})})
        self.gate = gate
        self.p = subprocess.Popen(prog.argv() + [str(n), str(STEPS), str(pace_us)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.step = -1
        self.err: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stderr:
            self.err.append(line)
            if line.startswith("step "):
                self.step = int(line.split()[1])

    def wait_step(self, k: int, timeout_s: float = 120, d: Daemon | None = None):
        t = time.monotonic()
        while self.step < k:
            assert self.p.poll() is None, "".join(self.err)
            assert time.monotonic() - t < timeout_s, \
                f"no step {k}: {''.join(self.err)[-2000:]}" + (state(d) if d is not None else "")
            time.sleep(0.01)

    def finish(self, timeout_s: float = 180, d: Daemon | None = None) -> str:
        """The job's stdout once it has ended (its few lines fit the pipe);
        a job that does not end within timeout_s is killed and fails the
        test with what proxyd says of it, never a runner waiting for good."""
        if self.gate is not None:
            self.gate.touch()
        try:
            self.p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the job did not end within {timeout_s:.0f} s: {''.join(self.err)[-2000:]}"
                                 + (state(d) if d is not None else "")) from None
        return self.p.stdout.read()

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


STATE_KEYS = ("pid", "state", "busy", "frozen", "checkpoint", "calls", "last_seq", "queued", "out_of_order",
              "nccl_hold", "why")


def state(d: Daemon) -> str:
    """For a failure's message: every session of the job in one line (its
    state, the message order its worker sees, its communicators and hold;
    of a worker that did not answer, its last figures), then each worker's
    thread stacks in the end of proxyd's log (SIGUSR2: worker/entry.py), so
    that a job that stopped shows where each rank waits."""
    from gpuproxy.proxyd.client import ControlClient
    try:
        st = ControlClient(d.endpoint, timeout_s=10).call("status", {})
        lines = []
        for s in st.get("sessions") or []:
            row = {k: s[k] for k in STATE_KEYS if s.get(k) is not None}
            row["nccl"] = [f"{c.get('rank')}/{c.get('nranks')} seq {c.get('seq')} {c.get('state')}"
                           for c in s.get("nccl") or []]
            lines.append(json.dumps(row, default=str))
        sessions = "\n".join(lines)
    except Exception as e:        # the message must come out whatever proxyd's state
        sessions = f"(status failed: {e})"
    log = before = d.log()
    stacks = []
    for w in children(d.proc.pid) if d.proc is not None else []:
        # one worker at a time, so that each stack in the log is known as its
        # (faulthandler writes no pid)
        try:
            os.kill(w, signal.SIGUSR2)
        except OSError:
            continue
        time.sleep(0.5)
        now = d.log()
        stacks.append(f"--- worker {w}:\n{now[len(log):][-6000:]}")
        log = now
    return (f"\nproxyd's sessions:\n{sessions}\nproxyd's log: {before[-4000:]}\nits workers' stacks:\n"
            + "\n".join(stacks))


def reference(prog, tmp: Path, n: int, env: dict | None = None) -> str:
    d = _daemon(tmp, "reference")
    try:
        j = Job(prog, d, n, 0, env=env)
        out = j.finish(d=d)
    finally:
        d.stop()
    assert j.p.returncode == 0 and out.endswith(f"DONE nccl_loop {n}\n"), out + "".join(j.err)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("n,device_map", [(2, None), (4, "0=1,1=0")])
def test_job_dumped_mid_run_daemon_restarted_restored_equals_uninterrupted(loop_prog, tmp_path, n, device_map):
    ref = reference(loop_prog, tmp_path, n)
    d = _daemon(tmp_path, "proxyd")
    j = Job(loop_prog, d, n, 60000, tmp_path / "gate")
    try:
        j.wait_step(STEPS // 3)
        img = tmp_path / "job"
        res = _cli(d, "dump", "--job", str(j.p.pid), "--dir", str(img), "--gpu-only")
        assert len(res["ranks"]) == n and res["released"] and res["communicators"] >= 2, res
        at = j.step
        assert at < STEPS - 1, "the job ended before the dump: nothing was tested"
        job = json.loads((img / "job.json").read_text())
        # one boundary: every communicator at the same sequence in every rank
        seqs: dict[str, set] = {}
        for r in job["ranks"]:
            for c in r["comms"]:
                seqs.setdefault(c["ident"], set()).add(c["seq"])
        assert all(len(v) == 1 for v in seqs.values()), seqs
        d.kill()
        d = _daemon(tmp_path, "proxyd2")
        time.sleep(1.0)
        assert j.p.poll() is None and j.step <= at + 1, "".join(j.err)    # the ranks wait for their restore
        args = ["restore", "--dir", str(img), "--gpu-only"] + (["--device-map", device_map] if device_map else [])
        r = _cli(d, *args)
        assert sorted(r["ranks"]) == sorted(res["ranks"]) and r["communicators"] == res["communicators"], r
        out = j.finish(d=d)
        assert j.p.returncode == 0, out + "".join(j.err) + d.log()[-3000:]
        assert out == ref, f"{out}\nvs uninterrupted\n{ref}"
        if device_map:
            st = _cli(d, "status")
            assert st is not None
    finally:
        j.kill()
        d.stop()


@pytest.mark.slow
def test_job_launching_captured_all_reduces_dumped_restored_equals_uninterrupted(loop_prog, tmp_path):
    """$NCCL_LOOP_GRAPH: every step's all-reduce over everyone is a launch
    of a graph that captured it. The hold counts a graph launch as the
    collectives its graph holds (nccl_cut.py, "Graph launches"), so the cut
    is one boundary with the launches counted, and the restored job ends as
    an uninterrupted one."""
    n, env = 2, {"NCCL_LOOP_GRAPH": "1"}
    ref = reference(loop_prog, tmp_path, n, env)
    d = _daemon(tmp_path, "proxyd")
    j = Job(loop_prog, d, n, 60000, tmp_path / "gate", env)
    try:
        j.wait_step(STEPS // 3)
        img = tmp_path / "job"
        res = _cli(d, "dump", "--job", str(j.p.pid), "--dir", str(img), "--gpu-only")
        assert len(res["ranks"]) == n and res["released"], res
        at = j.step
        assert at < STEPS - 1, "the job ended before the dump: nothing was tested"
        job = json.loads((img / "job.json").read_text())
        seqs: dict[str, set] = {}
        for r in job["ranks"]:
            for c in r["comms"]:
                seqs.setdefault(c["ident"], set()).add(c["seq"])
        assert all(len(v) == 1 for v in seqs.values()), seqs
        # the world communicator counted every launched all-reduce (one per
        # step, plus the split), not only the one captured
        assert max(min(v) for v in seqs.values()) >= STEPS // 3, seqs
        d.kill()
        d = _daemon(tmp_path, "proxyd2")
        r = _cli(d, "restore", "--dir", str(img), "--gpu-only")
        assert sorted(r["ranks"]) == sorted(res["ranks"]), r
        out = j.finish(d=d)
        assert j.p.returncode == 0, out + "".join(j.err) + d.log()[-3000:]
        assert out == ref, f"{out}\nvs uninterrupted\n{ref}"
    finally:
        j.kill()
        d.stop()


@pytest.mark.gpu
def test_job_launching_captured_all_reduces_on_gpus_cut_restored_equals_native(loop_prog, tmp_path):
    """The same on two GPUs with NVIDIA's NCCL in the workers: there the
    driver's executable graph runs the captured collectives, and the
    worker counts them at each launch (graph_libcapture.LibCapture.launch);
    a restore captures them again once the communicators exist
    (nccl-release). Reference: the program natively."""
    from gpuproxy.proxyd.backends.cuda import CudaBackend
    if CudaBackend().device_count() < 2:
        pytest.skip("needs 2 GPUs")
    n, env = 2, {"NCCL_LOOP_GRAPH": "1", "NCCL_NVLS_ENABLE": "0"}
    nat_env = dict(os.environ, **env)
    nat_env.pop("LD_PRELOAD", None)
    nat = subprocess.run(loop_prog.argv() + [str(n), str(STEPS), "0"], env=nat_env, capture_output=True, text=True,
                         timeout=300)
    assert nat.returncode == 0 and nat.stdout.endswith(f"DONE nccl_loop {n}\n"), nat.stdout + nat.stderr

    def cuda_daemon(name):
        return Daemon(backend="cuda", endpoint=f"ipc://{tmp_path}/proxyd.sock",
                      env={**os.environ, "GPUPROXY_SESSION_PRIMARY": "1"},
                      log_path=str(tmp_path / f"{name}.log")).start()
    d = cuda_daemon("proxyd")
    j = Job(loop_prog, d, n, 60000, tmp_path / "gate", env)
    try:
        j.wait_step(STEPS // 3)
        img = tmp_path / "job"
        res = _cli(d, "dump", "--job", str(j.p.pid), "--dir", str(img), "--gpu-only")
        assert len(res["ranks"]) == n and res["released"], res
        job = json.loads((img / "job.json").read_text())
        seqs: dict[str, set] = {}
        for r in job["ranks"]:
            for c in r["comms"]:
                seqs.setdefault(c["ident"], set()).add(c["seq"])
        assert all(len(v) == 1 for v in seqs.values()) and max(min(v) for v in seqs.values()) >= STEPS // 3, seqs
        d.kill()
        d = cuda_daemon("proxyd2")
        _cli(d, "restore", "--dir", str(img), "--gpu-only")
        out = j.finish(d=d)
        assert j.p.returncode == 0, out + "".join(j.err) + d.log()[-3000:]
        assert out == nat.stdout, f"{out}\nvs native\n{nat.stdout}"
    finally:
        j.kill()
        d.stop()


@pytest.mark.slow
def test_job_checkpointed_twice_while_running_goes_on_unchanged(loop_prog, tmp_path):
    """--leave-running: periodic checkpoints of a running job; the ranks are
    held only for the cut and the dump, and the result is unchanged."""
    n = 2
    ref = reference(loop_prog, tmp_path, n)
    d = _daemon(tmp_path, "proxyd")
    j = Job(loop_prog, d, n, 60000, tmp_path / "gate")
    try:
        for i, k in enumerate((STEPS // 4, STEPS // 2)):      # both before the gate at 2/3
            j.wait_step(k, d=d)
            res = _cli(d, "dump", "--pids", ",".join(str(p) for p in _ranks(d, j.p.pid)), "--dir",
                       str(tmp_path / f"ck{i}"), "--gpu-only", "--leave-running")
            assert not res["released"] and len(res["ranks"]) == n, res
        out = j.finish(d=d)
        assert j.p.returncode == 0 and out == ref, out + "".join(j.err)
    finally:
        j.kill()
        d.stop()


def _ranks(d: Daemon, root: int) -> list[int]:
    from gpuproxy.proxyd.checkpoint.orchestrate.multirank import tree_pids
    from gpuproxy.proxyd.client import ControlClient
    st = ControlClient(d.endpoint, timeout_s=60).call("status", {})
    tree = set(tree_pids(root))
    return [s["pid"] for s in st["sessions"] if s["pid"] in tree]


def test_a_dump_of_one_rank_alone_is_refused(loop_prog, tmp_path):
    """A plain dump of one rank says it needs the job's consistent cut, and
    the job goes on unharmed."""
    d = _daemon(tmp_path, "proxyd")
    j = Job(loop_prog, d, 2, 20000, tmp_path / "gate")
    try:
        j.wait_step(2)
        pid = _ranks(d, j.p.pid)[0]
        r = subprocess.run(CLI + ["--endpoint", d.endpoint, "dump", "--pid", str(pid), "--dir",
                                  str(tmp_path / "one"), "--gpu-only"], capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and "consistent cut" in r.stderr and "--job" in r.stderr, r.stdout + r.stderr
        assert "Traceback" not in r.stderr
        out = j.finish(d=d)
        assert j.p.returncode == 0 and out.endswith("DONE nccl_loop 2\n"), out + "".join(j.err)
    finally:
        j.kill()
        d.stop()


@pytest.mark.parametrize("devices,env,want", [(1, None, 2), (4, None, 4), (4, "3", 3)])
def test_proxyd_restores_one_rank_per_gpu_at_once(tmp_path, devices, env, want):
    """A job's ranks are restored as many at a time as proxyd says in its
    status (max_restores: one per GPU, at least 2, or GPUPROXY_MAX_RESTORES);
    it was 2 whatever the node, so a 4-rank job came back in two rounds."""
    from gpuproxy.proxyd.client import ControlClient
    extra = {"GPUPROXY_MAX_RESTORES": env} if env else {}
    d = Daemon(backend="emu", endpoint=f"ipc://{tmp_path}/proxyd.sock", extra_args=["--emu-devices", str(devices)],
               env={**{k: v for k, v in os.environ.items() if k != "GPUPROXY_MAX_RESTORES"}, **extra},
               log_path=str(tmp_path / "proxyd.log")).start()
    try:
        assert ControlClient(d.endpoint, timeout_s=30).call("status", {})["max_restores"] == want
    finally:
        d.stop()
