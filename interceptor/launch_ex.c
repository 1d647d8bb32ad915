/* Launch variants of the driver API beyond cuLaunchKernel: cuLaunchKernelEx
 * (launch attributes: cluster dimensions, cooperative, priority, ...),
 * cuLaunchCooperativeKernel, and the occupancy calculator
 * cuOccupancyMaxPotentialBlockSize, whose block-size-to-shared-memory
 * callback is code of this process and so is evaluated here.
 *
 * Locking: under gp_lock (GP_ENTER / GP_LEAVE), like driver.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gp_gen.h"
#include "gp_launch.h"
#include "gp_shim.h"


/* Launch attributes whose value is plain data (cuda.h, CUlaunchAttributeID):
 * they travel as the 64 bytes of CUlaunchAttributeValue. The others carry a
 * CUevent of this process (PROGRAMMATIC_EVENT, LAUNCH_COMPLETION_EVENT) or
 * only apply to graph nodes (DEVICE_UPDATABLE_KERNEL_NODE). */
static int attr_is_data(CUlaunchAttributeID id)
{
    switch (id) {
    case CU_LAUNCH_ATTRIBUTE_IGNORE:
    case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
    case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
    case CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY:
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
    case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
    case CU_LAUNCH_ATTRIBUTE_PRIORITY:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
    case CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION:
    case CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
    case CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING:
        return 1;
    default:
        return 0;
    }
}

static void put_config(gp_buf *b, const unsigned grid[3], const unsigned block[3], unsigned shmem, CUstream stream,
                       const CUlaunchAttribute *attrs, unsigned nattrs);

CUresult gp_launch_ex(uint32_t fid, CUfunction f, const unsigned grid[3], const unsigned block[3], unsigned shmem,
                      CUstream stream, const CUlaunchAttribute *attrs, unsigned nattrs, const void *params,
                      size_t nbytes)
{
    if (nattrs && !attrs)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < nattrs; i++)
        if (!attr_is_data(attrs[i].id)) {
            char what[96];
            snprintf(what, sizeof what, "cuLaunchKernelEx (launch attribute %d)", (int)attrs[i].id);
            gp_warn_unsupported(what);
            return CUDA_ERROR_NOT_SUPPORTED;
        }
    /* op: [config, f, kernelParams, extra] with config =
     * [gx, gy, gz, bx, by, bz, shmem, stream, [[id, value bytes], ...]] */
    gp_buf *b = gp_op_begin(fid, 4);
    put_config(b, grid, block, shmem, stream, attrs, nattrs);
    gp_put_handle(b, f);
    gp_put_data(b, params, nbytes, 1);
    mp_nil(b);
    return gp_op_async();
}

/* The launch configuration as gp_launch_ex sends it (attributes checked by the caller). */
static void put_config(gp_buf *b, const unsigned grid[3], const unsigned block[3], unsigned shmem, CUstream stream,
                       const CUlaunchAttribute *attrs, unsigned nattrs)
{
    mp_array(b, 9);
    for (int i = 0; i < 3; i++)
        mp_uint(b, grid[i]);
    for (int i = 0; i < 3; i++)
        mp_uint(b, block[i]);
    mp_uint(b, shmem);
    gp_put_handle(b, stream);
    unsigned n = 0;
    for (unsigned i = 0; i < nattrs; i++)
        n += attrs[i].id != CU_LAUNCH_ATTRIBUTE_IGNORE;
    mp_array(b, n);
    for (unsigned i = 0; i < nattrs; i++) {
        if (attrs[i].id == CU_LAUNCH_ATTRIBUTE_IGNORE)
            continue;
        mp_array(b, 2);
        mp_uint(b, (uint64_t)attrs[i].id);
        mp_bin(b, &attrs[i].value, sizeof attrs[i].value);
    }
}

/* cuOccupancyMaxActiveClusters (cuda.h): how many clusters of the given
 * configuration can be co-resident; a question for the driver of the
 * worker (cuDNN asks it before choosing cluster kernels). The config's
 * attributes travel as for cuLaunchKernelEx; its stream is ignored by the
 * driver for this query but sent as given. */
