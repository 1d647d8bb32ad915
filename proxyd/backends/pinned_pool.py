"""Page-locked host memory for checkpoints, pinned in the background, a
segment at a time, while copies into the segments already pinned proceed.

Why: a dump copies device memory into host memory at the link's speed only
if that memory is page-locked (CUDA Programming Guide, "Page-Locked Host
Memory": async copies need it, pageable memory is staged by the driver).
Pinning costs too: the pages must be faulted in (first touch) and then
registered (cuMemHostRegister walks and locks every page). The first dump of
a worker used to do all of that for the whole pool before copying anything
(0.96-2.4 s for 8 GiB on the H100), so it took several times longer than the
next ones. Here the pool is one anonymous mapping (transparent huge pages),
cut into SEGMENT-sized pieces; background threads touch and register the
pieces in order, and the engine waits (wait_pinned) only for the piece a
copy goes to: the first dump runs at max(pinning rate, copy rate) instead of
their sum, and the pool is kept for later dumps, as before, until the engine
releases it after an idle period (Engine.POOL_KEEP_S), so an idle client does
not hold gigabytes of page-locked memory.

A copy must not span two segments (each is its own registration; the driver
treats a range crossing registrations as pageable), so callers cut copies at
SEGMENT boundaries (segment_end).

A segment whose registration fails stays usable as pageable memory (copies
into it are correct, only slower); the reason is logged once.

Knobs (environment of proxyd), so that one GPU run can compare variants:
$GPUPROXY_PIN_THREADS (default min(16, cores): first touch scales with
threads, 40 GB/s on 16 of the H100 host's cores against 5 GB/s on one;
registration itself does not, bench/pin_cost.cu) and $GPUPROXY_PIN_SEGMENT_MB
(default 256: the unit a copy waits for and a registration call covers).

Locking: `_cv` guards the ready/failed sets; the pinning threads only touch
and register their own segments. The pool's owner (the engine, under its
lock) is the only user of the memory; free() waits for the pinning threads.
Process ownership: one pool per worker process (one session).
"""
from __future__ import annotations

import logging
import mmap
import os
import threading
import time

import numpy as np

log = logging.getLogger("proxyd")

SEGMENT = 256 << 20


def _env_int(name: str, default: int) -> int:
    try:
        v = int(os.environ.get(name, "") or default)
        return v if v > 0 else default
    except ValueError:
        log.warning("%s=%r is not a number; using %d", name, os.environ.get(name), default)
        return default


