"""A job's stall figures (multirank_wp.py, multirank.py): per rank, the
stall its shim measured, and which figure a job's "stall" is.

A whole-process job dump parks every rank (interceptor/park.c); each
rank's shim notes when it held the app's threads (held_ns, in the park's
answer) and, after the resume, when all run again (ran_ns; the resume asked
with wait_ran answers app_stopped_ms, supervisor/stall.py). Without
--leave-running the rank is gone at the end of CRIU's dump, so its figure
ends there, as a single process's does (whole_process.py). The job's
figure is the largest rank's: the job is stopped while any rank is.

stall_from says which figure stands for the job: "app" when every rank's
shim gave its own, "orchestrator" otherwise (an older shim, or a GPU-only
job dump, where no rank parks: the coordinator's time from the start of
the cut to the release of the holds). A rank that waited at the cut
before its park (a held collective) waited from that call on: that part is
in hold_ms and in the coordinator's stall_ms, not in its shim's park
window (docs/multigpu.md).

Plain functions, no I/O.
"""
from __future__ import annotations


def figures(ranks: list[int], parks: dict, ran: dict | None, end_ns: int | None, coordinator_ms: float) -> dict:
    """parks: each rank's park answer; ran: each rank's resume answer with
    wait_ran (leave-running), or None with end_ns (time.monotonic_ns() at
    the end of CRIU's dump: the ranks are gone)."""
    per: dict[str, float | None] = {}
    for pid in ranks:
        v = None
        if ran is not None:
            v = (ran.get(pid) or {}).get("app_stopped_ms")
        else:
            held = (parks.get(pid) or {}).get("held_ns")
            if held and end_ns:
                v = round((end_ns - int(held)) / 1e6, 3)
        per[str(pid)] = float(v) if isinstance(v, (int, float)) else None
    have = [v for v in per.values() if v is not None]
    every = bool(ranks) and len(have) == len(ranks)
    return {"stall_ms": round(coordinator_ms, 1), "app_stopped_ms": max(have) if have else None,
            "ranks_app_stopped_ms": per, "stall_from": "app" if every else "orchestrator"}


def for_job(f: dict) -> dict:
    """What job.json records: stall_ms is the figure stall_from names (as
    the preemption contract's job.json, contract.py)."""
    out = {"stall_ms": f["app_stopped_ms"] if f["stall_from"] == "app" else f["stall_ms"],
           "stall_from": f["stall_from"], "coordinator_stall_ms": f["stall_ms"]}
    if f.get("ranks_app_stopped_ms") is not None:
        out["ranks_app_stopped_ms"] = f["ranks_app_stopped_ms"]
    return out


def orchestrator_only(coordinator_ms: float) -> dict:
    """A GPU-only job dump: no rank parks, so no shim measures; the
    coordinator's figure is the job's."""
    return {"stall_ms": round(coordinator_ms, 1), "app_stopped_ms": None, "ranks_app_stopped_ms": None,
            "stall_from": "orchestrator"}