CUresult gpo_cuOccupancyMaxActiveClusters(int *numClusters, CUfunction func, const CUlaunchConfig *config)
{
    if (!numClusters || !config || (config->numAttrs && !config->attrs))
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < config->numAttrs; i++)
        if (!attr_is_data(config->attrs[i].id))
            return CUDA_ERROR_INVALID_VALUE;
    GP_RESOLVE_FUNCTION(func);
    GP_ENTER();
    const unsigned grid[3] = { config->gridDimX, config->gridDimY, config->gridDimZ };
    const unsigned block[3] = { config->blockDimX, config->blockDimY, config->blockDimZ };
    gp_buf *b = gp_op_begin(GP_FID_cuOccupancyMaxActiveClusters, 3);
    mp_bool(b, 1);
    gp_put_handle(b, func);
    put_config(b, grid, block, config->sharedMemBytes, config->hStream, config->attrs, config->numAttrs);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    if (rc == CUDA_SUCCESS && r.have_outs && r.nouts >= 1)
        gp_out_value(&r, numClusters, sizeof *numClusters);
    gp_reply_done(&r);
    GP_LEAVE(rc);
}

static CUresult launch_ex(uint32_t fid, const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                          void **extra, CUstream stream, const CUlaunchAttribute *extra_attr)
{
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    GP_RESOLVE_FUNCTION(f);
    GP_ENTER();
    const unsigned grid[3] = { config->gridDimX, config->gridDimY, config->gridDimZ };
    const unsigned block[3] = { config->blockDimX, config->blockDimY, config->blockDimZ };
    uint8_t small[4096];
    const void *buf = NULL;
    size_t n = 0;
    CUresult rc = gp_launch_args(f, kernelParams, extra, small, sizeof small, &buf, &n);
    if (rc != CUDA_SUCCESS)
        GP_LEAVE(rc);
    const CUlaunchAttribute *attrs = config->attrs;
    unsigned nattrs = config->numAttrs;
    if (extra_attr) {
        attrs = extra_attr;
        nattrs = 1;
    }
    rc = gp_launch_ex(fid, f, grid, block, config->sharedMemBytes, stream, attrs, nattrs, buf, n);
    if ((kernelParams || !extra) && buf != small)
        free((void *)buf);
    GP_LEAVE(rc);
}

CUresult gpo_cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    return launch_ex(GP_FID_cuLaunchKernelEx, config, f, kernelParams, extra, config ? config->hStream : NULL, NULL);
}

CUresult gpo_cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    /* per-thread-default-stream variant: NULL is the thread's own default stream */
    CUstream s = config ? config->hStream : NULL;
    return launch_ex(GP_FID_cuLaunchKernelEx_ptsz, config, f, kernelParams, extra, s ? s : CU_STREAM_PER_THREAD,
                     NULL);
}

/* cuLaunchCooperativeKernel is cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_COOPERATIVE
 * (cuda.h documents the attribute as equivalent). */
static CUresult cooperative(uint32_t fid, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                            unsigned by, unsigned bz, unsigned shmem, CUstream s, void **kernelParams)
{
    CUlaunchConfig c;
    memset(&c, 0, sizeof c);
    c.gridDimX = gx; c.gridDimY = gy; c.gridDimZ = gz;
    c.blockDimX = bx; c.blockDimY = by; c.blockDimZ = bz;
    c.sharedMemBytes = shmem;
    CUlaunchAttribute a;
    memset(&a, 0, sizeof a);
    a.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    a.value.cooperative = 1;
    return launch_ex(fid, &c, f, kernelParams, NULL, s, &a);
}

CUresult gpo_cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                       unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                       unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                       void **kernelParams)
{
    return cooperative(GP_FID_cuLaunchKernelEx, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                       sharedMemBytes, hStream, kernelParams);
}

CUresult gpo_cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                            unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                            unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                            void **kernelParams)
{
    return cooperative(GP_FID_cuLaunchKernelEx_ptsz, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                       blockDimZ, sharedMemBytes, hStream ? hStream : CU_STREAM_PER_THREAD, kernelParams);
}

