/* Several GPUs in one process (driver API): peer access and peer copies.
 *
 * All of a process's devices live in one worker (one address space, as
 * natively), and the worker maps every chunk of device memory for each
 * device that can reach it (proxyd/backends/cuda.py, map_chunk), so a peer
 * pointer works in kernels and copies exactly as a unified address does
 * natively. What is left for the shim:
 *
 * - peer access as the driver reports it (cuda.h, cuCtxEnablePeerAccess /
 *   cuCtxDisablePeerAccess): which (context, peer context) pairs the
 *   application enabled, with the driver's errors (already enabled, not
 *   enabled, unsupported pair, flags). This is client state: a checkpoint
 *   keeps it with the process (CRIU) or in the live process (GPU-only), so
 *   its restore rule is `client`.
 * - peer copies: cuMemcpyPeer(Async) and cuMemcpy3DPeer(Async) name the
 *   contexts of both sides; with unified addressing (every address of the
 *   session's arena is unique across its devices) they are ordinary
 *   device-to-device copies (cuda.h, cuMemcpyPeer: "copies from device
 *   memory in one context to device memory in another context"), so they go
 *   through the shim's own cuMemcpy / cuMemcpy3D paths, graph capture
 *   included.
 *
 * Locking: the pair table (owner.c) is guarded by gp_lock (the shim's one
 * recursive lock). */
#include <stdlib.h>
#include <string.h>

#include "gp_shim.h"
#include "gp_gen.h"
#include "gp_peer.h"

CUresult gpo_cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext cur = gp_ctx_current();
    CUdevice dev, pdev;
    if (!cur || !peerContext || gp_ctx_device(cur, &dev) != 0 || gp_ctx_device(peerContext, &pdev) != 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    /* a device is not its own peer: cuDeviceCanAccessPeer(d, d) is 0, so the
     * answer is "unsupported", as driver 580 gives it (H200, 2026-11-27) */
    int can = 0;
    CUresult r = cuDeviceCanAccessPeer(&can, dev, pdev);
    if (r != CUDA_SUCCESS)
        return r;
    if (!can)
        return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    switch (gp_peer_pair_add(cur, peerContext)) {
    case 1: return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    case 2: return CUDA_ERROR_TOO_MANY_PEERS;
    default: return CUDA_SUCCESS;
    }
}

