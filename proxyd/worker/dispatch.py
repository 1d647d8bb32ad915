"""Executes the ops of a client message (docs/protocol.md).

An op is [fid, ctx, arg...] with one argument per parameter of the spec'd
driver function. Functions with a `handler` in their spec go to the
hand-written handler of that name (families/*.py); all others take the generic
path: decode each argument by its role, translate handles to the backend's
objects, call the backend's function of the same name, then register created
objects, drop destroyed ones and encode the out-values. A successful call
whose spec says `restore: replay` is recorded on the session
(Session.record_replay), whichever path ran it; the checkpoint engine writes
the records into the image and replays them through run_op on restore.

Locking: runs on the daemon's main loop.
"""
from __future__ import annotations

import logging
import os

from ..core import protocol as P
from .._generated import FUNCTIONS, NAMES
from ..core.ratelog import RATE
from ..core.session import CudaError, Session
from ..core.registry import (  # noqa: F401  (some re-exported: tests use them by dispatch's name)
    _ROLE_TYPES, CUDA_ERROR_CONTEXT_IS_DESTROYED, CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS, HANDLERS, LIBRARY_IDS, bad_argument, handler,
    norm_scalar)
from ..core.shm import ShmError
from ..families.devnum import app_outs, physical_args

log = logging.getLogger("proxyd")
# GPUPROXY_LOG_CALL_ERRORS=1: one log line per call that proxyd answers with
# an error (a diagnostic: which call of an app's own runtime failed)
_LOG_CALL_ERRORS = os.environ.get("GPUPROXY_LOG_CALL_ERRORS") == "1"


def _arg_checks(fn) -> tuple:
    """bad_argument's tests for fn, worked out once: (index, allowed types
    or None, types that skip the test or None, integer required). The spec
    tables do not change while proxyd runs."""
    out = []
    for i, (name, role, _kind, _ctype, cls, _size, _sz) in enumerate(fn.params):
        ok = _ROLE_TYPES.get(role)
        alt = ()
        if role == "in_buffer" and fn.shim == "override":
            alt += (list,)
        if role == "in_buffer" and fn.handler == "module_load":
            alt += (P.ContentRef,)
        alt = alt or None
        int_only = role == "scalar" and cls in ("int", "uint")
        if ok is not None or int_only:
            out.append((i, ok, alt, int_only))
    return tuple(out)


def args_fit(checks: tuple, args: list) -> bool:
    """The fast form of bad_argument (same tests): True when args pass."""
    for i, ok, alt, int_only in checks:
        a = args[i]
        if a is None or (alt is not None and isinstance(a, alt)):
            continue
        if ok is not None and not isinstance(a, ok):
            return False
        if int_only and not isinstance(a, int):
            return False
    return True


def answered(sess) -> bool:
    """Whether the library op just run is answered although its spec says
    asynchronous (a cuRAND host generator's generate call: libraries.run_op
    sets the flag, proxyd/families/curand_host.py); reads and clears it."""
    a = getattr(sess, "lib_answered", False)
    sess.lib_answered = False
    return a


class Plan:
    """What run_op needs of one function besides its spec entry, worked out
    on its first call (Dispatcher.plan): a round trip then pays no walk
    over the spec's tables."""
    __slots__ = ("fn", "nparams", "checks", "uses_ctx", "ctx_setting", "replay", "handler", "sync")

    def __init__(self, fn):
        self.fn = fn
        self.nparams = len(fn.params)
        self.checks = _arg_checks(fn)
        self.uses_ctx = any(kind == "context" and effect == "use" for kind, effect in fn.objects)
        self.ctx_setting = -1 in fn.key
        self.replay = fn.restore == "replay"
        self.handler = HANDLERS.get(fn.handler) if fn.handler else None
        self.sync = fn.sync


# generic()'s argument conversions by role (_generic_plan)
_C_INT, _C_OUT, _C_PTR, _C_HANDLE, _C_STRUCT, _C_BUF, _C_NONE = range(7)


