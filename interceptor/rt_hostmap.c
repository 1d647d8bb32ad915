/* Runtime API for host memory the GPU reaches directly (CUDA Runtime API,
 * "Memory Management" and "Unified Addressing"), on the driver entry points
 * of hostmap_api.c (docs/host-memory.md). The runtime's flag values are the
 * driver's (cudaHostRegister* == CU_MEMHOSTREGISTER_*, cudaMemAttach* ==
 * CU_MEM_ATTACH_*, cudaMemAdvise values == CUmem_advise), and
 * struct cudaMemLocation has CUmemLocation's layout.
 *
 * Locking: each driver call takes gp_lock itself. */
#include <string.h>

#include "gp_gen.h"
#include "gp_rt.h"

cudaError_t gpo_cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    RT_INIT();
    RT_RETURN_CU(cuMemHostRegister_v2(ptr, size, flags));
}

cudaError_t gpo_cudaHostUnregister(void *ptr)
{
    RT_INIT();
    RT_RETURN_CU(cuMemHostUnregister(ptr));
}

cudaError_t gpo_cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags)
{
    if (!pDevice)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUdeviceptr d = 0;
    CUresult r = cuMemHostGetDevicePointer_v2(&d, pHost, flags);
    if (r == CUDA_SUCCESS)
        *pDevice = (void *)(uintptr_t)d;
    RT_RETURN_CU(r);
}

cudaError_t gpo_cudaHostGetFlags(unsigned int *pFlags, void *pHost)
{
    RT_INIT();
    RT_RETURN_CU(cuMemHostGetFlags(pFlags, pHost));
}

cudaError_t gpo_cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    if (!devPtr)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUdeviceptr d = 0;
    CUresult r = cuMemAllocManaged(&d, size, flags);
    if (r == CUDA_SUCCESS)
        *devPtr = (void *)(uintptr_t)d;
    RT_RETURN_CU(r);
}

static CUmemLocation to_cu(struct cudaMemLocation l)
{
    CUmemLocation c;
    memset(&c, 0, sizeof c);
    c.type = (CUmemLocationType)l.type;
    c.id = l.id;
    return c;
}

cudaError_t gpo_cudaMemPrefetchAsync(const void *devPtr, size_t count, struct cudaMemLocation location,
                                     unsigned int flags, cudaStream_t stream)
{
    RT_INIT();
    RT_RETURN_CU(cuMemPrefetchAsync_v2((CUdeviceptr)(uintptr_t)devPtr, count, to_cu(location), flags,
                                       gp_rt_stream(stream)));
}

cudaError_t gpo_cudaMemAdvise(const void *devPtr, size_t count, enum cudaMemoryAdvise advice,
                              struct cudaMemLocation location)
{
    RT_INIT();
    RT_RETURN_CU(cuMemAdvise_v2((CUdeviceptr)(uintptr_t)devPtr, count, (CUmem_advise)advice, to_cu(location)));
}

/* cudaStreamAttachMemAsync: cuStreamAttachMemAsync's checks and effect
 * (hostmap_api.c); cudaMemAttach* values are CU_MEM_ATTACH_*. */
CUresult cuStreamAttachMemAsync_ptsz(CUstream, CUdeviceptr, size_t, unsigned int);

cudaError_t gpo_cudaStreamAttachMemAsync(cudaStream_t stream, void *devPtr, size_t length, unsigned int flags)
{
    RT_INIT();
    RT_RETURN_CU(cuStreamAttachMemAsync(gp_rt_stream(stream), (CUdeviceptr)(uintptr_t)devPtr, length, flags));
}

cudaError_t gpo_cudaStreamAttachMemAsync_ptsz(cudaStream_t stream, void *devPtr, size_t length, unsigned int flags)
{
    RT_INIT();
    RT_RETURN_CU(cuStreamAttachMemAsync_ptsz(stream ? gp_rt_stream(stream) : NULL, (CUdeviceptr)(uintptr_t)devPtr,
                                             length, flags));
}
