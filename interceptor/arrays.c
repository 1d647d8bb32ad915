/* Copies to and from CUDA arrays (cuda.h, CUDA_MEMCPY3D with
 * CU_MEMORYTYPE_ARRAY; cuMemcpyHtoA/AtoH/DtoA/AtoD/AtoA), on the shim's side.
 *
 * Array memory exists only in proxyd's worker (proxyd/arrays.py): a copy
 * with an array on one side is one cuMemcpy3D op whose descriptor names the
 * array by its proxyd handle and the other side by a device address. A host
 * side is staged through a temporary device allocation: the host rows go
 * there (or come back from there) through the ordinary 2D/3D copy path of
 * copy2d.c, so the bytes travel the same way as every other host copy. An
 * asynchronous copy with a host side first waits for its stream (work before
 * it may still use the array), then runs synchronously, which the API allows
 * ("may be asynchronous"); one between device memory and an array stays in
 * stream order in proxyd.
 *
 * Locking: the whole copy holds gp_lock (recursive), so that the staging
 * allocation, the op and the free are not interleaved with another thread's
 * calls. */
#include <string.h>

#include "gp_gen.h"
#include "gp_shim.h"

CUresult cuMemcpy3D_v2_ptds(const CUDA_MEMCPY3D *);
CUresult cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D *, CUstream);
CUresult cuStreamSynchronize_ptsz(CUstream);
CUresult gp_linear_copy3d(const CUDA_MEMCPY3D *c, CUstream st, int async, int per_thread);   /* copy2d.c */

static int is_host(CUmemorytype t, const void *host, CUdeviceptr dev)
{
    if (t == CU_MEMORYTYPE_UNIFIED)
        return !gp_is_device_ptr((const void *)(uintptr_t)dev);
    (void)host;
    return t == CU_MEMORYTYPE_HOST;
}

/* The op: [descriptor] or [descriptor, stream]; every side is an array or
 * device memory. */
static CUresult send_copy(const CUDA_MEMCPY3D *c, CUstream st, int async, int per_thread)
{
    uint32_t fid = async ? (per_thread ? GP_FID_cuMemcpy3DAsync_v2_ptsz : GP_FID_cuMemcpy3DAsync_v2)
                         : (per_thread ? GP_FID_cuMemcpy3D_v2_ptds : GP_FID_cuMemcpy3D_v2);
    gp_buf *b = gp_op_begin(fid, async ? 2 : 1);
    gp_put_data(b, c, sizeof *c, 1);
    if (async)
        gp_put_handle(b, st);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    gp_reply_done(&r);
    return rc;
}

