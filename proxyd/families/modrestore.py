"""Modules and kernels of a restore, in the app's placement order, with the
images read and parsed ahead of the driver loads (issue 23, targets 4-5).

Two things decide how a restore gets its modules back:

* Where the driver puts `__device__` variables. The driver places a module's
  variables, and with lazy loading (CUDA_MODULE_LOADING=LAZY, the default
  since CUDA 12.2) a kernel's code at its first lookup, in device memory of
  its own, one after another; a fresh worker that repeats the same loads and
  lookups in the same order gets the same addresses. The app's order is
  recorded as each module's and kernel's placement number (`seq`, given by
  modules.placement_seq when the worker loads or first looks up); the restore
  replays the merged order, kernels between modules. Images without these
  numbers get the order of before (modules by id, kernels afterwards).
* Time. A restore used to read each image from the checkpoint, check its
  SHA-256, hash it a second time for the parse cache, parse it and load it,
  one after another, before anything else. Now the second hash is gone (the
  image's name is its checked digest) and reading, checking and parsing run
  on helper threads ahead of the loads (`parallel`, the default): file reads,
  SHA-256 and the driver's cuModuleLoadData release the GIL, so the loads
  overlap the preparation of the next images. The loads themselves stay on
  one thread, in order: parallel driver loads would place variables in
  whatever order the threads win. `unordered` does load on several threads
  (for measuring only: it gives up the placement order and the restore then
  reports the variables that moved). `serial` is the old way, for
  comparison. Chosen by $GPUPROXY_RESTORE_MODULES (serial, parallel,
  unordered); $GPUPROXY_RESTORE_MODULE_THREADS (default min(8, cores)).

Deferring a module's load to its first use is not offered: the shim already
loads a module only when the app first uses one of its kernels or variables
(interceptor/rt_register.c), so every module of an image has handles the app
holds; loading it later would move its variables (placement order) and need
every handler that reads a kernel's driver handle to resolve it on the way.

Figures (the engine's restore stats): modules_mode, modules_ms (the whole
step), modules_prep_ms (reading, checking, parsing, summed over threads),
modules_load_ms (the driver's loads), functions_ms (kernel lookups), and
modules / functions counts.

Locking: runs on the engine's restore thread; the helper threads only read
the image (each read opens its file anew) and use the module store, which
guards its tables with its own lock (modstore.py).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..core.addrspace import MAP_GATE

log = logging.getLogger("proxyd")

MODES = ("parallel", "serial", "unordered")


def mode() -> str:
    m = (os.environ.get("GPUPROXY_RESTORE_MODULES") or "parallel").strip().lower()
    if m not in MODES:
        log.warning("GPUPROXY_RESTORE_MODULES=%r is not one of %s; using parallel", m, ", ".join(MODES))
        return "parallel"
    return m


def threads() -> int:
    try:
        n = int(os.environ.get("GPUPROXY_RESTORE_MODULE_THREADS") or 0)
    except ValueError:
        n = 0
    return n if n > 0 else max(1, min(8, os.cpu_count() or 1))


def placement_order(modules: list, functions: list) -> list[tuple[str, dict]]:
    """[("module" | "function", description)] in the order the app placed
    them: by placement number when every module has one, else modules by
    id (the order of before; kernels then come at their own stage)."""
    if not modules or any(not md.get("seq") for md in modules):
        return [("module", md) for md in sorted(modules, key=lambda md: md["id"])]
    ev = [(md["seq"], 0, "module", md) for md in modules]
    ev += [(f["seq"], 1, "function", f) for f in functions if f.get("seq")]
    ev.sort(key=lambda e: (e[0], e[1]))
    return [(what, d) for _, _, what, d in ev]


def rebuild(r, load_module, restore_function, uid) -> None:
    """Stage MODULES: every module loaded and the kernels looked up in the
    app's placement order. load_module and restore_function are modules.py's
    and uid the client's user (modules.session_uid), passed in: modules.py
    imports this module, not the other way round."""
    from .modstore import store
    sess, desc = r.sess, r.desc
    m = mode()
    order = placement_order(desc["modules"], desc.get("functions") or [])
    mods = [d for what, d in order if what == "module"]
    prep_s = [0.0]
    lock = threading.Lock()

    def prep(md):
        t0 = time.monotonic()
        # shared against the driver zone's windows (core/addrspace.py): the
        # buffers read here would otherwise take a module's place
        with MAP_GATE.shared():
            image = r.img.module(md["image"])          # read, length and SHA-256 checked
            parsed = store().parsed(image, uid, bytes.fromhex(md["image"]))
        with lock:
            prep_s[0] += time.monotonic() - t0
        return image, parsed

    t0 = time.monotonic()
    load_s = func_s = 0.0
    nfunc = 0

    def load(md, image, parsed):
        ctx = sess.contexts[md["ctx"]]
        r.backend.make_current(ctx.real)
        load_module(r.dispatcher, sess, ctx, image, create=None, ident=md["id"],
                    digest=bytes.fromhex(md["image"]), parsed=parsed)

    if m == "unordered":
        # measurement only: loads on several threads, in no fixed order
        # (the session's tables are written on this thread only)
        def prep_load(md):
            image, parsed = prep(md)
            r.backend.make_current(sess.contexts[md["ctx"]].real)
            return image, parsed, r.backend.module_load(sess.contexts[md["ctx"]].real, image, parsed)
        tl = time.monotonic()
        with ThreadPoolExecutor(threads(), thread_name_prefix="gpuproxy-modload") as ex:
            for md, fut in [(md, ex.submit(prep_load, md)) for md in mods]:
                image, parsed, real = fut.result()
                load_module(r.dispatcher, sess, sess.contexts[md["ctx"]], image, create=None, ident=md["id"],
                            parsed=parsed, real=real)
        load_s = time.monotonic() - tl
        for what, d in order:
            if what == "function":
                tf = time.monotonic()
                restore_function(r, d)
                func_s += time.monotonic() - tf
                nfunc += 1
    else:
        n = min(threads(), len(mods))
        started = threading.Semaphore(0)
        # each helper thread signals once it runs: by then it has its stack and
        # its malloc arena (64 MiB of address space, made at a thread's first
        # allocation), which must not be made while a module load's zone
        # window is open (core/addrspace.py)
        ex = ThreadPoolExecutor(n, thread_name_prefix="gpuproxy-modprep",
                                initializer=started.release) if m == "parallel" and n else None
        try:
            futs = {md["id"]: ex.submit(prep, md) for md in mods} if ex is not None else {}
            for _ in range(len(ex._threads) if ex is not None else 0):
                started.acquire(timeout=30)
            for what, d in order:
                if what == "module":
                    image, parsed = futs[d["id"]].result() if ex is not None else prep(d)
                    tl = time.monotonic()
                    load(d, image, parsed)
                    load_s += time.monotonic() - tl
                else:
                    tf = time.monotonic()
                    restore_function(r, d)
                    func_s += time.monotonic() - tf
                    nfunc += 1
        finally:
            if ex is not None:
                ex.shutdown(wait=True, cancel_futures=True)
    r.stats.update(modules_mode=m, modules=len(mods), modules_ms=round((time.monotonic() - t0) * 1000, 3),
                   modules_prep_ms=round(prep_s[0] * 1000, 3), modules_load_ms=round(load_s * 1000, 3),
                   functions_ms=round(func_s * 1000, 3), functions_in_order=nfunc)
