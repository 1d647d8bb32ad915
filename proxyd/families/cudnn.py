"""cuDNN's backend (graph) API in the worker (docs/libraries.md, "cuDNN").

The shim's libcudnn.so.9 sends five backend calls in a form of their own
(interceptor/lib_cudnn.c); this module decodes them, translates the
handles inside attribute arrays, runs NVIDIA's cuDNN (or the emulated one,
proxyd/backends/emu/cudnn.py) and keeps what a restore needs:

* cudnnBackendCreateDescriptor(type, handle): the shim chose the handle
  ((K_CUDNN_BACKEND_DESC << 32) | n); the descriptor becomes the session
  object with that id. Asynchronous.
* cudnnBackendSetAttribute(desc, name, type, count, elements): elements are
  bytes, elementCount items of the type's size (cudnn_graph.h,
  cudnnBackendAttributeType_t). CUDNN_TYPE_BACKEND_DESCRIPTOR items are the
  app's descriptor handles, CUDNN_TYPE_HANDLE items its cudnnHandle_t
  handles: both are translated to cuDNN's. CUDNN_TYPE_VOID_PTR items are
  device addresses (the same in app and worker), except a variant pack's
  by-value scalars, which arrive as [elements, {index: 8 bytes}]: cuDNN is
  pointed at a copy the descriptor keeps. Asynchronous.
* cudnnBackendGetAttribute: synchronous. With CUDNN_TYPE_BACKEND_DESCRIPTOR
  the app passes descriptors it created, and cuDNN fills them (engine
  heuristics' results, a plan's engine config): a "fill".
* cudnnBackendFinalize: synchronous; answers cuDNN's status.
* cudnnBackendDestroyDescriptor: asynchronous.

Errors. A create or set that fails (natively: that call's status) cannot
answer the app, which already went on; its status is kept on the
descriptor and answered by the next synchronous call on it (Finalize,
GetAttribute), where cudnn-frontend checks statuses anyway. A descriptor
whose creation failed is kept as a placeholder answering that status.

Restore. Each session keeps an ordered log of the backend calls that made
its live descriptors what they are: creates, sets, fills and finalizes
(BackendLog). A destroyed descriptor's calls are dropped as soon as no
logged call of a live one refers to it (reference counting); otherwise they
stay, and a restore recreates it and destroys it again after the replay.
A restore (rebuild) replays the log in order in the fresh worker, with the
old handles: tensors, operations and graphs are set up again, heuristics
are asked again (same GPU model and cuDNN: same answers) and execution
plans are finalized again (cuDNN picks and, for runtime-compiled engines,
compiles their kernels again: the cost of a restore is that of building
the plans natively, typically milliseconds to a second per plan). A log
that names a cuDNN handle the app has destroyed cannot be replayed: the
dump is refused, saying so (describe).

Locking: the worker's main loop only (like libraries.py).
"""
from __future__ import annotations

import ctypes
import logging
import struct

from ..core import protocol as P
from ..core.kinds import Kind, Stage, register
from ..core.session import CudaError, Session

log = logging.getLogger("proxyd")

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_HANDLE = 400

# cudnn_graph.h cudnnStatus_t
SUCCESS, BAD_PARAM, BAD_PARAM_NULL, NOT_SUPPORTED = 0, 2000, 2002, 3000
# cudnn_graph.h cudnnBackendAttributeType_t
T_HANDLE, T_VOID_PTR, T_BACKEND_DESCRIPTOR = 0, 6, 15
ATTR_VARIANT_PACK_DATA_POINTERS = 1001
D_VARIANT_PACK = 16         # cudnnBackendDescriptorType_t

SPECIAL = ("cudnnBackendCreateDescriptor", "cudnnBackendDestroyDescriptor", "cudnnBackendSetAttribute",
           "cudnnBackendGetAttribute", "cudnnBackendFinalize")


def elem_size(t: int) -> int:
    """Bytes per element of attribute type t (as interceptor/lib_cudnn.c)."""
    if t in (0, 3, 5, 6, 15):          # HANDLE, INT64, DOUBLE, VOID_PTR, BACKEND_DESCRIPTOR
        return 8
    if t in (2, 24):                   # BOOLEAN (C++ bool), CHAR
        return 1
    if t == 26:                        # FRACTION: two int64_t
        return 16
    if 0 <= t <= 30:                   # FLOAT, INT32 and the enumerated types
        return 4
    return 0