def _generic_plan(fn) -> tuple:
    """generic()'s walk over fn's parameters, worked out once: per argument
    (conversion, name, kind, value class, size); per out-value (role, kind,
    kind code: None for a plain value, -1 for an unknown kind); the kinds fn
    creates; (index, kind) of the handles it destroys."""
    conv, outs, destroys = [], [], []
    creates = frozenset(k for k, e in fn.objects if e == "create")
    for i, (name, role, kind, _ctype, cls, size, _sz) in enumerate(fn.params):
        if role == "scalar":
            code = _C_STRUCT if cls == "struct" else _C_INT
        elif role == "device_ptr":
            code = _C_PTR
        elif role == "handle":
            code = _C_INT if kind in ("memory", "device") else _C_HANDLE
            if (kind, "destroy") in fn.objects:
                destroys.append((i, kind))
        elif role == "in_buffer":
            code = _C_BUF
        elif role in ("out_buffer", "out_value"):
            code = _C_OUT
            kc = None
            if role == "out_value" and kind and kind not in ("memory", "device"):
                kc = P.KIND_CODES.get(kind, -1)
            outs.append((role, kind, kc))
        else:
            code = _C_NONE
            kind = role
        conv.append((code, name, kind, cls, size))
    return tuple(conv), tuple(outs), creates, tuple(destroys)