CUresult gp_array_copy3d(const CUDA_MEMCPY3D *c, CUstream st, int async, int per_thread)
{
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    if (c->srcLOD || c->dstLOD) {
        gp_warn_unsupported("cuMemcpy3D (mipmap levels)");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    int sh = is_host(c->srcMemoryType, c->srcHost, c->srcDevice);
    int dh = is_host(c->dstMemoryType, c->dstHost, c->dstDevice);
    size_t depth = c->Depth ? c->Depth : 1, height = c->Height ? c->Height : 1;
    CUDA_MEMCPY3D op = *c;
    op.Depth = depth;
    op.Height = height;
    if (c->srcMemoryType == CU_MEMORYTYPE_UNIFIED && !sh)
        op.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    if (c->dstMemoryType == CU_MEMORYTYPE_UNIFIED && !dh)
        op.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    if (!sh && !dh) {
        GP_ENTER();
        GP_LEAVE(send_copy(&op, st, async, per_thread));
    }
    if (sh && dh)
        return CUDA_ERROR_INVALID_VALUE;     /* an array copy with two host sides cannot be */
    size_t bytes = c->WidthInBytes * height * depth;
    if (!bytes)
        return CUDA_SUCCESS;
    GP_ENTER();
    CUresult rc = CUDA_SUCCESS;
    if (async)
        rc = per_thread ? cuStreamSynchronize_ptsz(st) : cuStreamSynchronize(st);
    CUdeviceptr tmp = 0;
    if (rc == CUDA_SUCCESS)
        rc = cuMemAlloc_v2(&tmp, bytes);
    if (rc != CUDA_SUCCESS)
        GP_LEAVE(rc);
    /* the host side as it is, and the staging buffer: tightly packed rows */
    CUDA_MEMCPY3D lin;
    memset(&lin, 0, sizeof lin);
    lin.WidthInBytes = c->WidthInBytes;
    lin.Height = height;
    lin.Depth = depth;
    if (sh) {
        lin.srcXInBytes = c->srcXInBytes; lin.srcY = c->srcY; lin.srcZ = c->srcZ;
        lin.srcMemoryType = CU_MEMORYTYPE_HOST;
        lin.srcHost = c->srcMemoryType == CU_MEMORYTYPE_UNIFIED ? (const void *)(uintptr_t)c->srcDevice : c->srcHost;
        lin.srcPitch = c->srcPitch; lin.srcHeight = c->srcHeight;
        lin.dstMemoryType = CU_MEMORYTYPE_DEVICE;
        lin.dstDevice = tmp; lin.dstPitch = c->WidthInBytes; lin.dstHeight = height;
        rc = gp_linear_copy3d(&lin, NULL, 0, per_thread);
        op.srcXInBytes = op.srcY = op.srcZ = 0;
        op.srcMemoryType = CU_MEMORYTYPE_DEVICE;
        op.srcHost = NULL;
        op.srcDevice = tmp; op.srcPitch = c->WidthInBytes; op.srcHeight = height;
        if (rc == CUDA_SUCCESS)
            rc = send_copy(&op, NULL, 0, per_thread);
    } else {
        op.dstXInBytes = op.dstY = op.dstZ = 0;
        op.dstMemoryType = CU_MEMORYTYPE_DEVICE;
        op.dstHost = NULL;
        op.dstDevice = tmp; op.dstPitch = c->WidthInBytes; op.dstHeight = height;
        rc = send_copy(&op, NULL, 0, per_thread);
        lin.srcMemoryType = CU_MEMORYTYPE_DEVICE;
        lin.srcDevice = tmp; lin.srcPitch = c->WidthInBytes; lin.srcHeight = height;
        lin.dstXInBytes = c->dstXInBytes; lin.dstY = c->dstY; lin.dstZ = c->dstZ;
        lin.dstMemoryType = CU_MEMORYTYPE_HOST;
        lin.dstHost = c->dstMemoryType == CU_MEMORYTYPE_UNIFIED ? (void *)(uintptr_t)c->dstDevice : c->dstHost;
        lin.dstPitch = c->dstPitch; lin.dstHeight = c->dstHeight;
        if (rc == CUDA_SUCCESS)
            rc = gp_linear_copy3d(&lin, NULL, 0, per_thread);
    }
    CUresult fr = cuMemFree_v2(tmp);
    GP_LEAVE(rc != CUDA_SUCCESS ? rc : fr);
}

/* cuMemcpyHtoA & co. (cuda.h): an offset in bytes into a 1D array, or for
 * a 2D array into its first row; ByteCount bytes on one row. */
static void one_row(CUDA_MEMCPY3D *c, size_t bytes)
{
    memset(c, 0, sizeof *c);
    c->WidthInBytes = bytes;
    c->Height = 1;
    c->Depth = 1;
}

#define ARRAY_COPIES(SFX, PT)                                                                                   \
    CUresult gpo_cuMemcpyHtoA_v2##SFX(CUarray dst, size_t off, const void *src, size_t n)                       \
    {                                                                                                            \
        CUDA_MEMCPY3D c;                                                                                         \
        one_row(&c, n);                                                                                          \
        c.srcMemoryType = CU_MEMORYTYPE_HOST; c.srcHost = src;                                                   \
        c.dstMemoryType = CU_MEMORYTYPE_ARRAY; c.dstArray = dst; c.dstXInBytes = off;                            \
        return gp_array_copy3d(&c, NULL, 0, PT);                                                                 \
    }                                                                                                            \
    CUresult gpo_cuMemcpyAtoH_v2##SFX(void *dst, CUarray src, size_t off, size_t n)                             \
    {                                                                                                            \
        CUDA_MEMCPY3D c;                                                                                         \
        one_row(&c, n);                                                                                          \
        c.srcMemoryType = CU_MEMORYTYPE_ARRAY; c.srcArray = src; c.srcXInBytes = off;                            \
        c.dstMemoryType = CU_MEMORYTYPE_HOST; c.dstHost = dst;                                                   \
        return gp_array_copy3d(&c, NULL, 0, PT);                                                                 \
    }                                                                                                            \
    CUresult gpo_cuMemcpyDtoA_v2##SFX(CUarray dst, size_t off, CUdeviceptr src, size_t n)                       \
    {                                                                                                            \
        CUDA_MEMCPY3D c;                                                                                         \
        one_row(&c, n);                                                                                          \
        c.srcMemoryType = CU_MEMORYTYPE_DEVICE; c.srcDevice = src;                                               \
        c.dstMemoryType = CU_MEMORYTYPE_ARRAY; c.dstArray = dst; c.dstXInBytes = off;                            \
        return gp_array_copy3d(&c, NULL, 0, PT);                                                                 \
    }                                                                                                            \
    CUresult gpo_cuMemcpyAtoD_v2##SFX(CUdeviceptr dst, CUarray src, size_t off, size_t n)                       \
    {                                                                                                            \
        CUDA_MEMCPY3D c;                                                                                         \
        one_row(&c, n);                                                                                          \
        c.srcMemoryType = CU_MEMORYTYPE_ARRAY; c.srcArray = src; c.srcXInBytes = off;                            \
        c.dstMemoryType = CU_MEMORYTYPE_DEVICE; c.dstDevice = dst;                                               \
        return gp_array_copy3d(&c, NULL, 0, PT);                                                                 \
    }                                                                                                            \
    CUresult gpo_cuMemcpyAtoA_v2##SFX(CUarray dst, size_t doff, CUarray src, size_t soff, size_t n)             \
    {                                                                                                            \
        CUDA_MEMCPY3D c;                                                                                         \
        one_row(&c, n);                                                                                          \
        c.srcMemoryType = CU_MEMORYTYPE_ARRAY; c.srcArray = src; c.srcXInBytes = soff;                           \
        c.dstMemoryType = CU_MEMORYTYPE_ARRAY; c.dstArray = dst; c.dstXInBytes = doff;                           \
        return gp_array_copy3d(&c, NULL, 0, PT);                                                                 \
    }
ARRAY_COPIES(, 0)
ARRAY_COPIES(_ptds, 1)

#define ARRAY_ASYNC(SFX, PT)                                                                                    \
    CUresult gpo_cuMemcpyHtoAAsync_v2##SFX(CUarray dst, size_t off, const void *src, size_t n, CUstream s)      \
    {                                                                                                            \
        CUDA_MEMCPY3D c;                                                                                         \
        one_row(&c, n);                                                                                          \
        c.srcMemoryType = CU_MEMORYTYPE_HOST; c.srcHost = src;                                                   \
        c.dstMemoryType = CU_MEMORYTYPE_ARRAY; c.dstArray = dst; c.dstXInBytes = off;                            \
        return gp_array_copy3d(&c, s, 1, PT);                                                                    \
    }                                                                                                            \
    CUresult gpo_cuMemcpyAtoHAsync_v2##SFX(void *dst, CUarray src, size_t off, size_t n, CUstream s)            \
    {                                                                                                            \
        CUDA_MEMCPY3D c;                                                                                         \
        one_row(&c, n);                                                                                          \
        c.srcMemoryType = CU_MEMORYTYPE_ARRAY; c.srcArray = src; c.srcXInBytes = off;                            \
        c.dstMemoryType = CU_MEMORYTYPE_HOST; c.dstHost = dst;                                                   \
        return gp_array_copy3d(&c, s, 1, PT);                                                                    \
    }
ARRAY_ASYNC(, 0)
ARRAY_ASYNC(_ptsz, 1)
