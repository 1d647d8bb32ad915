"""The checkpoint engine: pre-dump, dump (stop-the-world or concurrent) and
restore of a session's GPU state. The on-disk format is image.py's.

Dump, in order:
 1. freeze: the session's calls are held (Session.frozen; the main loop
    queues them and answers KEEPALIVE), then its contexts are synchronised,
    so queued work has finished and nothing new starts;
 2. describe: the live object graph (contexts, modules, functions, streams,
    events, the arena's chunks and allocations, module globals) as a dict;
 3. hash: every 2 MiB chunk of device memory, on the device when the backend
    can (a gp64 kernel), so an incremental dump knows what changed;
 4. copy: changed chunks. Concurrent mode copies them device-to-device into
    spare memory in proxyd's own address slot and lets the app run again at
    once; what does not fit is copied to host memory while still frozen.
    Stop-the-world mode copies to host memory while frozen;
 5. drain: snapshot copies go to page-locked host memory, then to the image
    files, while the app runs (concurrent) or waits (stop-the-world);
 6. without --leave-running, the session's GPU resources are released and its
    calls keep waiting for a restore.
Pre-dump copies memory while the app keeps running (after a freeze only long
enough to describe the graph); the hash recorded for a chunk is the hash of
the bytes stored, so the next dump in the chain rewrites whatever changed,
including memory written through pointers kept in device memory.

Restore builds a detached session from the image, checks every chunk's hash
after upload, and only then installs it in the daemon; any failure tears it
down, so a restore either completes or changes nothing.

Locking: dump and restore run on a worker thread. The session being dumped is
frozen, so the main loop does not touch it; everything that must happen on
the main loop (resuming, installing a restored session) is posted with
Server.call_in_loop.
"""
from __future__ import annotations

import base64
import dataclasses
import logging
import os
import time

import numpy as np

from .. import __version__
from ..core import kinds
from ..core import procinfo
from ..core import protocol as P
from ..core.kinds import CheckpointError, Stage
from ..core.kinds import jsonable as _jsonable
from ..core.kinds import unjson as _unjson
from ..core.session import Session
from . import hashing, memory_restore
from .image import FLAG_GLOBAL, Image, ImageError, ImageWriter
from .manifest_schema import SESSION, SchemaError, validate_session

log = logging.getLogger("proxyd")

CHUNK = 2 << 20
# for tests only: pause between resuming the app and draining a concurrent snapshot
TEST_DRAIN_DELAY_S = float(os.environ.get("GPUPROXY_TEST_DRAIN_DELAY_S", "0"))


def _ms(t0: float, t1: float) -> float:
    return round((t1 - t0) * 1000.0, 3)


# ---------------------------------------------------------------- describing

def describe(sess: Session) -> dict:
    """The session's live objects as a JSON-ready dict (manifest 'session'):
    the fields of every kind (core/kinds.py), the engine's own steps'
    (contexts, streams and events, the client-facing state ...) and the
    families' (modules and kernels, the arena, pools, graphs, arrays,
    library handles, host memory ...)."""
    out = {}
    for k in kinds.ordered():
        if k.describe is not None:
            out.update(k.describe(sess))
    return out


def _describe_session_state(sess: Session) -> dict:
    """The client-facing state (rebuilt at Stage.SESSION_STATE) and who the
    client is."""
    out = {
        "token": sess.token,
        "pid": sess.pid,
        "exe": sess.exe,
        "slot": sess.slot,
        "last_seq": sess.last_seq,
        "last_reply": [base64.b64encode(bytes(f)).decode() for f in sess.last_reply] if sess.last_reply else None,
        "next_id": {str(k): v for k, v in sess.next_id.items()},
        "async_error": list(sess.async_error) if sess.async_error else None,
    }
    # who the process is, where this proxyd can tell (its pid namespace):
    # a restore refuses a process that is gone or whose pid now names
    # another process, and a root dump gives the image to the process's user
    pidns = getattr(sess, "pidns", "") or ""
    out["pidns"] = pidns or None
    out["start_time"] = out["uid"] = None
    if pidns and pidns == procinfo.OWN_PIDNS and sess.pid:
        out["start_time"] = procinfo.start_time(sess.pid)
        who = procinfo.owner(sess.pid)
        out["uid"] = who[0] if who else None
    if getattr(sess, "key_uid", None) is not None:
        out["uid"] = sess.key_uid      # keyed tcp (curve.py): the client key's user is the session's
    # the user whose messages its worker read (worker_gate.py): a restore by
    # an admin gives the session back to that user, also where "uid" is unknown
    out["owner_uid"] = getattr(sess, "owner_uid", None)
    return out


def _describe_contexts(sess: Session) -> dict:
    return {"contexts": [{"id": c.id, "device": c.device, "primary": c.primary, "flags": c.flags,
                          "refcount": c.refcount, "limits": {str(k): v for k, v in c.limits.items()},
                          "stream_attrs": _attrs_json(c.stream_attrs)}
                         for c in sorted(sess.contexts.values(), key=lambda c: c.id)]}


def _describe_streams_events(sess: Session) -> dict:
    out = {"streams": [], "events": []}
    for kind, key in ((P.K_STREAM, "streams"), (P.K_EVENT, "events")):
        for o in sess.of_kind(kind):
            fid, ctxh, args = o.create
            d = {"id": o.id, "ctx": o.ctx, "create": [fid, ctxh, [_jsonable(a) for a in args]]}
            if kind == P.K_STREAM:
                d["attrs"] = {str(k): _jsonable(v) for k, v in o.info.get("attrs", {}).items()}
            else:
                d["recorded"] = bool(o.info.get("recorded"))
            out[key].append(d)
    return out


def _describe_replay(sess: Session) -> dict:
    # settings made through `restore: replay` calls, in the order to replay them
    return {"replay": [[fid, ctxh, [_jsonable(a) for a in args]] for fid, ctxh, args in sess.replay.values()],
            "primary_flags": {str(d): f for d, f in sess.primary_flags.items()}}


def _attrs_json(stream_attrs: dict) -> dict:
    """{stream value: {attribute id: value bytes}} as JSON."""
    return {str(s): {str(k): _jsonable(v) for k, v in a.items()} for s, a in stream_attrs.items()}


# ------------------------------------------------------------------ pieces

class ChunkView:
    """A byte range of a stored (uncompressed) chunk run in its image's
    memory.bin, shaped like a ChunkRef for Image.read_into: the restore reads
    several adjacent chunks, or a part of one, in one copy."""
    __slots__ = ("addr", "length", "flags", "hash", "image", "offset", "stored", "compressed", "disk_length")

    def __init__(self, ref, offset: int, n: int):
        self.addr, self.flags, self.hash, self.image = ref.addr, 0, None, ref.image
        self.offset, self.length, self.stored, self.disk_length = offset, n, n, n
        self.compressed = False


