"""Per-client state kept by proxyd.

A Session is one client process. Everything the client can name is an
object in the session's tables: contexts, modules, functions, streams and
events, each with a per-session id that the client sees as a handle
(kind << 32 | id). Ids are never reused within a session, and a restore puts
every object back under the same id, so the handles a client holds stay
valid across dump and restore. Device memory lives in the session's Arena at
addresses that a restore reproduces.

Locking: sessions are touched by the daemon's main loop only, except that
checkpoint code reads a session while it is frozen (Session.frozen), when the
main loop does not execute its calls.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from . import protocol as P
from .arena import Arena

CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_INVALID_VALUE = 1            # cuda.h
CUDA_ERROR_INVALID_CONTEXT = 201


def _key_value(v):
    return bytes(v) if isinstance(v, (bytearray, memoryview)) else v


class CudaError(Exception):
    """A call failed with a CUresult; message (optional) is shown to the client."""

    def __init__(self, code: int, message: str = ""):
        super().__init__(message or f"CUDA error {code}")
        self.code = code
        self.message = message


@dataclass
class Obj:
    kind: int
    id: int
    real: Any                      # the backend's object
    ctx: int = 0                   # id of the context it belongs to (0: none)
    info: dict = field(default_factory=dict)
    create: tuple | None = None    # (fid, ctx handle, args) of the creating call, for restore

    @property
    def handle(self) -> int:
        return P.make_handle(self.kind, self.id)


@dataclass
class Context:
    id: int
    device: int
    real: Any
    primary: bool
    flags: int = 0
    refcount: int = 1
    # cuCtxSetLimit values and attributes of the context's NULL / legacy /
    # per-thread streams (stream value -> attribute id -> value bytes), which
    # a restore re-applies
    limits: dict = field(default_factory=dict)
    stream_attrs: dict = field(default_factory=dict)

    @property
    def handle(self) -> int:
        return P.make_handle(P.K_CONTEXT, self.id)


class Session:
    def __init__(self, token: str, pid: int, exe: str, slot: int, arena: Arena):
        self.token = token
        self.pid = pid
        self.exe = exe
        self.slot = slot
        # a launch since the last context-wide sync: device printf output may
        # still arrive (server.PRINTING_FIDS; loop thread only)
        self.may_print = False
        self.arena = arena
        self.created = time.time()
        self.last_active = self.created
        self.objects: dict[tuple[int, int], Obj] = {}
        self.contexts: dict[int, Context] = {}
        self.primary: dict[int, int] = {}          # device -> context id
        # device -> the id its primary context had: a primary context made
        # again after cuDevicePrimaryCtxReset gets it back, because the
        # driver's primary context keeps its handle across resets and NVIDIA's
        # runtime (the static one, through cuGetExportTable) relies on it: it
        # compares the thread's current context with the retained one.
        self.primary_ident: dict[int, int] = {}
        self.next_id = {k: 1 for k in P.KIND_NAMES}
        # reliability (docs/protocol.md): calls up to last_seq are executed
        self.last_seq = 0
        self.last_reply: list | None = None
        self.reorder: dict[int, list] = {}
        self.async_error: tuple[int, int, str] | None = None   # (code, fid, message)
        self.frozen = False
        self.queued: list = []          # messages that arrived while frozen
        # callable(sess, ops) -> True while a multi-rank checkpoint holds the
        # message (families/nccl_cut.py), else None
        self.nccl_hold = None
        # application device ordinal -> physical, after a restore onto other
        # devices (families/devnum.py); empty: the same numbers
        self.dev_map: dict[int, int] = {}
        self.staging_seg: int | None = None
        self.shm = None                 # ShmMap, set by the server
        self.shm_pending: set[int] = set()   # pinned segments to page-lock when the client (re)attaches
        # called as observer(kind, id, real) when an object appears (real) or
        # goes (None): proxyd's native launch path mirrors the tables
        self.observer = None
        self.released = False           # GPU state dumped and freed; calls wait for a restore
        self.ckpt_phase = None          # what a running checkpoint is doing (status)
        self.ckpt_busy = False          # a checkpoint command owns the session
        # (old base, size, new base) of module globals that moved in a restore:
        # device pointers the client still holds are translated (translate())
        self.addr_map: list[tuple[int, int, int]] = []
        # state set through calls whose spec says `restore: replay`, in call
        # order, the latest call per setting: {key: (fid, ctx handle, args)}
        # (record_replay); a restore replays them once the objects exist again
        self.replay: dict[tuple, tuple[int, int, list]] = {}
        self._replay_refs: dict[tuple, set[int]] = {}     # handles each recorded call names
        # cuDevicePrimaryCtxSetFlags on a device whose primary context this
        # session has not created yet: the flags it will be created with
        self.primary_flags: dict[int, int] = {}
        self.chan = None                # fast channel (channel.py), same host only
        # client segment id -> hostfn.Gate: where host functions are handed
        # to the client (hostfn.py)
        self.hostfn_gates: dict = {}
        # stream-ordered allocator (mempool.py): allocation address -> id of
        # the pool it came from; device -> its current pool (cuDeviceSetMemPool)
        self.pool_allocs: dict[int, int] = {}
        self.mem_pool_current: dict[int, int] = {}
        # texture ("t") and surface ("s") objects (arrays.py): (kind, the
        # driver's value, which the app holds) -> creating context, recorded
        # resource (array handle or address), raw descriptors as given
        self.tex_objects: dict[tuple[str, int], dict] = {}
        self.tex_gone: set[tuple[str, int]] = set()     # objects destroyed with their array
        # the application's VMM (vmm.py): mapped address -> id of its mem_handle
        self.vmm_mapped: dict[int, int] = {}
        # stream capture (graphs.py): capturing stream value -> graph id, and
        # events recorded inside a capture -> graph id; graph_replay is true
        # while an executable graph's ops run
        self.capture: dict[int, int] = {}
        self.capture_events: dict[int, int] = {}
        self.graph_replay = False
        # graph memory nodes (graph_mem.py): allocation address -> {"size",
        # "device", "live"}; device -> high-water mark of graph memory
        self.graph_mem: dict[int, dict] = {}
        self.graph_mem_high: dict[int, int] = {}
        self.calls = 0
        self.pidns = ""                 # the client's pid namespace (reaping by pid)
        self.key_uid = None             # keyed tcp: the uid of the client key's user (curve.py)

    # ------------------------------------------------------------- objects
    def new_id(self, kind: int) -> int:
        i = self.next_id[kind]
        self.next_id[kind] = i + 1
        return i

    def shim_ident(self, kind: int, handle: int, what: str) -> int:
        """The id of a handle the shim chose for a new object of `kind`
        (spec `ids: shim`: interceptor/lib_ids.c): it must be of that kind,
        carry SHIM_ID_BIT and name no live object; CudaError otherwise."""
        k, i = P.split_handle(int(handle or 0))
        if k != kind or not i & P.SHIM_ID_BIT:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: {int(handle or 0):#x} is not a shim-chosen handle "
                                                      f"of {P.KIND_NAMES.get(kind, kind)}")
        if (k, i) in self.objects:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{what}: handle {int(handle):#x} is already in use")
        return i

    def add(self, kind: int, real: Any, ctx: int = 0, info: dict | None = None, create=None,
            ident: int | None = None) -> Obj:
        if ident is None:
            ident = self.new_id(kind)
        elif not ident & P.SHIM_ID_BIT:     # shim-chosen ids live apart (protocol.py)
            self.next_id[kind] = max(self.next_id[kind], ident + 1)
        o = Obj(kind, ident, real, ctx, info or {}, create)
        self.objects[(kind, ident)] = o
        if self.observer:
            self.observer(kind, ident, real)
        return o

    def get(self, kind: int, handle: int) -> Obj:
        k, i = P.split_handle(handle)
        o = self.objects.get((k, i)) if k == kind else None
        if o is None:
            raise CudaError(CUDA_ERROR_INVALID_HANDLE,
                            f"invalid {P.KIND_NAMES.get(kind, kind)} handle {handle:#x}")
        return o

    def remove(self, kind: int, handle: int) -> Obj:
        o = self.get(kind, handle)
        self.drop(o)
        return o

    def drop(self, o: Obj):
        if self.objects.pop((o.kind, o.id), None) is not None and self.observer:
            self.observer(o.kind, o.id, None)
        self.forget_replay(o.handle)

    def drop_context(self, c: "Context"):
        self.forget_replay(c.handle)
        self.contexts.pop(c.id, None)
        if c.primary and self.primary.get(c.device) == c.id:
            del self.primary[c.device]
        if self.observer:
            self.observer(P.K_CONTEXT, c.id, None)

    def of_kind(self, kind: int) -> list[Obj]:
        return [o for (k, _), o in sorted(self.objects.items()) if k == kind]

    # ------------------------------------------------------------ contexts
    def add_context(self, device: int, real: Any, primary: bool, flags: int = 0, ident: int | None = None) -> Context:
        if ident is None and primary and device in self.primary_ident \
                and self.primary_ident[device] not in self.contexts:
            ident = self.primary_ident[device]
        if ident is None:
            ident = self.new_id(P.K_CONTEXT)
        else:
            self.next_id[P.K_CONTEXT] = max(self.next_id[P.K_CONTEXT], ident + 1)
        c = Context(ident, device, real, primary, flags)
        self.contexts[ident] = c
        if primary:
            self.primary[device] = ident
            self.primary_ident[device] = ident
        if self.observer:
            self.observer(P.K_CONTEXT, ident, real)
        return c

    def is_reset_primary(self, handle: int) -> bool:
        """handle names a primary context that a reset destroyed and no
        retain has made again yet."""
        k, i = P.split_handle(handle)
        return k == P.K_CONTEXT and i not in self.contexts and i in self.primary_ident.values()

    def context(self, handle: int) -> Context:
        k, i = P.split_handle(handle)
        c = self.contexts.get(i) if k == P.K_CONTEXT else None
        if c is None:
            raise CudaError(CUDA_ERROR_INVALID_CONTEXT, f"invalid context handle {handle:#x}")
        return c

    # --------------------------------------------------------- replay state
    def record_replay(self, fn, fid: int, ctxh: int, args: list):
        """Keeps a successful call of a `restore: replay` function (fn is its
        dispatch entry). A later call that names the same setting (same
        function, same key arguments) replaces it and moves to the end, so
        replay order follows the order the settings were last made in."""
        key = (fid,) + tuple(int(ctxh or 0) if i < 0 else _key_value(args[i]) for i in fn.key)
        self.replay.pop(key, None)
        self.replay[key] = (fid, int(ctxh or 0), list(args))
        names = {int(a) for (_n, role, kind, *_), a in zip(fn.params, args)
                 if role == "handle" and kind not in ("device", "memory") and a}
        self._replay_refs[key] = names | {int(ctxh or 0)}

    def forget_replay(self, handle: int):
        """Drops recorded calls that name an object (or a context) that is gone."""
        gone = [k for k, refs in self._replay_refs.items() if handle in refs]
        for k in gone:
            del self.replay[k]
            del self._replay_refs[k]

    def counts(self) -> dict[str, int]:
        out = {name: 0 for name in P.KIND_CODES}
        out["context"] = len(self.contexts)
        for (k, _), _o in self.objects.items():
            out[P.KIND_NAMES[k]] += 1
        out["allocation"] = len(self.arena.allocs)
        return out

    def app_address(self, addr: int) -> int:
        """The address the app knows for this worker's addr: for a variable
        that restores moved, the origin of its chain in addr_map, else addr.
        device_vars._write appends a variable's entries image address first
        and the chained origins after, in the image's order, so the last
        entry whose target holds addr is the first address the app got
        (after one restore [(A, B)]; after the next [(B, C), (A, C)]: B was
        the image's, never answered to the app)."""
        for old, size, new in reversed(self.addr_map):
            if new <= addr < new + size:
                return old + (addr - new)
        return addr

    def translate(self, addr: int) -> int:
        for old, size, new in self.addr_map:
            if old <= addr < old + size:
                return new + (addr - old)
        return addr

    def note_async_error(self, code: int, fid: int, message: str = ""):
        if self.async_error is None:
            self.async_error = (code, fid, message)

    def take_async_error(self) -> tuple[int, int, str]:
        e = self.async_error or (0, 0, "")
        self.async_error = None
        return e