class PinnedPool:
    def __init__(self, size: int, register, unregister, threads: int | None = None, segment: int | None = None):
        """register(view) -> handle or raises; unregister(handle). Pinning
        starts at once on `threads` background threads."""
        self.size = size
        self.segment = segment or (_env_int("GPUPROXY_PIN_SEGMENT_MB", SEGMENT >> 20) << 20)
        self.mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            self.mm.madvise(mmap.MADV_HUGEPAGE)
        except (AttributeError, OSError):
            pass
        self.view = memoryview(self.mm)
        self._register, self._unregister = register, unregister
        self.nseg = -(-size // self.segment)
        self._cv = threading.Condition()
        self._ready: set[int] = set()
        self._handles: dict[int, object] = {}
        self._next = 0
        self._stop = False
        self._hook = None          # (fn, segments still to run it for) of run_when_ready
        self._hook_left = 0
        self._hook_error: BaseException | None = None
        self.failed: str | None = None
        self.stats = {"touch_s": 0.0, "register_s": 0.0, "register_max_s": 0.0, "segments": self.nseg,
                      "segment_mb": self.segment >> 20, "threads": 0}
        self.t0 = time.monotonic()
        self.t_done: float | None = None
        n = max(1, min(threads or _env_int("GPUPROXY_PIN_THREADS", min(16, os.cpu_count() or 1)), self.nseg))
        self.stats["threads"] = n
        self._threads = [threading.Thread(target=self._run, name=f"gpuproxy-pin{i}", daemon=True) for i in range(n)]
        for t in self._threads:
            t.start()

    def _run(self):
        while True:
            with self._cv:
                if self._stop or self._next >= self.nseg:
                    return
                k = self._next
                self._next += 1
            lo = k * self.segment
            n = min(self.segment, self.size - lo)
            t0 = time.monotonic()
            np.frombuffer(self.mm, np.uint8, n, lo).fill(0)     # fault the pages in
            t1 = time.monotonic()
            h = None
            try:
                h = self._register(self.view[lo:lo + n])
            except Exception as e:       # stays pageable: correct, slower
                with self._cv:
                    if self.failed is None:
                        self.failed = str(e)
                        log.warning("page-locking checkpoint memory failed (%s); copies use pageable memory", e)
            t2 = time.monotonic()
            with self._cv:
                self.stats["touch_s"] += t1 - t0
                self.stats["register_s"] += t2 - t1
                self.stats["register_max_s"] = max(self.stats["register_max_s"], t2 - t1)
                if h is not None:
                    self._handles[k] = h
                self._ready.add(k)
                if len(self._ready) == self.nseg:
                    self.t_done = t2
                hook = self._hook
                mine = hook is not None and k in hook[1]
                if mine:
                    hook[1].discard(k)
                self._cv.notify_all()
            if mine:
                self._run_hook(hook[0], k)

    def segment_end(self, off: int) -> int:
        """The end of the segment holding byte off (copies stop there)."""
        return min(self.size, (off // self.segment + 1) * self.segment)

    def wait_pinned(self, off: int, n: int) -> float:
        """Blocks until [off, off+n) is pinned (or known to stay pageable);
        returns the seconds waited."""
        if n <= 0:
            return 0.0
        first, last = off // self.segment, (off + n - 1) // self.segment
        t0 = time.monotonic()
        with self._cv:
            while not all(k in self._ready for k in range(first, last + 1)):
                self._cv.wait()
        return time.monotonic() - t0

    def wait_any(self, segments) -> set[int]:
        """Blocks until at least one of `segments` (indexes) is pinned (or
        known to stay pageable); returns those that are. Lets a caller
        issue copies in the order segments become ready."""
        want = set(segments)
        if not want:
            return set()
        with self._cv:
            while True:
                got = want & self._ready
                if got:
                    return got
                self._cv.wait()

    def run_when_ready(self, segments, fn) -> None:
        """Runs fn(k) once for each segment index k in `segments` as soon as
        it is pinned: on the pinning thread that pinned it, right after its
        registration, or on the calling thread for segments pinned already;
        returns when every call has returned, re-raising the first
        exception one raised. Lets the first dump copy into a segment the
        moment it is page-locked, from as many threads as pin, with no
        single thread queueing all copies. One caller at a time (the
        engine's lock)."""
        want = set(segments)
        with self._cv:
            now = want & self._ready
            self._hook = (fn, want - now)
            self._hook_left = len(want)
            self._hook_error = None
        try:
            for k in sorted(now):
                self._run_hook(fn, k)
            with self._cv:
                while self._hook_left > 0:
                    self._cv.wait()
        finally:
            with self._cv:
                self._hook = None
        if self._hook_error is not None:
            raise self._hook_error

    def _run_hook(self, fn, k: int) -> None:
        try:
            fn(k)
        except BaseException as e:       # handed to run_when_ready's caller
            with self._cv:
                if self._hook_error is None:
                    self._hook_error = e
        finally:
            with self._cv:
                self._hook_left -= 1
                self._cv.notify_all()

    def all_pinned(self) -> bool:
        with self._cv:
            return len(self._ready) == self.nseg

    def free(self):
        with self._cv:
            self._stop = True
        for t in self._threads:
            t.join()
        for h in self._handles.values():
            try:
                self._unregister(h)
            except Exception as e:
                log.warning("unregistering checkpoint memory: %s", e)
        self._handles.clear()
        self.view.release()
        try:
            self.mm.close()
        except BufferError:
            pass          # a caller still holds a slice; the mapping goes with it
