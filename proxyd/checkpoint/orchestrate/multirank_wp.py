"""The whole-process form of a job's consistent checkpoint (issue 22, part
4; docs/multigpu.md, "The whole-process form"): multirank.py's cut, then
every rank's shim parked, GPU state and one CRIU dump of the job's process
tree; restore of both, communicators made again, the job goes on. A
library like multirank.py: plain arguments, dicts back, JobError with one
line, nothing printed.

Dump (`dump_job_whole`, the job named by its root pid, or by its ranks'
pids: then the tree of their common parent, job_tree.py):
 1. checks before anything is touched: CRIU usable, the caller may dump
    ROOT, CRIU can dump its tree (whole_process.check_*);
 2. multirank.quiesce: every rank held at one collective boundary;
 3. every rank parked with the holds in place (`park` with in_call: a rank
    whose thread waits for an answer its worker holds parks inside that
    call, interceptor/park.c), then the cut confirmed again;
 4. every rank's GPU state into DIR/rank-PID/ (the sessions stay in
    proxyd: CRIU decides whether the app goes on, as criu_hooks.py does);
 5. one `criu dump` of ROOT's tree into DIR/criu (criu.dump): CRIU dumps
    and restores process trees, and only with the launcher in the same
    dump do the ranks come back as its children with the pipes between
    them; its record goes into job.json (under "criu") and into every
    rank's manifest (criu.record_in_manifest);
 6. without leave_running the tree is gone (CRIU ended it; proxyd ends the
    sessions of the clients it sees die); with it every rank is resumed and
    then the holds are released (_go_on says why in this order).
 Any failure before CRIU has finished resumes every parked rank and
 releases the holds: the job goes on.

Restore (`restore_job_whole`): the pids must be free; multirank.restore_job
brings every rank's GPU state back (held) and makes the communicators
again while `criu restore` brings the tree back (the ranks come back parked
inside their calls; overlap.py, as for one process); then every rank is
resumed with its session's token (each shim reconnects and sends its held
message again), and the holds released (after the resume, as at a dump:
_go_on). A CRIU restore that fails releases the restored GPU state
(discard); a GPU restore that fails ends the tree CRIU restored.
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import time
from typing import Callable

from gpuproxy.proxyd.checkpoint import criu

from ...client import ControlError
from . import job_stall
from . import multirank as M
from . import overlap as O
from . import whole_process as W


def _resume_all(connect: Callable, pids: list[int], ran: dict | None = None) -> list[str]:
    """Resumes every rank; with ran (a dict), each rank's resume waits for
    its shim's own figure (stall.py), put into ran[pid]."""
    if ran is None:
        errors = []
        for pid in pids:
            try:
                W._resume(connect(30), pid=pid)
            except ControlError as e:
                errors.append(f"pid {pid}: {e}")
        return errors
    # at once: no rank stays parked while another's figure is awaited
    with cf.ThreadPoolExecutor(max_workers=max(1, len(pids)), thread_name_prefix="gpuproxy-job-resume") as pool:
        futs = {pid: pool.submit(W._resume, connect(30), pid=pid, wait_ran=True) for pid in pids}
        errors = []
        for pid, f in futs.items():
            try:
                ran[pid] = f.result() or {}
            except ControlError as e:
                errors.append(f"pid {pid}: {e}")
    return errors


def _go_on(connect: Callable, calls, ranks: list[int], ran: dict) -> list[str]:
    """After a leave-running dump: every rank resumed, then the holds
    released. In this order because a resumed shim attaches to its worker
    again (a HELLO, interceptor/transport.c gp_transport_unpark) and gives up
    after GPUPROXY_TIMEOUT_MS when the worker does not answer: once released,
    a worker runs its rank's held collective, which waits (the emulated
    backend in the worker's loop) for the peers, and a peer that was parked
    between two calls issues its part only once it runs again, maybe after
    the other's attach gave up ("did not take this session back", no "ran"
    figure: found with a rank that sleeps between its steps). While held, a
    worker queues the held calls and answers the attach at once; the
    resumed shims send their held calls again, answered after the release."""
    return _resume_all(connect, ranks, ran) + M._release_all(calls, ranks)


