/* Runtime API functions implemented on the driver API (spec: runtime,
 * `shim: override`). Each gpo_<name> is called by the generated stub of
 * <name>; the _ptds/_ptsz entry points call the same gpo_ between
 * gp_rt_ptds_begin/end. Section names follow the CUDA Runtime API reference.
 *
 * Locking: each driver call takes gp_lock itself; functions that need several
 * calls to be atomic take it around them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gp_gen.h"
#include "gp_memcpy.h"
#include "gp_rt.h"
#include "gp_peer.h"

#define GP_MAX_DEV 64

cudaError_t gp_rt_set_device(int dev);
void gp_rt_forget_primary(int dev);
cudaError_t gp_rt_last_error(int reset);
int gp_rt_ctx_device(void);

/* ------------------------------------------------------ device management */

cudaError_t gpo_cudaGetDeviceCount(int *count)
{
    if (!count)
        return gp_rt_ret(cudaErrorInvalidValue);
    CUresult r = cuInit(0);
    if (r == CUDA_SUCCESS)
        r = cuDeviceGetCount(count);
    if (r != CUDA_SUCCESS)
        *count = 0;
    RT_RETURN_CU(r);
}

cudaError_t gpo_cudaSetDevice(int device) { return gp_rt_ret(gp_rt_set_device(device)); }

cudaError_t gpo_cudaGetDevice(int *device)
{
    if (!device)
        return gp_rt_ret(cudaErrorInvalidValue);
    *device = gp_rt_ctx_device();
    return cudaSuccess;
}

cudaError_t gpo_cudaInitDevice(int device, unsigned int deviceFlags, unsigned int flags)
{
    (void)deviceFlags; (void)flags;
    int cur = gp_rt_device();
    cudaError_t e = gp_rt_set_device(device);
    if (e == cudaSuccess && cur != device)
        e = gp_rt_set_device(cur);
    return gp_rt_ret(e);
}

static unsigned int device_flags;

cudaError_t gpo_cudaSetDeviceFlags(unsigned int flags)
{
    device_flags = flags;
    RT_INIT();
    RT_RETURN_CU(cuDevicePrimaryCtxSetFlags(gp_rt_ctx_device(), flags & ~cudaDeviceMapHost));
}

cudaError_t gpo_cudaGetDeviceFlags(unsigned int *flags)
{
    if (!flags)
        return gp_rt_ret(cudaErrorInvalidValue);
    *flags = device_flags | cudaDeviceMapHost;
    return cudaSuccess;
}

cudaError_t gpo_cudaChooseDevice(int *device, const struct cudaDeviceProp *prop)
{
    (void)prop;
    if (!device)
        return gp_rt_ret(cudaErrorInvalidValue);
    *device = 0;
    return cudaSuccess;
}

cudaError_t gpo_cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    if (!value)
        return gp_rt_ret(cudaErrorInvalidValue);
    CUresult r = cuInit(0);
    if (r == CUDA_SUCCESS)   /* cudaDeviceAttr values are the CUdevice_attribute values */
        r = cuDeviceGetAttribute(value, (CUdevice_attribute)attr, device);
    if (r == CUDA_ERROR_INVALID_DEVICE)
        return gp_rt_ret(cudaErrorInvalidDevice);
    RT_RETURN_CU(r);
}

/* cudaDeviceProp, field by field from device attributes; fetched once per
 * device (properties do not change while a process runs). */
static struct cudaDeviceProp props[GP_MAX_DEV];
static int have_props[GP_MAX_DEV];

static int attr(int dev, CUdevice_attribute a)
{
    int v = 0;
    cuDeviceGetAttribute(&v, a, dev);
    return v;
}

