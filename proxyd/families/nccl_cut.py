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

**Graph launches.** A collective captured into a CUDA graph
(graph_libcapture.py keeps it as a LibCapture node naming the op and its
communicator, recorded at capture) runs at every launch of the graph, not
when it was captured: `Comm.seq` counts it at each launch (the emulated
backend runs the op again, which counts; on the cuda backend the driver's
executable graph runs and LibCapture.launch calls launched()), never at
the capture (nccl.py skips the count while the worker captures), and the
hold counts a message's cuGraphLaunch as the collectives its executable
graph runs (graph_collectives: its enabled captured collectives, and
those of graphs it launches in turn), so a rank stops before a launch
that would take a communicator past its target, as before a collective.
The one case that cannot be counted -- an executable graph instantiated
for device launch (CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH: kernels may
launch it any number of times) that holds collectives -- refuses the cut
with one line naming it. After a restore on the cuda backend a captured
collective can be captured again only once its communicator exists, so
the restore defers it to `nccl-release` (graph_libcapture.realize_pending).

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
from ..core import protocol as P
from ..core.kinds import Kind, Stage, register
from .graph_exec_state import skipped_positions
from .graph_libcapture import AFTER_RESTORE, LAUNCH_HOOKS, LibCapture, realize_pending
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
# cuGraphLaunch(_ptsz): the handler that runs an executable graph (graphs.py)
_LAUNCH = frozenset(fid for fid, fn in FUNCTIONS.items() if fn.handler == "graph_launch")
CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH = 4       # cuda.h CUgraphInstantiate_flags
_NEST = 16                                          # graphs launched from graphs, at most this deep


def _comm_arg() -> dict[int, tuple[str, int]]:
    global _COMM_ARG
    if _COMM_ARG is None:
        _COMM_ARG = _comm_arg_index()
    return _COMM_ARG


def graph_collectives(sess, exec_handle, depth: int = 0) -> list[tuple[str, int]]:
    """(function name, communicator handle) of each collective a launch of
    the executable graph runs, in order: its enabled captured collectives
    (LibCapture nodes, recorded at capture) and those of the graphs it
    launches in turn (a captured cuGraphLaunch node)."""
    e = sess.objects.get(P.split_handle(int(exec_handle or 0))) if type(exec_handle) is int else None
    if e is None or e.kind != P.K_GRAPH_EXEC or depth > _NEST:
        return []           # not an executable graph: the launch fails as usual, running nothing
    arg, skip, out = _comm_arg(), skipped_positions(e), []
    for k, node in enumerate(e.info.get("nodes", ())):
        fid, nargs = node[0], node[2]
        if k in skip:
            continue
        if isinstance(nargs, LibCapture):
            hit = arg.get(nargs.fid)
            if hit is not None and hit[0] in COLLECTIVES and len(nargs.args) > hit[1]:
                h = nargs.args[hit[1]]
                out.append((hit[0], int(h) if type(h) is int else 0))
        elif fid in _LAUNCH and nargs:
            out += graph_collectives(sess, nargs[0], depth + 1)
    return out


def launched(sess, fid: int, args) -> None:
    """A captured collective ran as part of a graph launch without its op
    (cuda backend: the driver's executable graph): its communicator counts
    it as nccl.py counts an issued one."""
    hit = _comm_arg().get(fid)
    if hit is not None and hit[0] in COLLECTIVES and len(args) > hit[1]:
        h = args[hit[1]]
        c = comms(sess).get(int(h) if type(h) is int else 0)
        if c is not None:
            c.seq += 1


def needs_communicator(fid: int) -> bool:
    """Whether captured library work of op fid runs on a communicator (it
    can be captured again only once the communicator is made again)."""
    return fid in _comm_arg()


LAUNCH_HOOKS.append(launched)
AFTER_RESTORE.append(needs_communicator)


def _comm_ops(ops, sess=None) -> list[tuple[str, int]]:
    """(function name, communicator handle) of each NCCL op of a message
    that needs its communicator, in order; a graph launch stands for the
    collectives its executable graph runs."""
    arg = _comm_arg()
    out = []
    for op in ops if isinstance(ops, list) else ():
        if type(op) is list and len(op) > 2 and type(op[0]) is int:
            hit = arg.get(op[0])
            if hit is not None and len(op) > 2 + hit[1]:
                h = op[2 + hit[1]]
                out.append((hit[0], int(h) if type(h) is int else 0))
            elif op[0] in _LAUNCH and sess is not None:
                out += graph_collectives(sess, op[2])
    return out


def uncountable(sess) -> list[str]:
    """Why the cut cannot count this session's collectives (module
    docstring, "Graph launches"); [] when it can."""
    why = []
    for e in sess.of_kind(P.K_GRAPH_EXEC):
        if int(e.info.get("flags", 0)) & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH:
            held = graph_collectives(sess, e.handle)
            if held:
                why.append(f"executable graph {e.id} was instantiated for device launch and holds {held[0][0]}: "
                           f"launches from kernels cannot be counted, so no consistent cut can be taken")
    return why


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
        for name, h in _comm_ops(ops, sess):
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
        why += uncountable(s)
        s.nccl_cut = not why
        out["cut"] = s.nccl_cut
        out["why"] = "; ".join(why)
    return out


def release(server, s) -> dict:
    pend = [c.ident for c in comms(s).values() if c.pending]
    if pend:
        raise ValueError(f"{len(pend)} communicator(s) of pid {s.pid} are not made again yet (nccl-recreate)")
    later = getattr(s, "lib_captures_after_comms", None)
    if later:
        # collectives captured into graphs, captured again now that their
        # communicators exist (module docstring, "Graph launches")
        from ..core.kinds import CheckpointError
        try:
            realize_pending(server.dispatcher, s, later)
        except CheckpointError as e:
            raise ValueError(f"pid {s.pid}: {e}") from None
        s.lib_captures_after_comms = None
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
