"""Restore by DMA straight out of the image file's mapping (issue 13,
target 1).

Why: the ring path (Engine._upload_ring) copies every byte of the image
twice on the host side (file mapping -> page-locked slot, on reader threads)
before the host-to-device copy; on the H100 those reads were the bottleneck
(3.6 thread-s for 8 GiB, 7-9 GB/s). A file in host memory (tmpfs, e.g.
/dev/shm) already *is* host memory: registering its mapping with
cuMemHostRegister (CUDA Driver API, Memory Management: "Page-locks the
specified address range ... so that it can be accessed by the device";
CU_MEMHOSTREGISTER_READ_ONLY lets the device only read it, which is what a
PROT_READ mapping of the image allows) makes it a DMA source, and the
copies run at the link's speed with no host copy at all. Registration walks
and pins every page, so it is done in segments on several threads, and each
segment's copies are queued as soon as it is registered (in the order
segments finish, not file order); a segment is unregistered once the event
recorded after its copies has passed.

Where registration is refused (a filesystem or driver that does not allow
it, the read-only flag unsupported) or a chunk is compressed, the chunks go
through the ring as before; nothing here decides correctness, since the
restore verifies every chunk on the device afterwards (gp64, engine.py).

Knobs (environment of proxyd):
  GPUPROXY_RESTORE_DIRECT       auto (default): the ring (see below);
                                1: this path, on every filesystem and on the
                                emulated backend too (where nothing needs
                                registering: the tests run this path there);
                                0: ring only

Why auto is the ring: on the H100 host (driver 580.159.04, 2026-11-24) the
driver pins a /dev/shm file's pages at 12-15 GB/s (20-28 GB/s when the
mapping was populated first) however many threads register segments
(bench/pin_cost.cu rows register_shm_seg), and the restore through this
path reached 5.7-6.2 GB/s against 7.0-7.7 GB/s for the ring in the same
runs (ckptvar, 8 GiB). Restoring at link speed from a file needs its pages
page-locked before the restore starts.
  GPUPROXY_RESTORE_REG_MB       segment size (default 64)
  GPUPROXY_RESTORE_REG_THREADS  registering threads (default min(16, cores))
  GPUPROXY_RESTORE_REG_POPULATE 1: map the image with MAP_POPULATE first
                                (default 0; bench/pin_cost.cu measures both)

Locking and threads: the registering threads call only
backend.host_register_readonly / host_unregister (the driver allows those
from any thread; proxyd's cuda backend makes its management context current
on the calling thread first). Every copy, fence and wait runs on the
calling (engine) thread, because the backend's copy streams and event free
lists are per thread. The Image's mapping outlives the upload (the engine
holds the Image).
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import time

from .image import _in_memory_fs

log = logging.getLogger("proxyd")

PAGE = 4096


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, "") or default)
    except ValueError:
        log.warning("%s=%r is not a number; using %d", name, os.environ.get(name), default)
        return default


def mode() -> str:
    m = os.environ.get("GPUPROXY_RESTORE_DIRECT", "auto").strip().lower() or "auto"
    if m not in ("auto", "0", "1"):
        log.warning("GPUPROXY_RESTORE_DIRECT=%r: expected auto, 0 or 1; using auto", m)
        return "auto"
    return m


def eligible_images(backend, img) -> set[int]:
    """Indexes (into img.chain) of the images whose memory.bin may be
    registered for DMA: none in mode 0; in auto, those in host memory on
    the cuda backend; in mode 1, all."""
    m = mode()
    if m in ("0", "auto"):
        return set()        # auto: the ring (module docstring: measured slower here)
    out = set()
    for k, im in enumerate(img.chain):
        if m == "1" or _in_memory_fs(im._file("memory.bin")):
            out.add(k)
    return out


class Segment:
    """One registered range of an image's mapping: [lo, hi) of chain image k."""
    __slots__ = ("key", "lo", "hi", "copies", "refs", "token", "view", "fences", "reg_s")

    def __init__(self, key, lo, hi):
        self.key, self.lo, self.hi = key, lo, hi
        self.copies: list[tuple] = []       # (file offset, device, device address, length)
        self.refs: list = []                # the chunks with bytes here (for the fallback)
        self.token = None
        self.view = None
        self.fences = None
        self.reg_s = 0.0


