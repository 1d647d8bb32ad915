"""The app's own figure of a park's stall (interceptor/park.c).

The shim writes, into the parked file, when it took its lock for parking
(held_ns: from then on every CUDA call of every app thread waits in the
shim), and, once it has given the lock back after going on, a "ran" file
with "held_ns ran_ns" (CLOCK_MONOTONIC: Python's time.monotonic on Linux).
The park command answers held_ns; a resume asked with wait_ran answers
once the ran file is there (or after RAN_WAIT_S without it), with
app_stopped_ms = ran - held: the stall as the app lived it, parking and
going on included.

Main-loop only (the supervisor's tick), like the park waiters.
"""
from __future__ import annotations

import os
import time

RAN_WAIT_S = float(os.environ.get("GPUPROXY_RAN_WAIT_S", "10"))


def ran_path(token: str, shm: str = "/dev/shm") -> str:
    """shm: the client's /dev/shm as proxyd reaches it (client_view.py)."""
    from ..core.shm_names import public_id
    return f"{shm}/gpuproxy-ran-{public_id(token)}"


def read_held(path: str) -> int | None:
    """held_ns from a parked file (None: an older shim's empty file)."""
    try:
        with open(path, "rb") as f:
            return int(f.read(64).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def forget_ran(token: str, shm: str = "/dev/shm") -> None:
    """Before a resume: a ran file of an earlier park is not this one's."""
    try:
        os.unlink(ran_path(token, shm))
    except OSError:
        pass


def _read_ran(token: str, shm: str) -> tuple[int, int] | None:
    try:
        with open(ran_path(token, shm), "rb") as f:
            held, ran = (int(x) for x in f.read(64).split()[:2])
    except (OSError, ValueError):
        return None
    return held, ran


def figures(held: int, ran: int) -> dict:
    return {"held_ns": held, "ran_ns": ran, "app_stopped_ms": round((ran - held) / 1e6, 3)}


def tick(sup, e, now: float) -> None:
    """Answers the resume commands of entry e waiting for the app to run."""
    if not e.ran_waiters:
        return
    shm = e.ran_shm or "/dev/shm"
    got = _read_ran(e.token, shm)
    for item in list(e.ran_waiters):
        rid, seq, dl, base = item
        if got is not None:
            sup.reply(rid, seq, dict(base, **figures(*got)))
        elif now > dl:
            sup.reply(rid, seq, dict(base, app_stopped_unknown=f"the app did not report running again within "
                                                                 f"{RAN_WAIT_S:g} s (an older shim, or it is "
                                                                 f"still going on)"))
        else:
            continue
        e.ran_waiters.remove(item)
    if got is not None:
        forget_ran(e.token, shm)


def wait_ran(e, rid, seq, base: dict) -> None:
    e.ran_waiters.append((rid, seq, time.monotonic() + RAN_WAIT_S, base))


PARK_TICK_S = 0.002


def tick_s(sup, normal: float) -> float:
    """The main loop's tick: PARK_TICK_S while a park command waits for its
    shim (each tick late is a tick the app stands still) or a resume for the
    app's figure (the orchestrator waits, and the image's completion after
    it), else normal."""
    for e in sup.entries.values():
        if e.park_waiters or e.ran_waiters:
            return PARK_TICK_S
    return normal
