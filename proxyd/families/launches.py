"""Kernel launches (CUDA Driver API, "Execution Control"): cuLaunchKernel,
cuLaunchKernelEx with its attributes, cooperative launches,
cuOccupancyMaxActiveClusters, and host functions in streams
(cuLaunchHostFunc, cuStreamAddCallback; the gate: hostfn.py).

Every handler takes (dispatcher, session, fn, ctx, args) with one argument per
spec'd parameter and returns (CUresult, outs), outs being one value per
out_value/out_buffer parameter (None where the client passed NULL).

Locking: called on the worker's main loop (dispatch.py).
"""
from __future__ import annotations

from ..core import protocol as P
from ..core.registry import CUDA_SUCCESS, handler, stream_of
from ..core.session import CudaError

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_SUPPORTED = 801


@handler("launch_kernel")
def h_launch(d, sess, fn, ctx, args, **kw):
    f = sess.get(P.K_FUNCTION, int(args[0]))
    grid = tuple(int(x) for x in args[1:4])
    block = tuple(int(x) for x in args[4:7])
    shmem = int(args[7])
    stream = stream_of(d, sess, args[8])
    params = args[9] if args[9] is not None else b""
    d.backend.launch(f.real, grid, block, shmem, stream, bytes(params), f.info)
    return CUDA_SUCCESS, []


# ------------------------------------------------------------ launch variants

CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2
ATTR_VALUE_SIZE = 64          # sizeof(CUlaunchAttributeValue), cuda.h
# launch attributes whose value is plain data (the shim refuses the others:
# events of the client, graph-only attributes); cuda.h CUlaunchAttributeID
DATA_LAUNCH_ATTRIBUTES = {1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 14, 16}


def _launch_attrs(fn, raw) -> list[tuple[int, bytes]]:
    out = []
    for a in raw or []:
        aid, val = int(a[0]), bytes(a[1])
        if aid not in DATA_LAUNCH_ATTRIBUTES:
            raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name}: launch attribute {aid} is not supported")
        if len(val) != ATTR_VALUE_SIZE:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: attribute {aid} value of {len(val)} bytes")
        out.append((aid, val))
    return out


@handler("launch_kernel_ex")
def h_launch_ex(d, sess, fn, ctx, args, **kw):
    """cuLaunchKernelEx: [config, f, params, extra], config = [gx, gy, gz,
    bx, by, bz, shmem, stream, [[attribute id, value bytes], ...]]; the shim
    also sends cooperative launches this way."""
    cfg = args[0]
    if not isinstance(cfg, list) or len(cfg) != 9:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: malformed launch configuration")
    f = sess.get(P.K_FUNCTION, int(args[1]))
    grid = tuple(int(x) for x in cfg[0:3])
    block = tuple(int(x) for x in cfg[3:6])
    stream = stream_of(d, sess, cfg[7])
    params = bytes(args[2]) if args[2] is not None else b""
    d.backend.launch(f.real, grid, block, int(cfg[6]), stream, params, f.info, attrs=_launch_attrs(fn, cfg[8]))
    return CUDA_SUCCESS, []


@handler("occupancy_max_active_clusters")
def h_occupancy_clusters(d, sess, fn, ctx, args, **kw):
    """cuOccupancyMaxActiveClusters: [want, f, config] with config as
    cuLaunchKernelEx sends it."""
    cfg = args[2]
    if not isinstance(cfg, list) or len(cfg) != 9:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: malformed launch configuration")
    f = sess.get(P.K_FUNCTION, int(args[1]))
    n = d.backend.occupancy_max_active_clusters(f.real, tuple(int(x) for x in cfg[0:3]),
                                                tuple(int(x) for x in cfg[3:6]), int(cfg[6]),
                                                _launch_attrs(fn, cfg[8]))
    return CUDA_SUCCESS, [n if args[0] else None]


@handler("launch_cooperative")
def h_launch_cooperative(d, sess, fn, ctx, args, **kw):
    """cuLaunchCooperativeKernel's own op (cuLaunchKernel's without `extra`)."""
    f = sess.get(P.K_FUNCTION, int(args[0]))
    grid = tuple(int(x) for x in args[1:4])
    block = tuple(int(x) for x in args[4:7])
    params = bytes(args[9]) if args[9] is not None else b""
    coop = (CU_LAUNCH_ATTRIBUTE_COOPERATIVE, (1).to_bytes(4, "little").ljust(ATTR_VALUE_SIZE, b"\0"))
    d.backend.launch(f.real, grid, block, int(args[7]), stream_of(d, sess, args[8]), params, f.info, attrs=[coop])
    return CUDA_SUCCESS, []


# ------------------------------------------------------------ host functions

@handler("host_func")
def h_host_func(d, sess, fn, ctx, args, **kw):
    """cuLaunchHostFunc / cuStreamAddCallback (and _ptsz): the shim sends
    [stream, id, gate] (+ flags), where id names the application's function
    in the shim's table (the `fn`/`callback` slot) and gate is a shared-memory
    reference (the `userData` slot): the function and its data never leave
    the application's process (interceptor/hostfn.c, proxyd/families/hostfn.py).
    The backend enqueues a host function of the worker's own in the stream,
    which has the client run the application's and waits for it."""
    from .hostfn import gate_for
    stream = stream_of(d, sess, args[0])
    ident, ref = args[1], args[2]
    if type(ident) is not int or ident <= 0 or not isinstance(ref, P.ShmRef):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: malformed host function op")
    if len(args) > 3 and int(args[3] or 0) != 0:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: flags must be 0")
    try:
        gate = gate_for(sess, ref)
    except Exception as e:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: no host function gate ({e})") from e
    # ops of an executable graph run again at every launch: the shim keeps
    # the function in its table (bit 63 of the id, interceptor/hostfn.c)
    ident_sent = ident | (1 << 63) if sess.graph_replay else ident
    d.backend.launch_host_func(stream, lambda: gate.run(ident_sent))
    return CUDA_SUCCESS, []
