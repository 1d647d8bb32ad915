/* Registration entry points that nvcc-generated host code calls, and kernel
 * launch through the runtime.
 *
 * At start-up each translation unit registers its fatbinary
 * (__cudaRegisterFatBinary), then its kernels (__cudaRegisterFunction: host
 * stub address -> device name) and __device__ variables (__cudaRegisterVar:
 * host shadow address -> device name), then __cudaRegisterFatBinaryEnd.
 * Modules are loaded lazily, per device, the first time one of their kernels
 * or variables is used (as CUDA's lazy loading does), so a program that never
 * touches the GPU never contacts proxyd.
 *
 * CUDA 13 launches: `kernel<<<g, b, s, st>>>(args)` becomes
 * __cudaPushCallConfiguration(g, b, s, st) followed by the host stub, which
 * calls __cudaPopCallConfiguration, __cudaGetKernel(&handle, stub) once, then
 * __cudaLaunchKernel(handle, g, b, args, s, st); legacy builds
 * (-D__NV_LEGACY_LAUNCH) call cudaLaunchKernel(stub, ...) instead
 * (crt/host_runtime.h).
 *
 * Locking: the tables are under gp_lock; the configuration stack is per thread. */
#include <stdlib.h>
#include <string.h>

#include "gp_funcs.h"
#include "gp_gen.h"
#include "gp_launch.h"
#include "gp_rt.h"

#define GP_MAX_DEV 64
#define GP_BUCKETS 1024

typedef struct gp_rt_fatbin {
    const void *image;
    size_t size;
    CUmodule mod[GP_MAX_DEV];
    int have_digest;            /* digest computed (the image is static data: it never changes) */
    uint8_t digest[32];         /* SHA-256 of the image, the name it is sent by (driver.c) */
} gp_rt_fatbin;

struct gp_rt_kernel {
    const void *host;
    char *name;
    gp_rt_fatbin *fb;
    CUfunction fn[GP_MAX_DEV];
    struct gp_rt_kernel *next;
};

typedef struct gp_rt_var {
    const void *host;
    char *name;
    size_t size;
    gp_rt_fatbin *fb;
    CUdeviceptr addr[GP_MAX_DEV];
    size_t dsize[GP_MAX_DEV];
    struct gp_rt_var *next;
} gp_rt_var;

static gp_rt_kernel *kernels[GP_BUCKETS];
static gp_rt_var *vars[GP_BUCKETS];

/* every registered fatbinary (libtorch alone registers about 450); grown
 * as needed, under gp_lock */
static gp_rt_fatbin **fatbins;
static int nfatbins, capfatbins;

static unsigned hptr(const void *p) { return (unsigned)(((uintptr_t)p * 0x9E3779B97F4A7C15ull) >> 54) & (GP_BUCKETS - 1); }

extern size_t gp_image_size(const void *image, const void **start);
extern int gp_rt_ctx_device(void);

static char *dupstr(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

void **gpo___cudaRegisterFatBinary(void *fatCubin)
{
    gp_rt_fatbin *fb = calloc(1, sizeof *fb);
    if (!fb)
        return NULL;
    fb->size = gp_image_size(fatCubin, &fb->image);
    gp_lock();
    if (nfatbins == capfatbins) {
        int cap = capfatbins ? 2 * capfatbins : 256;
        gp_rt_fatbin **t = realloc(fatbins, (size_t)cap * sizeof *t);
        if (t) {
            fatbins = t;
            capfatbins = cap;
        }
    }
    if (nfatbins < capfatbins)
        fatbins[nfatbins++] = fb;
    gp_unlock();
    return (void **)fb;
}

void gpo___cudaRegisterFatBinaryEnd(void **fatCubinHandle) { (void)fatCubinHandle; }

void gpo___cudaUnregisterFatBinary(void **fatCubinHandle)
{
    /* Runs from atexit, after the session has said goodbye: proxyd frees the
     * session's modules itself; here only the table entry goes. */
    gp_lock();
    for (int i = 0; i < nfatbins; i++)
        if ((void **)fatbins[i] == fatCubinHandle) {
            fatbins[i]->image = NULL;
            break;
        }
    gp_unlock();
}

void gpo___cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun, const char *deviceName,
                                int thread_limit, uint3 *tid, uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize)
{
    (void)deviceFun; (void)thread_limit; (void)tid; (void)bid; (void)bDim; (void)gDim; (void)wSize;
    gp_rt_kernel *k = calloc(1, sizeof *k);
    if (!k)
        return;
    k->host = hostFun;
    k->name = dupstr(deviceName);
    k->fb = (gp_rt_fatbin *)fatCubinHandle;
    gp_lock();
    unsigned b = hptr(hostFun);
    k->next = kernels[b];
    kernels[b] = k;
    gp_unlock();
}

