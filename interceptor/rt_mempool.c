/* The runtime's stream-ordered allocator and memory pools, on the driver
 * API (cuda_runtime_api.h, "Stream Ordered Memory Allocator"). The runtime
 * types are the driver's under other names with the same layout and values
 * (cudaMemPool_t is CUmemoryPool, cudaMemPoolProps is CUmemPoolProps,
 * cudaMemAccessDesc is CUmemAccessDesc, cudaMemPoolAttr is
 * CUmemPool_attribute), so the calls pass straight through.
 *
 * Locking: each driver call takes gp_lock itself. */
#include "gp_rt.h"

cudaError_t gpo_cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
    if (!devPtr)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    RT_RETURN_CU(cuMemAllocAsync((CUdeviceptr *)devPtr, size, gp_rt_stream(hStream)));
}

cudaError_t gpo_cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream)
{
    if (!ptr)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    RT_RETURN_CU(cuMemAllocFromPoolAsync((CUdeviceptr *)ptr, size, (CUmemoryPool)memPool, gp_rt_stream(stream)));
}

cudaError_t gpo_cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
    RT_INIT();
    RT_RETURN_CU(cuMemFreeAsync((CUdeviceptr)(uintptr_t)devPtr, gp_rt_stream(hStream)));
}

cudaError_t gpo_cudaMemPoolCreate(cudaMemPool_t *memPool, const struct cudaMemPoolProps *poolProps)
{
    if (!memPool || !poolProps)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    RT_RETURN_CU(cuMemPoolCreate((CUmemoryPool *)memPool, (const CUmemPoolProps *)poolProps));
}

cudaError_t gpo_cudaMemPoolDestroy(cudaMemPool_t memPool)
{
    RT_INIT();
    RT_RETURN_CU(cuMemPoolDestroy((CUmemoryPool)memPool));
}

cudaError_t gpo_cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep)
{
    RT_INIT();
    RT_RETURN_CU(cuMemPoolTrimTo((CUmemoryPool)memPool, minBytesToKeep));
}

cudaError_t gpo_cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value)
{
    RT_INIT();
    RT_RETURN_CU(cuMemPoolSetAttribute((CUmemoryPool)memPool, (CUmemPool_attribute)attr, value));
}

cudaError_t gpo_cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value)
{
    RT_INIT();
    RT_RETURN_CU(cuMemPoolGetAttribute((CUmemoryPool)memPool, (CUmemPool_attribute)attr, value));
}

cudaError_t gpo_cudaMemPoolSetAccess(cudaMemPool_t memPool, const struct cudaMemAccessDesc *descList, size_t count)
{
    if (!descList && count)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    RT_RETURN_CU(cuMemPoolSetAccess((CUmemoryPool)memPool, (const CUmemAccessDesc *)descList, count));
}

cudaError_t gpo_cudaMemPoolGetAccess(enum cudaMemAccessFlags *flags, cudaMemPool_t memPool,
                                     struct cudaMemLocation *location)
{
    if (!flags || !location)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    RT_RETURN_CU(cuMemPoolGetAccess((CUmemAccess_flags *)flags, (CUmemoryPool)memPool, (CUmemLocation *)location));
}

cudaError_t gpo_cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device)
{
    if (!memPool)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    RT_RETURN_CU(cuDeviceGetDefaultMemPool((CUmemoryPool *)memPool, device));
}

cudaError_t gpo_cudaDeviceGetMemPool(cudaMemPool_t *memPool, int device)
{
    if (!memPool)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    RT_RETURN_CU(cuDeviceGetMemPool((CUmemoryPool *)memPool, device));
}

cudaError_t gpo_cudaDeviceSetMemPool(int device, cudaMemPool_t memPool)
{
    RT_INIT();
    RT_RETURN_CU(cuDeviceSetMemPool(device, (CUmemoryPool)memPool));
}

/* Exportable pools (docs/ipc.md, "Exportable memory pools"): the runtime's
 * handle types and export data are the driver's (cudaMemAllocationHandleType
 * has CUmemAllocationHandleType's values; cudaMemPoolPtrExportData and
 * CUmemPoolPtrExportData are both 64 opaque bytes). */
_Static_assert(sizeof(struct cudaMemPoolPtrExportData) == sizeof(CUmemPoolPtrExportData),
               "pool pointer export data differ in size");

cudaError_t gpo_cudaMemPoolExportToShareableHandle(void *shareableHandle, cudaMemPool_t memPool,
                                                   enum cudaMemAllocationHandleType handleType, unsigned int flags)
{
    RT_INIT();
    RT_RETURN_CU(cuMemPoolExportToShareableHandle(shareableHandle, (CUmemoryPool)memPool,
                                                  (CUmemAllocationHandleType)handleType, flags));
}

cudaError_t gpo_cudaMemPoolImportFromShareableHandle(cudaMemPool_t *memPool, void *shareableHandle,
                                                     enum cudaMemAllocationHandleType handleType, unsigned int flags)
{
    RT_INIT();
    RT_RETURN_CU(cuMemPoolImportFromShareableHandle((CUmemoryPool *)memPool, shareableHandle,
                                                    (CUmemAllocationHandleType)handleType, flags));
}

cudaError_t gpo_cudaMemPoolExportPointer(struct cudaMemPoolPtrExportData *exportData, void *ptr)
{
    if (!exportData)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    RT_RETURN_CU(cuMemPoolExportPointer((CUmemPoolPtrExportData *)exportData, (CUdeviceptr)(uintptr_t)ptr));
}

cudaError_t gpo_cudaMemPoolImportPointer(void **ptr, cudaMemPool_t memPool, struct cudaMemPoolPtrExportData *exportData)
{
    if (!ptr || !exportData)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUdeviceptr d = 0;
    CUresult r = cuMemPoolImportPointer(&d, (CUmemoryPool)memPool, (CUmemPoolPtrExportData *)exportData);
    if (r == CUDA_SUCCESS)
        *ptr = (void *)(uintptr_t)d;
    RT_RETURN_CU(r);
}