cudaError_t gpo_cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    if (!prop)
        return gp_rt_ret(cudaErrorInvalidValue);
    int n = 0;
    CUresult r = cuInit(0);
    if (r == CUDA_SUCCESS)
        r = cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS)
        RT_RETURN_CU(r);
    if (device < 0 || device >= n || device >= GP_MAX_DEV)
        return gp_rt_ret(cudaErrorInvalidDevice);
    gp_lock();
    if (!have_props[device]) {
        struct cudaDeviceProp *p = &props[device];
        memset(p, 0, sizeof *p);
        int d = device;
        cuDeviceGetName(p->name, sizeof p->name, d);
        CUuuid u;
        if (cuDeviceGetUuid_v2(&u, d) == CUDA_SUCCESS)
            memcpy(&p->uuid, &u, sizeof u);
        size_t total = 0;
        cuDeviceTotalMem(&total, d);
        p->totalGlobalMem = total;
        p->sharedMemPerBlock = (size_t)attr(d, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
        p->regsPerBlock = attr(d, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
        p->warpSize = attr(d, CU_DEVICE_ATTRIBUTE_WARP_SIZE);
        p->memPitch = (size_t)attr(d, CU_DEVICE_ATTRIBUTE_MAX_PITCH);
        p->maxThreadsPerBlock = attr(d, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
        p->maxThreadsDim[0] = attr(d, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X);
        p->maxThreadsDim[1] = attr(d, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y);
        p->maxThreadsDim[2] = attr(d, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z);
        p->maxGridSize[0] = attr(d, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X);
        p->maxGridSize[1] = attr(d, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y);
        p->maxGridSize[2] = attr(d, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z);
        p->totalConstMem = (size_t)attr(d, CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY);
        p->major = attr(d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
        p->minor = attr(d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
        p->textureAlignment = (size_t)attr(d, CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT);
        p->texturePitchAlignment = (size_t)attr(d, CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT);
        p->multiProcessorCount = attr(d, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
        p->integrated = attr(d, CU_DEVICE_ATTRIBUTE_INTEGRATED);
        p->canMapHostMemory = attr(d, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY);
        p->maxTexture1D = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH);
        p->maxTexture1DMipmap = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_MIPMAPPED_WIDTH);
        p->maxTexture2D[0] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH);
        p->maxTexture2D[1] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_HEIGHT);
        p->maxTexture2DMipmap[0] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_WIDTH);
        p->maxTexture2DMipmap[1] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_MIPMAPPED_HEIGHT);
        p->maxTexture2DLinear[0] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_WIDTH);
        p->maxTexture2DLinear[1] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_HEIGHT);
        p->maxTexture2DLinear[2] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LINEAR_PITCH);
        p->maxTexture2DGather[0] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_WIDTH);
        p->maxTexture2DGather[1] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_GATHER_HEIGHT);
        p->maxTexture3D[0] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH);
        p->maxTexture3D[1] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT);
        p->maxTexture3D[2] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH);
        p->maxTexture3DAlt[0] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH_ALTERNATE);
        p->maxTexture3DAlt[1] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT_ALTERNATE);
        p->maxTexture3DAlt[2] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH_ALTERNATE);
        p->maxTextureCubemap = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_WIDTH);
        p->maxTexture1DLayered[0] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_WIDTH);
        p->maxTexture1DLayered[1] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_LAYERS);
        p->maxTexture2DLayered[0] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_WIDTH);
        p->maxTexture2DLayered[1] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_HEIGHT);
        p->maxTexture2DLayered[2] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_LAYERS);
        p->maxTextureCubemapLayered[0] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH);
        p->maxTextureCubemapLayered[1] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS);
        p->maxSurface1D = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_WIDTH);
        p->maxSurface2D[0] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_WIDTH);
        p->maxSurface2D[1] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_HEIGHT);
        p->maxSurface3D[0] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_WIDTH);
        p->maxSurface3D[1] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_HEIGHT);
        p->maxSurface3D[2] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE3D_DEPTH);
        p->maxSurface1DLayered[0] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_WIDTH);
        p->maxSurface1DLayered[1] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE1D_LAYERED_LAYERS);
        p->maxSurface2DLayered[0] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_WIDTH);
        p->maxSurface2DLayered[1] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_HEIGHT);
        p->maxSurface2DLayered[2] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACE2D_LAYERED_LAYERS);
        p->maxSurfaceCubemap = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_WIDTH);
        p->maxSurfaceCubemapLayered[0] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH);
        p->maxSurfaceCubemapLayered[1] = attr(d, CU_DEVICE_ATTRIBUTE_MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS);
        p->surfaceAlignment = (size_t)attr(d, CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT);
        p->concurrentKernels = attr(d, CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS);
        p->ECCEnabled = attr(d, CU_DEVICE_ATTRIBUTE_ECC_ENABLED);
        p->pciBusID = attr(d, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
        p->pciDeviceID = attr(d, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
        p->pciDomainID = attr(d, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID);
        p->tccDriver = attr(d, CU_DEVICE_ATTRIBUTE_TCC_DRIVER);
        p->asyncEngineCount = attr(d, CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT);
        p->unifiedAddressing = attr(d, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING);
        p->memoryBusWidth = attr(d, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
        p->l2CacheSize = attr(d, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
        p->persistingL2CacheMaxSize = attr(d, CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE);
        p->maxThreadsPerMultiProcessor = attr(d, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
        p->streamPrioritiesSupported = attr(d, CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED);
        p->globalL1CacheSupported = attr(d, CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED);
        p->localL1CacheSupported = attr(d, CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED);
        p->sharedMemPerMultiprocessor = (size_t)attr(d, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
        p->regsPerMultiprocessor = attr(d, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR);
        p->managedMemory = attr(d, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY);
        p->isMultiGpuBoard = attr(d, CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD);
        p->multiGpuBoardGroupID = attr(d, CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID);
        p->hostNativeAtomicSupported = attr(d, CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED);
        p->pageableMemoryAccess = attr(d, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS);
        p->concurrentManagedAccess = attr(d, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS);
        p->computePreemptionSupported = attr(d, CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED);
        p->canUseHostPointerForRegisteredMem = attr(d, CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM);
        p->cooperativeLaunch = attr(d, CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH);
        p->sharedMemPerBlockOptin = (size_t)attr(d, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
        p->pageableMemoryAccessUsesHostPageTables = attr(d, CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES);
        p->directManagedMemAccessFromHost = attr(d, CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST);
        p->maxBlocksPerMultiProcessor = attr(d, CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR);
        p->accessPolicyMaxWindowSize = attr(d, CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE);
        p->reservedSharedMemPerBlock = (size_t)attr(d, CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK);
        p->hostRegisterSupported = attr(d, CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED);
        p->sparseCudaArraySupported = attr(d, CU_DEVICE_ATTRIBUTE_SPARSE_CUDA_ARRAY_SUPPORTED);
        p->hostRegisterReadOnlySupported = attr(d, CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED);
        p->timelineSemaphoreInteropSupported = attr(d, CU_DEVICE_ATTRIBUTE_TIMELINE_SEMAPHORE_INTEROP_SUPPORTED);
        p->memoryPoolsSupported = attr(d, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED);
        p->gpuDirectRDMASupported = attr(d, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED);
        p->gpuDirectRDMAFlushWritesOptions = (unsigned)attr(d, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS);
        p->gpuDirectRDMAWritesOrdering = attr(d, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING);
        p->memoryPoolSupportedHandleTypes = (unsigned)attr(d, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES);
        p->deferredMappingCudaArraySupported = attr(d, CU_DEVICE_ATTRIBUTE_DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED);
        p->ipcEventSupported = attr(d, CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED);
        p->clusterLaunch = attr(d, CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH);
        p->unifiedFunctionPointers = attr(d, CU_DEVICE_ATTRIBUTE_UNIFIED_FUNCTION_POINTERS);
        p->deviceNumaConfig = attr(d, CU_DEVICE_ATTRIBUTE_NUMA_CONFIG);
        p->deviceNumaId = attr(d, CU_DEVICE_ATTRIBUTE_NUMA_ID);
        p->mpsEnabled = attr(d, CU_DEVICE_ATTRIBUTE_MPS_ENABLED);
        p->hostNumaId = attr(d, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID);
        p->gpuPciDeviceID = (unsigned)attr(d, CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID);
        p->gpuPciSubsystemID = (unsigned)attr(d, CU_DEVICE_ATTRIBUTE_GPU_PCI_SUBSYSTEM_ID);
        p->hostNumaMultinodeIpcSupported = attr(d, CU_DEVICE_ATTRIBUTE_HOST_NUMA_MULTINODE_IPC_SUPPORTED);
        have_props[device] = 1;
    }
    *prop = props[device];
    gp_unlock();
    return cudaSuccess;
}

cudaError_t gpo_cudaDeviceSynchronize(void)
{
    RT_INIT();
    RT_RETURN_CU(cuCtxSynchronize());
}

cudaError_t gpo_cudaDeviceReset(void)
{
    int dev = gp_rt_ctx_device();
    gp_lock();
    CUresult r = cuDevicePrimaryCtxReset(dev);
    if (r == CUDA_SUCCESS) {
        gp_rt_forget_device_modules(dev);
        gp_rt_forget_primary(dev);
        gp_ctx_set_current(NULL);
    }
    gp_unlock();
    RT_RETURN_CU(r);
}

cudaError_t gpo_cudaDeviceGetPCIBusId(char *pciBusId, int len, int device)
{
    CUresult r = cuInit(0);
    if (r == CUDA_SUCCESS)
        r = cuDeviceGetPCIBusId(pciBusId, len, device);
    RT_RETURN_CU(r);
}

cudaError_t gpo_cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice)
{
    CUresult r = cuInit(0);
    if (r == CUDA_SUCCESS)
        r = cuDeviceCanAccessPeer(canAccessPeer, device, peerDevice);
    RT_RETURN_CU(r);
}

cudaError_t gpo_cudaDeviceGetP2PAttribute(int *value, enum cudaDeviceP2PAttr attr, int srcDevice, int dstDevice)
{
    if (!value)
        return gp_rt_ret(cudaErrorInvalidValue);
    CUresult r = cuInit(0);
    if (r == CUDA_SUCCESS)   /* cudaDeviceP2PAttr values are the CUdevice_P2PAttribute values */
        r = cuDeviceGetP2PAttribute(value, (CUdevice_P2PAttribute)attr, srcDevice, dstDevice);
    if (r == CUDA_ERROR_INVALID_DEVICE)
        return gp_rt_ret(cudaErrorInvalidDevice);
    RT_RETURN_CU(r);
}

cudaError_t gpo_cudaDeviceGetLimit(size_t *pValue, enum cudaLimit limit)
{
    RT_INIT();
    RT_RETURN_CU(cuCtxGetLimit(pValue, (CUlimit)limit));
}

cudaError_t gpo_cudaDeviceSetLimit(enum cudaLimit limit, size_t value)
{
    RT_INIT();
    RT_RETURN_CU(cuCtxSetLimit((CUlimit)limit, value));
}

cudaError_t gpo_cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    RT_INIT();
    RT_RETURN_CU(cuCtxGetStreamPriorityRange(leastPriority, greatestPriority));
}

cudaError_t gpo_cudaDeviceGetCacheConfig(enum cudaFuncCache *pCacheConfig)
{
    RT_INIT();
    CUfunc_cache c = CU_FUNC_CACHE_PREFER_NONE;
    CUresult r = cuCtxGetCacheConfig(&c);
    if (pCacheConfig)
        *pCacheConfig = (enum cudaFuncCache)c;
    RT_RETURN_CU(r);
}

cudaError_t gpo_cudaDeviceSetCacheConfig(enum cudaFuncCache cacheConfig)
{
    RT_INIT();
    RT_RETURN_CU(cuCtxSetCacheConfig((CUfunc_cache)cacheConfig));
}

cudaError_t gpo_cudaDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_RETURN_CU(cuDriverGetVersion(driverVersion));
}

cudaError_t gpo_cudaRuntimeGetVersion(int *runtimeVersion)
{
    if (!runtimeVersion)
        return gp_rt_ret(cudaErrorInvalidValue);
    *runtimeVersion = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t gpo_cudaMemGetInfo(size_t *free_, size_t *total)
{
    RT_INIT();
    RT_RETURN_CU(cuMemGetInfo(free_, total));
}

/* --------------------------------------------------------------- errors */

cudaError_t gpo_cudaGetLastError(void) { return gp_rt_last_error(1); }
cudaError_t gpo_cudaPeekAtLastError(void) { return gp_rt_last_error(0); }

const char *gpo_cudaGetErrorName(cudaError_t error)
{
    const char *n = gp_rt_error_name(error);
    return n ? n : "cudaErrorUnknown";
}

const char *gpo_cudaGetErrorString(cudaError_t error)
{
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidSymbol: return "invalid device symbol";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorDevicesUnavailable: return "CUDA-capable device(s) unavailable (gpuproxy: proxyd not reachable)";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorMissingConfiguration: return "__global__ function call is not configured";
    case cudaErrorNoKernelImageForDevice: return "no kernel image is available for execution on the device";
    default: return gpo_cudaGetErrorName(error);
    }
}

/* ------------------------------------------------------- memory management */

cudaError_t gpo_cudaMalloc(void **devPtr, size_t size)
{
    if (!devPtr)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    if (size == 0) {
        *devPtr = NULL;
        return cudaSuccess;
    }
    CUdeviceptr p = 0;
    CUresult r = cuMemAlloc(&p, size);
    *devPtr = (void *)(uintptr_t)p;
    RT_RETURN_CU(r);
}

/* cuda_runtime_api.h, cudaMallocPitch: width in bytes, height in rows; the
 * pitch is the driver's (cuMemAllocPitch, answered in the shim, copy2d.c).
 * A zero width or height allocates nothing, as cudaMalloc(0) does. */
cudaError_t gpo_cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
    if (!devPtr || !pitch)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    if (width == 0 || height == 0) {
        *devPtr = NULL;
        *pitch = 0;
        return cudaSuccess;
    }
    CUdeviceptr p = 0;
    CUresult r = cuMemAllocPitch(&p, pitch, width, height, 16);
    *devPtr = (void *)(uintptr_t)p;
    RT_RETURN_CU(r);
}

/* cudaMalloc3D: extent.width is in bytes (CUDA Runtime API, "cudaMalloc3D");
 * the rows of every slice are padded like cudaMallocPitch's, and the slices
 * follow each other (slice pitch = pitch * extent.height), which is what
 * cudaMemset3D and the 3D copies assume of a cudaPitchedPtr. */
cudaError_t gpo_cudaMalloc3D(struct cudaPitchedPtr *pitchedDevPtr, struct cudaExtent extent)
{
    if (!pitchedDevPtr)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    if (extent.width == 0 || extent.height == 0 || extent.depth == 0) {
        struct cudaPitchedPtr none = { NULL, 0, extent.width, extent.height };
        *pitchedDevPtr = none;
        return cudaSuccess;
    }
    if (extent.depth > SIZE_MAX / extent.height)
        return gp_rt_ret(cudaErrorInvalidValue);
    CUdeviceptr p = 0;
    size_t pitch = 0;
    CUresult r = cuMemAllocPitch(&p, &pitch, extent.width, extent.height * extent.depth, 16);
    if (r == CUDA_SUCCESS) {
        struct cudaPitchedPtr got = { (void *)(uintptr_t)p, pitch, extent.width, extent.height };
        *pitchedDevPtr = got;
    }
    RT_RETURN_CU(r);
}

cudaError_t gpo_cudaFree(void *devPtr)
{
    RT_INIT();     /* cudaFree(0) is the customary way to initialise the runtime */
    if (!devPtr)
        return cudaSuccess;
    RT_RETURN_CU(cuMemFree((CUdeviceptr)(uintptr_t)devPtr));
}

cudaError_t gpo_cudaMallocHost(void **ptr, size_t size)
{
    RT_INIT();
    RT_RETURN_CU(cuMemAllocHost(ptr, size));
}

cudaError_t gpo_cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    RT_INIT();
    RT_RETURN_CU(cuMemHostAlloc(pHost, size, flags));
}

