/* Pitched memory in the shim: cuMemAllocPitch, cuMemcpy2D/3D (and their
 * async and unaligned forms), built on the shim's linear allocations and
 * copies. pycuda uses all of them (its mem_alloc_pitch, Memcpy2D/Memcpy3D
 * objects). The 2D memsets (cuMemsetD2D*) are one op each, generated from
 * the spec and run by proxyd's memset2d handler (proxyd/families/memory.py).
 *
 * A 2D/3D copy is one linear copy when both sides are contiguous over the
 * whole region (pitch == width), else one linear copy per row: every row
 * goes through the same path as cuMemcpyHtoD & co., so proxyd, the async
 * batching and checkpoints see ordinary copies. Copies with a CUDA array
 * (CU_MEMORYTYPE_ARRAY) on either side are at the end of this file. Semantics
 * follow cuda.h's CUDA_MEMCPY2D / CUDA_MEMCPY3D documentation. */
#include "gp_shim.h"
#include "gp_gen.h"

#include <string.h>

/* The pitch granularity that cuMemAllocPitch returns on current GPUs (it
 * rounds rows to the device's pitch alignment; 512 bytes covers every
 * CUDA 13 device's texturePitchAlignment and keeps rows coalesced). */
#define GP_PITCH_ALIGN 512u

/* Per-thread-default-stream entry points of the linear copies
 * (exported by this library; cuda.h declares them only when
 * CUDA_API_PER_THREAD_DEFAULT_STREAM is set). The _ptds/_ptsz 2D/3D variants
 * use them so that their rows go to the same default stream. */
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2_ptds(void *, CUdeviceptr, size_t);
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr, const void *, size_t, CUstream);
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr, CUdeviceptr, size_t, CUstream);
CUresult cuStreamSynchronize_ptsz(CUstream);

