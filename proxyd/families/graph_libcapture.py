"""Math-library work issued on a capturing stream (cuBLAS, cuBLASLt, cuDNN,
cuFFT, ... inside cuStreamBeginCapture/EndCapture: PyTorch's CUDA graphs,
torch.compile's "reduce-overhead" mode).

A captured graph here is the list of ops the worker replays at launch
(graphs.py). A library call cannot be kept that way: it reads its
descriptors and settings when it is *called* (the CUDA Programming Guide,
"CUDA Graphs": work captured from a library is recorded with the arguments
of the call), and the app may change or destroy them right after (PyTorch
destroys its cuBLASLt descriptors after every matmul). So the worker runs
the library call at capture time under a real stream capture of its own
stream (relaxed mode: the worker's other threads are not the app's) and
keeps the executable graph the driver built; a launch of the app's graph
launches it on the launch stream, in the graph's op order. On the emulated
backend, whose libraries run synchronously on the host, the call itself is
kept and run again at each launch.

Which library calls are captured: those that do work on a stream (spec
`restore: memory`) whose stream -- their stream argument (cublasLtMatmul)
or the stream set on their library handle (cublasSetStream & co, kept as
the handle's settings) -- is capturing. Settings and queries run at once,
as natively. Before this module such a cuBLAS call on a capturing handle
ran at once, outside the graph (a silently wrong graph); a cuBLASLt one was
refused.

Checkpoints: an image cannot hold the driver's executable graph, and the
descriptors and handles the call named may have changed or gone since the
capture. So each captured call keeps a *snapshot* of the library objects it
named, taken at capture time in the form the image keeps library objects
in (kind, creating call, settings: libraries.describe). The image records
the call and its snapshot (graph field `libcaptures`); a restore, once
streams and library objects exist again, recreates the snapshot's objects
as temporary ones, captures the call again with them on the restored
stream, and destroys them (realize_pending). On the emulated backend the
temporary objects are made at capture time too and kept while the graph
lives, so that a launch runs the call as it was captured. Calls naming
objects a snapshot cannot hold (cuDNN backend plans) make the dump refuse
with a clear error (describe_check).

Locking and ownership: the worker's main loop only (dispatch.py); the
executable graphs belong to the worker process and die with it.
"""
from __future__ import annotations

from ..core import protocol as P
from ..core.kinds import Kind, Stage, register
from ..core.session import CudaError

CUDA_ERROR_LAUNCH_FAILED = 719
# what a library family adds to its captured work (nccl_cut.py registers
# both, this module imports no family of its own): LAUNCH_HOOKS(sess, fid,
# args) after each launch of the driver's executable graph; AFTER_RESTORE
# (fid) -> True for work a restore captures again only later
LAUNCH_HOOKS: list = []
AFTER_RESTORE: list = []


def _real_stream(d, sess, st: int):
    if st in (0, P.STREAM_LEGACY, P.STREAM_PER_THREAD):
        return d.backend.stream(st)
    return sess.get(P.K_STREAM, st).real


def library_stream(sess, fn, args) -> int | None:
    """The app's stream handle a library call that does GPU work runs on,
    or None for calls that run at once (settings, queries, creates)."""
    if fn.restore != "memory":
        return None
    for i, (_n, role, kind, *_r) in enumerate(fn.params):
        if role == "handle" and kind == "stream" and i < len(args):
            return int(args[i] or 0)
    from .._generated import FUNCTIONS
    from .libraries import LIB_KINDS
    for i, (_n, role, kind, *_r) in enumerate(fn.params):
        if role != "handle" or kind not in LIB_KINDS or i >= len(args):
            continue
        o = sess.objects.get(P.split_handle(int(args[i] or 0)))
        if o is None:
            continue
        # the latest stream setting of the handle (libraries._record_setting)
        for sfid, sargs in reversed(list(o.info.get("settings", {}).values())):
            sfn = FUNCTIONS.get(sfid)
            if sfn is None:
                continue
            for j, (_n2, role2, kind2, *_r2) in enumerate(sfn.params):
                if role2 == "handle" and kind2 == "stream" and j < len(sargs):
                    return int(sargs[j] or 0)
        return 0
    return None


# kinds a snapshot cannot hold: their state is not (create, settings)
UNSNAPSHOTTABLE = {"cudnn_desc"}


