"""GPU-visible host memory of a session (docs/host-memory.md): page-locked
allocations, managed allocations and registered application memory, each a
shared segment that the worker maps at the client's own address and
registers with the driver, so that the pointer the application holds is the
device pointer too and both processes see the same bytes.

Handlers (spec `handler:`): host_map (cuMemHostRegister_v2's op, sent for
every such segment, interceptor/hostmap_api.c) and host_unmap
(cuMemHostUnregister's op). map_again() maps a known segment after a
restore or after the client re-created it (parking).

Locking: the worker's main loop; the checkpoint engine runs this module's
kind (below) on its thread while the session is frozen (dump) or not yet
served (restore).
"""
from __future__ import annotations

import logging

from ..core import protocol as P
from ..core.kinds import CheckpointError, Kind, Stage, register
from ..core.registry import CUDA_SUCCESS, handler
from ..core.session import CudaError
from ..core.shm import AddressInUse, ShmError

log = logging.getLogger("proxyd")

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2

KINDS = {1: "page-locked", 2: "managed", 3: "registered"}
# where the client's window may be (interceptor/hostmem.c) is the client's
# choice; a registered range is wherever the application's memory was. The
# only limit: a user-space address of x86-64/aarch64 (47/48 bits).
ADDR_LIMIT = 1 << 48


def map_again(backend, sess, seg: int) -> None:
    """Maps a GPU-visible segment at its address and registers it."""
    view = sess.shm.open(seg)
    addr = sess.shm.fixed[seg][0]
    sess.shm.registered[seg] = backend.host_map(addr, view)


def contains(sess, addr: int, n: int) -> bool:
    """[addr, addr + n) lies inside one GPU-visible segment of the session."""
    shm = sess.shm
    if shm is None:
        return False
    for seg, (a, length, _k, _f) in shm.fixed.items():
        if a <= addr and addr + n <= a + length and seg in shm.registered:
            return True
    return False


@handler("host_map")
def h_host_map(d, sess, fn, ctx, args, **kw):
    desc, length, flags = args
    if (not isinstance(desc, list) or len(desc) != 3 or not isinstance(desc[0], P.ShmRef)
            or not all(isinstance(x, int) for x in desc[1:])):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: expected [segment, address, kind]")
    ref, addr, kind = desc[0], int(desc[1]), int(desc[2])
    length = int(length)
    if kind not in KINDS or length <= 0 or ref.length != length or addr % 4096 or not 0 < addr < ADDR_LIMIT - length:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: bad segment description {desc!r}, {length} bytes")
    if ref.seg in sess.shm.fixed or ref.seg == sess.staging_seg:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: segment {ref.seg} is already mapped")
    sess.shm.fixed[ref.seg] = (addr, length, kind, int(flags))
    try:
        map_again(d.backend, sess, ref.seg)
    except AddressInUse as e:
        del sess.shm.fixed[ref.seg]
        raise CudaError(CUDA_ERROR_OUT_OF_MEMORY, f"{fn.name}: {e} (set GPUPROXY_HOSTMAP_BASE for the application "
                                                  f"to move its window)") from None
    except (ShmError, CudaError) as e:
        sess.shm.close(ref.seg)
        del sess.shm.fixed[ref.seg]
        if isinstance(e, CudaError):
            raise
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {e}") from None
    log.debug("session %s: %s host memory %#x+%d mapped", sess.token, KINDS[kind], addr, length)
    return CUDA_SUCCESS, []


@handler("host_unmap")
def h_host_unmap(d, sess, fn, ctx, args, **kw):
    ref = args[0]
    if not isinstance(ref, P.ShmRef) or ref.seg not in sess.shm.fixed:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: not a mapped host segment")
    # kernels and copies still using it finish first (cuMemFreeHost,
    # cuMemHostUnregister and cudaFree synchronise)
    for c in sess.contexts.values():
        d.backend.ctx_sync(c.real)
    tok = sess.shm.registered.pop(ref.seg, None)
    if tok is not None:
        d.backend.host_unregister(tok)
    sess.shm.close(ref.seg)
    sess.shm_pending.discard(ref.seg)
    del sess.shm.fixed[ref.seg]
    return CUDA_SUCCESS, []


# ------------------------------------------------------------ checkpoints
# The client's shared host memory as a checkpoint object kind (core/kinds.py):
# the staging segment, page-locked segments (memory.py's cuMemHostAlloc),
# GPU-visible ones mapped at the client's address (this module), and the
# fast channel's segment. The client's own mappings come back with the
# process (CRIU, or it never left); a restore opens them again here, last,
# once the session's GPU state is complete.

def _describe(sess) -> dict:
    return {"shm": {"staging": sess.staging_seg,
                    "registered": sorted(set(sess.shm.registered) | sess.shm_pending) if sess.shm else [],
                    # GPU-visible host segments: [segment, address, length, kind, flags]
                    "maps": [[seg, *v] for seg, v in sorted(sess.shm.fixed.items())] if sess.shm else []},
            "channel": sess.chan.name if sess.chan is not None else None}


def _rebuild(r) -> None:
    """Stage.HOST_MEMORY: the staging segment, page-locked segments
    registered again, GPU-visible host memory mapped at the client's
    address; then the fast channel. A segment the client has not
    re-created yet (it was parked) is registered when it attaches."""
    b, sess, desc = r.backend, r.sess, r.desc
    sess.staging_seg = desc["shm"]["staging"]
    for seg, addr, length, kind, flags in desc["shm"].get("maps", []):
        sess.shm.fixed[int(seg)] = (int(addr), int(length), int(kind), int(flags))
    for seg in desc["shm"]["registered"]:
        try:
            if int(seg) in sess.shm.fixed:
                map_again(b, sess, int(seg))       # at the client's address
                continue
            view = memoryview(sess.shm.open(int(seg)))
            sess.shm.registered[int(seg)] = b.host_register(view)
        except Exception as e:
            # the client re-creates it when it attaches (after parking)
            sess.shm_pending.add(int(seg))
            log.info("session %s: client segment %s not mapped yet (%s)", sess.token, seg, e)
    sess.shm_ok = sess.staging_seg is not None and int(sess.staging_seg) in sess.shm.maps
    if desc.get("channel") and sess.shm_ok:
        from ..core.channel import SIZE, Channel
        try:
            sess.chan = Channel(desc["channel"], SIZE)
        except Exception as e:
            log.info("session %s: fast channel not reopened (%s)", sess.token, e)


def _precheck_channel(desc: dict, backend, device_map: dict) -> None:
    """The fast channel an image names must be its session's: named by
    the session's public id (core/shm_names.py); images of before it carry
    the token form."""
    from ..core.shm_names import channel_name
    token = desc["token"]
    if desc.get("channel") not in (None, channel_name(token), f"/gpuproxy-{token}-chan"):
        raise CheckpointError(f"image refused: manifest field session.channel: {desc['channel']!r} is not "
                              f"the session's channel {channel_name(token)}")


register(Kind("host_memory", Stage.HOST_MEMORY, ("shm", "channel"), describe=_describe, rebuild=_rebuild,
              precheck=_precheck_channel, owner=__name__))