CUresult gpo_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                unsigned int ElementSizeBytes)
{
    /* cuda.h: ElementSizeBytes "may be 4, 8 or 16" */
    if (!dptr || !pPitch || !WidthInBytes || !Height ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = (WidthInBytes + GP_PITCH_ALIGN - 1) / GP_PITCH_ALIGN * GP_PITCH_ALIGN;
    CUresult rc = cuMemAlloc_v2(dptr, pitch * Height);
    if (rc == CUDA_SUCCESS)
        *pPitch = pitch;
    return rc;
}

typedef struct side {
    int per_thread;         /* the copy is a _ptds/_ptsz variant */
    CUmemorytype type;
    const void *host;
    CUdeviceptr dev;
    size_t pitch, height;   /* height: rows per slice (3D) */
} side;

static int resolve_side(CUmemorytype t, const void *host, CUdeviceptr dev, CUarray arr, side *s)
{
    if (t == CU_MEMORYTYPE_UNIFIED) {
        /* a unified address is a device address or a host address; gpuproxy's
         * device addresses are the session's arena (gp_shim.h range table) */
        t = gp_is_device_ptr((const void *)(uintptr_t)dev) ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
        host = (const void *)(uintptr_t)dev;
    }
    if (t == CU_MEMORYTYPE_ARRAY || arr)
        return -1;
    s->type = t;
    s->host = host;
    s->dev = dev;
    return 0;
}

/* One linear piece: n bytes at byte offset so/do of each side. */
static CUresult piece(const side *src, size_t so, const side *dst, size_t dof, size_t n, CUstream st, int async)
{
    int sh = src->type == CU_MEMORYTYPE_HOST, dh = dst->type == CU_MEMORYTYPE_HOST;
    if (src->per_thread) {
        const char *sp = (const char *)src->host + so;
        char *dp = (char *)dst->host + dof;
        if (sh && dh) {
            CUresult rc = async ? cuStreamSynchronize_ptsz(st) : CUDA_SUCCESS;
            if (rc == CUDA_SUCCESS)
                memcpy(dp, sp, n);
            return rc;
        }
        if (sh)
            return async ? cuMemcpyHtoDAsync_v2_ptsz(dst->dev + dof, sp, n, st) : cuMemcpyHtoD_v2_ptds(dst->dev + dof, sp, n);
        if (dh)
            return async ? cuMemcpyDtoHAsync_v2_ptsz(dp, src->dev + so, n, st) : cuMemcpyDtoH_v2_ptds(dp, src->dev + so, n);
        return async ? cuMemcpyDtoDAsync_v2_ptsz(dst->dev + dof, src->dev + so, n, st)
                     : cuMemcpyDtoD_v2_ptds(dst->dev + dof, src->dev + so, n);
    }
    if (sh && dh) {
        if (async) {
            CUresult rc = cuStreamSynchronize(st);   /* host copies run in stream order */
            if (rc != CUDA_SUCCESS)
                return rc;
        }
        memcpy((char *)dst->host + dof, (const char *)src->host + so, n);
        return CUDA_SUCCESS;
    }
    if (sh)
        return async ? cuMemcpyHtoDAsync_v2(dst->dev + dof, (const char *)src->host + so, n, st)
                     : cuMemcpyHtoD_v2(dst->dev + dof, (const char *)src->host + so, n);
    if (dh)
        return async ? cuMemcpyDtoHAsync_v2((char *)dst->host + dof, src->dev + so, n, st)
                     : cuMemcpyDtoH_v2((char *)dst->host + dof, src->dev + so, n);
    return async ? cuMemcpyDtoDAsync_v2(dst->dev + dof, src->dev + so, n, st)
                 : cuMemcpyDtoD_v2(dst->dev + dof, src->dev + so, n);
}

/* rows x depth rows of `width` bytes, starting at the given byte offsets. */
static CUresult copy_rows(const side *src, size_t s0, const side *dst, size_t d0, size_t width, size_t rows,
                          size_t depth, CUstream st, int async)
{
    if (!width || !rows || !depth)
        return CUDA_SUCCESS;
    int contiguous = src->pitch == width && dst->pitch == width &&
                     (depth == 1 || (src->height == rows && dst->height == rows));
    if (contiguous)
        return piece(src, s0, dst, d0, width * rows * depth, st, async);
    for (size_t z = 0; z < depth; z++)
        for (size_t y = 0; y < rows; y++) {
            CUresult rc = piece(src, s0 + z * src->height * src->pitch + y * src->pitch, dst,
                                d0 + z * dst->height * dst->pitch + y * dst->pitch, width, st, async);
            if (rc != CUDA_SUCCESS)
                return rc;
        }
    return CUDA_SUCCESS;
}

static CUresult array_copy3d(const CUDA_MEMCPY3D *c, CUstream st, int async, int per_thread);   /* below */

static int has_array(CUmemorytype s, CUmemorytype d)
{
    return s == CU_MEMORYTYPE_ARRAY || d == CU_MEMORYTYPE_ARRAY;
}

static CUresult copy2d(const CUDA_MEMCPY2D *c, CUstream st, int async, int per_thread, const char *who)
{
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    if (has_array(c->srcMemoryType, c->dstMemoryType)) {
        /* the 2D copy as a 3D copy of depth 1 (the fields mean the same) */
        CUDA_MEMCPY3D t;
        memset(&t, 0, sizeof t);
        t.srcXInBytes = c->srcXInBytes; t.srcY = c->srcY; t.srcMemoryType = c->srcMemoryType;
        t.srcHost = c->srcHost; t.srcDevice = c->srcDevice; t.srcArray = c->srcArray; t.srcPitch = c->srcPitch;
        t.dstXInBytes = c->dstXInBytes; t.dstY = c->dstY; t.dstMemoryType = c->dstMemoryType;
        t.dstHost = c->dstHost; t.dstDevice = c->dstDevice; t.dstArray = c->dstArray; t.dstPitch = c->dstPitch;
        t.WidthInBytes = c->WidthInBytes; t.Height = c->Height; t.Depth = 1;
        return array_copy3d(&t, st, async, per_thread);
    }
    side s = { .per_thread = per_thread }, d = { .per_thread = per_thread };
    if (resolve_side(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcArray, &s) ||
        resolve_side(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstArray, &d)) {
        gp_warn_unsupported(who);   /* CUDA arrays */
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    /* cuda.h: a pitch of 0 means tightly packed rows (WidthInBytes) */
    s.pitch = c->srcPitch ? c->srcPitch : c->WidthInBytes;
    d.pitch = c->dstPitch ? c->dstPitch : c->WidthInBytes;
    if (s.pitch < c->WidthInBytes || d.pitch < c->WidthInBytes)
        return CUDA_ERROR_INVALID_VALUE;
    s.height = d.height = c->Height;
    return copy_rows(&s, c->srcY * s.pitch + c->srcXInBytes, &d, c->dstY * d.pitch + c->dstXInBytes,
                     c->WidthInBytes, c->Height, 1, st, async);
}

static CUresult copy3d(const CUDA_MEMCPY3D *c, CUstream st, int async, int per_thread, const char *who)
{
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    if (has_array(c->srcMemoryType, c->dstMemoryType))
        return array_copy3d(c, st, async, per_thread);
    side s = { .per_thread = per_thread }, d = { .per_thread = per_thread };
    if (resolve_side(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcArray, &s) ||
        resolve_side(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstArray, &d) ||
        c->srcLOD || c->dstLOD) {
        gp_warn_unsupported(who);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    s.pitch = c->srcPitch ? c->srcPitch : c->WidthInBytes;
    d.pitch = c->dstPitch ? c->dstPitch : c->WidthInBytes;
    s.height = c->srcHeight ? c->srcHeight : c->Height;
    d.height = c->dstHeight ? c->dstHeight : c->Height;
    if (s.pitch < c->WidthInBytes || d.pitch < c->WidthInBytes || s.height < c->Height || d.height < c->Height)
        return CUDA_ERROR_INVALID_VALUE;
    size_t s0 = (c->srcZ * s.height + c->srcY) * s.pitch + c->srcXInBytes;
    size_t d0 = (c->dstZ * d.height + c->dstY) * d.pitch + c->dstXInBytes;
    return copy_rows(&s, s0, &d, d0, c->WidthInBytes, c->Height, c->Depth, st, async);
}

/* linear sides only (array copies stage host memory with it, below) */
static CUresult linear_copy3d(const CUDA_MEMCPY3D *c, CUstream st, int async, int per_thread)
{
    return copy3d(c, st, async, per_thread, "cuMemcpy3D");
}

#define COPY_ENTRY(name, fn, args, call) \
    CUresult gpo_##name args { return fn call; }
COPY_ENTRY(cuMemcpy2D_v2, copy2d, (const CUDA_MEMCPY2D *c), (c, NULL, 0, 0, "cuMemcpy2D (CUDA arrays)"))
COPY_ENTRY(cuMemcpy2D_v2_ptds, copy2d, (const CUDA_MEMCPY2D *c), (c, NULL, 0, 1, "cuMemcpy2D (CUDA arrays)"))
COPY_ENTRY(cuMemcpy2DUnaligned_v2, copy2d, (const CUDA_MEMCPY2D *c),
           (c, NULL, 0, 0, "cuMemcpy2DUnaligned (CUDA arrays)"))
COPY_ENTRY(cuMemcpy2DUnaligned_v2_ptds, copy2d, (const CUDA_MEMCPY2D *c),
           (c, NULL, 0, 1, "cuMemcpy2DUnaligned (CUDA arrays)"))
COPY_ENTRY(cuMemcpy2DAsync_v2, copy2d, (const CUDA_MEMCPY2D *c, CUstream s),
           (c, s, 1, 0, "cuMemcpy2DAsync (CUDA arrays)"))
COPY_ENTRY(cuMemcpy2DAsync_v2_ptsz, copy2d, (const CUDA_MEMCPY2D *c, CUstream s),
           (c, s, 1, 1, "cuMemcpy2DAsync (CUDA arrays)"))
COPY_ENTRY(cuMemcpy3D_v2, copy3d, (const CUDA_MEMCPY3D *c), (c, NULL, 0, 0, "cuMemcpy3D (CUDA arrays)"))
COPY_ENTRY(cuMemcpy3D_v2_ptds, copy3d, (const CUDA_MEMCPY3D *c), (c, NULL, 0, 1, "cuMemcpy3D (CUDA arrays)"))
COPY_ENTRY(cuMemcpy3DAsync_v2, copy3d, (const CUDA_MEMCPY3D *c, CUstream s),
           (c, s, 1, 0, "cuMemcpy3DAsync (CUDA arrays)"))
COPY_ENTRY(cuMemcpy3DAsync_v2_ptsz, copy3d, (const CUDA_MEMCPY3D *c, CUstream s),
           (c, s, 1, 1, "cuMemcpy3DAsync (CUDA arrays)"))


/* cuMemsetD2D*: Height rows of Width elements, rows dstPitch bytes apart.
 * Each is one op (the generated gpg_ body), run by proxyd's memset2d handler
 * in stream order like the 1D memsets; the ops are batched, so what can be
 * checked without the daemon is checked here, where the caller still gets
 * the error from this call: a pitch narrower than a row of several is
 * CUDA_ERROR_INVALID_VALUE (cuda.h, cuMemsetD2D8: "dstPitch ... must be at
 * least Width elements"). An empty memset sends nothing. */
#define MEMSET2D(name, esz, args, call)                                                           \
    CUresult gpo_##name args                                                                          \
    {                                                                                                 \
        if (Width == 0 || Height == 0)                                                                \
            return CUDA_SUCCESS;                                                                      \
        if (Height > 1 && (dstPitch < Width * (esz) || dstPitch % (esz)))                             \
            return CUDA_ERROR_INVALID_VALUE;                                                          \
        return gpg_##name call;                                                                       \
    }
#define MS_SYNC(T) (CUdeviceptr dstDevice, size_t dstPitch, T v, size_t Width, size_t Height)
#define MS_ASYNC(T) (CUdeviceptr dstDevice, size_t dstPitch, T v, size_t Width, size_t Height, CUstream hStream)
#define MS_SYNC_CALL (dstDevice, dstPitch, v, Width, Height)
#define MS_ASYNC_CALL (dstDevice, dstPitch, v, Width, Height, hStream)
MEMSET2D(cuMemsetD2D8_v2, 1, MS_SYNC(unsigned char), MS_SYNC_CALL)
MEMSET2D(cuMemsetD2D16_v2, 2, MS_SYNC(unsigned short), MS_SYNC_CALL)
MEMSET2D(cuMemsetD2D32_v2, 4, MS_SYNC(unsigned int), MS_SYNC_CALL)
MEMSET2D(cuMemsetD2D8_v2_ptds, 1, MS_SYNC(unsigned char), MS_SYNC_CALL)
MEMSET2D(cuMemsetD2D16_v2_ptds, 2, MS_SYNC(unsigned short), MS_SYNC_CALL)
MEMSET2D(cuMemsetD2D32_v2_ptds, 4, MS_SYNC(unsigned int), MS_SYNC_CALL)
MEMSET2D(cuMemsetD2D8Async, 1, MS_ASYNC(unsigned char), MS_ASYNC_CALL)
MEMSET2D(cuMemsetD2D16Async, 2, MS_ASYNC(unsigned short), MS_ASYNC_CALL)
MEMSET2D(cuMemsetD2D32Async, 4, MS_ASYNC(unsigned int), MS_ASYNC_CALL)
MEMSET2D(cuMemsetD2D8Async_ptsz, 1, MS_ASYNC(unsigned char), MS_ASYNC_CALL)
MEMSET2D(cuMemsetD2D16Async_ptsz, 2, MS_ASYNC(unsigned short), MS_ASYNC_CALL)
MEMSET2D(cuMemsetD2D32Async_ptsz, 4, MS_ASYNC(unsigned int), MS_ASYNC_CALL)

/* ------------------------------------------------------------ CUDA arrays
 * (Once arrays.c; in one file with the 2D/3D copies because each needs
 * the other: a copy with an array side comes here, and the host side of
 * one is staged through the linear copies above.)
 *
 * Copies to and from CUDA arrays (cuda.h, CUDA_MEMCPY3D with
 * CU_MEMORYTYPE_ARRAY; cuMemcpyHtoA/AtoH/DtoA/AtoD/AtoA), on the shim's side.
 *
 * Array memory exists only in proxyd's worker (proxyd/arrays.py): a copy
 * with an array on one side is one cuMemcpy3D op whose descriptor names the
 * array by its proxyd handle and the other side by a device address. A host
 * side is staged through a temporary device allocation: the host rows go
 * there (or come back from there) through the ordinary 2D/3D copy path
 * above (linear_copy3d), so the bytes travel the same way as every other
 * host copy. An
 * asynchronous copy with a host side first waits for its stream (work before
 * it may still use the array), then runs synchronously, which the API allows
 * ("may be asynchronous"); one between device memory and an array stays in
 * stream order in proxyd.
 *
 * Locking: the whole copy holds gp_lock (recursive), so that the staging
 * allocation, the op and the free are not interleaved with another thread's
 * calls. */
CUresult cuMemcpy3D_v2_ptds(const CUDA_MEMCPY3D *);
CUresult cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D *, CUstream);
CUresult cuStreamSynchronize_ptsz(CUstream);

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

static CUresult array_copy3d(const CUDA_MEMCPY3D *c, CUstream st, int async, int per_thread)
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
        rc = linear_copy3d(&lin, NULL, 0, per_thread);
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
            rc = linear_copy3d(&lin, NULL, 0, per_thread);
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

/* Host memory to an array and back, for the synchronous and the stream-
 * ordered entry points alike. */
static CUresult htoa(CUarray dst, size_t off, const void *src, size_t n, CUstream s, int async, int pt)
{
    CUDA_MEMCPY3D c;
    one_row(&c, n);
    c.srcMemoryType = CU_MEMORYTYPE_HOST; c.srcHost = src;
    c.dstMemoryType = CU_MEMORYTYPE_ARRAY; c.dstArray = dst; c.dstXInBytes = off;
    return array_copy3d(&c, s, async, pt);
}

static CUresult atoh(void *dst, CUarray src, size_t off, size_t n, CUstream s, int async, int pt)
{
    CUDA_MEMCPY3D c;
    one_row(&c, n);
    c.srcMemoryType = CU_MEMORYTYPE_ARRAY; c.srcArray = src; c.srcXInBytes = off;
    c.dstMemoryType = CU_MEMORYTYPE_HOST; c.dstHost = dst;
    return array_copy3d(&c, s, async, pt);
}

#define ARRAY_COPIES(SFX, PT)                                                                                   \
    CUresult gpo_cuMemcpyHtoA_v2##SFX(CUarray dst, size_t off, const void *src, size_t n)                       \
    {                                                                                                            \
        return htoa(dst, off, src, n, NULL, 0, PT);                                                              \
    }                                                                                                            \
    CUresult gpo_cuMemcpyAtoH_v2##SFX(void *dst, CUarray src, size_t off, size_t n)                             \
    {                                                                                                            \
        return atoh(dst, src, off, n, NULL, 0, PT);                                                              \
    }                                                                                                            \
    CUresult gpo_cuMemcpyDtoA_v2##SFX(CUarray dst, size_t off, CUdeviceptr src, size_t n)                       \
    {                                                                                                            \
        CUDA_MEMCPY3D c;                                                                                         \
        one_row(&c, n);                                                                                          \
        c.srcMemoryType = CU_MEMORYTYPE_DEVICE; c.srcDevice = src;                                               \
        c.dstMemoryType = CU_MEMORYTYPE_ARRAY; c.dstArray = dst; c.dstXInBytes = off;                            \
        return array_copy3d(&c, NULL, 0, PT);                                                                    \
    }                                                                                                            \
    CUresult gpo_cuMemcpyAtoD_v2##SFX(CUdeviceptr dst, CUarray src, size_t off, size_t n)                       \
    {                                                                                                            \
        CUDA_MEMCPY3D c;                                                                                         \
        one_row(&c, n);                                                                                          \
        c.srcMemoryType = CU_MEMORYTYPE_ARRAY; c.srcArray = src; c.srcXInBytes = off;                            \
        c.dstMemoryType = CU_MEMORYTYPE_DEVICE; c.dstDevice = dst;                                               \
        return array_copy3d(&c, NULL, 0, PT);                                                                    \
    }                                                                                                            \
    CUresult gpo_cuMemcpyAtoA_v2##SFX(CUarray dst, size_t doff, CUarray src, size_t soff, size_t n)             \
    {                                                                                                            \
        CUDA_MEMCPY3D c;                                                                                         \
        one_row(&c, n);                                                                                          \
        c.srcMemoryType = CU_MEMORYTYPE_ARRAY; c.srcArray = src; c.srcXInBytes = soff;                           \
        c.dstMemoryType = CU_MEMORYTYPE_ARRAY; c.dstArray = dst; c.dstXInBytes = doff;                           \
        return array_copy3d(&c, NULL, 0, PT);                                                                    \
    }
ARRAY_COPIES(, 0)
ARRAY_COPIES(_ptds, 1)

#define ARRAY_ASYNC(SFX, PT)                                                                                    \
    CUresult gpo_cuMemcpyHtoAAsync_v2##SFX(CUarray dst, size_t off, const void *src, size_t n, CUstream s)      \
    {                                                                                                            \
        return htoa(dst, off, src, n, s, 1, PT);                                                                 \
    }                                                                                                            \
    CUresult gpo_cuMemcpyAtoHAsync_v2##SFX(void *dst, CUarray src, size_t off, size_t n, CUstream s)            \
    {                                                                                                            \
        return atoh(dst, src, off, n, s, 1, PT);                                                                 \
    }
ARRAY_ASYNC(, 0)
ARRAY_ASYNC(_ptsz, 1)