class LibCapture:
    """The library work of one captured call: a real executable graph
    (cuda backend) or the call to run again with temporary copies of its
    objects (emulated backend); `objects` is the snapshot for the image,
    None when a named object cannot be kept that way."""

    def __init__(self, d, fid: int, ctxh: int, args: list, stream: int, objects, exec_=None, temps=(),
                 run_args=None):
        self.d, self.fid, self.ctxh, self.args, self.stream = d, fid, ctxh, args, stream
        self.objects, self.exec, self.temps = objects, exec_, list(temps)
        self.run_args = run_args if run_args is not None else args
        self.sess = None
        # read from an image and not yet made again (realize_pending)
        self.ready = exec_ is not None or run_args is not None or not objects

    def launch(self, sess, stream: int):
        from .._generated import FUNCTIONS
        fn = FUNCTIONS[self.fid]
        if self.exec is not None:
            self.d.backend.lib_graph_launch(self.exec, _real_stream(self.d, sess, stream))
            for hook in LAUNCH_HOOKS:
                hook(sess, self.fid, self.args)     # nccl_cut.launched: a captured collective counts
            return
        if not self.ready:
            raise CudaError(CUDA_ERROR_LAUNCH_FAILED, f"{fn.name}: captured library work not restored")
        code, _outs, msg = self.d.libs.run_op(sess, fn, self.fid, self.ctxh, list(self.run_args))
        if code:
            raise CudaError(CUDA_ERROR_LAUNCH_FAILED, msg or f"{fn.name} failed in a graph launch ({code})")

    def close(self):
        """Destroys the driver's executable graph now, while its context
        lives: on the H100 (driver 580) a cuGraphExecDestroy after the
        context was destroyed blocked for ever on a driver lock, and the
        garbage collector ran this object's __del__ just then when a
        GPU-only dump released the session (contexts.release_object)."""
        ex, self.exec = self.exec, None
        if ex is not None:
            try:
                self.d.backend.lib_graph_destroy(ex)
            except Exception:
                pass        # the worker is going away: the driver frees it with the context

    def __del__(self):
        self.close()
        if self.temps and self.sess is not None:
            try:
                _destroy_temps(self.d, self.sess, self.temps)
            except Exception:
                pass


def snapshot(sess, fn, args) -> list | None:
    """The library objects call `fn(args)` names, as they are now, in the
    image's form (libraries.describe) plus the parameter that names each;
    None if one of them cannot be kept that way."""
    from ..core.kinds import jsonable as _jsonable
    from .libraries import LIB_KINDS, lib_object
    out = []
    for i, (_n, role, kind, *_r) in enumerate(fn.params):
        if role != "handle" or kind not in LIB_KINDS or i >= len(args) or not args[i]:
            continue
        if kind in UNSNAPSHOTTABLE:
            return None
        o = lib_object(sess, kind, args[i])
        if o.create is None:
            return None
        fid, ctxh, cargs = o.create
        out.append({"param": i, "kind": kind, "ctx": o.ctx, "value": int(args[i]),
                    "create": [fid, ctxh, [_jsonable(a) for a in cargs]],
                    "settings": [[sfid, [_jsonable(a) for a in sargs]]
                                 for sfid, sargs in o.info.get("settings", {}).values()]})
    return out


_DESTROYERS: dict = {}


def _destroyer(kind: str):
    """The function id that destroys a library object of `kind` (its spec
    says `effect: destroy` and it takes the handle alone)."""
    if not _DESTROYERS:
        from .._generated import FUNCTIONS
        from .libraries import LIBRARY
        for fid, f in FUNCTIONS.items():
            if fid not in LIBRARY or len(f.params) != 1:
                continue
            for k, e in f.objects:
                if e == "destroy":
                    _DESTROYERS.setdefault(k, fid)
    return _DESTROYERS.get(kind)


def _destroy_temps(d, sess, temps):
    from .._generated import FUNCTIONS
    for kind, value, ctxh in reversed(temps):
        fid = _destroyer(kind)
        if fid is not None:
            d.libs.execute(sess, FUNCTIONS[fid], fid, ctxh, [value])


_temp_seq = [0x40000000]