class Piece:
    """One CHUNK of a session's device memory and where its copy is."""
    __slots__ = ("addr", "n", "dev", "hash", "changed", "scratch", "host", "scratch_base", "chunk")

    def __init__(self, addr, n, dev, chunk=None):
        self.addr, self.n, self.dev = addr, n, dev
        self.chunk = chunk      # start of the arena chunk (one mapping) it belongs to
        self.hash = None
        self.changed = True
        self.scratch = None     # device address of a snapshot copy
        self.scratch_base = None  # start of the scratch allocation, on the run's first piece
        self.host = None        # memoryview of a host copy


# a run of adjacent arena chunks copied as one is cut at this size, so that
# copies of several runs are in flight and the pipelines stay fed
RUN_MAX = 64 << 20


def runs(pieces: list[Piece], span: bool = False, src=None) -> list[list[Piece]]:
    """Pieces grouped into runs of consecutive addresses on one device, so a
    copy moves a whole run in one call. span: a run may cross from one arena
    chunk into the next when they are adjacent in the address space (the
    backend's copies span mappings): a session of many small allocations
    then copies in large pieces rather than a call per 2 MiB chunk. src:
    where each piece is copied from (default its address); a run is also
    contiguous there (snapshot copies of several runs need not be)."""
    out: list[list[Piece]] = []
    size = 0
    for p in pieces:
        q = out[-1][-1] if out else None
        if q is not None and q.addr + q.n == p.addr and q.dev == p.dev and \
                (src is None or src(q) + q.n == src(p)) and \
                (q.chunk == p.chunk or (span and size + p.n <= RUN_MAX)):
            out[-1].append(p)
            size += p.n
        else:
            out.append([p])
            size = p.n
    return out


def memory_pieces(sess: Session) -> list[Piece]:
    """The session's device memory, from every kind that owns some
    (core/kinds.py, Kind.pieces), in the kinds' order."""
    out = []
    for k in kinds.ordered():
        if k.pieces is not None:
            out += k.pieces(sess)
    return out


def module_images(sess: Session, desc: dict) -> list:
    """(manifest entry, image bytes) of every module image the kinds keep
    (core/kinds.py, Kind.module_images), taken while frozen: the app may
    load or unload modules once it runs again."""
    out = []
    for k in kinds.ordered():
        if k.module_images is not None:
            out += k.module_images(sess, desc)
    return out


def pieces_of(sess: Session) -> list[Piece]:
    """The arena's chunks, cut at CHUNK (the "memory" kind's pieces)."""
    out = []
    for c in sorted(sess.arena.chunks.values(), key=lambda c: c.start):
        for off in range(0, c.size, CHUNK):
            out.append(Piece(c.start + off, min(CHUNK, c.size - off), c.device, c.start))
    return out


