/* Answers the shim gives from what it already knows, instead of a round
 * trip to proxyd, for queries that programs ask thousands of times per
 * second (measured with GPUPROXY_PROFILE on PyTorch 2.11, H100, 2026-11-24:
 * a GPT training step asked cuDevicePrimaryCtxGetState ~2,700 times, through
 * c10::cuda's "has this device a primary context" check before many ops,
 * plus cuInit and cuDeviceGetAttribute; at ~55 us a round trip that was
 * ~150 ms of a 42 ms step).
 *
 * What is cached and why it stays right:
 * - cuInit: once it has succeeded it succeeds again (cuda.h: "if cuInit()
 *   has not been called, any function from the driver API will return
 *   CUDA_ERROR_NOT_INITIALIZED"; there is no un-init).
 * - cuDevicePrimaryCtxGetState: the primary context's flags and activity
 *   change only through this process's own retain, release, reset and
 *   set-flags calls, which all pass through the shim: any of them (or a
 *   move to another worker: gp_session_epoch) drops the cached answers.
 * - cuDeviceGetAttribute: a device's attributes are fixed for the life of
 *   its worker (the driver itself caches them); dropped when the session
 *   moves to another worker, which may be another GPU.
 *
 * Locking: gp_lock around the tables (callers may hold it: recursive). */
#include <string.h>

#include "gp_funcs.h"
#include "gp_gen.h"
#include "gp_transport.h"

#define QC_DEVS 64
#define QC_ATTRS 256          /* CUdevice_attribute values are below this (cuda.h, CU_DEVICE_ATTRIBUTE_MAX) */

static int init_ok;
static uint64_t func_gen = 1;       /* occupancy answers' generation (below) */
static uint64_t primary_gen = 1;

static struct {
    uint64_t gen, epoch;
    unsigned flags;
    int active;
} prim[QC_DEVS];

static struct {
    uint64_t epoch;           /* 0: not cached */
    int value;
} attrs[QC_DEVS][QC_ATTRS];

/* transport.c, for every op (gp_transport_hooks.op_begun, set by this
 * file's constructor): calls that change a primary context's state */
static void qc_note_op(uint32_t fid)
{
    switch (fid) {
    case GP_FID_cuDevicePrimaryCtxRetain:
    case GP_FID_cuDevicePrimaryCtxRelease:
    case GP_FID_cuDevicePrimaryCtxRelease_v2:
    case GP_FID_cuDevicePrimaryCtxSetFlags:
    case GP_FID_cuDevicePrimaryCtxSetFlags_v2:
    case GP_FID_cuDevicePrimaryCtxReset:
    case GP_FID_cuDevicePrimaryCtxReset_v2:
        primary_gen++;
        break;
    case GP_FID_cuFuncSetCacheConfig:       /* may change occupancy (see below) */
    case GP_FID_cuFuncSetSharedMemConfig:
    case GP_FID_cuCtxSetCacheConfig:
    case GP_FID_cuCtxSetSharedMemConfig:
    case GP_FID_cuCtxSetLimit:
        func_gen++;
        break;
    default:
        break;
    }
}

__attribute__((constructor)) static void register_op_hook(void)
{
    gp_transport_hooks.op_begun = qc_note_op;
}

CUresult gpo_cuInit(unsigned int Flags)
{
    GP_ENTER();
    if (init_ok && Flags == 0)
        GP_LEAVE(CUDA_SUCCESS);
    CUresult rc = gpg_cuInit(Flags);
    if (rc == CUDA_SUCCESS)
        init_ok = 1;
    GP_LEAVE(rc);
}

CUresult gpo_cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    GP_ENTER();
    uint64_t epoch = gp_session_epoch();
    if (dev >= 0 && dev < QC_DEVS && flags && active && prim[dev].gen == primary_gen && prim[dev].epoch == epoch) {
        *flags = prim[dev].flags;
        *active = prim[dev].active;
        GP_LEAVE(CUDA_SUCCESS);
    }
    uint64_t gen = primary_gen;
    CUresult rc = gpg_cuDevicePrimaryCtxGetState(dev, flags, active);
    if (rc == CUDA_SUCCESS && dev >= 0 && dev < QC_DEVS && flags && active) {
        prim[dev].gen = gen;
        prim[dev].epoch = epoch;
        prim[dev].flags = *flags;
        prim[dev].active = *active;
    }
    GP_LEAVE(rc);
}

