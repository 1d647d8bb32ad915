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
 * - cuFuncGetAttribute (and so cudaFuncGetAttributes, 10 of them a call,
 *   and cuKernelGetAttribute): per (function, attribute), below ("function
 *   attributes").
 *
 * Locking: gp_lock around the tables (callers may hold it: recursive). A
 * remoted call made under it keeps it until its answer has come (transport.c
 * releases it only in HELLO), so nothing can change a table between a
 * question and the caching of its answer; a move to another worker during
 * the call is caught by the epoch read before it. */
#include <string.h>

#include "gp_context.h"
#include "gp_funcs.h"
#include "gp_gen.h"
#include "gp_transport.h"

#define QC_DEVS 64
#define QC_ATTRS 256          /* CUdevice_attribute values are below this (cuda.h, CU_DEVICE_ATTRIBUTE_MAX) */

static int init_ok;
static uint64_t func_gen = 1;       /* occupancy answers' generation (below) */
static uint64_t fattr_gen = 1;      /* function attributes' generation (below) */
static void forget_function_sets(void);
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
    /* CUfunction handles die with their module or context, and the worker
     * may hand a dead one out again for another kernel: every cached answer
     * about functions goes (cuLibraryUnload unloads its modules through
     * cuModuleUnload, library.c; the last release of a primary context and
     * a reset destroy it with its modules, cuda.h) */
    switch (fid) {
    case GP_FID_cuModuleUnload:
    case GP_FID_cuCtxDestroy:
    case GP_FID_cuCtxDestroy_v2:
    case GP_FID_cuDevicePrimaryCtxRelease:
    case GP_FID_cuDevicePrimaryCtxRelease_v2:
    case GP_FID_cuDevicePrimaryCtxReset:
    case GP_FID_cuDevicePrimaryCtxReset_v2:
        func_gen++;
        fattr_gen++;
        forget_function_sets();
        break;
    case GP_FID_cuFuncSetCacheConfig:
        /* no CUfunction_attribute reflects it (cuda.h), but it is rare:
         * dropping everything costs nothing worth a risk */
        fattr_gen++;
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

/* A dead function's handle may come back for another function: the
 * record of what was set on it must not make a first set on the new one
 * look like a repeat that changes nothing (note_func_attr). */
static void forget_function_sets(void)
{
    nfattrs = 0;
}

/* ------------------------------------------------------ function attributes
 * cuFuncGetAttribute costs a round trip, which also waits for every
 * asynchronous op queued before it; PyTorch's DDP step asked it ~40 times
 * a step per rank (cudaFuncGetAttributes asks 10: rt_api.c), ~230 us each
 * on 4 H100s. The answers, per cuda.h's CUfunction_attribute:
 * - fixed by the compiled code: SHARED_SIZE_BYTES, CONST_SIZE_BYTES,
 *   LOCAL_SIZE_BYTES, NUM_REGS, PTX_VERSION, BINARY_VERSION,
 *   CACHE_MODE_CA, CLUSTER_SIZE_MUST_BE_SET and the REQUIRED_CLUSTER_*
 *   dimensions set at compile time;
 * - fixed for the function on its device: MAX_THREADS_PER_BLOCK ("depends
 *   on both the function and the device on which the function is
 *   currently loaded"); the shim keeps it per function, and it may follow
 *   the dynamic shared memory allowed, so any set drops it too;
 * - changed by cuFuncSetAttribute / cuKernelSetAttribute (cuda.h: "See
 *   ::cuFuncSetAttribute, ::cuKernelSetAttribute"):
 *   MAX_DYNAMIC_SHARED_SIZE_BYTES, PREFERRED_SHARED_MEMORY_CARVEOUT,
 *   CLUSTER_SIZE_MUST_BE_SET, REQUIRED_CLUSTER_WIDTH/HEIGHT/DEPTH,
 *   NON_PORTABLE_CLUSTER_SIZE_ALLOWED, CLUSTER_SCHEDULING_POLICY_PREFERENCE.
 *   All of those reach gpo_cuFuncSetAttribute (cudaFuncSetAttribute and
 *   cuKernelSetAttribute call cuFuncSetAttribute: rt_api.c, library.c),
 *   which drops every cached attribute of the function, unless the set
 *   repeats the last set made on that function (same attribute, same
 *   value): nothing has changed since that set, and a set is idempotent,
 *   its value or its refusal is what answers asked after it show already.
 *   PyTorch repeats the same set before some launches.
 * Dropped all at once when function handles may be reused (module unload,
 * context destroy or reset: qc_note_op) and when the session moves to
 * another worker (gp_session_epoch: a restore or a migration, which may be
 * onto another GPU model; a whole-process restore resumes through a new
 * worker endpoint too, transport.c set_worker_endpoint), so a restored
 * process asks again once. Only successful answers are cached.
 *
 * Kept per function: the handle as the worker knows it (a CUkernel passed
 * as a CUfunction, which cuda.h allows, is first turned into its function
 * in the current context: gp_function_of), direct-mapped by a hash of it.
 * Locking: gp_lock (GP_ENTER), as every table in this file. */

#define QC_FUNCS 1024
#define QC_FATTR_N 32          /* CUfunction_attribute values are below this (cuda.h: CU_FUNC_ATTRIBUTE_MAX is 16) */

static struct {
    CUfunction f;
    uint64_t epoch, gen;       /* the session epoch and fattr_gen it was filled in */
    uint32_t have;             /* bit a: value[a] is cached */
    int value[QC_FATTR_N];
    int set_known, set_attrib, set_value;   /* the last cuFuncSetAttribute on f (gen, epoch as above) */
} fcache[QC_FUNCS];

static size_t fcache_slot(CUfunction f)
{
    return (size_t)(((uint64_t)(uintptr_t)f * 0x9E3779B97F4A7C15ull) >> 40) % QC_FUNCS;
}

/* Slot s holds f's entry of this epoch and generation. */
static int fcache_live(size_t s, CUfunction f, uint64_t epoch, uint64_t gen)
{
    return fcache[s].f == f && fcache[s].epoch == epoch && fcache[s].gen == gen;
}

/* Makes slot s f's entry, empty, unless it already is: 1 when it was made. */
static int fcache_claim(size_t s, CUfunction f, uint64_t epoch, uint64_t gen)
{
    if (fcache_live(s, f, epoch, gen))
        return 0;
    fcache[s].f = f;
    fcache[s].epoch = epoch;
    fcache[s].gen = gen;
    fcache[s].have = 0;
    fcache[s].set_known = 0;
    return 1;
}

/* Before a set of f's attribute: drops what it may change (above). */
static void set_function_attr(CUfunction f, int attrib, int value)
{
    size_t s = fcache_slot(f);
    if (!fcache_claim(s, f, gp_session_epoch(), fattr_gen)
        && (!fcache[s].set_known || fcache[s].set_attrib != attrib || fcache[s].set_value != value))
        fcache[s].have = 0;
    fcache[s].set_known = 1;
    fcache[s].set_attrib = attrib;
    fcache[s].set_value = value;
}

CUresult gpo_cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction f)
{
    GP_RESOLVE_FUNCTION(f);
    GP_ENTER();
    uint64_t epoch = gp_session_epoch(), gen = fattr_gen;
    int cacheable = pi && f && (unsigned)attrib < QC_FATTR_N;
    size_t s = fcache_slot(f);
    if (cacheable && fcache_live(s, f, epoch, gen) && (fcache[s].have >> attrib & 1)) {
        *pi = fcache[s].value[attrib];
        GP_LEAVE(CUDA_SUCCESS);
    }
    CUresult rc = gpg_cuFuncGetAttribute(pi, attrib, f);
    if (rc == CUDA_SUCCESS && cacheable && epoch == gp_session_epoch() && gen == fattr_gen) {
        fcache_claim(s, f, epoch, gen);
        fcache[s].value[attrib] = *pi;
        fcache[s].have |= 1u << attrib;
    }
    GP_LEAVE(rc);
}

CUresult gpo_cuFuncSetAttribute(CUfunction f, CUfunction_attribute attrib, int value)
{
    GP_RESOLVE_FUNCTION(f);
    GP_ENTER();
    note_func_attr(f, (int)attrib, value);
    set_function_attr(f, (int)attrib, value);
    GP_LEAVE(gpg_cuFuncSetAttribute(f, attrib, value));
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