cudaError_t gpo_cudaFreeHost(void *ptr)
{
    if (!ptr)
        return cudaSuccess;
    RT_RETURN_CU(cuMemFreeHost(ptr));
}

static cudaError_t memcpy_kind(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream,
                               int async)
{
    RT_INIT();
    int pt = gp_rt_ptds();
    CUstream s = gp_rt_stream(stream);
    CUresult r;
    gp_lock();
    switch (kind) {
    case cudaMemcpyHostToDevice:
        r = gp_copy_htod(async ? (pt ? GP_FID_cuMemcpyHtoDAsync_v2_ptsz : GP_FID_cuMemcpyHtoDAsync_v2)
                               : (pt ? GP_FID_cuMemcpyHtoD_v2_ptds : GP_FID_cuMemcpyHtoD_v2),
                         (CUdeviceptr)(uintptr_t)dst, src, count, s, async, async);
        break;
    case cudaMemcpyDeviceToHost:
        r = gp_copy_dtoh(async ? (pt ? GP_FID_cuMemcpyDtoHAsync_v2_ptsz : GP_FID_cuMemcpyDtoHAsync_v2)
                               : (pt ? GP_FID_cuMemcpyDtoH_v2_ptds : GP_FID_cuMemcpyDtoH_v2),
                         dst, (CUdeviceptr)(uintptr_t)src, count, s, async, async);
        break;
    case cudaMemcpyDeviceToDevice:
        r = async ? cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, count, s)
                  : cuMemcpyDtoD((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, count);
        break;
    case cudaMemcpyHostToHost:
        r = gp_flush();
        memmove(dst, src, count);
        break;
    case cudaMemcpyDefault:
        r = gp_copy_any(pt, (CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, count, s, async);
        break;
    default:
        gp_unlock();
        return gp_rt_ret(cudaErrorInvalidMemcpyDirection);
    }
    gp_unlock();
    RT_RETURN_CU(r);
}

cudaError_t gpo_cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    return memcpy_kind(dst, src, count, kind, NULL, 0);
}