void gpo___cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress, const char *deviceName,
                           int ext, size_t size, int constant, int global)
{
    (void)deviceAddress; (void)ext; (void)constant; (void)global;
    gp_rt_var *v = calloc(1, sizeof *v);
    if (!v)
        return;
    v->host = hostVar;
    v->name = dupstr(deviceName);
    v->size = size;
    v->fb = (gp_rt_fatbin *)fatCubinHandle;
    gp_lock();
    unsigned b = hptr(hostVar);
    v->next = vars[b];
    vars[b] = v;
    gp_unlock();
}

char gpo___cudaInitModule(void **fatCubinHandle);

/* Loads fb on the current thread's device if not loaded yet. Caller holds the lock. */
static cudaError_t ensure_module(gp_rt_fatbin *fb, int *devp)
{
    cudaError_t e = gp_rt_init_thread();
    if (e != cudaSuccess)
        return e;
    int dev = gp_rt_ctx_device();
    if (dev < 0 || dev >= GP_MAX_DEV)
        return cudaErrorInvalidDevice;
    *devp = dev;
    if (!fb || !fb->image)
        return cudaErrorInvalidDeviceFunction;
    if (fb->mod[dev])
        return cudaSuccess;
    /* as cuModuleLoadData, by content, hashed once per process */
    if (!fb->have_digest) {
        gp_sha256(fb->image, fb->size, fb->digest);
        fb->have_digest = 1;
    }
    CUresult r = gp_module_load_image(GP_FID_cuModuleLoadData, 2, &fb->mod[dev], fb->image, fb->size, fb->digest);
    if (r != CUDA_SUCCESS) {
        fb->mod[dev] = NULL;
        return r == CUDA_ERROR_NO_BINARY_FOR_GPU ? cudaErrorNoKernelImageForDevice : gp_rt_from_cu(r);
    }
    return cudaSuccess;
}

char gpo___cudaInitModule(void **fatCubinHandle)
{
    int dev;
    gp_lock();
    cudaError_t e = ensure_module((gp_rt_fatbin *)fatCubinHandle, &dev);
    gp_unlock();
    return e == cudaSuccess;
}

gp_rt_kernel *gp_rt_kernel_for(const void *hostFun)
{
    gp_lock();
    gp_rt_kernel *k = kernels[hptr(hostFun)];
    while (k && k->host != hostFun)
        k = k->next;
    gp_unlock();
    return k;
}

cudaError_t gp_rt_kernel_handle(gp_rt_kernel *k, CUfunction *f)
{
    if (!k)
        return cudaErrorInvalidDeviceFunction;
    gp_lock();
    int dev;
    cudaError_t e = ensure_module(k->fb, &dev);
    if (e == cudaSuccess && !k->fn[dev]) {
        CUresult r = cuModuleGetFunction(&k->fn[dev], k->fb->mod[dev], k->name);
        if (r != CUDA_SUCCESS)
            e = r == CUDA_ERROR_NOT_FOUND ? cudaErrorInvalidDeviceFunction : gp_rt_from_cu(r);
    }
    if (e == cudaSuccess)
        *f = k->fn[dev];
    gp_unlock();
    return e;
}