CUresult gpo_cuCtxDisablePeerAccess(CUcontext peerContext)
{
    CUcontext cur = gp_ctx_current();
    CUdevice dev;
    if (!cur || !peerContext || gp_ctx_device(peerContext, &dev) != 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    return gp_peer_pair_remove(cur, peerContext) == 0 ? CUDA_SUCCESS : CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
}

/* Both contexts must be known to the shim (cuda.h lists
 * CUDA_ERROR_INVALID_CONTEXT for the peer copies). */
static CUresult check_ctx(CUcontext a, CUcontext b)
{
    CUdevice d;
    if (!a || !b || gp_ctx_device(a, &d) != 0 || gp_ctx_device(b, &d) != 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_SUCCESS;
}

/* cuda.h, cuMemcpyPeer: "asynchronous with respect to the host, but
 * serialized with respect all pending and future asynchronous work in to the
 * current context, srcContext, and dstContext". The copy runs in the current
 * context's stream, which orders it after that context's pending work; the
 * other two contexts' pending work is waited for first, and the copy itself
 * before the call returns, so that their future work comes after it. */
static CUresult sync_ctx(CUcontext c)
{
    CUresult r = cuCtxPushCurrent(c);
    if (r != CUDA_SUCCESS)
        return r;
    r = cuCtxSynchronize();
    CUcontext popped;
    CUresult r2 = cuCtxPopCurrent(&popped);
    return r != CUDA_SUCCESS ? r : r2;
}

static CUresult copy_peer(CUdeviceptr dst, CUcontext dstContext, CUdeviceptr src, CUcontext srcContext, size_t n,
                          int per_thread)
{
    CUresult r = check_ctx(dstContext, srcContext);
    CUcontext cur = gp_ctx_current();
    if (r == CUDA_SUCCESS && !cur)
        r = CUDA_ERROR_INVALID_CONTEXT;
    if (r == CUDA_SUCCESS && srcContext != cur)
        r = sync_ctx(srcContext);
    if (r == CUDA_SUCCESS && dstContext != cur && dstContext != srcContext)
        r = sync_ctx(dstContext);
    if (r == CUDA_SUCCESS)
        r = per_thread ? gpo_cuMemcpy_ptds(dst, src, n) : gpo_cuMemcpy(dst, src, n);
    if (r == CUDA_SUCCESS && (srcContext != cur || dstContext != cur))
        r = cuCtxSynchronize();
    return r;
}

CUresult gpo_cuMemcpyPeer(CUdeviceptr dst, CUcontext dstContext, CUdeviceptr src, CUcontext srcContext, size_t n)
{
    return copy_peer(dst, dstContext, src, srcContext, n, 0);
}

CUresult gpo_cuMemcpyPeer_ptds(CUdeviceptr dst, CUcontext dstContext, CUdeviceptr src, CUcontext srcContext, size_t n)
{
    return copy_peer(dst, dstContext, src, srcContext, n, 1);
}

/* cuMemcpyPeerAsync: ordered on hStream only (cuda.h), as natively. */

CUresult gpo_cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dstContext, CUdeviceptr src, CUcontext srcContext,
                               size_t n, CUstream s)
{
    CUresult r = check_ctx(dstContext, srcContext);
    return r != CUDA_SUCCESS ? r : gpo_cuMemcpyAsync(dst, src, n, s);
}

CUresult gpo_cuMemcpyPeerAsync_ptsz(CUdeviceptr dst, CUcontext dstContext, CUdeviceptr src, CUcontext srcContext,
                                    size_t n, CUstream s)
{
    CUresult r = check_ctx(dstContext, srcContext);
    return r != CUDA_SUCCESS ? r : gpo_cuMemcpyAsync_ptsz(dst, src, n, s);
}

/* CUDA_MEMCPY3D_PEER is CUDA_MEMCPY3D with the two reserved members replaced
 * by the sides' contexts (cuda.h); the copy itself is the same. */
static CUresult to_3d(const CUDA_MEMCPY3D_PEER *p, CUDA_MEMCPY3D *c)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = check_ctx(p->dstContext, p->srcContext);
    if (r != CUDA_SUCCESS)
        return r;
    memset(c, 0, sizeof *c);
    c->srcXInBytes = p->srcXInBytes;
    c->srcY = p->srcY;
    c->srcZ = p->srcZ;
    c->srcLOD = p->srcLOD;
    c->srcMemoryType = p->srcMemoryType;
    c->srcHost = p->srcHost;
    c->srcDevice = p->srcDevice;
    c->srcArray = p->srcArray;
    c->srcPitch = p->srcPitch;
    c->srcHeight = p->srcHeight;
    c->dstXInBytes = p->dstXInBytes;
    c->dstY = p->dstY;
    c->dstZ = p->dstZ;
    c->dstLOD = p->dstLOD;
    c->dstMemoryType = p->dstMemoryType;
    c->dstHost = p->dstHost;
    c->dstDevice = p->dstDevice;
    c->dstArray = p->dstArray;
    c->dstPitch = p->dstPitch;
    c->dstHeight = p->dstHeight;
    c->WidthInBytes = p->WidthInBytes;
    c->Height = p->Height;
    c->Depth = p->Depth;
    return CUDA_SUCCESS;
}

CUresult gpo_cuMemcpy3DPeer(const CUDA_MEMCPY3D_PEER *p)
{
    CUDA_MEMCPY3D c;
    CUresult r = to_3d(p, &c);
    return r != CUDA_SUCCESS ? r : gpo_cuMemcpy3D_v2(&c);
}

CUresult gpo_cuMemcpy3DPeer_ptds(const CUDA_MEMCPY3D_PEER *p)
{
    CUDA_MEMCPY3D c;
    CUresult r = to_3d(p, &c);
    return r != CUDA_SUCCESS ? r : gpo_cuMemcpy3D_v2_ptds(&c);
}

CUresult gpo_cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D_PEER *p, CUstream s)
{
    CUDA_MEMCPY3D c;
    CUresult r = to_3d(p, &c);
    return r != CUDA_SUCCESS ? r : gpo_cuMemcpy3DAsync_v2(&c, s);
}

CUresult gpo_cuMemcpy3DPeerAsync_ptsz(const CUDA_MEMCPY3D_PEER *p, CUstream s)
{
    CUDA_MEMCPY3D c;
    CUresult r = to_3d(p, &c);
    return r != CUDA_SUCCESS ? r : gpo_cuMemcpy3DAsync_v2_ptsz(&c, s);
}

/* 0 with *dev set when the device of p is known, -1 otherwise: a slab's
 * block (slab.c) or an allocation the worker placed (owner.c). */
int gp_owner_of(CUdeviceptr p, CUdevice *dev)
{
    return gp_slab_device(p, dev) == 0 ? 0 : gp_owner_noted(p, dev);
}
