/* The CUDA runtime API, implemented inside the shim on top of the (remoted)
 * driver API: proxyd only ever executes driver-level operations.
 *
 * Runtime semantics kept here, per thread: the current device (cudaSetDevice),
 * the last error (cudaGetLastError), the launch configuration stack
 * (__cudaPushCallConfiguration), and whether the call came through a
 * per-thread-default-stream entry point (_ptds/_ptsz).
 *
 * Locking: runtime functions take gp_lock (recursive) around their driver
 * calls where several must happen atomically (lazy module loading). */
#ifndef GP_RT_H
#define GP_RT_H

#include <cuda_runtime_api.h>

#include "gp_shim.h"

/* Error bookkeeping: every runtime call passes its result through gp_rt_ret,
 * which records failures as the thread's last error. */
cudaError_t gp_rt_ret(cudaError_t e);
cudaError_t gp_rt_from_cu(CUresult r);
#define RT_RETURN_CU(call) return gp_rt_ret(gp_rt_from_cu(call))

/* Makes sure the calling thread has a current context (the primary context of
 * its current device) and returns cudaSuccess or the error. */
cudaError_t gp_rt_init_thread(void);
/* The first step of a runtime entry point that needs a context: returns
 * the error (recorded as the thread's last) where there is none. */
#define RT_INIT()                                   \
    do {                                            \
        cudaError_t e_ = gp_rt_init_thread();       \
        if (e_ != cudaSuccess)                      \
            return gp_rt_ret(e_);                   \
    } while (0)
int gp_rt_device(void);
/* The device's primary context, retained on first use (rt_state.c). */
cudaError_t gp_rt_primary_ctx(int dev, CUcontext *out);
/* The stream as the driver should see it: NULL means the per-thread default
 * stream inside a _ptds/_ptsz entry point. */
CUstream gp_rt_stream(cudaStream_t s);
void gp_rt_ptds_begin(void);
void gp_rt_ptds_end(void);
int gp_rt_ptds(void);

/* Registered fatbinaries, kernels and variables (rt_register.c). */
typedef struct gp_rt_kernel gp_rt_kernel;
gp_rt_kernel *gp_rt_kernel_for(const void *hostFun);
cudaError_t gp_rt_kernel_handle(gp_rt_kernel *k, CUfunction *f);
cudaError_t gp_rt_symbol(const void *symbol, CUdeviceptr *dptr, size_t *size);
void gp_rt_forget_device_modules(int dev);

CUresult gp_copy_any(int per_thread, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s, int async);

const char *gp_rt_error_name(cudaError_t e);

#endif