def _park_all(connect: Callable, pids: list[int]) -> dict:
    """Parks every rank at once (a rank parks inside a held call, so none
    waits for another); raises JobError after resuming those that parked.
    Returns every rank's park answer (held_ns: when its shim held it)."""
    with cf.ThreadPoolExecutor(max_workers=max(1, len(pids)), thread_name_prefix="gpuproxy-job-park") as pool:
        futs = {pid: pool.submit(W._park, connect(W.PARK_TIMEOUT_S + 30), pid, in_call=True) for pid in pids}
        errors, answers = [], {}
        for pid, f in futs.items():
            try:
                answers[pid] = f.result() or {}
            except W.WholeProcessError as e:
                errors.append(str(e))
    if errors:
        _resume_all(connect, pids)
        raise M.JobError(f"park: {'; '.join(errors)}")
    return answers


def dump_job_whole(connect: Callable, endpoint: str, dir: str, root: int | None, *, leave_running: bool = False,
                   compress: str | None = None, timeout_s: float = 120.0, pids: list[int] | None = None) -> dict:
    """A whole-process consistent checkpoint of the job under root (or of
    the ranks pids, as the tree of their common parent) into dir (module
    docstring)."""
    if pids:
        from .job_tree import root_of_pids
        root = root_of_pids(connect, pids)
    ranks = M.job_ranks(connect, root=root)
    try:
        W.check_owner(root)
        c = W._usable_criu("dump")
        W.check_dumpable(root)
    except W.WholeProcessError as e:
        raise M.JobError(str(e)) from None
    dir = os.path.abspath(dir)
    os.makedirs(dir, mode=0o700, exist_ok=True)
    calls = M._Calls(connect, max(timeout_s, 30.0))
    t0 = time.monotonic()      # the coordinator's stall: from here to the resume (to CRIU's end without it)
    try:
        try:
            held, figs = M.quiesce(calls, ranks, timeout_s)
        except Exception:
            M._release_all(calls, ranks)
            raise
        parked = False
        try:
            parks = _park_all(connect, ranks)
            parked = True
            cut = calls.all("nccl-hold", {p: {"cut": True} for p in ranks})
            bad = [f"pid {p}: {a.get('why')}" for p, a in cut.items() if not a.get("cut")]
            if bad:
                raise M.JobError(f"the cut did not hold once parked: {'; '.join(bad)}")
            per = {}
            for pid in ranks:
                a = {"dir": os.path.join(dir, f"rank-{pid}"), "leave_running": True}
                if compress:
                    a["compress"] = compress
                per[pid] = a
            dumps = calls.all("dump", per)
            rec = criu.dump(c, root, dir, leave_running=bool(leave_running))
            t_criu, t_criu_ns = time.monotonic(), time.monotonic_ns()
        except BaseException as e:
            # resumed first, then released: see _go_on
            if parked:
                _resume_all(connect, ranks)
            M._release_all(calls, ranks)
            if isinstance(e, (criu.CriuError, ControlError)):
                raise M.JobError(f"whole-process dump of the job failed: {e}. The job runs on") from None
            raise
        for pid in ranks:
            # each rank's image says its process comes back by CRIU (the
            # engine then does not ask for a running process at its restore)
            criu.record_in_manifest(os.path.join(dir, f"rank-{pid}"), rec)
        job = {"version": M.JOB_VERSION,
               "ranks": [{"pid": pid, "dir": f"rank-{pid}", "comms": cut[pid]["comms"]} for pid in ranks],
               "leave_running": bool(leave_running), "targets": figs["targets"], "criu": rec}
        ran: dict = {}
        if leave_running:
            M.write_job(dir, job)
            criu.make_private(dir)
            errors = _go_on(connect, calls, ranks, ran)
            if errors:
                raise M.JobError(f"dumped, but not every rank went on: {'; '.join(errors)}")
            stall = job_stall.figures(ranks, parks, ran, None, (time.monotonic() - t0) * 1000.0)
        else:
            stall = job_stall.figures(ranks, parks, None, t_criu_ns, (t_criu - t0) * 1000.0)
        M.write_job(dir, dict(job, **job_stall.for_job(stall)))      # (again, with the stall, after the resume)
        criu.make_private(dir)
        return {**stall, "path": dir, "ranks": ranks, "root": root, "hold_ms": figs["hold_ms"], "rounds": figs["rounds"],
                "communicators": len(figs["targets"]), "criu": rec, "leave_running": bool(leave_running),
                "bytes": sum(int(d.get("bytes", 0)) for d in dumps.values()),
                "dumps": {str(p): d for p, d in dumps.items()}}
    finally:
        calls.close()


