/* The driver API's deprecated execution control and context usage counts,
 * which pycuda still calls on every launch (it sets the block shape with
 * cuFuncSetBlockShape before cuLaunchKernel) and at context teardown
 * (cuCtxDetach). Semantics follow cuda.h's documentation of each function
 * ("Execution Control [DEPRECATED]", cuCtxAttach/cuCtxDetach).
 *
 * All of it is client-side state: the block shape, dynamic shared memory
 * size and parameter buffer of each function live in its gp_fninfo, and
 * cuLaunch/cuLaunchGrid(Async) become an ordinary launch with that packed
 * buffer, so proxyd and the checkpoint image see nothing new (a restored
 * process keeps the state in its own memory).
 *
 * Locking: under gp_lock, like the function table. */
#include "gp_context.h"
#include "gp_funcs.h"
#include "gp_transport.h"
#include "gp_gen.h"

#include <stdlib.h>
#include <string.h>

/* proxyd's per-launch parameter limit is the driver's: 32764 bytes of kernel
 * parameters on CUDA 12.1+ (cuda.h, cuLaunchKernel). */
#define GP_LEGACY_PARAM_MAX 32764u

CUresult gp_launch(uint32_t fid, CUfunction f, const unsigned grid[3], const unsigned block[3],
                   unsigned shmem, CUstream stream, const void *params, size_t nbytes);

static gp_fninfo *fn_locked(CUfunction f)
{
    gp_lock();
    gp_fninfo *fi = gp_fn_lookup(f);
    if (!fi)
        gp_unlock();
    return fi;
}

CUresult gpo_cuFuncSetBlockShape(CUfunction hfunc, int x, int y, int z)
{
    if (x <= 0 || y <= 0 || z <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    gp_fninfo *fi = fn_locked(hfunc);
    if (!fi)
        return CUDA_ERROR_INVALID_HANDLE;
    fi->legacy_block[0] = x;
    fi->legacy_block[1] = y;
    fi->legacy_block[2] = z;
    gp_unlock();
    return CUDA_SUCCESS;
}

CUresult gpo_cuFuncSetSharedSize(CUfunction hfunc, unsigned int bytes)
{
    gp_fninfo *fi = fn_locked(hfunc);
    if (!fi)
        return CUDA_ERROR_INVALID_HANDLE;
    fi->legacy_shared = bytes;
    gp_unlock();
    return CUDA_SUCCESS;
}

CUresult gpo_cuParamSetSize(CUfunction hfunc, unsigned int numbytes)
{
    if (numbytes > GP_LEGACY_PARAM_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    gp_fninfo *fi = fn_locked(hfunc);
    if (!fi)
        return CUDA_ERROR_INVALID_HANDLE;
    uint8_t *p = realloc(fi->legacy_params, numbytes ? numbytes : 1);
    if (!p) {
        gp_unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (numbytes > fi->legacy_param_size)
        memset(p + fi->legacy_param_size, 0, numbytes - fi->legacy_param_size);
    fi->legacy_params = p;
    fi->legacy_param_size = numbytes;
    gp_unlock();
    return CUDA_SUCCESS;
}

static CUresult param_set(CUfunction hfunc, int offset, const void *src, unsigned n)
{
    if (offset < 0 || (n && !src))
        return CUDA_ERROR_INVALID_VALUE;
    gp_fninfo *fi = fn_locked(hfunc);
    if (!fi)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = CUDA_SUCCESS;
    /* The buffer is sized by cuParamSetSize; writes past it are the caller's error. */
    if ((uint64_t)offset + n > fi->legacy_param_size)
        rc = CUDA_ERROR_INVALID_VALUE;
    else
        memcpy(fi->legacy_params + offset, src, n);
    gp_unlock();
    return rc;
}

CUresult gpo_cuParamSeti(CUfunction hfunc, int offset, unsigned int value)
{
    return param_set(hfunc, offset, &value, sizeof value);
}

CUresult gpo_cuParamSetf(CUfunction hfunc, int offset, float value)
{
    return param_set(hfunc, offset, &value, sizeof value);
}

CUresult gpo_cuParamSetv(CUfunction hfunc, int offset, void *ptr, unsigned int numbytes)
{
    return param_set(hfunc, offset, ptr, numbytes);
}

static CUresult legacy_launch(CUfunction f, int gw, int gh, CUstream s)
{
    if (gw <= 0 || gh <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    gp_lock();
    CUresult rc = gp_session();
    if (rc != CUDA_SUCCESS) {
        gp_unlock();
        return rc;
    }
    gp_fninfo *fi = gp_fn_lookup(f);
    if (!fi) {
        gp_unlock();
        return CUDA_ERROR_INVALID_HANDLE;
    }
    /* A launch needs a block shape (cuLaunch: "the block shape ... set by
     * cuFuncSetBlockShape"); without one the configuration is invalid. */
    if (fi->legacy_block[0] <= 0) {
        gp_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    const unsigned grid[3] = { (unsigned)gw, (unsigned)gh, 1 };
    const unsigned block[3] = { (unsigned)fi->legacy_block[0], (unsigned)fi->legacy_block[1],
                                (unsigned)fi->legacy_block[2] };
    rc = gp_launch(GP_FID_cuLaunchKernel, f, grid, block, fi->legacy_shared, s, fi->legacy_params,
                   fi->legacy_param_size);
    gp_unlock();
    return rc;
}

CUresult gpo_cuLaunch(CUfunction f) { return legacy_launch(f, 1, 1, NULL); }

CUresult gpo_cuLaunchGrid(CUfunction f, int grid_width, int grid_height)
{
    return legacy_launch(f, grid_width, grid_height, NULL);
}

CUresult gpo_cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height, CUstream hStream)
{
    return legacy_launch(f, grid_width, grid_height, hStream);
}

/* ---------------------------------------------------- context usage counts */

CUresult gpo_cuCtxAttach(CUcontext *pctx, unsigned int flags)
{
    if (!pctx || flags != 0)   /* cuda.h: "flags: Context attach flags (must be 0)" */
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = gp_ctx_current();
    if (!c || gp_ctx_add_use(c, 1) < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    *pctx = c;
    return CUDA_SUCCESS;
}

CUresult gpo_cuCtxDetach(CUcontext ctx)
{
    /* cuda.h: ctx "must be current to the calling thread". */
    if (!ctx || ctx != gp_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    int uses = gp_ctx_add_use(ctx, -1);
    if (uses < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (uses > 0)
        return CUDA_SUCCESS;
    return gpo_cuCtxDestroy_v2(ctx);
}
