/* Runtime host functions (cudaLaunchHostFunc, cudaStreamAddCallback), on
 * the driver-side machinery of hostfn.c, which explains how the app's
 * function runs in the app's process in stream order.
 *
 * Locking: hostfn.c takes gp_lock. */
#include "gp_rt.h"

CUresult gp_hostfn_add_rt_callback(CUstream wire, int per_thread, void *callback, void *userData, void *app_stream);

cudaError_t gpo_cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
    cudaError_t e = gp_rt_init_thread();
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    /* gp_rt_stream: NULL is the per-thread stream inside a _ptsz entry point */
    RT_RETURN_CU(cuLaunchHostFunc(gp_rt_stream(stream), fn, userData));
}

/* The callback gets (stream, status, userData) with the stream value the
 * application passed, and cudaSuccess (cudaError_t and CUresult agree on 0).
 * "flags: Reserved for future use, must be 0" (cuda_runtime_api.h). */
cudaError_t gpo_cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t callback, void *userData,
                                      unsigned int flags)
{
    cudaError_t e = gp_rt_init_thread();
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    if (flags != 0 || !callback)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_RETURN_CU(gp_hostfn_add_rt_callback(gp_rt_stream(stream), gp_rt_ptds(), (void *)callback, userData, stream));
}