cudaError_t gpo_cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return memcpy_kind(dst, src, count, kind, stream, 1);
}

/* cuda_runtime_api.h, cudaMemcpy2D: height rows of width bytes between two
 * pitched ranges, through the driver's cuMemcpy2D (answered in the shim,
 * copy2d.c). cudaMemcpyDefault takes each side's kind from its address
 * (unified addressing): the shim's device ranges are device memory, anything
 * else host memory. Synchronous, like cudaMemcpy. */
CUresult cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D *);     /* copy2d.c (cuda.h declares it under CUDA_API_PER_THREAD_DEFAULT_STREAM) */
CUresult cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D *, CUstream);

/* async: cudaMemcpy2DAsync, in stream order on `stream` (PyTorch copies
 * strided tensors between host and device with it); same rules otherwise. */
static cudaError_t memcpy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                            enum cudaMemcpyKind kind, int per_thread, int async, cudaStream_t stream)
{
    RT_INIT();
    if (width > dpitch || width > spitch)
        return gp_rt_ret(cudaErrorInvalidPitchValue);
    int sdev, ddev;
    switch (kind) {
    case cudaMemcpyHostToHost: sdev = 0; ddev = 0; break;
    case cudaMemcpyHostToDevice: sdev = 0; ddev = 1; break;
    case cudaMemcpyDeviceToHost: sdev = 1; ddev = 0; break;
    case cudaMemcpyDeviceToDevice: sdev = 1; ddev = 1; break;
    case cudaMemcpyDefault:
        gp_lock();
        sdev = gp_is_device_ptr(src);
        ddev = gp_is_device_ptr(dst);
        gp_unlock();
        break;
    default:
        return gp_rt_ret(cudaErrorInvalidMemcpyDirection);
    }
    CUDA_MEMCPY2D c;
    memset(&c, 0, sizeof c);
    c.srcMemoryType = sdev ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
    if (sdev)
        c.srcDevice = (CUdeviceptr)(uintptr_t)src;
    else
        c.srcHost = src;
    c.srcPitch = spitch;
    c.dstMemoryType = ddev ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
    if (ddev)
        c.dstDevice = (CUdeviceptr)(uintptr_t)dst;
    else
        c.dstHost = dst;
    c.dstPitch = dpitch;
    c.WidthInBytes = width;
    c.Height = height;
    if (async)
        RT_RETURN_CU(per_thread ? cuMemcpy2DAsync_v2_ptsz(&c, gp_rt_stream(stream))
                                : cuMemcpy2DAsync(&c, gp_rt_stream(stream)));
    RT_RETURN_CU(per_thread ? cuMemcpy2D_v2_ptds(&c) : cuMemcpy2D(&c));
}