def restore_job_whole(connect: Callable, dir: str, device_map: dict | None = None, allow_foreign: bool = False,
                      rollback_files: bool = False, timeout_s: float = 120.0) -> dict:
    """The job's GPU state and process tree back, the job going on (module
    docstring)."""
    dir = os.path.abspath(dir)
    job = M.read_job(dir)
    rec = job.get("criu")
    if (not isinstance(rec, dict) or rec.get("kind") != "dump" or not rec.get("complete")
            or rec.get("dir") != criu.SUBDIR):
        raise M.JobError(f"{dir} holds no whole-process dump of the job (restore it with --gpu-only)")
    try:
        c = W._usable_criu("restore")
        W._check_pids_free(rec)
        W._check_files(rec, rollback_files)
    except W.WholeProcessError as e:
        raise M.JobError(str(e)) from None
    # The GPU state (every rank, communicators made again, held until every
    # rank runs again: _go_on says why) and CRIU's tree at the same time, as
    # for one process (overlap.py: the ranks come back parked and make no
    # call before they are resumed below). Images that do not pass the
    # checks proxyd makes go one after the other, GPU first, so that proxyd
    # refuses them before CRIU starts.
    pre = None
    for r in job["ranks"]:
        pre = O.precheck(os.path.join(dir, r["dir"]), allow_foreign)
        if pre is not None:
            pre = f"rank pid {r['pid']}: {pre}"
            break
    both = O.run_both(lambda: M.restore_job(connect, dir, device_map, allow_foreign=allow_foreign,
                                            timeout_s=timeout_s, release=False),
                      lambda: criu.restore(c, dir, rec), pre)
    if both["gpu_error"] is not None:
        if both["pid"] is not None:       # CRIU's tree waits parked: it cannot go on without its GPU state
            O.end_restored(rec.get("pids") or [both["pid"]])
        raise both["gpu_error"]
    gpu = both["gpu"]
    tokens = {int(p): r.get("token") for p, r in gpu["restores"].items()}
    if both["criu_error"] is not None:
        e = both["criu_error"]
        for t in tokens.values():
            try:
                connect(30).call("discard", {"token": t}) if t else None
            except ControlError:
                pass
        if isinstance(e, criu.CriuError):
            raise M.JobError(f"{e}. The process tree was not restored: the GPU state restored into proxyd was "
                             f"released again") from None
        raise e
    root, criu_ms = both["pid"], both["criu_ms"]
    errors = []
    for pid, t in tokens.items():
        try:
            W._resume(connect(30), **({"token": t, "pid_here": pid} if t else {"pid": pid}))     # (whole_process.restore)
        except ControlError as e:
            errors.append(f"pid {pid}: {e}")
    calls = M._Calls(connect, max(timeout_s, 30.0))
    try:
        errors += M._release_all(calls, list(tokens))
    finally:
        calls.close()
    if errors:
        raise M.JobError(f"restored, but not every rank went on: {'; '.join(errors)}")
    return dict(gpu, root=root, criu_ms=criu_ms, gpu_ms=both["gpu_ms"], both_ms=both["wall_ms"],
                overlapped=both["overlapped"], sequential_why=None if both["overlapped"] else both["sequential_why"])