class Dispatcher:
    def __init__(self, backend):
        self.backend = backend
        from .. import families
        families.load_all()     # each family registers its @handler functions and object kinds on import
        from ..families import graphs
        self._capture_op = graphs.capture_op
        from ..families.libraries import LibraryCalls
        self.libs = LibraryCalls(self)      # cuBLAS, cuBLASLt, NVML ops (handler "library")
        # Kernel launches are the hottest op by far (a training step issues
        # thousands): they get a direct path that skips the generic
        # bookkeeping but makes the same checks.
        self.fast = {fid: self.launch_fast for fid, fn in FUNCTIONS.items() if fn.handler == "launch_kernel"}
        self._plans: dict[int, Plan] = {}
        self._generic_plans: dict[int, tuple] = {}

    def launch_fast(self, sess: Session, op: list):
        if len(op) != 13 or any(type(v) is not int for v in op[1:10]) or \
                not (op[10] is None or type(op[10]) is int) or not (op[11] is None or isinstance(op[11], bytes)):
            raise CudaError(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel: malformed op")
        ctxh = op[1]
        if ctxh:
            self.backend.make_current(sess.context(ctxh).real)
        f = sess.get(P.K_FUNCTION, op[2])
        st = op[10] or 0
        stream = self.backend.stream(st) if st < 3 else sess.get(P.K_STREAM, st).real
        self.backend.launch(f.real, (op[3], op[4], op[5]), (op[6], op[7], op[8]), op[9], stream,
                            op[11] or b"", f.info)

    # ------------------------------------------------------------- helpers
    def resolve_handle(self, sess: Session, kind_name: str | None, value):
        if value is None:
            return None
        value = int(value)
        if kind_name == "stream" and value in (0, P.STREAM_LEGACY, P.STREAM_PER_THREAD):
            return self.backend.stream(value)
        if kind_name == "context":
            return sess.context(value).real if value else None
        if value == 0:
            return None
        kind = P.KIND_CODES.get(kind_name)
        if kind is None:
            raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"objects of kind {kind_name} are not supported")
        return sess.get(kind, value).real

    def data(self, sess: Session, v):
        """An in-buffer argument: bytes (inline or frame) or a shared-memory reference."""
        if isinstance(v, P.ShmRef):
            try:
                return sess.shm.view(v.seg, v.offset, v.length)
            except ShmError as e:
                raise CudaError(CUDA_ERROR_INVALID_VALUE, str(e)) from e
        return v

    # --------------------------------------------------------------- ops
    def plan(self, fid: int) -> Plan | None:
        p = self._plans.get(fid)
        if p is None:
            fn = FUNCTIONS.get(fid)
            if fn is None or fn.handler == "library":
                return None
            p = self._plans[fid] = Plan(fn)
        return p

    def run_op(self, sess: Session, op: list) -> tuple[int, list | None, str]:
        if not isinstance(op, list) or len(op) < 2 or type(op[0]) is not int or type(op[1]) is not int:
            return CUDA_ERROR_INVALID_VALUE, None, "malformed op (expected [function id, context, args...])"
        fid, ctxh, args = op[0], op[1], op[2:]
        plan = self._plans.get(fid) or self.plan(fid)
        if plan is None:
            fn = FUNCTIONS.get(fid)
            if fn is None:
                name = NAMES.get(fid, f"function id {fid}")
                if fid in NAMES and fid >= LIBRARY_IDS:
                    # an unsupported library function: the library's not-supported status
                    from ..families.libraries import STATUS, api_of
                    return STATUS[api_of(fid)].not_supported, None, f"{name} is not supported by proxyd"
                return CUDA_ERROR_NOT_SUPPORTED, None, f"{name} is not supported by proxyd"
            # codes are the library's statuses (libraries.py), not CUresult
            return self.libs.run_op(sess, fn, fid, ctxh, args)
        fn = plan.fn
        if sess.dev_map:
            args = physical_args(sess, fn, args)     # the app's device numbers after a remapping restore
        if len(args) != plan.nparams:
            return CUDA_ERROR_INVALID_VALUE, None, f"{fn.name}: {len(args)} arguments for {len(fn.params)} parameters"
        if not args_fit(plan.checks, args):
            return CUDA_ERROR_INVALID_VALUE, None, bad_argument(fn, args)
        ctx = None
        if ctxh:
            # the context by its id without a call (Session.context does the same)
            ctx = sess.contexts.get(ctxh & 0xFFFFFFFF) if ctxh >> 32 == P.K_CONTEXT else None
            if ctx is None and sess.is_reset_primary(ctxh):
                # The thread's current context is a primary context that
                # cuDevicePrimaryCtxReset destroyed; its handle stays valid and
                # comes back with the next retain (Session.primary_ident). Calls
                # that use no context (device queries, that retain) run without
                # one; the others fail as the driver fails them (cuda.h,
                # CUDA_ERROR_CONTEXT_IS_DESTROYED: "a primary context which has
                # not yet been initialized").
                if plan.uses_ctx:
                    return CUDA_ERROR_CONTEXT_IS_DESTROYED, None, f"{fn.name}: the current primary context was reset"
                ctxh = 0
        try:
            if ctxh and ctx is None:
                ctx = sess.context(ctxh)      # raises: invalid context
            if ctx is not None:
                self.backend.make_current(ctx.real)
            elif plan.ctx_setting:
                # a setting of the current context (spec: restore key names
                # `context`): without one it would land in whatever context
                # proxyd's thread last used, which is not this client's
                return CUDA_ERROR_INVALID_CONTEXT, None, f"{fn.name}: no current context on the calling thread"
            if fn.handler:
                h = plan.handler
                if h is None:
                    return CUDA_ERROR_NOT_SUPPORTED, None, f"{fn.name}: handler {fn.handler} missing in proxyd"
                code, outs = h(self, sess, fn, ctx, args, fid=fid, ctxh=ctxh)
            else:
                code, outs = self.generic(sess, fn, ctx, args, fid, ctxh)
            if code == CUDA_SUCCESS and plan.replay:
                sess.record_replay(fn, fid, ctxh, args)
            if sess.dev_map and outs:
                outs = app_outs(sess, fn, outs)     # device locations in the app's numbers (devnum.py)
            return code, outs, ""
        except CudaError as e:
            if _LOG_CALL_ERRORS:
                log.warning("call %s failed: %d %s", fn.name, e.code, e.message)
            return e.code, None, e.message
        except Exception as e:  # a bug in proxyd must not take the daemon down
            RATE.internal_error("internal error in a call", f"{fn.name} failed inside proxyd", e)
            return CUDA_ERROR_UNKNOWN, None, f"{fn.name}: internal error in proxyd: {e}"

    def generic(self, sess: Session, fn, ctx, args: list, fid: int, ctxh: int, force_ids: dict | None = None):
        gp = self._generic_plans.get(fid)
        if gp is None or gp[0] is not fn:
            gp = self._generic_plans[fid] = (fn,) + _generic_plan(fn)
        _fn, conv, outs_spec, creates, destroys = gp
        cargs = []
        for (code, name, kind, cls, size), a in zip(conv, args):
            if code == _C_INT:
                cargs.append(norm_scalar(a, cls, size))
            elif code == _C_OUT:
                cargs.append(a if a else None)
            elif code == _C_PTR:
                cargs.append(sess.translate(int(a or 0)) if sess.addr_map else int(a or 0))
            elif code == _C_HANDLE:
                cargs.append(self.resolve_handle(sess, kind, a))
            elif code == _C_STRUCT:
                cargs.append(bytes(a))
            elif code == _C_BUF:
                cargs.append(self.data(sess, a))
            else:
                raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name}: parameter {name} ({kind}) cannot be remoted")
        shim_ids = {}
        if fn.ids == "shim" and not force_ids:
            # spec `ids: shim` (cuEventCreate): the shim named the object and
            # sent the handle in the out parameter's slot; checked before the
            # driver creates anything, so a refused handle leaks nothing. (A
            # restore passes force_ids: images made before events were named
            # by the shim carry `true` there.)
            for (code_, _n, kind, _c, _s), a in zip(conv, args):
                if code_ == _C_OUT and kind in creates:
                    shim_ids[kind] = sess.shim_ident(P.KIND_CODES.get(kind), a, fn.name)
        code, outs = self.backend.call(fn, cargs)
        if code != CUDA_SUCCESS:
            return code, None
        enc = []
        for (role, kind, kc), v in zip(outs_spec, outs):
            if v is None:
                enc.append(None)
            elif kc is not None:
                if kc < 0:
                    raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"objects of kind {kind} are not supported")
                if kind in creates:
                    ident = (force_ids or shim_ids).get(kind)
                    o = sess.add(kc, v, ctx.id if ctx else 0, create=(fid, ctxh, list(args)), ident=ident)
                    enc.append(o.handle)
                else:
                    enc.append(self._handle_of(sess, kc, v))
            else:
                enc.append(v)
        for i, kind in destroys:
            a = args[i]
            if a:
                o = sess.remove(P.KIND_CODES[kind], int(a))
                self.backend_destroyed(o)
        return code, enc

    def _handle_of(self, sess, kc, real):
        for (k, _), o in sess.objects.items():
            if k == kc and o.real == real:
                return o.handle
        raise CudaError(CUDA_ERROR_UNKNOWN, "driver returned an object proxyd does not know")

    def backend_destroyed(self, o):
        """Hook for objects destroyed through the generic path."""

    # ------------------------------------------------------------ messages
    def run_ops(self, sess: Session, ops: list, raw=None) -> tuple[int, list | None, str]:
        """Runs all ops of one message; returns the result of the last op if
        it is synchronous (its reply), else (0, None). Failures of async ops
        are recorded on the session and reported with the next reply.
        raw: the message's msgpack frame, for the native launch path."""
        code, outs, msg = CUDA_SUCCESS, None, ""
        fast = self.fast
        if not isinstance(ops, list):
            return CUDA_ERROR_INVALID_VALUE, None, "malformed message: the ops are not a list"
        if len(ops) == 1 and not sess.capture:
            # One op that is not a launch (a synchronous call on its own, the
            # round trip of issue 13 target 4): the loop below without its
            # native-launch and capture bookkeeping, same results.
            op = ops[0]
            if type(op) is list and op and type(op[0]) is int and op[0] not in fast:
                c, o, m = self.run_op(sess, op)
                sess.calls += 1
                fid = op[0]
                fn = FUNCTIONS.get(fid)
                if fn is not None and (fn.sync or answered(sess)):
                    return c, o, m
                if c != CUDA_SUCCESS:
                    name = fn.name if fn else NAMES.get(fid, str(fid))
                    sess.note_async_error(c, fid, m or f"{name} failed with error {c}")
                    if m:
                        RATE.event("failed call", "session %s: %s", sess.token, m)
                return code, outs, msg
        nat = getattr(self.backend, "native", None) if raw is not None and not sess.capture else None
        if nat is not None and not any(isinstance(op, list) and op and type(op[0]) is int and op[0] in fast
                                       for op in ops):
            nat = None      # no launch in this message
        off = -1
        if nat is not None:
            off, n = nat.ops_start(raw)
            if off < 0 or n != len(ops):
                nat = None
        i, nops = 0, len(ops)
        while i < nops:
            op = ops[i]
            if sess.capture:
                # a stream is capturing (graphs.py): its ops go into the graph
                captured, c, m, couts = self._capture_op(self, sess, op)
                if captured:
                    sess.calls += 1
                    fid = op[0]
                    fn = FUNCTIONS.get(fid)
                    if i == nops - 1 and fn is not None and fn.sync:
                        if c != CUDA_SUCCESS:
                            couts = None
                        elif couts is None:
                            couts = [None] * sum(1 for p in fn.params if p[1] in ("out_value", "out_buffer"))
                        code, outs, msg = c, couts, m
                    elif c != CUDA_SUCCESS:
                        sess.note_async_error(c, fid, m)
                    if nat is not None:
                        off = nat.skip(raw, off)
                        if off < 0:
                            nat = None
                    i += 1
                    continue
            h = fast.get(op[0]) if isinstance(op, list) and op and type(op[0]) is int else None
            if h is not None and nat is not None:
                done, off2, err, erri = self.backend.native_launches(sess.slot, raw, off, nops - i)
                if done:
                    sess.calls += done
                    if err:
                        f = ops[i + erri]
                        sess.note_async_error(err, f[0], f"cuLaunchKernel failed: {self.backend.err_name(err)}")
                    i += done
                    off = off2
                    continue
            if h is not None:
                sess.calls += 1
                try:
                    h(sess, op)
                    c = CUDA_SUCCESS
                except CudaError as e:
                    c, m = e.code, e.message
                except Exception as e:
                    RATE.internal_error("internal error in a call", "cuLaunchKernel failed inside proxyd", e)
                    c, m = CUDA_ERROR_UNKNOWN, f"cuLaunchKernel: internal error in proxyd: {e}"
                if c != CUDA_SUCCESS:
                    # launches are async: their failure is reported with a later answer
                    sess.note_async_error(c, op[0], m or f"cuLaunchKernel failed with error {c}")
            else:
                c, o, m = self.run_op(sess, op)
                sess.calls += 1
                fid = op[0] if isinstance(op, list) and op and type(op[0]) is int else 0
                fn = FUNCTIONS.get(fid)
                if i == nops - 1 and fn is not None and (fn.sync or answered(sess)):
                    code, outs, msg = c, o, m
                elif c != CUDA_SUCCESS:
                    name = fn.name if fn else NAMES.get(fid, str(fid))
                    sess.note_async_error(c, fid, m or f"{name} failed with error {c}")
                    if m:
                        RATE.event("failed call", "session %s: %s", sess.token, m)
            if nat is not None:
                off = nat.skip(raw, off)
                if off < 0:
                    nat = None
            i += 1
        return code, outs, msg