cudaError_t gpo_cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                             enum cudaMemcpyKind kind)
{
    return memcpy2d(dst, dpitch, src, spitch, width, height, kind, gp_rt_ptds(), 0, NULL);
}

cudaError_t gpo_cudaMemcpy2D_ptds(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                  size_t height, enum cudaMemcpyKind kind)
{
    return memcpy2d(dst, dpitch, src, spitch, width, height, kind, 1, 0, NULL);
}

cudaError_t gpo_cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                  size_t height, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return memcpy2d(dst, dpitch, src, spitch, width, height, kind, gp_rt_ptds(), 1, stream);
}

cudaError_t gpo_cudaMemcpy2DAsync_ptsz(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                       size_t height, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return memcpy2d(dst, dpitch, src, spitch, width, height, kind, 1, 1, stream);
}

cudaError_t gpo_cudaMemset(void *devPtr, int value, size_t count)
{
    RT_INIT();
    RT_RETURN_CU(cuMemsetD8((CUdeviceptr)(uintptr_t)devPtr, (unsigned char)value, count));
}

cudaError_t gpo_cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    RT_INIT();
    RT_RETURN_CU(cuMemsetD8Async((CUdeviceptr)(uintptr_t)devPtr, (unsigned char)value, count, gp_rt_stream(stream)));
}

/* cudaMemset2D/3D (+Async): one cuMemsetD2D8 op per call (per slice for a 3D
 * memset whose slices are not contiguous rows), run by proxyd in stream
 * order like the 1D memsets. The _ptds/_ptsz entry points reach these
 * between gp_rt_ptds_begin/end: their ops go to the per-thread default
 * stream. CUDA Runtime API, "cudaMemset2D": width is in bytes, value is
 * converted to unsigned char. */
CUresult cuMemsetD2D8_v2_ptds(CUdeviceptr, size_t, unsigned char, size_t, size_t);
CUresult cuMemsetD2D8Async_ptsz(CUdeviceptr, size_t, unsigned char, size_t, size_t, CUstream);

static CUresult memset2d(CUdeviceptr p, size_t pitch, int value, size_t width, size_t height, int async,
                         cudaStream_t stream)
{
    if (width == 0 || height == 0)
        return CUDA_SUCCESS;       /* nothing to set; the driver accepts an empty memset too */
    int pt = gp_rt_ptds();
    unsigned char v = (unsigned char)value;
    if (async)
        return pt ? cuMemsetD2D8Async_ptsz(p, pitch, v, width, height, gp_rt_stream(stream))
                  : cuMemsetD2D8Async(p, pitch, v, width, height, gp_rt_stream(stream));
    return pt ? cuMemsetD2D8_v2_ptds(p, pitch, v, width, height) : cuMemsetD2D8(p, pitch, v, width, height);
}

cudaError_t gpo_cudaMemset2D(void *devPtr, size_t pitch, int value, size_t width, size_t height)
{
    RT_INIT();
    RT_RETURN_CU(memset2d((CUdeviceptr)(uintptr_t)devPtr, pitch, value, width, height, 0, NULL));
}

