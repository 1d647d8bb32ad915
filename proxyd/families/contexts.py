"""Contexts and devices (CUDA Driver API, "Context Management", "Primary
Context Management"): cuInit, the primary context (retain, release, flags,
state, reset), cuCtxCreate/Destroy/Synchronize and context limits; freeing
everything a context holds when it goes (destroy_context, also the
checkpoint engine's release after a dump).

Every handler takes (dispatcher, session, fn, ctx, args) with one argument per
spec'd parameter and returns (CUresult, outs), outs being one value per
out_value/out_buffer parameter (None where the client passed NULL).

Locking: called on the worker's main loop (dispatch.py).
"""
from __future__ import annotations

from ..core import protocol as P
from ..core.kinds import provide
from ..core.registry import CUDA_SUCCESS, handler, need_ctx
from ..core.session import CudaError

CUDA_ERROR_INVALID_DEVICE = 101


# ------------------------------------------------------------------ init / contexts

@handler("init")
def h_init(d, sess, fn, ctx, args, **kw):
    d.backend.init()
    return CUDA_SUCCESS, []


def _check_device(d, dev):
    if not 0 <= dev < d.backend.device_count():
        raise CudaError(CUDA_ERROR_INVALID_DEVICE, f"invalid device ordinal {dev}")


@handler("primary_ctx_retain")
def h_primary_retain(d, sess, fn, ctx, args, **kw):
    dev = int(args[1])
    _check_device(d, dev)
    cid = sess.primary.get(dev)
    if cid is None:
        flags = sess.primary_flags.get(dev, 0)
        c = sess.add_context(dev, d.backend.ctx_create(dev, flags, primary=True), primary=True, flags=flags)
    else:
        c = sess.contexts[cid]
        c.refcount += 1
    return CUDA_SUCCESS, [c.handle]


@handler("primary_ctx_release")
def h_primary_release(d, sess, fn, ctx, args, **kw):
    dev = int(args[0])
    _check_device(d, dev)
    cid = sess.primary.get(dev)
    if cid is not None and sess.contexts[cid].refcount > 0:
        # The context stays alive at refcount 0 so that handles derived from it
        # keep working; it goes with cuDevicePrimaryCtxReset or the session.
        sess.contexts[cid].refcount -= 1
    return CUDA_SUCCESS, []


def destroy_context(d, sess, c):
    """Frees everything the session created in context c, then c itself."""
    d.backend.ctx_sync(c.real)
    from .arrays import release_context
    release_context(d, sess, c.id)       # texture/surface objects before the arrays they read
    for o in list(sess.objects.values()):
        if o.ctx == c.id:
            release_object(d, sess, o)
    for a in [a for a in sess.arena.allocs.values() if a.chunk.device == c.device and c.primary]:
        sess.arena.free(a.addr, vmm=a.chunk.vmm)
    for addr in [x for x in sess.graph_mem if x not in sess.arena.allocs]:
        del sess.graph_mem[addr]            # graph allocations went with the arena (graph_mem.py)
    d.backend.ctx_destroy(c.real)
    sess.drop_context(c)


def release_object(d, sess, o):
    b = d.backend
    if o.kind == P.K_MODULE:
        b.module_unload(o.real)
    elif o.kind == P.K_STREAM:
        b.call_named("cuStreamDestroy_v2", [o.real])
    elif o.kind == P.K_EVENT:
        b.call_named("cuEventDestroy_v2", [o.real])
    elif o.kind == P.K_ARRAY:
        if "level_of" not in o.info:      # a mipmap level goes with its mipmapped array
            b.array_destroy(o.real)
    elif o.kind == P.K_MIPMAPPED_ARRAY:
        b.mipmap_destroy(o.real)
    elif o.kind in (P.K_GRAPH, P.K_GRAPH_EXEC, P.K_GRAPH_NODE):
        from .graph_libcapture import close_in
        close_in(o)          # the driver's graphs of captured library work, while the context lives
    sess.drop(o)


@handler("primary_ctx_set_flags")
def h_primary_set_flags(d, sess, fn, ctx, args, **kw):
    """cuDevicePrimaryCtxSetFlags: proxyd gives every session a context of its
    own in place of the device's primary context, so the flags go to that
    context (cuCtxSetFlags takes the same values: cuda.h), or, before the
    session has one, to the context it will create. The device's real primary
    context belongs to proxyd and is never changed."""
    dev, flags = int(args[0]), int(args[1])
    _check_device(d, dev)
    cid = sess.primary.get(dev)
    if cid is not None:
        c = sess.contexts[cid]
        d.backend.ctx_set_flags(c.real, flags)
        c.flags = flags
    sess.primary_flags[dev] = flags
    return CUDA_SUCCESS, []


@handler("primary_ctx_get_state")
def h_primary_get_state(d, sess, fn, ctx, args, **kw):
    dev = int(args[0])
    _check_device(d, dev)
    cid = sess.primary.get(dev)
    c = sess.contexts[cid] if cid is not None else None
    flags = c.flags if c is not None else sess.primary_flags.get(dev, 0)
    active = 1 if c is not None and c.refcount > 0 else 0
    return CUDA_SUCCESS, [flags if args[1] else None, active if args[2] else None]


@handler("primary_ctx_reset")
def h_primary_reset(d, sess, fn, ctx, args, **kw):
    dev = int(args[0])
    _check_device(d, dev)
    cid = sess.primary.get(dev)
    if cid is not None:
        destroy_context(d, sess, sess.contexts[cid])
    return CUDA_SUCCESS, []


@handler("ctx_create")
def h_ctx_create(d, sess, fn, ctx, args, **kw):
    flags, dev = int(args[2] or 0), int(args[3])
    _check_device(d, dev)
    c = sess.add_context(dev, d.backend.ctx_create(dev, flags), primary=False, flags=flags)
    return CUDA_SUCCESS, [c.handle]


@handler("ctx_destroy")
def h_ctx_destroy(d, sess, fn, ctx, args, **kw):
    c = sess.context(int(args[0]))
    destroy_context(d, sess, c)
    return CUDA_SUCCESS, []


@handler("ctx_sync")
def h_ctx_sync(d, sess, fn, ctx, args, **kw):
    d.backend.ctx_sync(need_ctx(ctx, fn).real)
    return CUDA_SUCCESS, []


@handler("ctx_set_limit")
def h_ctx_set_limit(d, sess, fn, ctx, args, fid=0, ctxh=0, **kw):
    c = need_ctx(ctx, fn)
    code, outs = d.generic(sess, fn, ctx, args, fid, ctxh)
    if code == CUDA_SUCCESS:
        c.limits[int(args[0])] = int(args[1])
    return code, outs


provide("destroy_context", destroy_context)      # the engine's release after a dump
