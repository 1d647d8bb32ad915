"""The whole-process form of a job's consistent checkpoint (issue 22, part
4; docs/multigpu.md): tests/programs_extra/nccl_loop.cu's launcher and its
2 ranks, dumped mid-run with `proxy-cli dump --job ROOT` (the cut, every
rank parked inside its held call, GPU state, one CRIU dump of the tree),
the tree gone, proxyd killed and started again, `proxy-cli restore --dir`
(GPU state, communicators made again, CRIU restore of the tree, every
rank resumed): the launcher's printed checksums must equal those of an
uninterrupted run of the same program.

The job's standard streams are files (stdin /dev/null): CRIU restores files
at their offsets, while a pipe to the test runner would not reach the
restored tree; it is a plain child of the test, so CRIU's --shell-job is
chosen (see tests/test_whole_process.py).
"""
from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_nccl_cut import STEPS, _cli, _daemon, _ranks, loop_prog, reference, state  # noqa: E402,F401
from test_criu import runner_session_visible  # noqa: E402
from wholeproc import require_park  # noqa: E402
from gpuproxy.proxyd.client import ControlClient  # noqa: E402

N = 2


def _status(d) -> dict:
    return ControlClient(d.endpoint, timeout_s=30).call("status", {})


def _step(err: Path) -> int:
    steps = [int(x.split()[1]) for x in err.read_text(errors="replace").splitlines() if x.startswith("step ")]
    return max(steps, default=-1)


def _check_stall(res: dict, img: Path) -> None:
    """Every rank's shim gave its own stall (job_stall.py): the job's is the
    largest, within the coordinator's window (the park and the resume lie
    inside it: one clock, CLOCK_MONOTONIC), and job.json says the same."""
    per = res["ranks_app_stopped_ms"]
    assert res["stall_from"] == "app" and sorted(map(int, per)) == sorted(res["ranks"]), res
    assert all(isinstance(v, float) and v > 0 for v in per.values()), per
    assert res["app_stopped_ms"] == max(per.values()) <= res["stall_ms"] + 0.1, res
    job = json.loads((img / "job.json").read_text())
    assert job["stall_from"] == "app" and job["stall_ms"] == res["app_stopped_ms"], job
    assert job["ranks_app_stopped_ms"] == per and job["coordinator_stall_ms"] == res["stall_ms"], job


@pytest.mark.parametrize("named_by", ["job", "pids"])
def test_job_whole_process_dumped_gone_daemon_restarted_restored_equals_uninterrupted(loop_prog, usable_criu,
                                                                                       tmp_path, named_by):
    """named_by pids: `dump --pids RANK,RANK` (no --gpu-only) dumps the
    tree of the ranks' common parent, the launcher (job_tree.py), as
    --job LAUNCHER does."""
    ref = reference(loop_prog, tmp_path, N)
    d = _daemon(tmp_path, "proxyd")
    require_park(d)
    out, err = tmp_path / "job.out", tmp_path / "job.err"
    env = d.env_for_client({"GPUPROXY_TIMEOUT_MS": "2000", "NCCL_LOOP_GATE": str(tmp_path / "gate")})
    with open(out, "w") as fo, open(err, "w") as fe:
        p = subprocess.Popen(loop_prog.argv() + [str(N), str(STEPS), "60000"], env=env, stdin=subprocess.DEVNULL,
                             stdout=fo, stderr=fe,
                             # its own session where the runner's is out of reach (CI: see wholeproc.start)
                             start_new_session=not runner_session_visible())
    root = p.pid
    try:
        t = time.monotonic()
        while _step(err) < STEPS // 3:
            assert p.poll() is None, err.read_text()
            assert time.monotonic() - t < 60, err.read_text()
            time.sleep(0.02)
        img = tmp_path / "job"
        who = ["--job", str(root)] if named_by == "job" else ["--pids", ",".join(map(str, _ranks(d, root)))]
        res = _cli(d, "dump", *who, "--dir", str(img))
        assert len(res["ranks"]) == N and res["communicators"] >= 2 and not res["leave_running"], res
        assert res["root"] == root, res
        assert root in res["criu"]["pids"] and all(r in res["criu"]["pids"] for r in res["ranks"]), res
        _check_stall(res, img)
        at = _step(err)
        assert at < STEPS - 1, "the job ended before the dump: nothing was tested"
        p.wait(timeout=30)          # CRIU ended the tree
        t = time.monotonic()        # its ranks, orphaned, are reaped by init
        while any(os.path.exists(f"/proc/{q}") for q in res["criu"]["pids"]):
            assert time.monotonic() - t < 20, f"pids {res['criu']['pids']} not freed"
            time.sleep(0.05)
        d.kill()
        d = _daemon(tmp_path, "proxyd2")
        (tmp_path / "gate").touch()
        r = _cli(d, "restore", "--dir", str(img))
        assert sorted(r["ranks"]) == sorted(res["ranks"]) and r["root"] == root, r
        # GPU state and CRIU's tree restored at the same time (overlap.py)
        assert r["overlapped"] is True and r["gpu_ms"] > 0 and r["criu_ms"] > 0, r
        t = time.monotonic()
        while os.path.exists(f"/proc/{root}") and not out.read_text().endswith(f"DONE nccl_loop {N}\n"):
            assert time.monotonic() - t < 60, err.read_text() + d.log()[-3000:]
            time.sleep(0.05)
        t = time.monotonic()
        while os.path.exists(f"/proc/{root}") and time.monotonic() - t < 10:
            time.sleep(0.05)
        assert out.read_text() == ref, f"{out.read_text()}\n{err.read_text()}\nvs uninterrupted\n{ref}"
    finally:
        if p.poll() is None:
            p.kill()
        try:
            os.kill(root, 9)
        except OSError:
            pass
        d.stop()