cudaError_t gpo_cudaMemset2DAsync(void *devPtr, size_t pitch, int value, size_t width, size_t height,
                                  cudaStream_t stream)
{
    RT_INIT();
    RT_RETURN_CU(memset2d((CUdeviceptr)(uintptr_t)devPtr, pitch, value, width, height, 1, stream));
}

/* cudaMemset3D: extent.width bytes of extent.height rows in extent.depth
 * slices; rows are p.pitch bytes apart and slices p.pitch * p.ysize (CUDA
 * Runtime API, "cudaMemset3D"). Where the extent covers every row of a
 * slice the slices are one run of rows: one op; otherwise one op per slice. */
static cudaError_t memset3d(struct cudaPitchedPtr p, int value, struct cudaExtent e, int async, cudaStream_t stream)
{
    RT_INIT();
    if (e.width == 0 || e.height == 0 || e.depth == 0)
        return cudaSuccess;
    if (!p.ptr || e.width > p.pitch || (e.depth > 1 && e.height > p.ysize))
        return gp_rt_ret(cudaErrorInvalidValue);
    CUdeviceptr base = (CUdeviceptr)(uintptr_t)p.ptr;
    if (e.depth == 1 || e.height == p.ysize)
        RT_RETURN_CU(memset2d(base, p.pitch, value, e.width, e.height * e.depth, async, stream));
    size_t slice = p.pitch * p.ysize;
    for (size_t z = 0; z < e.depth; z++) {
        CUresult r = memset2d(base + z * slice, p.pitch, value, e.width, e.height, async, stream);
        if (r != CUDA_SUCCESS)
            RT_RETURN_CU(r);
    }
    return cudaSuccess;
}

cudaError_t gpo_cudaMemset3D(struct cudaPitchedPtr pitchedDevPtr, int value, struct cudaExtent extent)
{
    return memset3d(pitchedDevPtr, value, extent, 0, NULL);
}

cudaError_t gpo_cudaMemset3DAsync(struct cudaPitchedPtr pitchedDevPtr, int value, struct cudaExtent extent,
                                  cudaStream_t stream)
{
    return memset3d(pitchedDevPtr, value, extent, 1, stream);
}

static cudaError_t symbol_range(const void *symbol, size_t count, size_t offset, CUdeviceptr *dptr)
{
    size_t size;
    cudaError_t e = gp_rt_symbol(symbol, dptr, &size);
    if (e != cudaSuccess)
        return e;
    if (offset > size || count > size - offset)
        return cudaErrorInvalidValue;
    gp_note_device_range(*dptr, size);
    *dptr += offset;
    return cudaSuccess;
}

/* cudaMemcpy{To,From}Symbol[Async]: `count` bytes at `offset` into the
 * variable, to it from host_side (to_symbol) or from it into host_side. The
 * synchronous forms refuse a direction that does not fit (the kinds their
 * documentation allows, cuda_runtime_api.h); the asynchronous forms pass
 * the kind on to memcpy_kind as they always did. */
static cudaError_t symbol_copy(const void *symbol, void *other, size_t count, size_t offset,
                               enum cudaMemcpyKind kind, int to_symbol, cudaStream_t stream, int async)
{
    RT_INIT();
    CUdeviceptr d;
    cudaError_t e = symbol_range(symbol, count, offset, &d);
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    if (!async && kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyDefault &&
        kind != (to_symbol ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost))
        return gp_rt_ret(cudaErrorInvalidMemcpyDirection);
    void *sym = (void *)(uintptr_t)d;
    return to_symbol ? memcpy_kind(sym, other, count, kind, stream, async)
                     : memcpy_kind(other, sym, count, kind, stream, async);
}

cudaError_t gpo_cudaMemcpyToSymbol(const void *symbol, const void *src, size_t count, size_t offset,
                                   enum cudaMemcpyKind kind)
{
    return symbol_copy(symbol, (void *)src, count, offset, kind, 1, NULL, 0);
}

cudaError_t gpo_cudaMemcpyFromSymbol(void *dst, const void *symbol, size_t count, size_t offset,
                                     enum cudaMemcpyKind kind)
{
    return symbol_copy(symbol, dst, count, offset, kind, 0, NULL, 0);
}

cudaError_t gpo_cudaMemcpyToSymbolAsync(const void *symbol, const void *src, size_t count, size_t offset,
                                        enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return symbol_copy(symbol, (void *)src, count, offset, kind, 1, stream, 1);
}

cudaError_t gpo_cudaMemcpyFromSymbolAsync(void *dst, const void *symbol, size_t count, size_t offset,
                                          enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return symbol_copy(symbol, dst, count, offset, kind, 0, stream, 1);
}

cudaError_t gpo_cudaGetSymbolAddress(void **devPtr, const void *symbol)
{
    RT_INIT();
    CUdeviceptr d;
    size_t size;
    cudaError_t e = gp_rt_symbol(symbol, &d, &size);
    if (e == cudaSuccess) {
        gp_note_device_range(d, size);
        *devPtr = (void *)(uintptr_t)d;
    }
    return gp_rt_ret(e);
}

cudaError_t gpo_cudaGetSymbolSize(size_t *size, const void *symbol)
{
    RT_INIT();
    CUdeviceptr d;
    return gp_rt_ret(gp_rt_symbol(symbol, &d, size));
}

