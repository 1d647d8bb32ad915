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

Checkpoints: an image cannot hold the driver's executable graph, and
re-running the library call at restore would read the descriptors as they
are then, not as they were at capture. So a dump of a session holding such
a graph is refused with a clear error (describe_check) until the app has
destroyed the graph; everything else is unchanged.

Locking and ownership: the worker's main loop only (dispatch.py); the
executable graphs belong to the worker process and die with it.
"""
from __future__ import annotations

from . import protocol as P
from .session import CudaError

CUDA_ERROR_LAUNCH_FAILED = 719


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
    from ._generated import FUNCTIONS
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


class LibCapture:
    """The library work of one captured call: a real executable graph
    (cuda backend) or the call to run again (emulated backend)."""

    def __init__(self, d, fid: int, ctxh: int, args: list, exec_=None):
        self.d, self.fid, self.ctxh, self.args, self.exec = d, fid, ctxh, args, exec_

    def launch(self, sess, stream: int):
        from ._generated import FUNCTIONS
        fn = FUNCTIONS[self.fid]
        if self.exec is not None:
            self.d.backend.lib_graph_launch(self.exec, _real_stream(self.d, sess, stream))
            return
        code, _outs, msg = self.d.libs.run_op(sess, fn, self.fid, self.ctxh, list(self.args))
        if code:
            raise CudaError(CUDA_ERROR_LAUNCH_FAILED, msg or f"{fn.name} failed in a graph launch ({code})")

    def __del__(self):
        if self.exec is not None:
            try:
                self.d.backend.lib_graph_destroy(self.exec)
            except Exception:
                pass        # the worker is going away: the driver frees it with the context


def capture(d, sess, fn, op, st: int, frozen_args) -> tuple[object | None, int, str]:
    """Runs library op `op` under a real capture of its stream (cuda
    backend) or keeps it (emulated). Returns (LibCapture or None, status,
    message); the status is the library's, as its op would return it."""
    fid, ctxh, args = op[0], op[1], op[2:]
    b = d.backend
    if not hasattr(b, "lib_graph_capture"):
        return LibCapture(d, fid, ctxh, frozen_args), 0, ""
    real = _real_stream(d, sess, st)
    result = {}

    def run():
        result["r"] = d.libs.run_op(sess, fn, fid, ctxh, list(args))
    exec_, err = b.lib_graph_capture(real, run)
    code, _outs, msg = result.get("r", (0, None, ""))
    if code or err:
        if exec_ is not None:
            b.lib_graph_destroy(exec_)
        return None, code or CUDA_ERROR_LAUNCH_FAILED, msg or f"{fn.name}: capturing the library's work failed: {err}"
    return LibCapture(d, fid, ctxh, frozen_args, exec_), 0, ""


def describe_check(sess):
    """Refuses a dump while a graph holds captured library work (see the
    module's docstring)."""
    for kind in (P.K_GRAPH, P.K_GRAPH_EXEC, P.K_GRAPH_NODE):
        for o in sess.of_kind(kind):
            for node in o.info.get("nodes", []) + o.info.get("ops", []) + o.info.get("child", []):
                if isinstance(node[2], LibCapture):
                    from ._generated import FUNCTIONS
                    name = FUNCTIONS[node[2].fid].name
                    from .checkpoint.engine import CheckpointError
                    what = {P.K_GRAPH: "graph", P.K_GRAPH_EXEC: "executable graph"}.get(kind, "graph node")
                    raise CheckpointError(
                        f"{what} {o.id} holds {name} work captured "
                        f"from a stream; checkpointing graphs with captured math-library calls is not supported "
                        f"yet: destroy the graph (and its executable graphs) before the dump")