cudaError_t gp_rt_symbol(const void *symbol, CUdeviceptr *dptr, size_t *size)
{
    gp_lock();
    gp_rt_var *v = vars[hptr(symbol)];
    while (v && v->host != symbol)
        v = v->next;
    cudaError_t e = cudaErrorInvalidSymbol;
    int dev;
    if (v && (e = ensure_module(v->fb, &dev)) == cudaSuccess) {
        if (!v->addr[dev]) {
            CUresult r = cuModuleGetGlobal(&v->addr[dev], &v->dsize[dev], v->fb->mod[dev], v->name);
            if (r != CUDA_SUCCESS)
                e = r == CUDA_ERROR_NOT_FOUND ? cudaErrorInvalidSymbol : gp_rt_from_cu(r);
        }
        if (e == cudaSuccess) {
            *dptr = v->addr[dev];
            *size = v->dsize[dev];
        }
    }
    gp_unlock();
    return e;
}

/* cudaDeviceReset destroys the device's primary context and with it every
 * module loaded there; they are loaded again on next use. */
void gp_rt_forget_device_modules(int dev)
{
    gp_lock();
    for (int i = 0; i < nfatbins; i++)
        fatbins[i]->mod[dev] = NULL;
    for (int b = 0; b < GP_BUCKETS; b++) {
        for (gp_rt_kernel *k = kernels[b]; k; k = k->next)
            k->fn[dev] = NULL;
        for (gp_rt_var *v = vars[b]; v; v = v->next)
            v->addr[dev] = 0;
    }
    gp_unlock();
}

/* --------------------------------------------------------------- launch */

typedef struct { dim3 grid, block; size_t shmem; cudaStream_t stream; } gp_cfg;
#define GP_CFG_DEPTH 32
static __thread gp_cfg cfg_stack[GP_CFG_DEPTH];
static __thread int cfg_depth;

unsigned gpo___cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem, struct CUstream_st *stream)
{
    if (cfg_depth == GP_CFG_DEPTH)
        return 1;
    cfg_stack[cfg_depth].grid = gridDim;
    cfg_stack[cfg_depth].block = blockDim;
    cfg_stack[cfg_depth].shmem = sharedMem;
    cfg_stack[cfg_depth].stream = stream;
    cfg_depth++;
    return 0;
}

cudaError_t gpo___cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem, void *stream)
{
    if (cfg_depth == 0)
        return cudaErrorMissingConfiguration;
    cfg_depth--;
    *gridDim = cfg_stack[cfg_depth].grid;
    *blockDim = cfg_stack[cfg_depth].block;
    *sharedMem = cfg_stack[cfg_depth].shmem;
    *(cudaStream_t *)stream = cfg_stack[cfg_depth].stream;
    return cudaSuccess;
}

cudaError_t gpo___cudaGetKernel(cudaKernel_t *kernel, const void *funcAddr)
{
    gp_rt_kernel *k = gp_rt_kernel_for(funcAddr);
    if (!k)
        return gp_rt_ret(cudaErrorInvalidDeviceFunction);
    *kernel = (cudaKernel_t)k;
    return cudaSuccess;
}

/* One runtime launch: plain (attrs == NULL: the op of cuLaunchKernel) or
 * with launch attributes (the op of cuLaunchKernelEx). cudaLaunchAttribute
 * is CUlaunchAttribute (same ids, same 64-byte value union; driver_types.h
 * and cuda.h), checked at compile time below. */
_Static_assert(sizeof(cudaLaunchAttribute) == sizeof(CUlaunchAttribute), "cudaLaunchAttribute layout");
_Static_assert(sizeof(cudaLaunchAttributeValue) == sizeof(CUlaunchAttributeValue), "cudaLaunchAttributeValue layout");