cudaError_t gpo_cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr)
{
    if (!attributes)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    memset(attributes, 0, sizeof *attributes);
    uint32_t seg;
    uint64_t off, avail;
    int kind;
    gp_lock();
    if (gp_is_device_ptr(ptr)) {
        CUdevice owner;     /* several GPUs: the allocation's own device (peer.c) */
        attributes->type = cudaMemoryTypeDevice;
        attributes->device = gp_owner_of((CUdeviceptr)(uintptr_t)ptr, &owner) == 0 ? owner : gp_rt_ctx_device();
        attributes->devicePointer = (void *)ptr;
    } else if (gp_hostmap_info(ptr, &kind, NULL, NULL, NULL, NULL, NULL, NULL) == 0) {
        /* GPU-visible host memory: the same address on both sides */
        attributes->type = kind == GP_HM_MANAGED ? cudaMemoryTypeManaged : cudaMemoryTypeHost;
        attributes->device = gp_rt_ctx_device();
        attributes->devicePointer = (void *)ptr;
        attributes->hostPointer = (void *)ptr;
    } else if (gp_host_lookup(ptr, &seg, &off, &avail) == 0) {
        attributes->type = cudaMemoryTypeHost;
        attributes->device = gp_rt_ctx_device();
        attributes->hostPointer = (void *)ptr;
    } else {
        attributes->type = cudaMemoryTypeUnregistered;
        attributes->device = -2;
    }
    gp_unlock();
    return cudaSuccess;
}

/* -------------------------------------------------------- stream management */

cudaError_t gpo_cudaStreamCreate(cudaStream_t *pStream)
{
    RT_INIT();
    RT_RETURN_CU(cuStreamCreate((CUstream *)pStream, CU_STREAM_DEFAULT));
}

cudaError_t gpo_cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    RT_INIT();
    RT_RETURN_CU(cuStreamCreate((CUstream *)pStream, flags));
}

cudaError_t gpo_cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority)
{
    RT_INIT();
    RT_RETURN_CU(cuStreamCreateWithPriority((CUstream *)pStream, flags, priority));
}

cudaError_t gpo_cudaStreamDestroy(cudaStream_t stream)
{
    RT_INIT();
    RT_RETURN_CU(cuStreamDestroy((CUstream)stream));
}

cudaError_t gpo_cudaStreamSynchronize(cudaStream_t stream)
{
    RT_INIT();
    RT_RETURN_CU(cuStreamSynchronize(gp_rt_stream(stream)));
}

cudaError_t gpo_cudaStreamQuery(cudaStream_t stream)
{
    RT_INIT();
    RT_RETURN_CU(cuStreamQuery(gp_rt_stream(stream)));
}

cudaError_t gpo_cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    RT_INIT();
    RT_RETURN_CU(cuStreamWaitEvent(gp_rt_stream(stream), (CUevent)event, flags));
}

cudaError_t gpo_cudaStreamGetFlags(cudaStream_t hStream, unsigned int *flags)
{
    RT_INIT();
    RT_RETURN_CU(cuStreamGetFlags(gp_rt_stream(hStream), flags));
}

cudaError_t gpo_cudaStreamGetPriority(cudaStream_t hStream, int *priority)
{
    RT_INIT();
    RT_RETURN_CU(cuStreamGetPriority(gp_rt_stream(hStream), priority));
}

/* cudaLaunchAttributeValue is CUlaunchAttributeValue (= CUstreamAttrValue) and
 * the runtime's attribute ids are the driver's (driver_types.h, cuda.h). */
_Static_assert(sizeof(cudaLaunchAttributeValue) == sizeof(CUstreamAttrValue), "stream attribute value layout");

cudaError_t gpo_cudaStreamSetAttribute(cudaStream_t hStream, cudaLaunchAttributeID attr,
                                       const cudaLaunchAttributeValue *value)
{
    if (!value)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    RT_RETURN_CU(cuStreamSetAttribute(gp_rt_stream(hStream), (CUstreamAttrID)attr, (const CUstreamAttrValue *)value));
}

cudaError_t gpo_cudaStreamGetAttribute(cudaStream_t hStream, cudaLaunchAttributeID attr,
                                       cudaLaunchAttributeValue *value_out)
{
    if (!value_out)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    RT_RETURN_CU(cuStreamGetAttribute(gp_rt_stream(hStream), (CUstreamAttrID)attr, (CUstreamAttrValue *)value_out));
}

cudaError_t gpo_cudaStreamCopyAttributes(cudaStream_t dst, cudaStream_t src)
{
    RT_INIT();
    RT_RETURN_CU(cuStreamCopyAttributes(gp_rt_stream(dst), gp_rt_stream(src)));
}

/* --------------------------------------------------------- event management */

cudaError_t gpo_cudaEventCreate(cudaEvent_t *event)
{
    RT_INIT();
    RT_RETURN_CU(cuEventCreate((CUevent *)event, CU_EVENT_DEFAULT));
}

cudaError_t gpo_cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    RT_INIT();
    RT_RETURN_CU(cuEventCreate((CUevent *)event, flags));
}

cudaError_t gpo_cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    RT_INIT();
    RT_RETURN_CU(cuEventRecord((CUevent)event, gp_rt_stream(stream)));
}

cudaError_t gpo_cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags)
{
    RT_INIT();
    RT_RETURN_CU(cuEventRecordWithFlags((CUevent)event, gp_rt_stream(stream), flags));
}

cudaError_t gpo_cudaEventQuery(cudaEvent_t event)
{
    RT_INIT();
    RT_RETURN_CU(cuEventQuery((CUevent)event));
}