def materialize(d, sess, objects: list, args: list) -> tuple[list, list]:
    """Temporary library objects made from a snapshot, and the call's
    arguments naming them instead of the originals. Returns (args, temps);
    temps are (kind, handle value, context handle) to destroy later.
    Ids the shim chooses (`ids: shim`) are taken from the top of the shim's
    id space, far above what a shim hands out (it counts up from 1)."""
    from .._generated import FUNCTIONS
    from ..core.kinds import unjson as _unjson
    from .libraries import LIB_KINDS, LIBRARY, STATUS, lib_object
    args, temps = list(args), []
    try:
        for od in objects:
            kind, kc = od["kind"], LIB_KINDS[od["kind"]]
            fid, ctxh, cargs = od["create"]
            fn = FUNCTIONS.get(int(fid))
            if fn is None or int(fid) not in LIBRARY:
                raise CudaError(CUDA_ERROR_LAUNCH_FAILED, f"captured library work: creating call {fid} unknown")
            cargs = [_unjson(a) for a in cargs]
            outs_at = [j for j, p in enumerate(fn.params) if p[1] in ("out_value", "out_buffer")]
            mine = [j for j in outs_at if fn.params[j][1] == "out_value" and fn.params[j][2] == kind]
            if fn.ids == "shim":
                while True:
                    _temp_seq[0] += 1
                    ident = P.SHIM_ID_BIT | _temp_seq[0]
                    if (kc, ident) not in sess.objects:
                        break
                for j in mine:
                    cargs[j] = P.make_handle(kc, ident)
                code, _ = d.libs.execute(sess, fn, int(fid), int(ctxh), cargs)
                value = P.make_handle(kc, ident)
            else:
                code, enc = d.libs.execute(sess, fn, int(fid), int(ctxh), cargs)
                value = enc[outs_at.index(mine[0])] if code == 0 and mine and enc else None
            if code != STATUS[LIBRARY[int(fid)]].success or value is None:
                raise CudaError(CUDA_ERROR_LAUNCH_FAILED, f"captured library work: recreating a {kind} failed ({code})")
            temps.append((kind, value, int(ctxh)))
            lib_object(sess, kind, value).info["graph_temp"] = True
            old = od["value"]
            for sfid, sargs in od["settings"]:
                sfn = FUNCTIONS[int(sfid)]
                sargs = [_unjson(a) for a in sargs]
                for j, p in enumerate(sfn.params):
                    if p[1] == "handle" and p[2] == kind and j < len(sargs) and sargs[j] == old:
                        sargs[j] = value
                code, _ = d.libs.execute(sess, sfn, int(sfid), int(ctxh), sargs)
                if code != STATUS[LIBRARY[int(sfid)]].success:
                    raise CudaError(CUDA_ERROR_LAUNCH_FAILED,
                                    f"captured library work: replaying {sfn.name} on a {kind} failed ({code})")
            args[int(od["param"])] = value
    except Exception:
        _destroy_temps(d, sess, temps)
        raise
    return args, temps


def _capture_now(d, sess, fn, fid, ctxh, args, st):
    """(exec, status, message): fn(args) run under a real capture of st."""
    b = d.backend
    result = {}

    def run():
        # nccl.py counts a collective when it is issued, and one captured
        # here is issued at each launch (nccl_cut.py, "Graph launches")
        prev, sess.lib_capturing = getattr(sess, "lib_capturing", False), True
        try:
            result["r"] = d.libs.run_op(sess, fn, fid, ctxh, list(args))
        finally:
            sess.lib_capturing = prev
    exec_, err = b.lib_graph_capture(_real_stream(d, sess, st), run)
    code, _outs, msg = result.get("r", (0, None, ""))
    if code or err:
        if exec_ is not None:
            b.lib_graph_destroy(exec_)
        return None, code or CUDA_ERROR_LAUNCH_FAILED, msg or f"{fn.name}: capturing the library's work failed: {err}"
    return exec_, 0, ""


def capture(d, sess, fn, op, st: int, frozen_args) -> tuple[object | None, int, str]:
    """Runs library op `op` under a real capture of its stream (cuda
    backend) or keeps it with temporary copies of its objects (emulated).
    Returns (LibCapture or None, status, message); the status is the
    library's, as its op would return it."""
    fid, ctxh, args = op[0], op[1], op[2:]
    objects = snapshot(sess, fn, frozen_args)
    if not hasattr(d.backend, "lib_graph_capture"):
        if objects is None:
            lc = LibCapture(d, fid, ctxh, frozen_args, st, None)
        else:
            run_args, temps = materialize(d, sess, objects, frozen_args)
            lc = LibCapture(d, fid, ctxh, frozen_args, st, objects, temps=temps, run_args=run_args)
        lc.sess = sess
        return lc, 0, ""
    exec_, code, msg = _capture_now(d, sess, fn, fid, ctxh, args, st)
    if exec_ is None:
        return None, code, msg
    return LibCapture(d, fid, ctxh, frozen_args, st, objects, exec_), 0, ""