def plan(img, refs, pieces, span: bool, seg: int, images: set[int]):
    """(segments in file order, refs left for the ring). A copy is a run of
    chunks contiguous in the file and on the device (in one arena mapping
    unless span), cut at segment boundaries: one copy never crosses two
    registrations (the driver would treat the range as pageable)."""
    rest = []
    segs: dict[tuple[int, int], Segment] = {}
    sizes = {}
    last = None          # the copy being extended: [seg, file off, dev, addr, n, chunk]
    for r in sorted(refs, key=lambda r: (r.image, r.offset)):
        if r.compressed or r.image not in images or r.length == 0:
            rest.append(r)
            last = None
            continue
        if r.image not in sizes:
            sizes[r.image] = img.chain[r.image].memory_size()
        p = pieces[r.addr]
        off, addr, left = r.offset, r.addr, r.length
        while left:
            k = off // seg
            key = (r.image, k)
            s = segs.get(key)
            if s is None:
                s = segs[key] = Segment(key, k * seg, min((k + 1) * seg, sizes[r.image]))
            n = min(left, s.hi - off)
            if last is not None and last[0] is s and last[1] + last[4] == off and last[2] == p.dev and \
                    last[3] + last[4] == addr and (span or last[5] == p.chunk):
                last[4] += n
            else:
                last = [s, off, p.dev, addr, n, p.chunk]
                s.copies.append(last)
            if not s.refs or s.refs[-1] is not r:
                s.refs.append(r)
            off, addr, left = off + n, addr + n, left - n
    return [segs[k] for k in sorted(segs)], rest


