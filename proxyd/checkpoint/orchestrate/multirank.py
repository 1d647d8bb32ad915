"""One consistent checkpoint of a multi-rank job, and its restore (issue 22,
part 4; docs/multigpu.md, "The consistent cut"). A library like gpu.py:
plain arguments, a control-client factory, dicts back, typed errors,
nothing printed. Each rank's part is proxyd/families/nccl_cut.py, reached
through the supervisor's forwarded nccl-* commands.

Dump (`dump_job`):
 1. the job's ranks: the given pids, or every gpuproxy client in the
    process tree under a root pid (torchrun, mpirun, a launcher);
 2. hold: every rank is held before any collective past its
    communicators' targets; the targets rise to the highest `seq` any rank
    of the communicator reached, so the ranks behind catch up. A worker
    that does not answer is inside a call that waits for its peers (a
    collective the others have not issued yet, or a synchronisation behind
    one): while it does, each held rank that shares a communicator with
    it is let one collective further on the communicator it is held on (at
    most one step per communicator and STALL_S): that is what the blocked
    one waits for, or what the held rank must pass first (a split of its
    own, whose collectives no other rank joins);
 3. cut: every rank confirms that each of its communicators is at its
    target, nothing busy (the dump's synchronisation then completes every
    collective issued: none is in flight);
 4. dump every rank (in parallel) into DIR/rank-PID/, and write
    DIR/job.json; with leave_running the holds are released after.
Any failure releases the holds (the job goes on) and raises JobError.

Restore (`restore_job`): every rank's image (GPU-only: its process waits;
optionally onto other GPUs, the same device map for all), then per
communicator a new unique id from one rank's worker, handed to every rank
(nccl-recreate), a wait until all are made, then the holds are released
and the job continues from the cut.

Sending is concurrent (one thread per rank and call); a call that does
not answer within a round is left running and its answer taken later.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import time
from typing import Callable

JOB_FILE = "job.json"
JOB_VERSION = 1
ROUND_S = 0.25
RESTORES_AT_ONCE = 2      # what a supervisor that does not say its max_restores runs at once
STALL_S = 0.5         # a worker silent this long is taken to wait for its peers


class JobError(Exception):
    """A job checkpoint or restore that cannot be done (one line)."""


def tree_pids(root: int) -> list[int]:
    """root and its descendants (/proc/PID/task/*/children)."""
    out, todo = [], [int(root)]
    while todo:
        p = todo.pop()
        if p in out:
            continue
        out.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo += [int(x) for x in f.read().split()]
            except OSError:
                pass
    return out


def job_ranks(connect: Callable, root: int | None = None, pids: list[int] | None = None) -> list[int]:
    """The job's gpuproxy clients: pids as given (each must be a client), or
    those in root's process tree."""
    st = connect(30).call("status", {})
    live = {int(s["pid"]) for s in st.get("sessions", []) if s.get("state") not in ("released", "dead")}
    if pids:
        missing = [p for p in pids if p not in live]
        if missing:
            raise JobError(f"pid(s) {', '.join(map(str, missing))} have no running session in this proxyd")
        return sorted(set(pids))
    if root is None:
        raise JobError("a job is named by its root pid (--job) or its ranks' pids (--pids)")
    if not os.path.exists(f"/proc/{int(root)}"):
        raise JobError(f"no process {root}")
    found = sorted(p for p in tree_pids(root) if p in live)
    if not found:
        raise JobError(f"no gpuproxy client in the process tree of pid {root}")
    return found


class _Calls:
    """Concurrent control calls, at most one in flight per (pid, command)."""

    def __init__(self, connect: Callable, timeout_s: float):
        self.connect, self.timeout_s = connect, timeout_s
        self.pool = cf.ThreadPoolExecutor(max_workers=32, thread_name_prefix="gpuproxy-job")
        self.inflight: dict[tuple[int, str], tuple[cf.Future, float]] = {}

    def call(self, cmd: str, args: dict):
        return self.connect(self.timeout_s).call(cmd, args)

    def start(self, pid: int, cmd: str, args: dict) -> None:
        if (pid, cmd) not in self.inflight:
            self.inflight[(pid, cmd)] = (self.pool.submit(self.call, cmd, dict(args, pid=pid)), time.monotonic())

    def take(self, pid: int, cmd: str):
        """(done, result); raises the call's error."""
        f = self.inflight.get((pid, cmd))
        if f is None or not f[0].done():
            return False, None
        del self.inflight[(pid, cmd)]
        return True, f[0].result()

    def silent_for(self, pid: int, cmd: str) -> float:
        f = self.inflight.get((pid, cmd))
        return time.monotonic() - f[1] if f is not None and not f[0].done() else 0.0

    def all(self, cmd: str, per_pid: dict[int, dict]) -> dict[int, dict]:
        futs = {pid: self.pool.submit(self.call, cmd, dict(a, pid=pid)) for pid, a in per_pid.items()}
        out, errors = {}, []
        for pid, f in futs.items():
            try:
                out[pid] = f.result()
            except Exception as e:
                errors.append(f"pid {pid}: {e}")
        if errors:
            raise JobError(f"{cmd}: {'; '.join(errors)}")
        return out

    def close(self):
        self.pool.shutdown(wait=False, cancel_futures=True)


def _members(answers: dict[int, dict]) -> dict[str, dict[int, dict]]:
    """identity -> pid -> that rank's row."""
    out: dict[str, dict[int, dict]] = {}
    for pid, a in answers.items():
        for row in a.get("comms", []):
            out.setdefault(row["ident"], {})[pid] = row
    return out


def quiesce(calls: _Calls, pids: list[int], timeout_s: float) -> tuple[dict[int, dict], dict]:
    """Holds every rank at one collective boundary (module docstring, steps
    2-3); returns each rank's last answer and figures."""
    t0 = time.monotonic()
    targets: dict[str, int] = {}
    answers: dict[int, dict] = {}
    crept: dict[str, float] = {}
    rounds = 0
    while True:
        rounds += 1
        if time.monotonic() - t0 > timeout_s:
            silent = [p for p in pids if (p, "nccl-hold") in calls.inflight]
            raise JobError(f"the ranks did not reach one collective boundary within {timeout_s:.0f} s"
                           + (f" (pids {', '.join(map(str, silent))} did not answer)" if silent else ""))
        for pid in pids:
            calls.start(pid, "nccl-hold", {"targets": targets})
        deadline = time.monotonic() + ROUND_S
        while time.monotonic() < deadline:
            for pid in pids:
                done, res = calls.take(pid, "nccl-hold")
                if done:
                    answers[pid] = res
            if all((p, "nccl-hold") not in calls.inflight for p in pids):
                break
            time.sleep(0.005)
        members = _members(answers)
        for ident, per in members.items():
            targets[ident] = max(targets.get(ident, 0), max(r["seq"] for r in per.values()))
        silent = [p for p in pids if calls.silent_for(p, "nccl-hold") > STALL_S]
        if silent:
            # a silent rank waits inside a call for its peers: a held peer
            # goes one collective further on the communicator it is held on
            # (once per STALL_S and communicator), which is what the silent
            # one waits for, or what stands before it in the peer's program
            # (a peer held on a communicator of its own, e.g. a split of one
            # rank, must pass it to reach the collective the silent one is in)
            now = time.monotonic()
            for pid, a in answers.items():
                w = a.get("waiting_on")
                per = members.get(w) or {}
                if not a.get("held") or pid in silent or pid not in per or now - crept.get(w, 0) < STALL_S:
                    continue
                if _peer_of_silent(pid, members, silent) and per[pid]["seq"] >= targets[w]:
                    targets[w] = per[pid]["seq"] + 1
                    crept[w] = now
            continue
        if len(answers) < len(pids) or any((p, "nccl-hold") in calls.inflight for p in pids):
            continue
        # everyone answered: every communicator complete in the job and level?
        level = True
        for ident, per in members.items():
            n = _nranks(members, ident)
            if len(per) != n:
                outside = n - len(per)
                raise JobError(f"communicator {ident[:8]} has {outside} rank(s) outside the job (give every "
                               f"rank's pid, or the root of the whole job)")
            if any(r["seq"] != targets[ident] or r["state"] != "ready" for r in per.values()):
                level = False
        if not level:
            continue
        cut = calls.all("nccl-hold", {p: {"targets": targets, "cut": True} for p in pids})
        if all(a.get("cut") for a in cut.values()):
            return cut, {"hold_ms": round((time.monotonic() - t0) * 1000, 3), "rounds": rounds,
                         "targets": targets}
        answers.update(cut)


def _peer_of_silent(pid: int, members: dict[str, dict[int, dict]], silent: list[int]) -> bool:
    """Whether pid shares a communicator with a silent rank, or with a rank
    that has not answered yet (a communicator with members missing)."""
    for ident, per in members.items():
        if pid in per and (any(p in silent for p in per) or len(per) < _nranks(members, ident)):
            return True
    return False


def _nranks(members: dict, ident: str) -> int:
    per = members.get(ident) or {}
    return max((r["nranks"] for r in per.values()), default=0)


def _restores_at_once(calls: _Calls) -> int:
    try:
        n = calls.call("status", {}).get("max_restores")
    except Exception:        # (answered below with the old figure; a dead proxyd fails the restore itself)
        n = None
    return n if isinstance(n, int) and n > 0 else RESTORES_AT_ONCE


def _release_all(calls: _Calls, pids: list[int]) -> list[str]:
    """Releases every rank at once (a released rank may wait in a collective
    for the others)."""
    try:
        calls.all("nccl-release", {p: {} for p in pids})
    except JobError as e:
        return [str(e)]
    return []


def dump_job(connect: Callable, dir: str, *, root: int | None = None, pids: list[int] | None = None,
             leave_running: bool = False, compress: str | None = None, timeout_s: float = 120.0) -> dict:
    """A GPU-only consistent checkpoint of every rank into dir (module
    docstring). connect(timeout_s) gives a control client of the supervisor."""
    ranks = job_ranks(connect, root, pids)
    dir = os.path.abspath(dir)
    os.makedirs(dir, exist_ok=True)
    calls = _Calls(connect, max(timeout_s, 30.0))
    t0 = time.monotonic()
    try:
        try:
            held, figs = quiesce(calls, ranks, timeout_s)
        except Exception:
            _release_all(calls, ranks)
            raise
        t_held = time.monotonic()
        per = {}
        for pid in ranks:
            a = {"dir": os.path.join(dir, f"rank-{pid}"), "leave_running": bool(leave_running)}
            if compress:
                a["compress"] = compress
            per[pid] = a
        try:
            dumps = calls.all("dump", per)
        except JobError:
            _release_all(calls, ranks)
            raise
        t_dumped = time.monotonic()
        write_job(dir, {"version": JOB_VERSION, "ranks": [{"pid": pid, "dir": f"rank-{pid}",
                                                           "comms": held[pid]["comms"]} for pid in ranks],
                        "leave_running": bool(leave_running), "targets": figs["targets"]})
        if leave_running:
            errors = _release_all(calls, ranks)
            if errors:
                raise JobError(f"dumped, but the holds were not all released: {'; '.join(errors)}")
        return {"path": dir, "ranks": ranks, "hold_ms": figs["hold_ms"], "rounds": figs["rounds"],
                "dump_ms": round((t_dumped - t_held) * 1000, 3),
                "stall_ms": round((time.monotonic() - t0) * 1000, 3),
                "stall_from": "orchestrator",      # no rank parks: no shim measures (job_stall.py)
                "bytes": sum(int(d.get("bytes", 0)) for d in dumps.values()),
                "communicators": len(figs["targets"]), "released": not leave_running,
                "dumps": {str(p): d for p, d in dumps.items()}}
    finally:
        calls.close()


def write_job(dir: str, job: dict) -> None:
    """DIR/job.json, durable, replaced whole."""
    tmp = os.path.join(dir, JOB_FILE + ".tmp")
    with open(tmp, "w") as f:
        json.dump(job, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(dir, JOB_FILE))


def is_job_image(dir: str) -> bool:
    return os.path.isfile(os.path.join(dir, JOB_FILE))


def read_job_quiet(dir: str) -> dict | None:
    """read_job, or None where it refuses (the caller's read_job says why)."""
    try:
        return read_job(dir)
    except JobError:
        return None


def read_job(dir: str) -> dict:
    """job.json, checked (it names only rank folders inside dir)."""
    p = os.path.join(dir, JOB_FILE)
    try:
        with open(p) as f:
            if not os.path.isfile(p) or os.path.getsize(p) > 1 << 24:
                raise JobError(f"{p} is not a job file")
            job = json.load(f)
    except (OSError, ValueError) as e:
        raise JobError(f"job image refused: {p}: {e}") from None
    try:
        if job["version"] != JOB_VERSION:
            raise JobError(f"job image refused: version {job['version']} (this gpuproxy reads {JOB_VERSION})")
        for r in job["ranks"]:
            if not re.fullmatch(r"rank-[0-9]{1,8}", str(r["dir"])) or not isinstance(r["pid"], int):
                raise JobError(f"job image refused: bad rank entry {str(r)[:200]}")
            for c in r["comms"]:
                if not re.fullmatch(r"[0-9a-f]{32}", str(c["ident"])):
                    raise JobError("job image refused: bad communicator identity")
                int(c["rank"]), int(c["nranks"])
    except (KeyError, TypeError, ValueError) as e:
        raise JobError(f"job image refused: {p}: malformed ({e})") from None
    return job


def restore_job(connect: Callable, dir: str, device_map: dict | None = None, allow_foreign: bool = False,
                timeout_s: float = 120.0, release: bool = True) -> dict:
    """Every rank's GPU state back, the communicators made again, the job
    released (module docstring); with release False the holds stay, for
    the caller to release (multirank_wp.py: after its ranks are resumed)."""
    dir = os.path.abspath(dir)
    job = read_job(dir)
    calls = _Calls(connect, max(timeout_s, 30.0))
    t0 = time.monotonic()
    try:
        args = {r["pid"]: {"dir": os.path.join(dir, r["dir"]), "device_map": dict(device_map or {}),
                           "allow_foreign": bool(allow_foreign)} for r in job["ranks"]}
        # proxyd runs a bounded number of restores at once (its status's
        # max_restores: one per GPU, at least 2): the ranks go that many at
        # a time; each comes back held
        slots = cf.ThreadPoolExecutor(max_workers=_restores_at_once(calls), thread_name_prefix="gpuproxy-job-restore")
        futs = {pid: slots.submit(calls.call, "restore", a) for pid, a in args.items()}
        slots.shutdown(wait=True)
        restored, errors = {}, []
        for pid, f in futs.items():
            try:
                restored[pid] = f.result()
            except Exception as e:
                errors.append(f"rank pid {pid}: {e}")
        if errors:
            raise JobError(f"restore: {'; '.join(errors)}")
        t_rest = time.monotonic()
        # per communicator: a new unique id from the worker of its rank 0
        members: dict[str, dict[int, int]] = {}
        for r in job["ranks"]:
            for c in r["comms"]:
                members.setdefault(c["ident"], {})[int(c["rank"])] = r["pid"]
        uids = {}
        for ident, per in members.items():
            uids[ident] = calls.call("nccl-uid", {"pid": per[min(per)]})["uid"]
        calls.all("nccl-recreate", {r["pid"]: {"uids": {c["ident"]: uids[c["ident"]] for c in r["comms"]}}
                                    for r in job["ranks"]})
        deadline = time.monotonic() + timeout_s
        while True:
            st = calls.all("nccl-hold", {r["pid"]: {} for r in job["ranks"]})
            states = [c["state"] for a in st.values() for c in a["comms"]]
            bad = [s for s in states if s.startswith("failed")]
            if bad:
                raise JobError(f"a communicator was not made again: {bad[0]}")
            if all(s == "ready" for s in states):
                break
            if time.monotonic() > deadline:
                raise JobError(f"the communicators were not made again within {timeout_s:.0f} s")
            time.sleep(0.02)
        t_comm = time.monotonic()
        if release:
            calls.all("nccl-release", {r["pid"]: {} for r in job["ranks"]})
        return {"path": dir, "ranks": sorted(restored), "communicators": len(members),
                "restore_ms": round((t_rest - t0) * 1000, 3), "comm_ms": round((t_comm - t_rest) * 1000, 3),
                "total_ms": round((time.monotonic() - t0) * 1000, 3),
                "restores": {str(p): r for p, r in restored.items()}}
    finally:
        calls.close()