def _u64s(data: bytes, n: int) -> list[int]:
    return list(struct.unpack(f"<{n}Q", data[:8 * n]))


class BackendLog:
    """The calls that made a session's live backend descriptors (see the
    module comment). ops: seq -> (fid, ctxh, args) in call order; subj: handle
    -> seqs of its own calls; refs: handle -> seqs of other descriptors' calls
    that name it; dead: destroyed handles whose calls are still needed."""

    def __init__(self):
        self.seq = 0
        self.ops: dict[int, tuple] = {}
        self.meta: dict[int, tuple] = {}     # seq -> (subjects, referenced descriptors, cudnn handles)
        self.subj: dict[int, list] = {}
        self.refs: dict[int, set] = {}
        self.types: dict[int, int] = {}      # handle -> descriptor type
        self.dead: set[int] = set()

    def add(self, fid, ctxh, args, subjects, refs=(), handles=()):
        self.seq += 1
        s = self.seq
        self.ops[s] = (fid, ctxh, list(args))
        self.meta[s] = (tuple(subjects), tuple(refs), tuple(handles))
        for h in subjects:
            self.subj.setdefault(h, []).append(s)
        for r in refs:
            self.refs.setdefault(r, set()).add(s)

    def destroyed(self, h: int):
        if h not in self.subj:
            return
        self.dead.add(h)
        if not self.refs.get(h):
            self._collect(h)

    def _collect(self, h: int):
        self.dead.discard(h)
        self.types.pop(h, None)
        self.refs.pop(h, None)
        for s in self.subj.pop(h, []):
            m = self.meta.get(s)
            if m is None:
                continue
            subjects, refs, _ = m
            if any(x in self.subj for x in subjects if x != h):
                continue        # a fill that still makes another live descriptor
            del self.ops[s], self.meta[s]
            for r in refs:
                rb = self.refs.get(r)
                if rb is not None:
                    rb.discard(s)
                    if not rb and r in self.dead:
                        self._collect(r)


def log_of(sess: Session) -> BackendLog:
    lg = getattr(sess, "cudnn_log", None)
    if lg is None:
        lg = sess.cudnn_log = BackendLog()
    return lg