static cudaError_t launch_attrs(gp_rt_kernel *k, dim3 g, dim3 b, void **args, size_t shmem, cudaStream_t stream,
                                const cudaLaunchAttribute *attrs, unsigned nattrs, int ex)
{
    if (!k)
        return gp_rt_ret(cudaErrorInvalidDeviceFunction);
    if (g.x == 0 || g.y == 0 || g.z == 0 || b.x == 0 || b.y == 0 || b.z == 0)
        return gp_rt_ret(cudaErrorInvalidConfiguration);
    gp_lock();
    CUfunction f;
    cudaError_t e = gp_rt_kernel_handle(k, &f);
    if (e == cudaSuccess) {
        gp_fninfo *fi = gp_fn_lookup(f);
        if (!fi || !fi->have_layout) {
            e = cudaErrorInvalidDeviceFunction;
        } else {
            uint8_t small[4096];
            uint8_t *buf = fi->param_bytes <= sizeof small ? small : malloc(fi->param_bytes);
            if (!buf) {
                e = cudaErrorMemoryAllocation;
            } else {
                gp_fn_pack(fi, args, buf);
                const unsigned grid[3] = { g.x, g.y, g.z }, block[3] = { b.x, b.y, b.z };
                int pt = gp_rt_ptds();
                CUresult r;
                if (ex)
                    r = gp_launch_ex(pt ? GP_FID_cuLaunchKernelEx_ptsz : GP_FID_cuLaunchKernelEx, f, grid, block,
                                     (unsigned)shmem, gp_rt_stream(stream), (const CUlaunchAttribute *)attrs, nattrs,
                                     buf, fi->param_bytes);
                else
                    r = gp_launch(pt ? GP_FID_cuLaunchKernel_ptsz : GP_FID_cuLaunchKernel, f, grid, block,
                                  (unsigned)shmem, gp_rt_stream(stream), buf, fi->param_bytes);
                e = gp_rt_from_cu(r);
                if (buf != small)
                    free(buf);
            }
        }
    }
    gp_unlock();
    return gp_rt_ret(e);
}

static cudaError_t launch(gp_rt_kernel *k, dim3 g, dim3 b, void **args, size_t shmem, cudaStream_t stream)
{
    return launch_attrs(k, g, b, args, shmem, stream, NULL, 0, 0);
}

cudaError_t gpo___cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                                   cudaStream_t stream)
{
    return launch((gp_rt_kernel *)kernel, gridDim, blockDim, args, sharedMem, stream);
}

cudaError_t gpo___cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                                        size_t sharedMem, cudaStream_t stream)
{
    gp_rt_ptds_begin();
    cudaError_t e = launch((gp_rt_kernel *)kernel, gridDim, blockDim, args, sharedMem, stream);
    gp_rt_ptds_end();
    return e;
}

cudaError_t gpo_cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                                 cudaStream_t stream)
{
    return launch(gp_rt_kernel_for(func), gridDim, blockDim, args, sharedMem, stream);
}

/* cudaLaunchKernelEx (a template in cuda_runtime.h) packs the arguments and
 * calls this. */
cudaError_t gpo_cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args)
{
    if (!config)
        return gp_rt_ret(cudaErrorInvalidValue);
    cudaError_t e = gp_rt_init_thread();
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    return launch_attrs(gp_rt_kernel_for(func), config->gridDim, config->blockDim, args, config->dynamicSmemBytes,
                        config->stream, config->attrs, config->numAttrs, 1);
}

/* A cooperative launch is a launch with cudaLaunchAttributeCooperative
 * (driver_types.h documents the two as equivalent). */
cudaError_t gpo_cudaLaunchCooperativeKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                            size_t sharedMem, cudaStream_t stream)
{
    cudaError_t e = gp_rt_init_thread();
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    cudaLaunchAttribute a;
    memset(&a, 0, sizeof a);
    a.id = cudaLaunchAttributeCooperative;
    a.val.cooperative = 1;
    return launch_attrs(gp_rt_kernel_for(func), gridDim, blockDim, args, sharedMem, stream, &a, 1, 1);
}