def pending(sess) -> list:
    """LibCaptures read from an image, waiting for realize_pending."""
    lst = getattr(sess, "_lib_captures_pending", None)
    if lst is None:
        lst = sess._lib_captures_pending = []
    return lst


def from_image(d, sess, fid: int, ctxh: int, args: list, rec: dict):
    lc = LibCapture(d, fid, ctxh, args, int(rec["stream"]), rec["objects"])
    lc.sess, lc.ready = sess, False
    pending(sess).append(lc)
    return lc


def realize_pending(d, sess, todo: list | None = None):
    """After a restore has recreated streams and library objects: each
    captured call of the image is made again from its snapshot (module
    docstring). On the cuda backend a captured NCCL collective waits for
    its communicator, which the job's restore makes again later: it is
    kept in sess.lib_captures_after_comms, and nccl_cut.release passes
    that list here (todo)."""
    from .._generated import FUNCTIONS
    from ..core.kinds import CheckpointError
    later = []
    if todo is None:
        todo = pending(sess)
        if hasattr(d.backend, "lib_graph_capture"):
            def wait(fid):
                return any(f(fid) for f in AFTER_RESTORE)
            later = [lc for lc in todo if wait(lc.fid)]
            todo[:] = [lc for lc in todo if not wait(lc.fid)]
            if later:
                sess.lib_captures_after_comms = later
    for lc in todo:
        fn = FUNCTIONS[lc.fid]
        try:
            run_args, temps = materialize(d, sess, lc.objects, lc.args)
        except CudaError as e:
            raise CheckpointError(f"graph: {fn.name}: {e.message}") from None
        if not hasattr(d.backend, "lib_graph_capture"):
            lc.temps, lc.run_args, lc.ready = temps, run_args, True
            continue
        try:
            exec_, code, msg = _capture_now(d, sess, fn, lc.fid, lc.ctxh, run_args, lc.stream)
        finally:
            _destroy_temps(d, sess, temps)
        if exec_ is None:
            raise CheckpointError(f"graph: capturing {fn.name} again failed: {msg or code}")
        lc.exec, lc.ready = exec_, True
    todo.clear()


def _nodes_of(o) -> list:
    """The ops a graph or executable graph (its nodes) or an explicitly
    built graph node (its ops and child-graph ops) holds."""
    return o.info.get("nodes", []) if o.kind != P.K_GRAPH_NODE else o.info.get("ops", []) + o.info.get("child", [])


def close_in(o):
    """Closes the LibCaptures a graph, executable graph or graph node object
    holds (before its context goes: LibCapture.close)."""
    for node in _nodes_of(o):
        if isinstance(node, (list, tuple)) and len(node) > 2 and isinstance(node[2], LibCapture):
            node[2].close()


def describe_node(lc) -> dict:
    return {"stream": lc.stream, "objects": lc.objects}


def describe_check(sess):
    """Refuses a dump while a graph holds captured library work that a
    snapshot cannot keep, or that sits in an explicitly built graph's node
    (see the module's docstring)."""
    for kind in (P.K_GRAPH, P.K_GRAPH_EXEC, P.K_GRAPH_NODE):
        for o in sess.of_kind(kind):
            for node in _nodes_of(o):
                if isinstance(node[2], LibCapture) and (kind == P.K_GRAPH_NODE or node[2].objects is None):
                    from .._generated import FUNCTIONS
                    name = FUNCTIONS[node[2].fid].name
                    from ..core.kinds import CheckpointError
                    what = {P.K_GRAPH: "graph", P.K_GRAPH_EXEC: "executable graph"}.get(kind, "graph node")
                    raise CheckpointError(
                        f"{what} {o.id} holds {name} work captured "
                        f"from a stream that a checkpoint cannot keep (cuDNN backend plans, or a captured graph "
                        f"added as a child node): destroy the graph (and its executable graphs) before the dump")


# math-library calls captured into graphs, made again from their snapshots
# once streams and library objects exist (their records are part of `graphs`)
register(Kind("graph_libcapture", Stage.LIBCAPTURE, rebuild=lambda r: realize_pending(r.dispatcher, r.sess),
              owner=__name__))