cudaError_t gpo_cudaEventSynchronize(cudaEvent_t event)
{
    RT_INIT();
    RT_RETURN_CU(cuEventSynchronize((CUevent)event));
}

cudaError_t gpo_cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    RT_INIT();
    RT_RETURN_CU(cuEventElapsedTime(ms, (CUevent)start, (CUevent)end));
}

cudaError_t gpo_cudaEventDestroy(cudaEvent_t event)
{
    RT_INIT();
    RT_RETURN_CU(cuEventDestroy((CUevent)event));
}

/* --------------------------------------------------------- execution control */

static cudaError_t func_of(const void *func, CUfunction *f)
{
    return gp_rt_kernel_handle(gp_rt_kernel_for(func), f);
}

cudaError_t gpo_cudaFuncGetAttributes(struct cudaFuncAttributes *a, const void *func)
{
    if (!a)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUfunction f;
    cudaError_t e = func_of(func, &f);
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    memset(a, 0, sizeof *a);
    int v = 0;
    CUresult r = cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f);
    if (r != CUDA_SUCCESS)
        RT_RETURN_CU(r);
    a->maxThreadsPerBlock = v;
    cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f); a->sharedSizeBytes = (size_t)v;
    cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES, f); a->constSizeBytes = (size_t)v;
    cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f); a->localSizeBytes = (size_t)v;
    cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_NUM_REGS, f); a->numRegs = v;
    cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_PTX_VERSION, f); a->ptxVersion = v;
    cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_BINARY_VERSION, f); a->binaryVersion = v;
    cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_CACHE_MODE_CA, f); a->cacheModeCA = v;
    cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f); a->maxDynamicSharedSizeBytes = v;
    cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, f); a->preferredShmemCarveout = v;
    return cudaSuccess;
}

cudaError_t gpo_cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    RT_INIT();
    CUfunction f;
    cudaError_t e = func_of(func, &f);
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    /* cudaFuncAttribute and CUfunction_attribute share values for the
     * settable attributes (dynamic shared memory size = 8, carveout = 9) */
    RT_RETURN_CU(cuFuncSetAttribute(f, (CUfunction_attribute)attr, value));
}

cudaError_t gpo_cudaFuncSetCacheConfig(const void *func, enum cudaFuncCache cacheConfig)
{
    RT_INIT();
    CUfunction f;
    cudaError_t e = func_of(func, &f);
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    RT_RETURN_CU(cuFuncSetCacheConfig(f, (CUfunc_cache)cacheConfig));
}

cudaError_t gpo_cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, const void *func, int blockSize,
                                                                      size_t dynamicSMemSize, unsigned int flags)
{
    RT_INIT();
    CUfunction f;
    cudaError_t e = func_of(func, &f);
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    RT_RETURN_CU(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, f, blockSize, dynamicSMemSize, flags));
}

cudaError_t gpo_cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, const void *func, int blockSize,
                                                              size_t dynamicSMemSize)
{
    return gpo_cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, func, blockSize, dynamicSMemSize, 0);
}

cudaError_t gpo_cudaOccupancyAvailableDynamicSMemPerBlock(size_t *dynamicSmemSize, const void *func, int numBlocks,
                                                         int blockSize)
{
    RT_INIT();
    CUfunction f;
    cudaError_t e = func_of(func, &f);
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    RT_RETURN_CU(cuOccupancyAvailableDynamicSMemPerBlock(dynamicSmemSize, f, numBlocks, blockSize));
}

/* The driver function of a kernel: the handle the shim uses itself, valid
 * with the driver API entry points of this shim (cuLaunchKernel, ...). */
cudaError_t gpo_cudaGetFuncBySymbol(cudaFunction_t *functionPtr, const void *symbolPtr)
{
    if (!functionPtr)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUfunction f;
    cudaError_t e = func_of(symbolPtr, &f);
    if (e == cudaSuccess)
        *functionPtr = (cudaFunction_t)f;
    return gp_rt_ret(e);
}

/* ---------------------------------------------------------------- profiler */

/* Nothing to switch: see gpo_cuProfilerStart (launch_ex.c). */
cudaError_t gpo_cudaCtxResetPersistingL2Cache(void)
{
    RT_INIT();
    RT_RETURN_CU(cuCtxResetPersistingL2Cache());
}

cudaError_t gpo_cudaProfilerStart(void) { return cudaSuccess; }
cudaError_t gpo_cudaProfilerStop(void) { return cudaSuccess; }

/* ------------------------------------------------------ driver entry points */

cudaError_t gpo_cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                                 unsigned long long flags,
                                                 enum cudaDriverEntryPointQueryResult *driverStatus)
{
    if (!symbol || !funcPtr)
        return gp_rt_ret(cudaErrorInvalidValue);
    int other = 0;
    void *p = gp_proc_lookup(symbol, (int)cudaVersion, (flags & cudaEnablePerThreadDefaultStream) != 0, &other);
    gp_proc_note_missing("cudaGetDriverEntryPoint", symbol, (int)cudaVersion, p);
    *funcPtr = p;
    if (driverStatus)
        *driverStatus = p ? cudaDriverEntryPointSuccess
                          : (other ? cudaDriverEntryPointVersionNotSufficent : cudaDriverEntryPointSymbolNotFound);
    /* like the real runtime, a missing symbol is reported through driverStatus */
    return (p || driverStatus) ? cudaSuccess : gp_rt_ret(cudaErrorSymbolNotFound);
}

cudaError_t gpo_cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                        enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return gpo_cudaGetDriverEntryPointByVersion(symbol, funcPtr, CUDART_VERSION, flags, driverStatus);
}
