/* Several GPUs in one process (runtime API): peer access and peer copies,
 * on the driver's (interceptor/peer.c) with each device's primary context,
 * as the runtime names devices by ordinal (cuda_runtime_api.h,
 * cudaDeviceEnablePeerAccess: access "from the current device" to
 * peerDevice's memory). */
#include <cuda.h>
#include <string.h>

#include "gp_rt.h"
#include "gp_gen.h"

static cudaError_t check_device(int dev)
{
    int n = 0;
    CUresult r = cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS)
        return gp_rt_from_cu(r);
    return dev >= 0 && dev < n ? cudaSuccess : cudaErrorInvalidDevice;
}

/* Both devices' primary contexts (retained on first use, as the runtime
 * initialises a device it is asked about). */
static cudaError_t two_ctx(int a, int b, CUcontext *ca, CUcontext *cb)
{
    cudaError_t e = gp_rt_init_thread();
    if (e == cudaSuccess)
        e = check_device(a);
    if (e == cudaSuccess)
        e = check_device(b);
    if (e == cudaSuccess)
        e = gp_rt_primary_ctx(a, ca);
    if (e == cudaSuccess)
        e = gp_rt_primary_ctx(b, cb);
    return e;
}

cudaError_t gpo_cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags)
{
    CUcontext self, peer;
    cudaError_t e = two_ctx(gp_rt_device(), peerDevice, &self, &peer);
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    if (flags != 0)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_RETURN_CU(cuCtxEnablePeerAccess(peer, 0));
}

cudaError_t gpo_cudaDeviceDisablePeerAccess(int peerDevice)
{
    CUcontext self, peer;
    cudaError_t e = two_ctx(gp_rt_device(), peerDevice, &self, &peer);
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    RT_RETURN_CU(cuCtxDisablePeerAccess(peer));
}

/* cudaMemcpyPeer: serialized with the work of the current device and both
 * sides' devices, as cuMemcpyPeer is with their contexts (peer.c). */
cudaError_t gpo_cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice, size_t count)
{
    CUcontext dc, sc;
    cudaError_t e = two_ctx(dstDevice, srcDevice, &dc, &sc);
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    if (!count)
        return cudaSuccess;
    RT_RETURN_CU(cuMemcpyPeer((CUdeviceptr)(uintptr_t)dst, dc, (CUdeviceptr)(uintptr_t)src, sc, count));
}

cudaError_t gpo_cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
                                    cudaStream_t stream)
{
    CUcontext dc, sc;
    cudaError_t e = two_ctx(dstDevice, srcDevice, &dc, &sc);
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    if (!count)
        return cudaSuccess;
    RT_RETURN_CU(cuMemcpyPeerAsync((CUdeviceptr)(uintptr_t)dst, dc, (CUdeviceptr)(uintptr_t)src, sc, count,
                                   gp_rt_stream(stream)));
}

/* cudaMemcpy3DPeerParms is cudaMemcpy3DParms with the sides' devices in
 * place of the kind (cuda_runtime_api.h); both sides are device memory
 * (arrays or linear), whose unified addresses say where they are. */
static cudaError_t to_3d(const struct cudaMemcpy3DPeerParms *p, struct cudaMemcpy3DParms *c)
{
    if (!p)
        return cudaErrorInvalidValue;
    CUcontext dc, sc;
    cudaError_t e = two_ctx(p->dstDevice, p->srcDevice, &dc, &sc);
    if (e != cudaSuccess)
        return e;
    memset(c, 0, sizeof *c);
    c->srcArray = p->srcArray;
    c->srcPos = p->srcPos;
    c->srcPtr = p->srcPtr;
    c->dstArray = p->dstArray;
    c->dstPos = p->dstPos;
    c->dstPtr = p->dstPtr;
    c->extent = p->extent;
    c->kind = cudaMemcpyDeviceToDevice;
    return cudaSuccess;
}

static CUresult sync_ctx(CUcontext c)
{
    if (c == gp_ctx_current())
        return CUDA_SUCCESS;
    CUresult r = cuCtxPushCurrent(c);
    if (r != CUDA_SUCCESS)
        return r;
    r = cuCtxSynchronize();
    CUcontext popped;
    CUresult r2 = cuCtxPopCurrent(&popped);
    return r != CUDA_SUCCESS ? r : r2;
}

/* serialized with the work of both devices and the current one, as
 * cudaMemcpyPeer (cuda_runtime_api.h, cudaMemcpy3DPeer) */
cudaError_t gpo_cudaMemcpy3DPeer(const struct cudaMemcpy3DPeerParms *p)
{
    struct cudaMemcpy3DParms c;
    cudaError_t e = to_3d(p, &c);
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    CUcontext dc, sc;
    e = two_ctx(p->dstDevice, p->srcDevice, &dc, &sc);
    if (e == cudaSuccess)
        e = gp_rt_from_cu(sync_ctx(sc));
    if (e == cudaSuccess)
        e = gp_rt_from_cu(sync_ctx(dc));
    if (e == cudaSuccess)
        e = gpo_cudaMemcpy3D(&c);
    if (e == cudaSuccess)
        e = gp_rt_from_cu(cuCtxSynchronize());
    return gp_rt_ret(e);
}

cudaError_t gpo_cudaMemcpy3DPeerAsync(const struct cudaMemcpy3DPeerParms *p, cudaStream_t stream)
{
    struct cudaMemcpy3DParms c;
    cudaError_t e = to_3d(p, &c);
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    return gpo_cudaMemcpy3DAsync(&c, stream);
}
