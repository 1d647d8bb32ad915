"""The consistent cut of a multi-rank NCCL job: one rank's part (issue 22,
part 4; docs/multigpu.md). The coordinator is proxyd/checkpoint/orchestrate/
multirank.py, which drives every rank's worker through the control commands
below (forwarded by the supervisor to the pid's worker).

**Hold.** `nccl-hold` puts a `Hold` on the session (`sess.nccl_hold`,
consulted by the worker's on_call before a message runs): a message whose
NCCL collectives would take a communicator past its *target* waits,
queued like the messages of a frozen session, with keep-alives to the
client; so does every later message of the session (order). Targets start
at each communicator's `seq` when the hold begins and only rise (the
coordinator raises them to the highest `seq` any rank reached). A message
runs whole or not at all, so a rank stops between two messages, never
inside one. Communicators are matched across ranks by `Comm.ident`
(nccl.py), the same in every rank.

**Cut.** Once every rank of every communicator has issued exactly the
collectives up to the target, `nccl-hold` with `cut` checks it here
(nothing busy, no group open, every `seq` at its target) and marks the
session (`sess.nccl_cut`), which lets the dump's check pass (nccl.py). The
dump's own first step synchronises the contexts: the collectives issued by
all ranks complete, so none is in flight in the image.

**Image.** The `nccl_comms` kind records each communicator (handle,
identity, nranks, rank, context, seq, blocking). NCCL's own state is not
kept: between collectives it holds nothing the application can observe.
Pre-multiplied-sum reduction ops (ncclRedOpCreatePreMulSum) are not kept:
an application that uses one after a restore gets NCCL's invalid-argument
answer (docs/multigpu.md, limits).

**Restore.** The restored session's communicators are `pending` (no NCCL
communicator behind them) and the session comes back held: no collective
runs until `nccl-recreate` has made each communicator again with a new
unique id (`nccl-uid` on one rank's worker; the coordinator hands it to
the others): same nranks, same rank, on the context it was made on (which
a device map may have moved). Splits are made again as communicators of
their own (their identity, ranks and rank numbers are the split's), so
the topology is the job's. `nccl-release` then lets the held messages run.

Locking: the control handlers and the hold run on the worker's main loop;
re-creation runs on the helper threads of nccl.py (_in_thread), which
touch only their Comm's real/code/busy.
"""
from __future__ import annotations

import logging

from .._generated import FUNCTIONS
from ..core.kinds import Kind, Stage, register
from .nccl import COLLECTIVES, NCCL_IN_PROGRESS, NCCL_SUCCESS, Comm, _in_thread, comms

log = logging.getLogger("proxyd")

COUNTED = frozenset(COLLECTIVES) | {"ncclCommSplit"}     # what advances Comm.seq (nccl.py)
# calls that need the NCCL communicator behind a handle (held while it is pending)
NEEDS_REAL = COUNTED | {"ncclCommFinalize", "ncclRedOpCreatePreMulSum", "ncclRedOpDestroy"}


def _comm_arg_index() -> dict[int, tuple[str, int]]:
    """fid -> (name, index of its communicator among the op's arguments)."""
    out = {}
    for fid, fn in FUNCTIONS.items():
        if fn.name in NEEDS_REAL:
            for i, p in enumerate(fn.params):
                if p[1] == "handle" and p[2] == "nccl_comm":
                    out[fid] = (fn.name, i)
                    break
    return out


_COMM_ARG: dict[int, tuple[str, int]] | None = None


def _comm_ops(ops) -> list[tuple[str, int]]:
    """(function name, communicator handle) of each NCCL op of a message
    that needs its communicator, in order."""
    global _COMM_ARG
    if _COMM_ARG is None:
        _COMM_ARG = _comm_arg_index()
    out = []
    for op in ops if isinstance(ops, list) else ():
        if type(op) is list and len(op) > 2 and type(op[0]) is int:
            hit = _COMM_ARG.get(op[0])
            if hit is not None and len(op) > 2 + hit[1]:
                h = op[2 + hit[1]]
                out.append((hit[0], int(h) if type(h) is int else 0))
    return out


class Hold:
    """sess.nccl_hold: whether a message must wait (module docstring)."""

    def __init__(self, sess):
        self.targets = {c.ident: c.seq for c in comms(sess).values() if not c.nocolor}
        self.waiting_on = None          # the identity the first held message waits for

    def __call__(self, sess, ops) -> bool:
        if sess.queued:
            return True                 # an earlier message waits: this one after it
        table = comms(sess)
        adds: dict[str, int] = {}
        for name, h in _comm_ops(ops):
            c = table.get(h)
            if c is None or c.nocolor:
                continue                # nccl.py answers the bad handle as usual
            if c.pending or c.busy:
                self.waiting_on = c.ident
                return True
            if name in COUNTED:
                adds[c.ident] = adds.get(c.ident, 0) + 1
                target = self.targets.setdefault(c.ident, c.seq)
                if c.seq + adds[c.ident] > target:
                    self.waiting_on = c.ident
                    return True
        return False


def rows(sess) -> list[dict]:
    return [{"ident": c.ident, "comm": c.handle, "nranks": c.nranks, "rank": c.rank, "seq": c.seq,
             "state": "pending" if c.pending else "busy" if c.busy else "ready" if c.code == NCCL_SUCCESS
             else f"failed ({c.code}: {c.message})"}
            for c in comms(sess).values() if not c.nocolor]


