"""Several GPUs in one process: which devices a chunk of session memory is
mapped for.

All of one process's devices live in its one worker, in one address space
with unified addresses, as natively. Natively, memory from cudaMalloc
becomes reachable from a peer device once the application calls
cuCtxEnablePeerAccess / cudaDeviceEnablePeerAccess; under gpuproxy every
allocation is VMM memory (cuMemCreate + cuMemMap, proxyd/backends/cuda.py),
for which peer access is granted per mapping with cuMemSetAccess, not by
cuCtxEnablePeerAccess (CUDA Driver API, "Virtual Memory Management":
"cuCtxEnablePeerAccess ... has no effect on memory allocated with
cuMemCreate"). So the worker maps each chunk read-write for its own device
and for every device that cuDeviceCanAccessPeer says can reach it; the
application's peer-access calls are then bookkeeping for the errors the
driver reports (the shim, interceptor/peer.c), and a peer pointer works in
kernels and in copies (cuMemcpyPeer, cudaMemcpy with cudaMemcpyDefault) as
natively. The price: a kernel that dereferences a peer's memory without
having enabled peer access works where natively it would fault.

GPUPROXY_PEER_MAP=0 maps each chunk for its own device only (then copies
between devices rely on the driver and kernels cannot read a peer's memory).

Locking: the answer per device is computed once, on first use, by the
worker's main loop (map_chunk runs there and on the restore thread while the
session is being built: both compute the same list, so a race is harmless).
"""
from __future__ import annotations

import os


def access_devices(backend, dev: int) -> list[int]:
    """[dev, then every other device that can access dev's memory]."""
    cache = backend.__dict__.setdefault("_peer_access", {})
    devs = cache.get(dev)
    if devs is None:
        devs = [dev]
        if os.environ.get("GPUPROXY_PEER_MAP", "1") != "0":
            can = backend.ffi.new("int *")
            for p in range(backend.device_count()):
                # cuDeviceCanAccessPeer(canAccessPeer, dev, peerDev): whether
                # dev can access peerDev's memory (cuda.h)
                if p != dev and backend.lib.cuDeviceCanAccessPeer(can, p, dev) == 0 and can[0]:
                    devs.append(p)
        cache[dev] = devs
    return devs
