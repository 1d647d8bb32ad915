"""The coordinator's hold-and-creep (proxyd/checkpoint/orchestrate/
multirank.py, quiesce) against simulated ranks, fast and without proxyd.

Each simulated rank is a thread that runs its program message by message
like a worker's main loop: a message's collectives on a communicator of
several ranks block until every member has issued that collective (as the
emulated hub does), and while a rank blocks it answers no control command
(the coordinator sees it silent). Between messages it serves nccl-hold /
nccl-release with the semantics of proxyd/families/nccl_cut.py: held
before a message that would take a communicator past its target.

The program is tests/programs_extra/nccl_loop.cu's: every step an
all-reduce on the world communicator, every third step one more on the
rank's split by parity, which for two ranks is a communicator of one rank.
Rank 0 is slow, so rank 1 is often already inside the next world
all-reduce when the hold reaches rank 0 before its own split's collective:
the case CI met, where rank 0 stayed held on its private split while rank
1 waited for it on the world communicator.
"""
from __future__ import annotations

import queue
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from gpuproxy.proxyd.checkpoint.orchestrate import multirank as M  # noqa: E402

WORLD = "a" * 32


class Hub:
    """Collectives of communicators of several ranks meet here."""

    def __init__(self, nranks: dict[str, int]):
        self.nranks = nranks
        self.arrived: dict[tuple[str, int], int] = {}
        self.cv = threading.Condition()

    def collective(self, ident: str, seq: int, stop: threading.Event):
        with self.cv:
            self.arrived[(ident, seq)] = self.arrived.get((ident, seq), 0) + 1
            self.cv.notify_all()
            while self.arrived[(ident, seq)] < self.nranks[ident] and not stop.is_set():
                self.cv.wait(0.05)


class Rank(threading.Thread):
    def __init__(self, pid: int, rank: int, program: list[list[str]], hub: Hub, pace_s: float,
                 stop: threading.Event):
        super().__init__(daemon=True)
        self.pid, self.rank, self.program, self.hub, self.pace_s, self.stop = pid, rank, program, hub, pace_s, stop
        self.seq = {ident: 0 for msg in program for ident in msg}
        self.targets: dict[str, int] | None = None
        self.waiting_on: str | None = None
        self.inbox: queue.Queue = queue.Queue()
        self.pc = 0

    def _held(self, msg: list[str]) -> str | None:
        if self.targets is None:
            return None
        adds: dict[str, int] = {}
        for ident in msg:
            adds[ident] = adds.get(ident, 0) + 1
            if self.seq[ident] + adds[ident] > self.targets.setdefault(ident, self.seq[ident]):
                return ident
        return None

    def _rows(self) -> list[dict]:
        return [{"ident": i, "nranks": self.hub.nranks[i], "rank": self.rank, "seq": s, "state": "ready"}
                for i, s in self.seq.items()]

    def _serve(self, cmd: str, args: dict) -> dict:
        if cmd == "nccl-hold":
            if self.targets is None:
                self.targets = dict(self.seq)
            for i, t in (args.get("targets") or {}).items():
                self.targets[i] = max(int(t), self.targets.get(i, 0))
            held = self.pc < len(self.program) and self._held(self.program[self.pc]) is not None
            out = {"comms": self._rows(), "held": held, "waiting_on": self.waiting_on if held else None}
            if args.get("cut"):
                out["cut"] = all(self.seq[i] == self.targets.get(i) for i in self.seq)
            return out
        if cmd == "nccl-release":
            self.targets = None
            return {"released": True}
        raise AssertionError(cmd)

    def run(self):
        while not self.stop.is_set():
            try:
                while True:
                    cmd, args, fut = self.inbox.get_nowait()
                    fut.set_result(self._serve(cmd, args))
            except queue.Empty:
                pass
            if self.pc >= len(self.program):
                time.sleep(0.001)
                continue
            msg = self.program[self.pc]
            self.waiting_on = self._held(msg)
            if self.waiting_on is not None:
                time.sleep(0.001)
                continue
            for ident in msg:
                self.seq[ident] += 1
                if self.hub.nranks[ident] > 1:
                    self.hub.collective(ident, self.seq[ident], self.stop)     # silent meanwhile
            self.pc += 1
            if self.pace_s:
                time.sleep(self.pace_s)


class Connect:
    def __init__(self, ranks: dict[int, Rank]):
        self.ranks = ranks

    def __call__(self, timeout_s):
        return self

    def call(self, cmd: str, args: dict):
        fut: Future = Future()
        self.ranks[int(args["pid"])].inbox.put((cmd, args, fut))
        return fut.result(timeout=30)


def _job(steps: int):
    nranks = {WORLD: 2, "b" * 32: 1, "c" * 32: 1}
    hub = Hub(nranks)
    stop = threading.Event()
    ranks = {}
    for r, sub in ((0, "b" * 32), (1, "c" * 32)):
        prog = []
        for k in range(steps):
            prog.append([WORLD])
            if k % 3 == 2:
                prog.append([sub])
        ranks[100 + r] = Rank(100 + r, r, prog, hub, 0.004 if r == 0 else 0.0, stop)
    return ranks, stop


def test_cut_while_a_peer_waits_behind_a_private_split(monkeypatch):
    """Repeated cuts of the running job all reach one boundary in time (with
    the creep limited to communicators a silent rank waits on, some of them
    never did: rank 0 stayed held on its one-rank split)."""
    monkeypatch.setattr(M, "STALL_S", 0.05)
    monkeypatch.setattr(M, "ROUND_S", 0.01)
    ranks, stop = _job(4000)
    for r in ranks.values():
        r.start()
    calls = M._Calls(Connect(ranks), 30)
    try:
        for i in range(25):
            time.sleep(0.013 * (i % 7))
            held, figs = M.quiesce(calls, sorted(ranks), timeout_s=10)
            assert all(a["cut"] for a in held.values()), held
            world = {a["comms"][0]["seq"] for a in held.values()}
            assert len(world) == 1, held           # one boundary on the shared communicator
            assert ranks[100].pc < len(ranks[100].program), "the job ended: nothing was tested"
            calls.all("nccl-release", {p: {} for p in ranks})
    finally:
        stop.set()
        calls.close()


@pytest.mark.parametrize("silent_answered", [False, True])
def test_peer_of_silent(silent_answered):
    members = {WORLD: {100: {"nranks": 2}}, "b" * 32: {100: {"nranks": 1}}}
    if silent_answered:
        members[WORLD][101] = {"nranks": 2}
    assert M._peer_of_silent(100, members, [101])
    assert not M._peer_of_silent(100, {"b" * 32: {100: {"nranks": 1}}}, [101])