CUresult gpo_cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    GP_ENTER();
    uint64_t epoch = gp_session_epoch();
    int cacheable = pi && dev >= 0 && dev < QC_DEVS && (unsigned)attrib < QC_ATTRS;
    if (cacheable && attrs[dev][attrib].epoch == epoch) {
        *pi = attrs[dev][attrib].value;
        GP_LEAVE(CUDA_SUCCESS);
    }
    CUresult rc = gpg_cuDeviceGetAttribute(pi, attrib, dev);
    if (rc == CUDA_SUCCESS && cacheable) {
        attrs[dev][attrib].epoch = epoch;
        attrs[dev][attrib].value = *pi;
    }
    GP_LEAVE(rc);
}

/* ------------------------------------------------------------ occupancy
 * cuOccupancyMaxActiveBlocksPerMultiprocessor(WithFlags): PyTorch asks it
 * before some launches every step (2 per GPT step above, each waiting for
 * the whole queue of asynchronous work ahead of it: ~7 ms apiece). The
 * answer is a function of the kernel, the block size, the dynamic shared
 * memory, the flags and the kernel's attributes (cuda.h,
 * cuOccupancyMaxActiveBlocksPerMultiprocessor); attributes change through
 * cuFuncSetAttribute/SetCacheConfig/SetSharedMemConfig, which pass through
 * the shim. PyTorch sets the same attribute to the same value before each
 * launch of some kernels, so only a set that changes a value (or one the
 * shim cannot track) drops the cached answers. */

#define QC_OCC 1024
#define QC_FATTRS 1024

static struct {
    CUfunction f;
    int attrib, value;
} fattrs[QC_FATTRS];
static size_t nfattrs;

static struct {
    CUfunction f;
    int block;
    size_t smem;
    unsigned flags;
    uint64_t epoch, gen;       /* epoch 0: empty */
    int blocks;
} occ[QC_OCC];

static void note_func_attr(CUfunction f, int attrib, int value)
{
    for (size_t i = 0; i < nfattrs; i++)
        if (fattrs[i].f == f && fattrs[i].attrib == attrib) {
            if (fattrs[i].value != value) {
                fattrs[i].value = value;
                func_gen++;
            }
            return;
        }
    func_gen++;
    if (nfattrs < QC_FATTRS)
        fattrs[nfattrs++] = (typeof(fattrs[0])){ f, attrib, value };
    /* else: every later set of an untracked attribute bumps func_gen */
}

CUresult gpo_cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value)
{
    GP_ENTER();
    note_func_attr(hfunc, (int)attrib, value);
    GP_LEAVE(gpg_cuFuncSetAttribute(hfunc, attrib, value));
}

static size_t occ_slot(CUfunction f, int block, size_t smem, unsigned flags)
{
    uint64_t h = (uint64_t)(uintptr_t)f * 0x9E3779B97F4A7C15ull ^ (uint64_t)block * 0xC2B2AE3D27D4EB4Full
                 ^ (uint64_t)smem * 0x165667B19E3779F9ull ^ flags;
    return (size_t)(h >> 40) % QC_OCC;
}

static CUresult occupancy(int *numBlocks, CUfunction func, int blockSize, size_t smem, unsigned flags, int with_flags)
{
    GP_ENTER();
    if (!numBlocks)
        GP_LEAVE(with_flags ? gpg_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, func, blockSize,
                                                                                       smem, flags)
                            : gpg_cuOccupancyMaxActiveBlocksPerMultiprocessor(numBlocks, func, blockSize, smem));
    uint64_t epoch = gp_session_epoch();
    size_t s = occ_slot(func, blockSize, smem, flags);
    if (occ[s].epoch == epoch && occ[s].gen == func_gen && occ[s].f == func && occ[s].block == blockSize
        && occ[s].smem == smem && occ[s].flags == flags) {
        *numBlocks = occ[s].blocks;
        GP_LEAVE(CUDA_SUCCESS);
    }
    uint64_t gen = func_gen;
    CUresult rc = with_flags
        ? gpg_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, func, blockSize, smem, flags)
        : gpg_cuOccupancyMaxActiveBlocksPerMultiprocessor(numBlocks, func, blockSize, smem);
    if (rc == CUDA_SUCCESS) {
        occ[s].f = func;
        occ[s].block = blockSize;
        occ[s].smem = smem;
        occ[s].flags = flags;
        occ[s].epoch = epoch;
        occ[s].gen = gen;
        occ[s].blocks = *numBlocks;
    }
    GP_LEAVE(rc);
}

CUresult gpo_cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func, int blockSize,
                                                         size_t dynamicSMemSize)
{
    return occupancy(numBlocks, func, blockSize, dynamicSMemSize, 0, 0);
}

CUresult gpo_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, CUfunction func, int blockSize,
                                                                  size_t dynamicSMemSize, unsigned int flags)
{
    return occupancy(numBlocks, func, blockSize, dynamicSMemSize, flags, 1);
}