/* ------------------------------------------------------------- occupancy */

/* The block size with the highest occupancy, found the way NVIDIA's
 * cuda_occupancy.h does on the host (cudaOccupancyMaxPotentialBlockSize...):
 * try every multiple of the warp size up to the limit, from the largest
 * down, asking the occupancy of each (here: proxyd, per block size) with the
 * dynamic shared memory the application's callback wants for it; keep the
 * first size that reaches the best thread count; stop early once a size
 * fills the multiprocessor. minGridSize is that size's blocks per SM times
 * the number of SMs. */
static CUresult potential_block_size(int *minGridSize, int *blockSize, CUfunction func,
                                     CUoccupancyB2DSize b2d, size_t dynamicSMemSize, int blockSizeLimit,
                                     unsigned int flags)
{
    if (!minGridSize || !blockSize || blockSizeLimit < 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUdevice dev;
    CUresult rc = cuCtxGetDevice(&dev);
    int dev_max = 0, warp = 0, sms = 0, per_sm = 0, fn_max = 0;
    if (rc == CUDA_SUCCESS)
        rc = cuDeviceGetAttribute(&dev_max, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, dev);
    if (rc == CUDA_SUCCESS)
        rc = cuDeviceGetAttribute(&warp, CU_DEVICE_ATTRIBUTE_WARP_SIZE, dev);
    if (rc == CUDA_SUCCESS)
        rc = cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    if (rc == CUDA_SUCCESS)
        rc = cuDeviceGetAttribute(&per_sm, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev);
    if (rc == CUDA_SUCCESS)
        rc = cuFuncGetAttribute(&fn_max, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, func);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (warp <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    int limit = dev_max < fn_max ? dev_max : fn_max;
    if (blockSizeLimit > 0 && blockSizeLimit < limit)
        limit = blockSizeLimit;
    int best_threads = 0, best_size = 0, best_blocks = 0;
    for (int aligned = (limit + warp - 1) / warp * warp; aligned > 0; aligned -= warp) {
        int size = aligned < limit ? aligned : limit;
        size_t smem = b2d ? b2d(size) : dynamicSMemSize;
        int blocks = 0;
        rc = cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(&blocks, func, size, smem, flags);
        if (rc != CUDA_SUCCESS)
            return rc;
        if (blocks * size > best_threads) {
            best_threads = blocks * size;
            best_size = size;
            best_blocks = blocks;
        }
        if (best_threads == per_sm)
            break;
    }
    *minGridSize = best_blocks * sms;
    *blockSize = best_size;
    return CUDA_SUCCESS;
}

CUresult gpo_cuOccupancyMaxPotentialBlockSize(int *minGridSize, int *blockSize, CUfunction func,
                                              CUoccupancyB2DSize blockSizeToDynamicSMemSize, size_t dynamicSMemSize,
                                              int blockSizeLimit)
{
    return potential_block_size(minGridSize, blockSize, func, blockSizeToDynamicSMemSize, dynamicSMemSize,
                                blockSizeLimit, CU_OCCUPANCY_DEFAULT);
}

CUresult gpo_cuOccupancyMaxPotentialBlockSizeWithFlags(int *minGridSize, int *blockSize, CUfunction func,
                                                       CUoccupancyB2DSize blockSizeToDynamicSMemSize,
                                                       size_t dynamicSMemSize, int blockSizeLimit, unsigned int flags)
{
    return potential_block_size(minGridSize, blockSize, func, blockSizeToDynamicSMemSize, dynamicSMemSize,
                                blockSizeLimit, flags);
}

/* -------------------------------------------------------------- profiler */

/* cuProfilerStart/Stop bracket what an attached profiler records. The
 * application's work runs in proxyd, where no profiler of the application
 * is attached, so there is nothing to switch: success, as the driver
 * answers when no profiler is attached. */
CUresult gpo_cuProfilerStart(void) { return CUDA_SUCCESS; }
CUresult gpo_cuProfilerStop(void) { return CUDA_SUCCESS; }