class CudnnBackendCalls:
    """Runs the five special backend calls for LibraryCalls.execute."""

    def __init__(self, calls):
        self.calls = calls
        self.d = calls.d

    # ------------------------------------------------------------ helpers
    def _desc(self, sess: Session, h) -> "object":
        if type(h) is not int or P.split_handle(h)[0] != P.K_CUDNN_BACKEND_DESC:
            raise CudaError(CUDA_ERROR_INVALID_HANDLE, f"invalid cudnnBackendDescriptor_t {h!r}")
        return sess.get(P.K_CUDNN_BACKEND_DESC, h)

    def _translate(self, sess: Session, o, atype: int, count: int, data: bytes, byval: dict | None):
        """Elements with the app's handles -> cuDNN's; (bytes, descriptor
        handles named, cudnn handles named, status of a failed descriptor named)."""
        es = elem_size(atype)
        if len(data) != es * count:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{count} elements of type {atype} need {es * count} bytes, "
                                                      f"got {len(data)}")
        refs, handles, bad = [], [], 0
        if atype == T_BACKEND_DESCRIPTOR:
            reals = []
            for h in _u64s(data, count):
                if h == 0:
                    reals.append(0)     # NULL passes as NULL: cuDNN answers it as natively
                    continue
                r = self._desc(sess, h)
                refs.append(h)
                if r.real is None:
                    bad = bad or r.info.get("deferred", BAD_PARAM)
                reals.append(int(r.real or 0))
            data = struct.pack(f"<{count}Q", *reals)
        elif atype == T_HANDLE:
            reals = []
            for h in _u64s(data, count):
                handles.append(h)
                reals.append(int(sess.get(P.K_CUDNN_HANDLE, h).real))
            data = struct.pack(f"<{count}Q", *reals)
        elif atype == T_VOID_PTR:
            ptrs = _u64s(data, count)
            if sess.addr_map:
                ptrs = [sess.translate(p) if p else 0 for p in ptrs]
            if byval:
                keep = o.info.setdefault("byval", {})
                for i, raw in byval.items():
                    i = int(i)
                    if not 0 <= i < count or not isinstance(raw, (bytes, bytearray)) or len(raw) != 8:
                        raise CudaError(CUDA_ERROR_INVALID_VALUE, "malformed by-value scalar of a variant pack")
                    buf = ctypes.create_string_buffer(bytes(raw), 8)
                    keep[i] = buf
                    ptrs[i] = ctypes.addressof(buf)
            data = struct.pack(f"<{count}Q", *ptrs)
        return data, refs, handles, bad

    # -------------------------------------------------------------- calls
    def execute(self, sess: Session, fn, fid: int, ctxh: int, args: list, lib, replay: bool = False):
        if len(args) != len(fn.params):
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{len(args)} arguments for {len(fn.params)} parameters")
        lg = log_of(sess)
        name = fn.name
        if name == "cudnnBackendCreateDescriptor":
            dtype, h = args
            if type(dtype) is not int or type(h) is not int:
                raise CudaError(CUDA_ERROR_INVALID_VALUE, "malformed descriptor creation")
            k, i = P.split_handle(h)
            if k != P.K_CUDNN_BACKEND_DESC or i == 0 or (k, i) in sess.objects:
                raise CudaError(CUDA_ERROR_INVALID_HANDLE, f"descriptor handle {h:#x} is not a new one")
            st, real = lib.bk_create(dtype)
            if st != SUCCESS:
                sess.add(k, None, ctxh and sess.context(ctxh).id, info={"deferred": st, "type": dtype}, ident=i)
                return SUCCESS, []
            sess.add(k, real, ctxh and sess.context(ctxh).id, info={"type": dtype}, ident=i)
            lg.types[h] = dtype
            lg.add(fid, ctxh, args, [h])
            return SUCCESS, []
        if name == "cudnnBackendDestroyDescriptor":
            (h,) = args
            o = self._desc(sess, h)
            if o.real is not None:
                st = lib.bk_destroy(o.real)
                if st != SUCCESS:
                    log.warning("session %s: cudnnBackendDestroyDescriptor(%#x): status %d", sess.token, h, st)
            sess.drop(o)
            if not replay:
                lg.destroyed(h)
            return SUCCESS, []
        h = args[0]
        o = self._desc(sess, h)
        if name == "cudnnBackendSetAttribute":
            _, aname, atype, count, elems = args
            if type(aname) is not int or type(atype) is not int or type(count) is not int or count < 0:
                raise CudaError(CUDA_ERROR_INVALID_VALUE, "malformed attribute")
            byval = None
            if isinstance(elems, list) and len(elems) == 2 and isinstance(elems[1], dict):
                elems, byval = elems
            raw = bytes(self.d.data(sess, elems)) if elems is not None else b""
            if o.info.get("deferred"):
                return SUCCESS, []
            data, refs, handles, bad = self._translate(sess, o, atype, count, raw, byval)
            st = bad or lib.bk_set(o.real, aname, atype, count, data)
            if st != SUCCESS:
                o.info["deferred"] = st
                return SUCCESS, []
            if not replay:
                lg.add(fid, ctxh, [h, aname, atype, count, [raw, dict(byval)] if byval else raw],
                       [h], refs, handles)
            return SUCCESS, []
        if o.info.get("deferred"):
            if name == "cudnnBackendFinalize" and o.info.get("type") == D_VARIANT_PACK:
                return SUCCESS, []          # asynchronous: answered by the execution (below)
            return o.info["deferred"], None
        if name == "cudnnBackendFinalize":
            st = lib.bk_finalize(o.real)
            if st == SUCCESS and not replay:
                lg.add(fid, ctxh, args, [h])
            if o.info.get("type") == D_VARIANT_PACK:
                # sent asynchronously (interceptor/lib_cudnn.c): a failure is
                # answered by the execution that uses the pack
                if st != SUCCESS:
                    o.info["deferred"] = st
                return SUCCESS, []
            return st, ([] if st == SUCCESS else None)
        # cudnnBackendGetAttribute
        _, aname, atype, requested, want_count, arr = args
        if type(aname) is not int or type(atype) is not int or type(requested) is not int or requested < 0:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, "malformed attribute query")
        es = elem_size(atype)
        if not es:
            return 2010, None           # CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE
        if atype == T_BACKEND_DESCRIPTOR and arr is not None:
            data = bytes(self.d.data(sess, arr))
            if len(data) != 8 * requested:
                raise CudaError(CUDA_ERROR_INVALID_VALUE, "descriptor array size does not match the count")
            targets = _u64s(data, requested)
            reals, bad = [], 0
            for t in targets:
                to = self._desc(sess, t)
                if to.real is None:
                    bad = bad or to.info.get("deferred", BAD_PARAM)
                reals.append(int(to.real or 0))
            if bad:
                return bad, None
            st, count, _ = lib.bk_get(o.real, aname, atype, requested, struct.pack(f"<{requested}Q", *reals))
            if st == SUCCESS and not replay and count:
                filled = targets[:min(count, requested)]
                lg.add(fid, ctxh, [h, aname, atype, requested, True, data,
                                   [lg.types.get(t, 0) for t in targets], len(filled)], filled, [h])
            return st, ([count if want_count else None, None] if st == SUCCESS else None)
        if arr is not None and (type(arr) is not int or arr != requested * es):
            raise CudaError(CUDA_ERROR_INVALID_VALUE, "array size does not match the count")
        st, count, out = lib.bk_get(o.real, aname, atype, requested, arr)
        if st != SUCCESS:
            return st, None
        if out is not None:
            n = min(count, requested)
            out = out[:n * es]
            if atype == T_HANDLE:
                out = struct.pack(f"<{n}Q", *[self._app_handle(sess, r) for r in _u64s(out, n)])
            elif atype == T_VOID_PTR and sess.addr_map:
                out = struct.pack(f"<{n}Q", *[_untranslate(sess, p) for p in _u64s(out, n)])
        return st, [count if want_count else None, out]

    def _app_handle(self, sess: Session, real: int) -> int:
        for o in sess.of_kind(P.K_CUDNN_HANDLE):
            if int(o.real) == real:
                return o.handle
        return 0


