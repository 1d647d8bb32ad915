"""Restore from host memory: a dump's memory left in the supervisor's shared
host pool, uploaded from there by a later restore of the same image in the
same proxyd instead of reading the image's files back (issue 23, target 4;
docs/architecture.md, "Shared host pool").

A dump copies the session's memory into its staging memory. When that is
the shared pool (backends/shared_pool.py, $GPUPROXY_HOST_POOL_MB), the
bytes are still there after the image is written; keep() tells the
supervisor which image they are of (the sha256 of its manifest, which names
it wherever its directory is moved: the preemption contract renames a
finished image, `latest` is a symlink) and where each chunk lies (a "keep
note": runs of device range -> pool offset, and a digest of every chunk's
address, length and gp64 hash). Until something writes to the pool again
(the backends' host_buffer withdraws the note first) a restore of that
image asks for the pool by that manifest digest (shared_pool.lease_kept), and
upload() sends the noted chunks to the device straight from the pool; the
rest (chunks of parent images, ones not noted) come from the files as
before.

Why it is safe to use:
* the supervisor lends a pool only to workers of the user it belongs to; a
  restore's worker gets the pool of the image's owner, whom the supervisor
  authorised for that image (supervisor/daemon.py ctl_restore, issue 21);
* the note must name this image (its manifest's sha256), and its digest
  must equal the one computed from this image's manifest for the same
  chunks: another image, this directory dumped again, or a manifest that
  differs, is not used (the files are read);
* every chunk is hashed on the device after the upload, as for a restore
  from files; a chunk from memory that does not match the manifest is sent
  again from the files (redo()), so a pool overwritten behind the note's
  back costs speed, never a wrong byte.

Memory bound: the pool itself ($GPUPROXY_HOST_POOL_MB); nothing is held
beyond it. The note goes with the next lease of the pool for anything but
this restore, the holder's next write, a larger pool replacing it, or the
pool's close after $GPUPROXY_HOST_POOL_KEEP_S idle seconds.

$GPUPROXY_RESTORE_FROM_MEMORY=0 turns both halves off.

Locking: called by the engine under its lock (one checkpoint operation at
a time per worker).
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import struct
import time

log = logging.getLogger("proxyd")

MAX_RUNS = 1024           # host_pool.py's bound on a note
COPY_MAX = 64 << 20       # one host-to-device copy at most; copies alternate between lanes


def enabled() -> bool:
    return os.environ.get("GPUPROXY_RESTORE_FROM_MEMORY", "1") != "0"


def digest(items) -> bytes:
    """items: (addr, length, gp64) of the noted chunks, in address order."""
    h = hashlib.sha256()
    for a, n, x in items:
        h.update(struct.pack("<QQQ", a, n, x & 0xFFFFFFFFFFFFFFFF))
    return h.digest()[:16]


def _addr(view) -> int:
    c = ctypes.c_char.from_buffer(view)
    try:
        return ctypes.addressof(c)
    finally:
        del c                 # the export ends here, so the pool can be unmapped later


# ------------------------------------------------------------------ dump side

def keep(b, path: str, pieces, kind: str) -> int:
    """After a dump wrote its image: notes the chunks that are in the shared
    pool with the supervisor. Returns the bytes noted (0: nothing kept)."""
    if kind != "dump" or not enabled():
        return 0
    current = getattr(b, "current_host_pool", None)
    pool = current() if current is not None else None
    if pool is None or not hasattr(pool, "note"):
        return 0
    try:
        base = _addr(pool.view)
        items = []
        for p in pieces:
            if p.host is None or p.hash is None or len(p.host) != p.n or not p.changed:
                continue
            off = _addr(p.host) - base
            if 0 <= off and off + p.n <= pool.size:
                items.append((p.addr, off, p.n, p.hash))
    except (TypeError, ValueError, BufferError) as e:
        log.info("restore from memory: the dump's pieces cannot be located in the pool (%s)", e)
        return 0
    if not items:
        return 0
    items.sort()
    runs: list[list[int]] = []
    for a, off, n, _h in items:
        r = runs[-1] if runs else None
        if r is not None and r[0] + r[2] == a and r[1] + r[2] == off:
            r[2] += n
        else:
            runs.append([a, off, n])
    if len(runs) > MAX_RUNS:
        log.info("restore from memory: %d runs in the pool, more than a note holds (%d); not kept",
                 len(runs), MAX_RUNS)
        return 0
    try:
        from .image import Image
        name = Image.open(path).digest        # as written: the manifest the restore will check
    except Exception as e:
        log.info("restore from memory: the image just written cannot be opened (%s); not kept", e)
        return 0
    note = {"image": name, "digest": digest((a, n, h) for a, _o, n, h in items), "runs": runs}
    return sum(r[2] for r in runs) if pool.note(note) else 0


# --------------------------------------------------------------- restore side

def upload(engine, img, refs, pieces):
    """Uploads what the pool holds of img from there. Returns (the refs
    still to upload from the files, stats or None when nothing was tried).
    The copies have finished when it returns."""
    if not refs or not enabled():
        return refs, None
    from ..backends import shared_pool
    b = engine.backend
    if getattr(b, "adopt_host_pool", None) is None:
        return refs, None
    t0 = time.monotonic()
    pool = shared_pool.lease_kept(b, img.digest)
    if pool is None:
        return refs, None
    b.adopt_host_pool(pool)       # the worker's staging from now on; freed as any (engine.release, idle timer)
    kept = pool.kept or {}
    st = {"map_ms": round((time.monotonic() - t0) * 1000, 3), "noted_bytes": kept.get("bytes", 0)}
    by_addr = {r.addr: r for r in refs}
    chosen = []                   # (ref, pool offset)
    why = None
    for addr, off, n in kept.get("runs") or []:
        a = addr
        while a < addr + n:
            r = by_addr.get(a)
            if r is None or a + r.length > addr + n:
                why = f"the image has no chunk of {r.length if r else '?'} bytes at {a:#x} where the memory kept has one"
                break
            chosen.append((r, off + (a - addr)))
            a += r.length
        if why:
            break
    if why is None and digest((r.addr, r.length, r.hash) for r, _o in sorted(chosen, key=lambda x: x[0].addr)) \
            != kept.get("digest"):
        why = "the memory kept is of other contents than this image's manifest says"
    if why is not None:
        log.warning("restore from memory: not used for %s: %s; reading the files", img.path, why)
        st["refused"] = why
        return refs, st
    t1 = time.monotonic()
    span = getattr(b, "spans_mappings", False)
    lanes = max(1, getattr(engine, "LANES", 1))
    view = pool.view
    # copies: contiguous in the pool and on the device, one device, within one mapping unless span
    copies = []
    for r, off in sorted(chosen, key=lambda x: x[1]):
        p = pieces[r.addr]
        c = copies[-1] if copies else None
        if c is not None and c[1] + c[2] == off and c[0] + c[2] == r.addr and c[3] == p.dev \
                and c[2] + r.length <= COPY_MAX and (span or c[4] == p.chunk):
            c[2] += r.length
        else:
            copies.append([r.addr, off, r.length, p.dev, p.chunk])
    devs = set()
    for k, (addr, off, n, dev, _chunk) in enumerate(copies):
        b.write_device_async(dev, addr, view[off:off + n], lane=k % lanes)
        devs.add(dev)
    for d in devs:
        b.sync_copies(d)
    nbytes = sum(r.length for r, _o in chosen)
    dt = time.monotonic() - t1
    st.update(bytes=nbytes, copies=len(copies), wall_ms=round(dt * 1000, 3),
              gbps=round(nbytes / max(dt, 1e-9) / 1e9, 2))
    engine.from_memory = {r.addr for r, _o in chosen}
    took = engine.from_memory
    return [r for r in refs if r.addr not in took], st


def redo(engine, img, bad, pieces) -> list:
    """Chunks whose device hash differs from the manifest after the upload:
    the ones that came from memory are sent again from the files and hashed
    again. Returns the refs that still differ (corrupt in the image)."""
    took = getattr(engine, "from_memory", None) or set()
    again = [r for r in bad if r.addr in took]
    if not again:
        return bad
    log.warning("restore from memory: %d chunks in the pool differ from the image; read from the files", len(again))
    up = engine.rstats.get("upload")
    engine._upload_ring(img, again, pieces)
    if up is not None:
        up["from_memory_redone"] = len(again)
        engine.rstats["upload"] = up
    engine.rstats["from_memory_bytes"] = max(0, engine.rstats.get("from_memory_bytes", 0)
                                             - sum(r.length for r in again))
    for d in {pieces[r.addr].dev for r in again}:
        engine.backend.sync_copies(d)
    check = [pieces[r.addr] for r in again]
    for p in check:
        p.hash = None
    engine.hash_live(check)
    took -= {r.addr for r in again}
    return [r for r in bad if r.addr not in {x.addr for x in again}] + \
        [r for r in again if pieces[r.addr].hash != r.hash]
