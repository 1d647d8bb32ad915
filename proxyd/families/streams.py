"""Streams and events (CUDA Driver API, "Stream Management", "Event
Management"): the handlers that synchronise, and those that keep state a
restore must apply again (stream attributes, whether an event was
recorded); the other stream and event calls are generic (specs/).

Every handler takes (dispatcher, session, fn, ctx, args) with one argument per
spec'd parameter and returns (CUresult, outs), outs being one value per
out_value/out_buffer parameter (None where the client passed NULL).

Locking: called on the worker's main loop (dispatch.py).
"""
from __future__ import annotations

from ..core import protocol as P
from ..core.registry import CUDA_SUCCESS, handler, stream_of


# ------------------------------------------------------------------- synchronise

@handler("stream_sync")
def h_stream_sync(d, sess, fn, ctx, args, **kw):
    d.backend.stream_sync(stream_of(d, sess, args[0]))
    return CUDA_SUCCESS, []


@handler("event_sync")
def h_event_sync(d, sess, fn, ctx, args, **kw):
    d.backend.event_sync(sess.get(P.K_EVENT, int(args[0])).real)
    return CUDA_SUCCESS, []


# ------------------------------------------- state a restore must re-apply
#
# Stream attributes, context limits and whether an event has been recorded
# are kept on the session's objects; the checkpoint engine records them and
# re-applies them after re-creating the objects (checkpoint/engine.py).

def _stream_state(sess, ctx, handle) -> dict:
    """Where the attributes of a stream are kept: on the stream object, or,
    for the NULL / legacy / per-thread streams, on the calling context."""
    h = int(handle or 0)
    if h in (0, P.STREAM_LEGACY, P.STREAM_PER_THREAD):
        if ctx is None:
            return {}
        return ctx.stream_attrs.setdefault(h, {})
    return sess.get(P.K_STREAM, h).info.setdefault("attrs", {})


@handler("stream_set_attribute")
def h_stream_set_attribute(d, sess, fn, ctx, args, fid=0, ctxh=0, **kw):
    code, outs = d.generic(sess, fn, ctx, args, fid, ctxh)
    if code == CUDA_SUCCESS:
        _stream_state(sess, ctx, args[0])[int(args[1])] = bytes(d.data(sess, args[2]))
    return code, outs


@handler("stream_copy_attributes")
def h_stream_copy_attributes(d, sess, fn, ctx, args, fid=0, ctxh=0, **kw):
    code, outs = d.generic(sess, fn, ctx, args, fid, ctxh)
    if code == CUDA_SUCCESS:
        _stream_state(sess, ctx, args[0]).update(_stream_state(sess, ctx, args[1]))
    return code, outs


@handler("event_record")
def h_event_record(d, sess, fn, ctx, args, fid=0, ctxh=0, **kw):
    code, outs = d.generic(sess, fn, ctx, args, fid, ctxh)
    if code == CUDA_SUCCESS:
        sess.get(P.K_EVENT, int(args[0])).info["recorded"] = True
    return code, outs
