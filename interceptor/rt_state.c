/* Per-thread runtime state and error handling; see gp_rt.h.
 *
 * The runtime binds each thread to the primary context of its current device
 * (CUDA Runtime API, "Interactions with the CUDA Driver API": the runtime
 * uses the context current on the thread if there is one, otherwise the
 * device's primary context). Primary contexts are retained once per process.
 *
 * Locking: thread-local state needs none; the primary context table is
 * under gp_lock. */
#include "gp_gen.h"
#include "gp_rt.h"

#define GP_MAX_DEV 64

static __thread int tls_dev;
static __thread cudaError_t tls_last_error = cudaSuccess;
static __thread int tls_ptds;

static CUcontext primary[GP_MAX_DEV];

cudaError_t gp_rt_ret(cudaError_t e)
{
    if (e != cudaSuccess && e != cudaErrorNotReady)
        tls_last_error = e;
    return e;
}

/* The runtime's error codes mirror the driver's for every code the shim can
 * produce (driver_types.h and cuda.h give the same numbers), except where the
 * runtime names the condition differently. */
cudaError_t gp_rt_from_cu(CUresult r)
{
    switch (r) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_INVALID_CONTEXT: return cudaErrorDeviceUninitialized;
    case CUDA_ERROR_NOT_FOUND: return cudaErrorSymbolNotFound;
    case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
    case CUDA_ERROR_DEVICE_UNAVAILABLE: return cudaErrorDevicesUnavailable;
    default: return (cudaError_t)r;
    }
}

int gp_rt_device(void) { return tls_dev; }

static cudaError_t primary_ctx(int dev, CUcontext *out)
{
    if (dev < 0 || dev >= GP_MAX_DEV)
        return cudaErrorInvalidDevice;
    gp_lock();
    CUresult r = CUDA_SUCCESS;
    if (!primary[dev]) {
        r = cuInit(0);
        if (r == CUDA_SUCCESS)
            r = cuDevicePrimaryCtxRetain(&primary[dev], dev);
    }
    *out = primary[dev];
    gp_unlock();
    if (r == CUDA_ERROR_INVALID_DEVICE)
        return cudaErrorInvalidDevice;
    return gp_rt_from_cu(r);
}

/* The device's primary context, retained on first use (rt_peer.c). */
cudaError_t gp_rt_primary_ctx(int dev, CUcontext *out) { return primary_ctx(dev, out); }

cudaError_t gp_rt_init_thread(void)
{
    if (gp_ctx_current())
        return cudaSuccess;
    CUcontext c;
    cudaError_t e = primary_ctx(tls_dev, &c);
    if (e == cudaSuccess)
        gp_ctx_set_current(c);
    return e;
}

cudaError_t gp_rt_set_device(int dev)
{
    int n = 0;
    CUresult r = cuInit(0);
    if (r == CUDA_SUCCESS)
        r = cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS)
        return gp_rt_from_cu(r);
    if (dev < 0 || dev >= n)
        return cudaErrorInvalidDevice;
    CUcontext c;
    cudaError_t e = primary_ctx(dev, &c);
    if (e != cudaSuccess)
        return e;
    tls_dev = dev;
    gp_ctx_set_current(c);
    return cudaSuccess;
}

void gp_rt_forget_primary(int dev)
{
    gp_lock();
    if (dev >= 0 && dev < GP_MAX_DEV)
        primary[dev] = NULL;
    gp_unlock();
}

cudaError_t gp_rt_last_error(int reset)
{
    cudaError_t e = tls_last_error;
    if (reset)
        tls_last_error = cudaSuccess;
    return e;
}

CUstream gp_rt_stream(cudaStream_t s)
{
    if (!s && tls_ptds)
        return CU_STREAM_PER_THREAD;
    return (CUstream)s;
}

void gp_rt_ptds_begin(void) { tls_ptds++; }
void gp_rt_ptds_end(void) { tls_ptds--; }
int gp_rt_ptds(void) { return tls_ptds > 0; }

/* Device of the thread's current context (the runtime may run on a context
 * the application made current through the driver API). */
int gp_rt_ctx_device(void)
{
    CUdevice d;
    CUcontext c = gp_ctx_current();
    if (c && gp_ctx_device(c, &d) == 0)
        return d;
    return tls_dev;
}