def test_job_whole_process_checkpointed_twice_while_running_goes_on_unchanged(loop_prog, usable_criu, tmp_path):
    """--leave-running: periodic whole-process checkpoints of a running job
    (CRIU leaves the tree running, every rank resumed, holds released); the
    result is unchanged and each image holds the tree and every rank."""
    ref = reference(loop_prog, tmp_path, N)
    d = _daemon(tmp_path, "proxyd")
    require_park(d)
    out, err = tmp_path / "job.out", tmp_path / "job.err"
    env = d.env_for_client({"GPUPROXY_TIMEOUT_MS": "2000", "NCCL_LOOP_GATE": str(tmp_path / "gate")})
    with open(out, "w") as fo, open(err, "w") as fe:
        p = subprocess.Popen(loop_prog.argv() + [str(N), str(STEPS), "60000"], env=env, stdin=subprocess.DEVNULL,
                             stdout=fo, stderr=fe,
                             # its own session where the runner's is out of reach (CI: see wholeproc.start)
                             start_new_session=not runner_session_visible())
    try:
        for i, k in enumerate((STEPS // 4, STEPS // 2)):      # both before the gate at 2/3
            t = time.monotonic()
            while _step(err) < k:
                assert p.poll() is None, err.read_text()
                assert time.monotonic() - t < 60, err.read_text() + state(d)
                time.sleep(0.02)
            res = _cli(d, "dump", "--job", str(p.pid), "--dir", str(tmp_path / f"ck{i}"), "--leave-running")
            assert res["leave_running"] and len(res["ranks"]) == N and p.pid in res["criu"]["pids"], res
            _check_stall(res, tmp_path / f"ck{i}")
            assert (tmp_path / f"ck{i}" / "criu").is_dir() and all(
                (tmp_path / f"ck{i}" / f"rank-{r}" / "manifest").is_file() for r in res["ranks"]), res
        # the ranks' public ids (what /dev/shm names carry; the log names them)
        ids = set(re.findall(r"session id ([0-9a-f]+)-(?:%s):" % "|".join(map(str, res["ranks"])), d.log()))
        assert len(ids) == N, d.log()[-3000:]
        (tmp_path / "gate").touch()
        try:
            p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the job did not end: {err.read_text()[-2000:]}{state(d)}") from None
        assert p.returncode == 0 and out.read_text() == ref, out.read_text() + err.read_text() + d.log()[-3000:]
        # once proxyd has ended the ranks' sessions, none of their parks'
        # small files is left in /dev/shm (parked, parkheld, the stall's ran)
        end = time.monotonic() + 30
        while any(s["pid"] in res["ranks"] for s in _status(d)["sessions"]):
            assert time.monotonic() < end, "proxyd kept the ended ranks' sessions"
            time.sleep(0.1)
        left = [f for i in ids for f in glob.glob(f"/dev/shm/gpuproxy-*-{i}")]
        assert not left, left
    finally:
        if p.poll() is None:
            p.kill()
        d.stop()


@pytest.mark.slow
def test_job_whole_process_dumped_while_a_rank_sleeps_every_rank_goes_on_at_once(loop_prog, usable_criu, tmp_path):
    """--leave-running with rank 0 asleep between two steps (3 s) and rank 1
    held in its next all-reduce (the cut comes once rank 0 wakes and joins
    the all-reduce rank 1 waits in; then it sleeps again): every rank is resumed before the holds are
    released, so each attaches to its worker at once and measures its own
    stall. Released first, rank 1's worker ran the held all-reduce and
    waited in it for rank 0, still asleep, while rank 1's shim gave up its
    attach after GPUPROXY_TIMEOUT_MS ("did not take this session back", no
    figure of its own)."""
    d = _daemon(tmp_path, "proxyd")
    require_park(d)
    out, err = tmp_path / "job.out", tmp_path / "job.err"
    env = d.env_for_client({"GPUPROXY_TIMEOUT_MS": "2000"})
    with open(out, "w") as fo, open(err, "w") as fe:
        p = subprocess.Popen(loop_prog.argv() + [str(N), "4", "3000000"], env=env, stdin=subprocess.DEVNULL,
                             stdout=fo, stderr=fe, start_new_session=not runner_session_visible())
    try:
        t = time.monotonic()
        while _step(err) < 1:
            assert p.poll() is None and time.monotonic() - t < 60, err.read_text() + state(d)
            time.sleep(0.02)
        res = _cli(d, "dump", "--job", str(p.pid), "--dir", str(tmp_path / "ck"), "--leave-running")
        assert "did not take this session back" not in err.read_text(), err.read_text()
        _check_stall(res, tmp_path / "ck")
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the job did not end: {err.read_text()[-2000:]}{state(d)}") from None
        assert p.returncode == 0 and out.read_text().endswith(f"DONE nccl_loop {N}\n"), out.read_text() + err.read_text()
    finally:
        if p.poll() is None:
            p.kill()
        d.stop()