def _group_open(server) -> bool:
    lib = getattr(server.dispatcher.libs, "_libs", {}).get("nccl")
    return bool(getattr(lib, "group", 0))


def _flush(server, s):
    """Runs the held messages that may run now (the rest queue again)."""
    if s.queued and not s.frozen and not s.ckpt_busy:
        server.resume(s)


def hold(server, s, targets: dict | None, cut: bool) -> dict:
    if s.nccl_hold is None:
        s.nccl_hold = Hold(s)
    h = s.nccl_hold
    for ident, t in (targets or {}).items():
        h.targets[str(ident)] = max(int(t), h.targets.get(str(ident), 0))
    out = {"comms": rows(s), "held": bool(s.queued), "waiting_on": h.waiting_on if s.queued else None,
           "targets": dict(h.targets)}
    if cut:
        why = [f"communicator {c.ident[:8]} rank {c.rank} at {c.seq} of {h.targets.get(c.ident)}"
               for c in comms(s).values() if not c.nocolor and c.seq != h.targets.get(c.ident)]
        why += [f"communicator {c.ident[:8]} is {'pending' if c.pending else 'busy'}"
                for c in comms(s).values() if not c.nocolor and (c.busy or c.pending)]
        if _group_open(server):
            why.append("an ncclGroupStart is open")
        s.nccl_cut = not why
        out["cut"] = s.nccl_cut
        out["why"] = "; ".join(why)
    return out


def release(server, s) -> dict:
    pend = [c.ident for c in comms(s).values() if c.pending]
    if pend:
        raise ValueError(f"{len(pend)} communicator(s) of pid {s.pid} are not made again yet (nccl-recreate)")
    s.nccl_hold = None
    s.nccl_cut = False
    return {"released": True, "comms": rows(s)}


def recreate(server, s, uids: dict) -> dict:
    """Makes each pending communicator named in uids ({identity: new unique
    id}) again, on a helper thread (nccl.py _in_thread), as the rank it was."""
    lib = server.dispatcher.libs.library("nccl")
    started = 0
    for c in comms(s).values():
        uid = uids.get(c.ident)
        if uid is None or not c.pending:
            continue
        uid = bytes(uid)
        if len(uid) != 128:
            raise ValueError("a unique id is 128 bytes")
        ctx = s.contexts.get(c.ctx_id)
        if ctx is None:
            raise ValueError(f"communicator {c.ident[:8]}: its context {c.ctx_id} is not in the restored session")
        c.device = ctx.device
        c.pending, c.busy, c.code, c.real = False, True, NCCL_IN_PROGRESS, None

        def work(c=c, uid=uid, ctx=ctx):
            return lib.init_rank(c.nranks, uid, c.rank, {"blocking": 1}, ctx.device)
        _in_thread(server.backend, ctx, c, work, "recreate")
        started += 1
    return {"started": started}


def _session(server, args):
    pid = int(args["pid"])
    for s in server.sessions.values():
        if s.pid == pid:
            return s
    raise LookupError(f"no session of pid {pid} in this worker")


def register_ctl(server, ctl):
    def handler(fn):
        def run(rid, seq, args):
            try:
                s = _session(server, args)
                server.ctl_reply(rid, seq, fn(s, args))
            except (LookupError, ValueError, TypeError, KeyError) as e:
                server.ctl_reply(rid, seq, error=str(e))
                return
            # after the answer: a released message may run a collective that
            # waits for the other ranks (the emulated backend waits in the
            # main loop), whose own release the coordinator sends meanwhile
            _flush(server, s)
        return run

    ctl("nccl-hold")(handler(lambda s, a: hold(server, s, a.get("targets"), bool(a.get("cut")))))
    ctl("nccl-release")(handler(lambda s, a: release(server, s)))
    ctl("nccl-uid")(handler(lambda s, a: {"uid": server.dispatcher.libs.library("nccl").unique_id()}))
    ctl("nccl-recreate")(handler(lambda s, a: recreate(server, s, a.get("uids") or {})))


# ------------------------------------------------------------ checkpoint kind

def describe(sess) -> dict:
    cs = [c for c in comms(sess).values() if not c.nocolor]
    if not cs:
        return {}
    return {"nccl_comms": [{"comm": c.handle, "ident": c.ident, "nranks": c.nranks, "rank": c.rank,
                            "ctx": c.ctx_id, "seq": c.seq, "blocking": bool(c.blocking)} for c in cs]}


def rebuild(r) -> None:
    """The communicators come back pending, the session held until the
    coordinator makes them again (module docstring)."""
    rows_ = r.desc.get("nccl_comms") or []
    if not rows_:
        return
    table = comms(r.sess)
    for d in rows_:
        ctx = r.sess.contexts.get(int(d["ctx"]))
        c = Comm(int(d["comm"]), int(d["nranks"]), int(d["rank"]), ctx.device if ctx else -1, bool(d["blocking"]))
        c.ident, c.ctx_id, c.seq = str(d["ident"]), int(d["ctx"]), int(d["seq"])
        c.busy, c.code, c.pending = False, NCCL_SUCCESS, True
        table[c.handle] = c
    r.sess.nccl_hold = Hold(r.sess)


register(Kind("nccl_comms", Stage.NCCL, ("nccl_comms",), describe=describe, rebuild=rebuild, owner=__name__))