def upload(backend, img, refs, pieces, *, span: bool, lanes: int, fail_segment: int | None = None):
    """Uploads what it can of refs by DMA from the image's mapping; returns
    (refs left for the ring, stats). fail_segment: tests only, the index of
    a segment whose registration is made to fail."""
    b = backend
    t0 = time.monotonic()
    seg = max(PAGE, (_env_int("GPUPROXY_RESTORE_REG_MB", 64) << 20) // PAGE * PAGE)
    threads = max(1, _env_int("GPUPROXY_RESTORE_REG_THREADS", min(16, os.cpu_count() or 1)))
    images = eligible_images(b, img)
    segs, rest = plan(img, refs, pieces, span, seg, images)
    st = {"segment_mb": seg >> 20, "threads": threads, "segments": len(segs), "copies": 0, "bytes": 0,
          "register_s": 0.0, "unregister_s": 0.0, "reg_wait_ms": 0.0, "queue_ms": 0.0, "fence_ms": 0.0,
          "failed_segments": 0}
    if not segs:
        st["wall_ms"] = round((time.monotonic() - t0) * 1000, 3)
        return rest, st
    needs_reg = b.name != "emu"        # the emulated GPU copies from any host memory
    # the mappings, made here (one per chain image), not on the registering
    # threads; without MAP_POPULATE by default: registering a segment enters
    # its pages anyway, on several threads, where MAP_POPULATE would enter
    # all of them first on this one
    populate = os.environ.get("GPUPROXY_RESTORE_REG_POPULATE", "0") == "1"
    st["populate"] = populate
    t_map = time.monotonic()
    maps = {k: memoryview(img.chain[k]._memory(populate=populate)) for k in sorted({s.key[0] for s in segs})}
    st["map_ms"] = round((time.monotonic() - t_map) * 1000, 3)
    bad = segs[fail_segment] if fail_segment is not None and 0 <= fail_segment < len(segs) else None

    def register(s: Segment):
        """On a registering thread; the token is kept on the segment at once,
        so that whatever happens next it is unregistered."""
        t = time.monotonic()
        try:
            if s is bad:
                return s, None
            s.view = maps[s.key[0]][s.lo:s.hi]
            s.token = b.host_register_readonly(s.view) if needs_reg else True
            return s, s.token
        except Exception as e:          # refused: this segment's chunks go through the ring
            log.info("registering image memory for DMA failed (%s); those chunks go through the ring", e)
            return s, None
        finally:
            s.reg_s = time.monotonic() - t

    def unregister(s: Segment):
        t = time.monotonic()
        try:
            if needs_reg and s.token is not None:
                b.host_unregister(s.token)
        except Exception as e:
            log.warning("unregistering image memory: %s", e)
        s.token = None
        s.view = None
        return time.monotonic() - t

    done: list[Segment] = []
    failed: list[Segment] = []
    lanes = max(1, lanes)
    ex = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="gpuproxy-imgreg")
    try:
        # the first segment alone: where the driver refuses this mapping,
        # every segment would be refused, one call per segment
        s, tok = register(segs[0])
        if tok is None and needs_reg:
            st["refused"] = getattr(b, "last_register_error", None) or "refused"
            st["failed_segments"] = len(segs)
            st["register_s"] = round(s.reg_s, 4)
            seen = {id(r) for r in rest}
            for s in segs:
                for r in s.refs:
                    if id(r) not in seen:
                        seen.add(id(r))
                        rest.append(r)
            st["wall_ms"] = round((time.monotonic() - t0) * 1000, 3)
            return rest, st
        ready = [concurrent.futures.Future()]
        ready[0].set_result((s, tok))
        ready += [ex.submit(register, s) for s in segs[1:]]
        t_wait = time.monotonic()
        for fut in concurrent.futures.as_completed(ready):
            t = time.monotonic()
            st["reg_wait_ms"] += (t - t_wait) * 1000
            s, tok = fut.result()
            st["register_s"] += s.reg_s
            if tok is None:
                failed.append(s)
                t_wait = time.monotonic()
                continue
            lane = len(done) % lanes
            devs = set()
            for _seg, off, dev, addr, n, _chunk in s.copies:
                b.write_device_async(dev, addr, s.view[off - s.lo:off - s.lo + n], lane=lane)
                devs.add(dev)
                st["copies"] += 1
                st["bytes"] += n
            s.fences = [b.lane_fence(d, lane) for d in devs]
            done.append(s)
            t_wait = time.monotonic()
            st["queue_ms"] += (t_wait - t) * 1000
        # segments are given back in the order they were queued, each once
        # its copies have passed; the unregistering overlaps the waits
        t = time.monotonic()
        unregs = []
        for s in done:
            for f in s.fences:
                b.wait_fence(f)
            unregs.append(ex.submit(unregister, s))
        st["fence_ms"] = (time.monotonic() - t) * 1000
        st["unregister_s"] = sum(f.result() for f in unregs)
    finally:
        # whatever happened, no registration outlives the upload: none is
        # in progress after shutdown, and a segment whose copies were
        # queued is given back only after they have run
        ex.shutdown(wait=True)
        left = [s for s in segs if s.token is not None]
        if left:
            # an error got here: copies of any segment may still be queued
            # (also a part of the one being queued), so all of this
            # thread's copy lanes are waited for before any unregistering
            for d in {c[2] for s in segs for c in s.copies}:
                try:
                    b.sync_copies(d)
                except Exception as e:
                    log.warning("waiting for restore copies after an error: %s", e)
            for s in left:
                unregister(s)
        for s in segs:
            s.view = None
        maps.clear()
    if failed:
        st["failed_segments"] = len(failed)
        have = {id(r) for r in rest}
        for s in failed:
            for r in s.refs:
                if id(r) not in have:
                    have.add(id(r))
                    rest.append(r)
    for k in ("register_s", "unregister_s"):
        st[k] = round(st[k], 4)
    for k in ("reg_wait_ms", "queue_ms", "fence_ms"):
        st[k] = round(st[k], 3)
    st["wall_ms"] = round((time.monotonic() - t0) * 1000, 3)
    st["gbps"] = round(st["bytes"] / max(time.monotonic() - t0, 1e-9) / 1e9, 2)
    return rest, st