def _untranslate(sess: Session, addr: int) -> int:
    for old, size, new in sess.addr_map:
        if new <= addr < new + size:
            return old + (addr - new)
    return addr


# ------------------------------------------------------------- checkpoint

def describe(sess: Session) -> list:
    """The backend log for the image (manifest 'cudnn_backend'): [fid, ctx,
    args] in call order, then the handles to destroy after the replay."""
    from ..core.kinds import CheckpointError, jsonable as _jsonable
    lg = getattr(sess, "cudnn_log", None)
    if lg is None or not lg.ops:
        return []
    for s, (_, _, handles) in lg.meta.items():
        for hh in handles:
            k, i = P.split_handle(hh)
            if (k, i) not in sess.objects:
                raise CheckpointError(f"a cuDNN descriptor was set up with cudnnHandle_t {hh:#x}, which the "
                                      f"application has destroyed since: its execution plan cannot be rebuilt")
    out = []
    for s, (fid, ctxh, args) in lg.ops.items():
        out.append([fid, ctxh, [_jsonable_deep(a, _jsonable) for a in args]])
    out.append([0, 0, sorted(lg.dead)])
    return out


def _jsonable_deep(a, j):
    if isinstance(a, list):
        return [_jsonable_deep(x, j) for x in a]
    if isinstance(a, dict):
        return {str(k): _jsonable_deep(v, j) for k, v in a.items()}
    return j(a)


def _unjson_deep(a, u):
    if isinstance(a, list):
        return [_unjson_deep(x, u) for x in a]
    if isinstance(a, dict) and "bytes" not in a:
        return {int(k): _unjson_deep(v, u) for k, v in a.items()}
    return u(a)


