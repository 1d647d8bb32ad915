/* The two ops every kernel launch travels as (gp_launch.h): the packed
 * argument buffer and cuLaunchKernel's op. Used by the driver's launch entry
 * points (driver.c, legacy_launch.c, launch_ex.c), the runtime's
 * (rt_register.c) and kernel graph nodes (graph_build.c); it sits below all
 * of them (interceptor/LAYERS).
 *
 * Locking: the caller holds gp_lock. */
#include <stdlib.h>

#include "gp_funcs.h"
#include "gp_launch.h"

/* Enqueues a launch with an already packed argument buffer. Caller holds the lock. */
CUresult gp_launch(uint32_t fid, CUfunction f, const unsigned grid[3], const unsigned block[3],
                   unsigned shmem, CUstream stream, const void *params, size_t nbytes)
{
    gp_buf *b = gp_op_begin(fid, 11);
    gp_put_handle(b, f);
    for (int i = 0; i < 3; i++)
        mp_uint(b, grid[i]);
    for (int i = 0; i < 3; i++)
        mp_uint(b, block[i]);
    mp_uint(b, shmem);
    gp_put_handle(b, stream);
    gp_put_data(b, params, nbytes, 1);
    mp_nil(b);
    return gp_op_async();
}

/* The packed argument buffer of a launch, from kernelParams (one pointer per
 * parameter, packed by the layout proxyd reported) or from `extra` =
 * { CU_LAUNCH_PARAM_BUFFER_POINTER, p, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
 * CU_LAUNCH_PARAM_END } in any order (cuLaunchKernel documentation). *buf is
 * either `small` (cap bytes), a malloc'ed buffer the caller frees when it is
 * not `small`, or the caller's own `extra` buffer. Caller holds the lock. */
CUresult gp_launch_args(CUfunction f, void **kernelParams, void **extra, uint8_t *small, size_t cap,
                        const void **buf, size_t *n)
{
    gp_fninfo *fi = gp_fn_lookup(f);
    if (!fi)
        return CUDA_ERROR_INVALID_HANDLE;
    if (kernelParams || !extra) {
        if (!fi->have_layout)
            return CUDA_ERROR_INVALID_IMAGE;
        uint8_t *b = fi->param_bytes <= cap ? small : malloc(fi->param_bytes);
        if (!b)
            return CUDA_ERROR_OUT_OF_MEMORY;
        gp_fn_pack(fi, kernelParams, b);
        *buf = b;
        *n = fi->param_bytes;
        return CUDA_SUCCESS;
    }
    const void *p = NULL;
    size_t len = 0;
    for (int i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
            p = extra[i + 1];
        else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
            len = *(const size_t *)extra[i + 1];
        else
            return CUDA_ERROR_INVALID_VALUE;
    }
    if (!p && len)
        return CUDA_ERROR_INVALID_VALUE;
    *buf = p;
    *n = len;
    return CUDA_SUCCESS;
}