class Engine:
    def __init__(self, server):
        # one checkpoint operation at a time: they share the page-locked pool
        import threading
        self.lock = threading.Lock()
        self.server = server
        self.backend = server.backend
        self.dispatcher = server.dispatcher

    # ------------------------------------------------------------- hashing
    def hash_live(self, pieces: list[Piece], src=lambda p: p.addr):
        """gp64 of every piece, on the device where possible: one launch per
        run of contiguous memory (across adjacent mappings where the backend
        allows: a kernel reads any mapped range), all of a device's launches
        waited for once."""
        b = self.backend
        span = getattr(b, "hash_spans_mappings", False)
        groups: list[list[Piece]] = []
        for p in pieces:
            g = groups[-1] if groups else None
            if g and (g[-1].chunk == p.chunk or span) and g[-1].dev == p.dev and \
                    src(g[-1]) + g[-1].n == src(p) and g[-1].n == CHUNK:
                g.append(p)
            else:
                groups.append([p])
        by_dev: dict[int, list[list[Piece]]] = {}
        for g in groups:
            by_dev.setdefault(g[0].dev, []).append(g)
        for dev, gs in by_dev.items():
            hs = b.hash_device_many(dev, [(src(g[0]), sum(q.n for q in g)) for g in gs], CHUNK)
            if hs is None:
                for g in gs:
                    for q in g:
                        buf = bytearray(q.n)
                        b.read_device(q.dev, src(q), q.n, buf)
                        q.hash = hashing.gp64(buf)
                continue
            for g, h in zip(gs, hs):
                for q, x in zip(g, h):
                    q.hash = int(x)

    # ---------------------------------------------------------------- dump
    def dump(self, sess: Session, path: str, **kw) -> dict:
        with self.lock:
            try:
                return self._dump(sess, path, **kw)
            finally:
                self._pool_idle_timer()

    def restore(self, path: str, device_map: dict | None = None, allow_foreign: bool = False):
        with self.lock:
            try:
                return self._restore(path, device_map, allow_foreign)
            finally:
                self._pool_idle_timer()

    # The page-locked pool (backend.host_buffer) is kept this long after the
    # last checkpoint operation, for the next one, then given back: an idle
    # session holds no pinned memory ($GPUPROXY_POOL_KEEP_S).
    POOL_KEEP_S = float(os.environ.get("GPUPROXY_POOL_KEEP_S", "300"))

    def _pool_idle_timer(self):
        import threading
        self._pool_gen = getattr(self, "_pool_gen", 0) + 1
        gen = self._pool_gen

        def release():
            if not self.lock.acquire(blocking=False):
                return                 # a checkpoint runs; it starts a new timer when done
            try:
                if gen == self._pool_gen:
                    self.backend.release_host_buffer()
            finally:
                self.lock.release()
        t = threading.Timer(self.POOL_KEEP_S, release)
        t.daemon = True
        t.start()

    def _dump(self, sess: Session, path: str, *, kind: str = "dump", leave_running: bool = False,
              concurrent: bool = False, parent: str | None = None, compress: str | None = None,
              on_captured=None) -> dict:
        """Runs on a worker thread; the session is frozen here, once the
        image directory is ready. on_captured: called with the stats so far
        once the state is captured (in host staging, or in device snapshots
        for concurrent) and, with leave_running, the session runs again;
        before the image is written (background.py)."""
        b = self.backend
        try:
            from .image import require_codec
            require_codec(compress)
            _kinds_complete()
        except (ValueError, CheckpointError) as e:
            self.server.call_in_loop(lambda: self.server.unreserve_checkpoint(sess)).result()
            raise CheckpointError(str(e)) from None
        if concurrent and not leave_running and kind != "pre-dump":
            # A concurrent dump lets the app run while its snapshot drains;
            # releasing the session afterwards would drop whatever it did
            # meanwhile (and take its GPU state from under a running app).
            self.server.call_in_loop(lambda: self.server.unreserve_checkpoint(sess)).result()
            raise CheckpointError("a concurrent dump keeps the app running, so it cannot release the session: "
                                  "add leave_running (--leave-running), or dump without concurrent to stop "
                                  "the app and release its GPU state")
        try:
            for k in kinds.ordered():     # what a checkpoint cannot keep (open IPC exports, a link state ...)
                if k.check is not None:
                    k.check(sess)
        except RuntimeError as e:
            self.server.call_in_loop(lambda: self.server.unreserve_checkpoint(sess)).result()
            raise CheckpointError(str(e)) from None
        stats = {"kind": kind, "concurrent": concurrent, "leave_running": leave_running}
        self.cstats = {}          # per-stage figures of the copies (_read_runs)
        resumed = False
        sess.ckpt_phase = "preparing"
        try:
            parent_img, path = self._prepare_dir(path, parent)
        except Exception:
            self.server.call_in_loop(lambda: self.server.unreserve_checkpoint(sess)).result()
            sess.ckpt_phase = None
            raise
        # the app stops from here: its calls are held from the next message on
        self.server.call_in_loop(lambda: setattr(sess, "frozen", True)).result()
        t0 = time.monotonic()
        sess.ckpt_phase = "quiescing"
        try:
            for c in list(sess.contexts.values()):
                b.ctx_sync(c.real)
            t_quiet = time.monotonic()
            desc = describe(sess)
            # everything written later comes from here, taken while frozen:
            # the app may load or unload modules once it runs again
            modules = module_images(sess, desc)
            globals_ = self._read_captures(sess, desc)
            pieces = memory_pieces(sess)
            total = sum(p.n for p in pieces)
            stats.update(bytes=total, chunks=len(pieces), quiesce_ms=_ms(t0, t_quiet))
            if kind == "pre-dump":
                # graph captured; memory is copied while the app runs. A copy
                # taken while kernels write may be torn: what counts is that
                # each chunk's recorded hash is that of the bytes stored, so
                # the snapshot is hashed (on the device where it can be) and
                # drained from the same copy; the next dump rewrites whatever
                # differs.
                self._resume(sess)
                resumed = True
                stats["stop_ms"] = _ms(t0, time.monotonic())
                self._snapshot_to_device(pieces)
                self._drain(pieces)
                self.hash_pieces(pieces)
            else:
                if parent_img is not None:
                    self.hash_live(pieces)
                    for p in pieces:
                        p.changed = parent_img.hash_of(p.addr) != p.hash
                changed = [p for p in pieces if p.changed]
                if concurrent:
                    self._snapshot_to_device(changed)
                    t_snap = time.monotonic()
                    stats["snapshot_ms"] = _ms(t_quiet, t_snap)
                    self._resume(sess)
                    resumed = True
                    stats["stop_ms"] = _ms(t0, time.monotonic())
                    sess.ckpt_phase = "draining"
                    if on_captured is not None:
                        on_captured(dict(stats))
                    if TEST_DRAIN_DELAY_S:
                        time.sleep(TEST_DRAIN_DELAY_S)   # tests: widen the window in which the app runs
                    self._drain(changed)
                else:
                    if any(p.hash is None for p in changed):
                        self.hash_live([p for p in changed if p.hash is None])   # on the device: cheap
                    self._copy_to_host(changed)
                self.hash_pieces(changed)     # what is still unhashed (no device hashing)
                stats["host_ms"] = _ms(t0, time.monotonic())
                if not concurrent and leave_running:
                    self._resume(sess)
                    resumed = True
                    stats["stop_ms"] = _ms(t0, time.monotonic())
                    if on_captured is not None:
                        on_captured(dict(stats, copy=dict(self.cstats)))
                elif on_captured is not None and not concurrent and kind == "dump":
                    # a final dump: the state is in host memory; the session stays
                    # frozen and is released once the image is written
                    on_captured(dict(stats, copy=dict(self.cstats), host_ms=_ms(t0, time.monotonic())))
            stats["changed_chunks"] = sum(1 for p in pieces if p.changed)
            stats["changed_bytes"] = sum(p.n for p in pieces if p.changed)
            t_w = time.monotonic()
            stats.update(copy=self.cstats)
            pool = b.pool_stats()
            if pool is not None:
                stats["host_pool"] = pool
            self._write(path, kind, parent_img, modules, desc, pieces, globals_, stats,
                        key_uid=getattr(sess, "key_uid", None), compress=compress)
            stats["write_ms"] = _ms(t_w, time.monotonic())
            # the memory stays in the shared pool for a restore of this image (memory_restore.py)
            stats["kept_in_memory_bytes"] = memory_restore.keep(b, path, pieces, kind)
            if not leave_running and kind != "pre-dump":
                self.release(sess)
                stats["released"] = True
                stats["last_seq"] = int(desc.get("last_seq") or 0)    # the released state's age (proxyd/supervisor/markers.py)
                stats.setdefault("stop_ms", _ms(t0, time.monotonic()))
            stats["total_ms"] = _ms(t0, time.monotonic())
            stats["path"] = os.path.abspath(path)
            return stats
        finally:
            for p in locals().get("pieces") or []:
                if p.scratch is not None:
                    self._free_scratch(p)
            sess.ckpt_phase = None
            if not resumed and not stats.get("released"):
                # finished without releasing (or failed): the app goes on
                self._resume(sess)

    def _resume(self, sess: Session):
        self.server.call_in_loop(lambda: self.server.resume(sess)).result()

    def _prepare_dir(self, path: str, parent: str | None):
        """A directory that already holds an image continues its chain: the
        old image moves into DIR/parent and the new one takes DIR."""
        parent_img = None
        if parent:
            parent_img = Image.open(parent)
        elif os.path.exists(os.path.join(path, "manifest")):
            Image.open(path).close()       # refuses a broken image before anything moves
            nested = os.path.join(path, "parent")
            tmp = path.rstrip("/") + ".moving"
            os.rename(path, tmp)
            os.makedirs(path)
            os.rename(tmp, nested)
            parent_img = Image.open(nested)
        os.makedirs(path, exist_ok=True)
        return parent_img, path

    def _read_captures(self, sess: Session, desc: dict) -> list:
        """Contents that kinds keep as pieces of the image (__device__
        variables, families/device_vars.py; CUDA arrays, families/arrays.py), as
        (key, size, bytes, flags); read while frozen, after describe."""
        out = []
        for k in kinds.ordered():
            if k.capture is not None:
                for key, data, flags in k.capture(self.backend, sess, desc):
                    out.append((key, len(data), data, FLAG_GLOBAL | flags))
        return out

    def _snapshot_to_device(self, pieces: list[Piece]):
        b = self.backend
        host = []
        devs = set()
        for run in runs(pieces, getattr(b, "spans_mappings", False)):
            size = sum(p.n for p in run)
            s = b.scratch_alloc(run[0].dev, size)
            if s is None:
                host += run
                continue
            b.copy_dtod(run[0].dev, s, run[0].addr, size)
            off = 0
            for p in run:
                p.scratch = s + off
                off += p.n
            run[0].scratch_base = s          # the run's allocation, freed as one
            devs.add(run[0].dev)
        for d in devs:
            if hasattr(b, "sync_copies"):
                b.sync_copies(d)
        if host:
            log.info("no spare device memory for %d chunks: copying them to host memory while frozen", len(host))
            self._copy_to_host(host)

    LANES = int(os.environ.get("GPUPROXY_CKPT_LANES", "2"))
    # how copies into the page-locked pool are issued while it is still
    # being pinned: "ready" (default), queued by this thread as their pool
    # segments become page-locked; "address", queued in order, each waiting
    # for its segment; "pinthread", each segment's copies made by the
    # pinning thread that page-locked it, right after its registration
    # (synchronous copies in proxyd's own context: no stream per thread)
    COPY_ORDER = os.environ.get("GPUPROXY_CKPT_COPY_ORDER", "ready")

    def _read_runs(self, pieces: list[Piece], buf, off: int, src):
        """Copies pieces into buf (the page-locked pool) from offset off, a run
        of contiguous memory per copy, queued on the backend's copy lanes
        with no synchronisation in between and waited for once at the end;
        each piece's `host` becomes its slice of buf. A copy never crosses
        a pool segment (pinned_pool.py: each is its own registration) and
        is queued only once its segment is page-locked; while the pool is
        still being pinned (the first dump of a worker), copies are queued
        in the order their segments become ready. Stats (cstats): time
        waited for pinning, time spent inside the copy calls themselves
        (call_ms, call_max_ms: the driver may hold a queued copy while
        registrations run), queueing and the final synchronisation."""
        b = self.backend
        t0 = time.monotonic()
        lanes = max(1, self.LANES)
        jobs = []                        # (device, source address, offset in buf, bytes)
        devs = set()
        for run in runs(pieces, getattr(b, "spans_mappings", False), src):
            size = sum(p.n for p in run)
            dev, a, o, left = run[0].dev, src(run[0]), off, size
            while left:
                k = min(left, b.segment_end(o) - o)
                jobs.append((dev, a, o, k))
                a, o, left = a + k, o + k, left - k
            devs.add(dev)
            for p in run:
                p.host = buf[off:off + p.n]
                off += p.n
        pool = b.pinned_pool() if hasattr(b, "pinned_pool") else None
        st = self.cstats
        calls = {"n": 0, "s": 0.0, "max": 0.0}

        def issue(job):
            dev, a, o, k = job
            t = time.monotonic()
            b.read_device_async(dev, a, k, buf[o:o + k], lane=calls["n"] % lanes)
            t = time.monotonic() - t
            calls["n"] += 1
            calls["s"] += t
            calls["max"] = max(calls["max"], t)

        waited = 0.0
        if pool is not None and self.COPY_ORDER == "pinthread" and not pool.all_pinned():
            st["order"] = "pinthread"
            by_seg = {}
            for j in jobs:
                by_seg.setdefault(j[2] // pool.segment, []).append(j)
            mu = __import__("threading").Lock()

            def copy_segment(k):
                for dev, a, o, n in by_seg[k]:
                    t = time.monotonic()
                    b.read_device(dev, a, n, buf[o:o + n])
                    t = time.monotonic() - t
                    with mu:
                        calls["n"] += 1
                        calls["s"] += t
                        calls["max"] = max(calls["max"], t)
            t = time.monotonic()
            pool.run_when_ready(by_seg, copy_segment)
            # the caller waited for the pinning threads, which also copied
            waited = time.monotonic() - t
        elif pool is not None and self.COPY_ORDER == "ready" and not pool.all_pinned():
            st["order"] = "ready"
            by_seg: dict[int, list] = {}
            for j in jobs:
                by_seg.setdefault(j[2] // pool.segment, []).append(j)
            while by_seg:
                t = time.monotonic()
                got = pool.wait_any(by_seg)
                waited += time.monotonic() - t
                for k in sorted(got):
                    for j in by_seg.pop(k):
                        issue(j)
        else:
            st.setdefault("order", "address")
            for j in jobs:
                waited += b.wait_pinned(j[2], j[3])
                issue(j)
        t1 = time.monotonic()
        for d in devs:
            b.sync_copies(d)
        st["copies"] = st.get("copies", 0) + calls["n"]
        st["wait_pinned_ms"] = round(st.get("wait_pinned_ms", 0) + waited * 1000, 3)
        st["call_ms"] = round(st.get("call_ms", 0) + calls["s"] * 1000, 3)
        st["call_max_ms"] = round(max(st.get("call_max_ms", 0), calls["max"] * 1000), 3)
        st["queue_ms"] = round(st.get("queue_ms", 0) + (t1 - t0) * 1000, 3)
        st["sync_ms"] = round(st.get("sync_ms", 0) + (time.monotonic() - t1) * 1000, 3)
        st["lanes"] = lanes

    def _copy_to_host(self, pieces: list[Piece]):
        """Device memory -> the page-locked pool (the app may be running: a
        pre-dump's copy is hashed as stored)."""
        if pieces:
            self._read_runs(pieces, self.backend.host_buffer(sum(p.n for p in pieces)), 0, lambda p: p.addr)

    def _drain(self, pieces: list[Piece]):
        """Snapshot copies in device memory -> host memory (app running)."""
        need = [p for p in pieces if p.host is None]
        if not need:
            return
        if any(p.hash is None for p in need):
            # hashing the snapshot on the device is cheaper than on the host
            self.hash_live([p for p in need if p.hash is None], src=lambda p: p.scratch)
        buf = self.backend.host_buffer(sum(p.n for p in pieces))
        # the scratch copy of a run is contiguous too (one allocation per run)
        self._read_runs(need, buf, sum(p.n for p in pieces if p.host is not None), lambda p: p.scratch)
        for p in need:
            self._free_scratch(p)

    def _free_scratch(self, p: Piece):
        base = getattr(p, "scratch_base", None)
        if base is not None:
            self.backend.scratch_free(base)
            p.scratch_base = None
        p.scratch = None

    def hash_pieces(self, pieces: list[Piece]):
        for p in pieces:
            if p.hash is None and p.host is not None:
                p.hash = hashing.gp64(p.host)

    def _write(self, path, kind, parent_img, modules, desc, pieces, globals_, stats, key_uid=None, compress=None):
        b = self.backend
        meta = {
            "gpuproxy_version": __version__,
            "backend": b.name,
            "driver_version": b.driver_version(),
            "devices": [{"index": d, "name": b.device_name(d), "total_memory": b.device_total_mem(d)}
                        for d in range(b.device_count())],
        }
        w = ImageWriter(path, kind, meta, parent=parent_img, chunk_size=CHUNK, seal_key=self.seal_key(),
                        owner=self.image_owner(desc, key_uid), compress=compress)
        for entry, image in modules:
            entry["image"] = w.add_module(image)
        for p in pieces:
            if not p.changed and parent_img is not None:
                w.add_unchanged(p.addr, p.n, p.hash)
        w.add_chunks([(p.addr, p.host, p.hash, 0) for p in pieces if p.changed or parent_img is None],
                     workers=self.WRITERS)
        for addr, size, data, flags in globals_:      # the kinds' pieces (__device__ variables, arrays)
            h = hashing.gp64(data)
            if parent_img is not None and parent_img.hash_of(addr) == h:
                w.add_unchanged(addr, size, h, flags=flags)
            else:
                w.add_chunk(addr, data, hash=h, flags=flags)
        stats["image_write"] = dict(w.write_stats, direct=w.direct)
        if w.compress is not None:
            stats["image_write"]["compress"] = f"{w.compress[0]}:{w.compress[1]}"
        w.finish(desc, stats)

    def seal_key(self) -> bytes | None:
        """The daemon's image-seal key (keys.py); None, with a warning, if
        the key directory cannot be used (images are then written unsealed,
        and a restore treats them as foreign)."""
        from ..core.keys import KeyError_, seal_key
        try:
            return seal_key()
        except (OSError, KeyError_) as e:
            log.warning("images are written without a seal: %s", e)
            return None

    def image_owner(self, desc: dict, key_uid: int | None = None) -> tuple[int, int] | None:
        """(uid, gid) to give a new image: when root dumps another user's
        session the image is that user's (docs/security.md); None keeps the
        writer's own. A keyed tcp session (curve.py) is its key's user's,
        wherever the client runs."""
        if os.geteuid() != 0 or not desc.get("uid"):
            return None
        if key_uid is not None and key_uid == desc["uid"]:
            import pwd
            try:
                return key_uid, pwd.getpwuid(key_uid).pw_gid
            except KeyError:
                return key_uid, key_uid
        pid = int(desc["pid"])
        who = procinfo.owner(pid)
        if who is None or who[0] != desc["uid"] or procinfo.start_time(pid) != desc.get("start_time"):
            return None
        return who

    # threads that prepare (hash, compress) and write an image's chunks
    WRITERS = int(os.environ.get("GPUPROXY_IMAGE_WRITERS", "0")) or min(16, os.cpu_count() or 1)
    # restore staging: SLOTS page-locked slots of UPLOAD_SLOT bytes, in a ring
    UPLOAD_SLOT = int(os.environ.get("GPUPROXY_RESTORE_SLOT_MB", "16")) << 20
    UPLOAD_SLOTS = int(os.environ.get("GPUPROXY_RESTORE_SLOTS", "6"))
    # reads of the image per slot run on this many threads, in pieces of READ_PIECE
    READERS = int(os.environ.get("GPUPROXY_RESTORE_READERS", "0")) or min(16, os.cpu_count() or 1)
    READ_PIECE = 4 << 20

    def _upload(self, img: Image, refs, pieces):
        """Image chunks -> device memory: what the shared host pool kept of
        this image straight from there (memory_restore.py), then by DMA
        straight out of the image file's mapping where it can be registered (direct_upload.py: an
        image in host memory on the cuda backend), the rest (compressed
        chunks, files or segments whose registration is refused) through
        the ring of page-locked slots (_upload_ring). rstats["upload"]: the
        ring's figures at the top level where it ran, the direct path's
        under "direct", and mode, bytes, wall_ms, gbps of the whole."""
        from . import direct_upload
        b = self.backend
        t0 = time.monotonic()
        refs_all = refs
        refs, mem = memory_restore.upload(self, img, refs, pieces)     # what the shared pool kept of img
        rest, dst = refs, None
        if refs and direct_upload.eligible_images(b, img):
            fail = os.environ.get("GPUPROXY_TEST_DIRECT_FAIL_SEGMENT")     # tests: one refused segment
            rest, dst = direct_upload.upload(b, img, refs, pieces, span=getattr(b, "spans_mappings", False),
                                             lanes=self.LANES, fail_segment=int(fail) if fail else None)
        up: dict = {}
        if rest:
            self._upload_ring(img, rest, pieces)
            up = self.rstats["upload"]
            up["ring_bytes"] = up.get("bytes", 0)
        if dst is not None:
            up["direct"] = dst
        up["mode"] = "ring" if dst is None or not dst["bytes"] else ("direct+ring" if rest else "direct")
        if mem is not None:
            up["from_memory"] = mem
            if mem.get("bytes"):
                up["mode"] = f"memory+{up['mode']}" if refs else "memory"
        self.rstats["from_memory_bytes"] = (mem or {}).get("bytes", 0)
        self.rstats["from_files_bytes"] = sum(r.length for r in refs)
        up["bytes"] = sum(r.length for r in refs_all)
        up["wall_ms"] = _ms(t0, time.monotonic())
        up["gbps"] = round(up["bytes"] / max(time.monotonic() - t0, 1e-9) / 1e9, 2)
        self.rstats["upload"] = up

    def _upload_ring(self, img: Image, refs, pieces):
        """Image chunks -> device memory, as a pipeline over a ring of
        page-locked slots (the pool's first SLOTS x SLOT bytes, reused by
        every restore of this worker):

          read:   reader threads copy (or decompress) the chunks of batch k
                  straight into slot k % SLOTS (Image.read_into: out of the
                  file's mapping, populated at once for a file in host
                  memory; no intermediate copy);
          upload: as soon as batch k is in its slot, its host-to-device
                  copies are queued on copy lane k % LANES and an event
                  (fence) is recorded after them;
          reuse:  slot k % SLOTS is refilled with batch k + SLOTS only once
                  that fence has passed.

        Nothing else synchronises: several batches are being read while
        earlier ones are on the link. Chunks that follow each other in the
        file and on the device (a full image written in address order) are
        one read and one copy, within a slot. The per-stage times go into
        the restore's stats (rstats["upload"])."""
        import collections
        import concurrent.futures
        b = self.backend
        # a slot holds at least the largest chunk (CHUNK: pieces_of cuts memory at it)
        slot = max(self.UPLOAD_SLOT, CHUNK, max((r.length for r in refs), default=0))
        nslots, lanes = max(2, self.UPLOAD_SLOTS), max(1, self.LANES)
        t_start = time.monotonic()
        stage = b.host_buffer(nslots * slot)
        span = getattr(b, "spans_mappings", False)
        # extents: (image, file offset, stored, device address, length, dev, [refs]); merged when
        # contiguous in the file and on the device, uncompressed, and (unless span) in one mapping
        ext = []
        for r in sorted(refs, key=lambda r: (r.image, r.offset)):
            p = pieces[r.addr]
            e = ext[-1] if ext else None
            if e is not None and not r.compressed and not e[7] and e[0] == r.image and e[1] + e[2] == r.offset \
                    and e[3] + e[4] == r.addr and e[5] == p.dev and e[4] + r.length <= slot \
                    and (span or pieces[e[6][-1].addr].chunk == p.chunk):
                e[2] += r.length
                e[4] += r.length
                e[6].append(r)
            else:
                ext.append([r.image, r.offset, r.disk_length, r.addr, r.length, p.dev, [r], r.compressed])
        batches, cur, size = [], [], 0
        for e in ext:
            if cur and size + e[4] > slot:
                batches.append(cur)
                cur, size = [], 0
            cur.append(e)
            size += e[4]
        if cur:
            batches.append(cur)
        st = {"slot_mb": slot >> 20, "slots": nslots, "lanes": lanes, "readers": self.READERS,
              "batches": len(batches), "copies": len(ext), "read_s": 0.0}
        wait_pin = b.wait_pinned(0, min(len(stage), nslots * slot))
        st["pin_wait_ms"] = round(wait_pin * 1000, 3)
        lock = __import__("threading").Lock()

        def read(job):
            o, e, lo, n = job            # bytes [lo, lo+n) of extent e into stage[o:o+n]
            t = time.monotonic()
            if e[7]:
                img.read_into(e[6][0], stage[o:o + n])
            else:
                ref = e[6][0]
                img.read_into(ChunkView(ref, e[1] + lo, n), stage[o:o + n])
            with lock:
                st["read_s"] += time.monotonic() - t

        fences: dict[int, object] = {}
        pending = collections.deque()
        waits = {"fill_ms": 0.0, "fence_ms": 0.0, "queue_ms": 0.0}

        def submit_upload(k, batch, futs):
            t = time.monotonic()
            for f in futs:
                f.result()
            t1 = time.monotonic()
            waits["fill_ms"] += (t1 - t) * 1000
            base = (k % nslots) * slot
            o = base
            lane = k % lanes
            devs = set()
            for e in batch:
                b.write_device_async(e[5], e[3], stage[o:o + e[4]], lane=lane)
                devs.add(e[5])
                o += e[4]
            # one fence per slot, on the lane that used it (all of a batch is on one lane and device,
            # or the fence covers each device's lane)
            fences[k % nslots] = [b.lane_fence(d, lane) for d in devs]
            waits["queue_ms"] += (time.monotonic() - t1) * 1000

        with concurrent.futures.ThreadPoolExecutor(max(1, self.READERS)) as ex:
            for k, batch in enumerate(batches):
                s_ = k % nslots
                # the slot's previous batch (k - nslots) must be queued, then on the device,
                # before the slot is overwritten
                while pending and pending[0][0] <= k - nslots:
                    submit_upload(*pending.popleft())
                if s_ in fences:
                    t = time.monotonic()
                    for f in fences.pop(s_):
                        b.wait_fence(f)
                    waits["fence_ms"] += (time.monotonic() - t) * 1000
                jobs, o = [], s_ * slot
                for e in batch:
                    if e[7]:
                        jobs.append((o, e, 0, e[4]))
                    else:
                        for lo in range(0, e[4], self.READ_PIECE):
                            jobs.append((o + lo, e, lo, min(self.READ_PIECE, e[4] - lo)))
                    o += e[4]
                pending.append((k, batch, [ex.submit(read, j) for j in jobs]))
                # queue the uploads of batches whose reads are done, in order
                while pending and all(f.done() for f in pending[0][2]):
                    submit_upload(*pending.popleft())
            while pending:
                submit_upload(*pending.popleft())
        t = time.monotonic()
        for fs in fences.values():
            for f in fs:
                b.wait_fence(f)
        for d in {e[5] for e in ext}:
            b.sync_copies(d)
        waits["fence_ms"] += (time.monotonic() - t) * 1000
        st.update({k: round(v, 3) for k, v in waits.items()})
        st["read_s"] = round(st["read_s"], 4)
        st["wall_ms"] = _ms(t_start, time.monotonic())
        nbytes = sum(e[4] for e in ext)
        st["bytes"] = nbytes
        st["gbps"] = round(nbytes / max(time.monotonic() - t_start, 1e-9) / 1e9, 2)
        self.rstats["upload"] = st

    # ------------------------------------------------------------- release
    def release(self, sess: Session):
        """Frees the session's GPU resources after a dump; the session stays
        (frozen) so its calls wait for a restore."""
        destroy_context = kinds.service("destroy_context")     # families/contexts.py
        for c in list(sess.contexts.values()):
            destroy_context(self.dispatcher, sess, c)
        sess.arena.release_all()
        sess.released = True
        # its staging memory too: a shared host pool goes back to the
        # supervisor for the worker that restores it (backends/shared_pool.py)
        self.backend.release_host_buffer()

    # ------------------------------------------------------------- restore
    def _restore(self, path: str, device_map: dict | None = None, allow_foreign: bool = False
                 ) -> tuple[Session, dict]:
        """Builds a session from an image (worker thread) and installs it."""
        t0 = time.monotonic()
        _kinds_complete()
        try:
            img = Image.open(path)
            img.check_restorable()
            validate_session(img.session, strict=True)
        except ImageError as e:
            raise CheckpointError(f"image refused: {e}") from e
        except SchemaError as e:
            raise CheckpointError(f"image refused: {img.path}/manifest: {e}") from e
        ours, why = img.chain_seal(self.seal_key())
        if not ours:
            if not allow_foreign:
                raise CheckpointError(f"image refused: {img.path}: {why}; restore it with --allow-foreign if you "
                                      f"trust where it came from")
            log.warning("restoring %s although it is a %s", img.path, why)
        m = img.manifest
        b = self.backend
        if m.get("backend") != b.name:
            raise CheckpointError(f"image was taken on the {m.get('backend')} backend; this proxyd runs {b.name}")
        desc = img.session
        if not (m.get("criu") or {}).get("complete"):
            # a whole-process image's process does not exist yet: CRIU
            # recreates it (same pid, new start time) once the GPU state is back
            self._check_process(desc)
        device_map = {int(k): int(v) for k, v in (device_map or {}).items()}
        used = sorted({c["device"] for c in desc["contexts"]} | {c[2] for c in desc["arena"]["chunks"]})
        names = {d["index"]: d["name"] for d in m.get("devices", [])}
        for d in used:
            nd = device_map.get(d, d)
            if not 0 <= nd < b.device_count():
                raise CheckpointError(f"image uses device {d}, mapped to {nd}, which this machine does not have")
            if names.get(d) and names[d] != b.device_name(nd):
                raise CheckpointError(f"image device {d} is a {names[d]}; device {nd} here is a {b.device_name(nd)} "
                                      f"(restore needs the same GPU model)")
        kinds.precheck(desc, self.backend, device_map)     # each kind's own fields (Kind.precheck)
        token = desc["token"]
        old = self.server.sessions.get(token)
        if old is not None and not getattr(old, "released", False):
            raise CheckpointError(f"session {token} (pid {old.pid}) is live in this proxyd; dump it without "
                                  f"--leave-running first")
        t_check = time.monotonic()
        self.rstats = {}
        self.from_memory = set()      # chunks uploaded from the shared pool (memory_restore.py)
        sess = self.server.make_session(token, int(desc["pid"]), desc.get("exe", ""), int(desc["slot"]),
                                        reuse=old)
        try:
            self._rebuild(sess, img, desc, device_map)
        except Exception as e:
            self.server.call_in_loop(lambda: self.server.discard_session(sess, keep=old)).result()
            if isinstance(e, (CheckpointError, ImageError)):
                raise CheckpointError(f"restore failed, nothing restored: {e}") from e
            log.exception("restore failed")
            raise CheckpointError(f"restore failed, nothing restored: {e}") from e
        t_built = time.monotonic()
        self.server.call_in_loop(lambda: self.server.install_session(sess, old)).result()
        stats = {"bytes": sum(r.length for r in img.chunks()), "check_ms": _ms(t0, t_check),
                 "rebuild_ms": _ms(t_check, t_built), "total_ms": _ms(t0, time.monotonic()),
                 "token": token, "pid": sess.pid, **self.rstats}
        return sess, stats

    @staticmethod
    def _read_key(img: Image, key: int, what: str) -> bytes | None:
        """The image piece stored under key (kinds' own pieces: CUDA array
        contents), its hash checked; None if the image has none."""
        r = img.find(key)
        if r is None:
            return None
        data = bytes(img.read_chunk(r))
        if hashing.gp64(data) != r.hash:
            raise CheckpointError(f"{what} is corrupt in the image")
        return data

    def _check_process(self, desc: dict) -> None:
        """Refuses to restore into a process that is gone: a session with no
        process would sit in proxyd holding memory (a phantom). Only where
        the pid means something here (the same pid namespace)."""
        pid, ns = desc["pid"], desc.get("pidns")
        if not pid or not ns or ns != procinfo.OWN_PIDNS:
            return
        now = procinfo.start_time(pid)
        if now is None:
            raise CheckpointError(f"image refused: its process (pid {pid}, {desc.get('exe') or 'unknown program'}) "
                                  f"has exited; nothing to restore into")
        if desc.get("start_time") is not None and now != desc["start_time"]:
            raise CheckpointError(f"image refused: pid {pid} now belongs to another process (started at tick {now}, "
                                  f"the image's process at tick {desc['start_time']})")

    def _set_stream_attrs(self, stream, attrs: dict, keep: dict):
        """Re-applies recorded cuStreamSetAttribute values to a re-created stream."""
        for aid, val in sorted(attrs.items(), key=lambda x: int(x[0])):
            val = _unjson(val)
            code, _ = self.backend.call_named("cuStreamSetAttribute", [stream, int(aid), val])
            if code:
                raise CheckpointError(f"cuStreamSetAttribute({aid}) on a restored stream failed ({code})")
            keep[int(aid)] = bytes(val)
    def _rebuild(self, sess: Session, img: Image, desc: dict, device_map: dict):
        """Every kind's objects, in the declared restore order (core/kinds.py,
        Stage): the engine's own steps (contexts, the arena, memory contents,
        client-facing state) are kinds like the families'."""
        rst = kinds.Restore(self, sess, img, desc, device_map, self.rstats,
                            read_key=lambda key, what: self._read_key(img, key, what))
        t = time.monotonic()
        marks = list(_REBUILD_TIMERS)
        for k in kinds.ordered():
            while marks and k.stage > marks[0][0]:
                now = time.monotonic()
                self.rstats[marks.pop(0)[1]] = _ms(t, now)
                t = now
            if k.rebuild is not None:
                k.rebuild(rst)
        while marks:
            now = time.monotonic()
            self.rstats[marks.pop(0)[1]] = _ms(t, now)
            t = now

    def _upload_memory(self, sess: Session, img: Image) -> None:
        """The device memory's contents (Stage.MEMORY; every kind's pieces,
        memory_pieces): uploaded, then what landed on the device checked
        against the image's hashes."""
        b = self.backend
        refs = img.chunks()
        arena_refs = [r for r in refs if not (r.flags & FLAG_GLOBAL)]
        pieces = {p.addr: p for p in memory_pieces(sess)}
        t_up = time.monotonic()
        for r in arena_refs:
            p = pieces.get(r.addr)
            if p is None or p.n != r.length:
                raise CheckpointError(f"chunk {r.addr:#x}+{r.length} does not match the image's arena")
            p.hash = None
        self._upload(img, arena_refs, pieces)
        for c in list(sess.contexts.values()):
            b.ctx_sync(c.real)
        t_hash = time.monotonic()
        self.rstats.update(upload_ms=_ms(t_up, t_hash))
        check = [pieces[r.addr] for r in arena_refs]
        self.hash_live(check)
        self.rstats["verify_ms"] = _ms(t_hash, time.monotonic())
        bad = [r for r in arena_refs if pieces[r.addr].hash != r.hash]
        if bad:                           # a chunk taken from the pool is read from the files instead
            bad = memory_restore.redo(self, img, bad, pieces)
        for r in bad:
            got = pieces[r.addr].hash
            if got != r.hash:
                raise CheckpointError(f"chunk at {r.addr:#x} is corrupt: gp64 {got:#018x}, image says {r.hash:#018x}")
        if len(arena_refs) != len(pieces):
            missing = sorted(set(pieces) - {r.addr for r in arena_refs})
            raise CheckpointError(f"image lacks {len(missing)} chunks, first at {missing[0]:#x}")


# ------------------------------------------------- the engine's own steps
# Registered in the kinds table with the families' kinds, so that the whole
# restore order is one declared list (core/kinds.py, Stage).

# restore figures taken at stage boundaries: (last stage timed, figure)
_REBUILD_TIMERS = ((Stage.GLOBALS, "contexts_modules_ms"),      # contexts and modules
                   (Stage.ARRAYS, "memory_map_ms"),             # the arena's chunks mapped again, and what lives there
                   (Stage.LIBCAPTURE, "objects_ms"))            # kernels, streams, events, library objects, settings


def _kinds_complete() -> None:
    """Refuses a checkpoint while some required manifest field has no kind
    to write and rebuild it: the API families were not loaded (the
    dispatcher loads them; families.load_all), and an image made now would
    silently lack their objects."""
    owned = set().union(*(k.keys for k in kinds.KINDS.values()))
    missing = sorted(set(SESSION.fields) - owned)
    if missing:
        raise CheckpointError(f"no checkpoint object kind writes the manifest fields {', '.join(missing)}: the API "
                              f"families are not loaded (gpuproxy.proxyd.families.load_all)")


def _rebuild_contexts(r: kinds.Restore) -> None:
    b = r.backend
    for c in r.desc["contexts"]:
        ctx = r.sess.add_context(r.dmap(c["device"]), b.ctx_create(r.dmap(c["device"]), c["flags"],
                                                                    primary=c["primary"]),
                                 c["primary"], c["flags"], ident=c["id"])
        ctx.refcount = c["refcount"]


def _rebuild_streams_events(r: kinds.Restore) -> None:
    from .._generated import FUNCTIONS
    b, sess = r.backend, r.sess
    for key, kind in (("streams", "stream"), ("events", "event")):
        for o in r.desc[key]:
            fid, ctxh, args = o["create"]
            fn = FUNCTIONS[fid]
            ctx = sess.context(ctxh) if ctxh else None
            if ctx is not None:
                b.make_current(ctx.real)
            code, outs = r.dispatcher.generic(sess, fn, ctx, [_unjson(a) for a in args], fid, ctxh,
                                              force_ids={kind: o["id"]})
            if code:
                raise CheckpointError(f"recreating {kind} {o['id']} failed with CUDA error {code}")
            obj = sess.objects[(P.KIND_CODES[kind], o["id"])]
            if kind == "stream":
                r.engine._set_stream_attrs(obj.real, o.get("attrs", {}), obj.info.setdefault("attrs", {}))
            elif o.get("recorded"):
                # an event that had been recorded comes back completed
                # (its work finished before the dump): queries, waits and
                # stream waits on it succeed at once
                b.event_mark_complete(obj.real)
                obj.info["recorded"] = True


def _rebuild_context_settings(r: kinds.Restore) -> None:
    b = r.backend
    for c in r.desc["contexts"]:
        ctx = r.sess.contexts[c["id"]]
        b.make_current(ctx.real)
        for limit, value in c.get("limits", {}).items():
            code, _ = b.call_named("cuCtxSetLimit", [int(limit), int(value)])
            if code:
                raise CheckpointError(f"context {c['id']}: cuCtxSetLimit({limit}, {value}) failed ({code})")
            ctx.limits[int(limit)] = int(value)
        for special, attrs in c.get("stream_attrs", {}).items():
            r.engine._set_stream_attrs(b.stream(int(special)), attrs,
                                       ctx.stream_attrs.setdefault(int(special), {}))


def _rebuild_replay(r: kinds.Restore) -> None:
    """Settings made through `restore: replay` calls, now that the objects
    they name exist again; run_op records them on the new session too."""
    from .._generated import FUNCTIONS
    sess, desc = r.sess, r.desc
    sess.primary_flags = {int(k): int(v) for k, v in desc.get("primary_flags", {}).items()}
    for fid, ctxh, args in desc.get("replay", []):
        fn = FUNCTIONS.get(fid)
        if fn is None or fn.restore != "replay":
            raise CheckpointError(f"image replays function id {fid}, which this proxyd does not record")
        code, _, msg = r.dispatcher.run_op(sess, [fid, ctxh] + [_unjson(a) for a in args])
        if code:
            raise CheckpointError(f"replaying {fn.name} failed with CUDA error {code}: {msg}")
    r.stats["replayed"] = len(desc.get("replay", []))


def _rebuild_session_state(r: kinds.Restore) -> None:
    """The client-facing state (Stage.SESSION_STATE)."""
    sess, desc = r.sess, r.desc
    sess.pidns = desc.get("pidns") or ""      # the reaper and the next dump need it
    sess.last_seq = int(desc["last_seq"])
    sess.last_reply = [base64.b64decode(f) for f in desc["last_reply"]] if desc.get("last_reply") else None
    for k, v in desc["next_id"].items():
        sess.next_id[int(k)] = max(sess.next_id.get(int(k), 1), int(v))
    if desc.get("async_error"):
        sess.async_error = tuple(desc["async_error"])


for _k in (kinds.Kind("contexts", Stage.CONTEXTS, ("contexts",), describe=_describe_contexts,
                      rebuild=_rebuild_contexts),
           kinds.Kind("streams_events", Stage.STREAMS_EVENTS, ("streams", "events"), describe=_describe_streams_events,
                      rebuild=_rebuild_streams_events),
           kinds.Kind("context_settings", Stage.CONTEXT_SETTINGS, rebuild=_rebuild_context_settings),
           kinds.Kind("replay", Stage.REPLAY, ("replay", "primary_flags"), describe=_describe_replay,
                      rebuild=_rebuild_replay),
           kinds.Kind("memory", Stage.MEMORY, pieces=pieces_of,
                      rebuild=lambda r: r.engine._upload_memory(r.sess, r.img)),
           kinds.Kind("session_state", Stage.SESSION_STATE,
                      ("token", "pid", "exe", "slot", "last_seq", "last_reply", "next_id", "async_error", "pidns",
                       "start_time", "uid", "owner_uid"),
                      describe=_describe_session_state, rebuild=_rebuild_session_state)):
    kinds.register(dataclasses.replace(_k, owner=__name__))