def rebuild(d, sess: Session, entries: list):
    """Replays the log into a fresh worker (cuDNN handles exist again by
    now: libraries.rebuild), then destroys what the app had destroyed."""
    from .._generated import FUNCTIONS
    from ..core.kinds import CheckpointError, unjson as _unjson
    if not entries:
        return
    calls = d.libs
    lib = calls.library("cudnn")
    bk = calls.cudnn
    lg = log_of(sess)
    *ops, (_, _, dead) = entries
    for fid, ctxh, args in ops:
        fn = FUNCTIONS.get(fid)
        if fn is None or fn.name not in SPECIAL:
            raise CheckpointError(f"image replays cuDNN function id {fid}, which this proxyd does not have")
        args = _unjson_deep(args, _unjson)
        if fn.name == "cudnnBackendGetAttribute":
            # a fill: targets destroyed since are recreated for the call
            h, aname, atype, requested, _, data, ttypes, _ = args
            temps = []
            for t, tt in zip(_u64s(data, requested), ttypes):
                k, i = P.split_handle(t)
                if (k, i) not in sess.objects:
                    code, _ = bk.execute(sess, FUNCTIONS[_fid("cudnnBackendCreateDescriptor")],
                                         _fid("cudnnBackendCreateDescriptor"), ctxh, [tt, t], lib, replay=True)
                    temps.append(t)
            args = [h, aname, atype, requested, True, data]
        try:
            code, _ = bk.execute(sess, fn, fid, ctxh, args, lib, replay=True)
        except CudaError as e:
            raise CheckpointError(f"replaying {fn.name} failed: {e.message}") from e
        o = sess.objects.get(P.split_handle(int(args[0] if fn.name != "cudnnBackendCreateDescriptor" else args[1])))
        if code != SUCCESS or (o is not None and o.info.get("deferred")):
            raise CheckpointError(f"replaying {fn.name} on cuDNN descriptor {args[0]:#x} failed "
                                  f"(cudnnStatus_t {code or o.info.get('deferred')})")
        if fn.name == "cudnnBackendGetAttribute":
            for t in temps:
                bk.execute(sess, FUNCTIONS[_fid("cudnnBackendDestroyDescriptor")],
                           _fid("cudnnBackendDestroyDescriptor"), ctxh, [t], lib, replay=True)
    # the restored session's log: the same calls
    lg.__init__()
    _relog(sess, lg, ops)
    for h in dead:
        o = sess.objects.get(P.split_handle(int(h)))
        if o is not None:
            bk.execute(sess, FUNCTIONS[_fid("cudnnBackendDestroyDescriptor")],
                       _fid("cudnnBackendDestroyDescriptor"), 0, [int(h)], lib, replay=True)
        lg.destroyed(int(h))


def _relog(sess, lg: BackendLog, ops):
    """The log of a restored session: the replayed calls with the same
    subjects and references as when they were first made."""
    from .._generated import FUNCTIONS
    from ..core.kinds import unjson as _unjson
    for fid, ctxh, args in ops:
        fn = FUNCTIONS[fid]
        args = _unjson_deep(args, _unjson)
        if fn.name == "cudnnBackendCreateDescriptor":
            lg.types[int(args[1])] = int(args[0])
            lg.add(fid, ctxh, args, [int(args[1])])
        elif fn.name == "cudnnBackendSetAttribute":
            h, _, atype, count, elems = args
            data = elems[0] if isinstance(elems, list) else elems
            refs = _u64s(data, count) if atype == T_BACKEND_DESCRIPTOR else []
            handles = _u64s(data, count) if atype == T_HANDLE else []
            lg.add(fid, ctxh, args, [int(h)], refs, handles)
        elif fn.name == "cudnnBackendGetAttribute":
            h, _, _, requested, _, data, _, filled = args
            lg.add(fid, ctxh, args, _u64s(data, requested)[:filled], [int(h)])
        else:
            lg.add(fid, ctxh, args, [int(args[0])])


def _fid(name: str) -> int:
    from .._generated import FUNCTIONS
    for fid, fn in FUNCTIONS.items():
        if fn.name == name:
            return fid
    raise KeyError(name)


# cuDNN backend descriptors: the calls that made them, replayed (plans finalized again)
register(Kind("cudnn_backend", Stage.CUDNN, ("cudnn_backend",), describe=lambda sess: {"cudnn_backend": describe(sess)},
              rebuild=lambda r: rebuild(r.dispatcher, r.sess, r.desc.get("cudnn_backend", [])), owner=__name__))
