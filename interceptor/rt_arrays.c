/* The runtime's CUDA arrays, array copies, texture and surface objects, on
 * the driver API (cuda_runtime_api.h, "Memory Management", "Texture Object
 * Management", "Surface Object Management"). cudaArray_t is the driver's
 * CUarray (a proxyd handle here); texture and surface objects are the
 * driver's values, which kernels receive as they are.
 *
 * Runtime descriptors differ from the driver's: a channel descriptor
 * (bits per channel and a kind) stands for a CUarray_format and a channel
 * count; cudaTextureDesc's readMode, normalizedCoords, sRGB and flags
 * become CUDA_TEXTURE_DESC.flags (cuda.h, CU_TRSF_*); positions and widths of
 * cudaMemcpy3D are in elements on an array side and in bytes on a linear
 * one. cudaResourceViewDesc and CUDA_RESOURCE_VIEW_DESC have the same layout
 * and values.
 *
 * Locking: each driver call takes gp_lock itself. */
#include <string.h>

#include "gp_rt.h"

CUresult cuMemcpy3D_v2_ptds(const CUDA_MEMCPY3D *);
CUresult cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D *, CUstream);

/* ------------------------------------------------------ channel formats */

struct cudaChannelFormatDesc gpo_cudaCreateChannelDesc(int x, int y, int z, int w, enum cudaChannelFormatKind f)
{
    struct cudaChannelFormatDesc d = { x, y, z, w, f };
    return d;
}

/* channel descriptor -> driver format and channel count; 0 if it has none */
static int to_format(const struct cudaChannelFormatDesc *d, CUarray_format *fmt, unsigned *channels)
{
    int bits[4] = { d->x, d->y, d->z, d->w };
    unsigned n = 0;
    while (n < 4 && bits[n])
        n++;
    if (n == 0 || n == 3)
        return 0;
    for (unsigned i = 1; i < 4; i++)
        if ((i < n && bits[i] != bits[0]) || (i >= n && bits[i]))
            return 0;
    switch (d->f) {
    case cudaChannelFormatKindSigned:
        *fmt = bits[0] == 8 ? CU_AD_FORMAT_SIGNED_INT8 : bits[0] == 16 ? CU_AD_FORMAT_SIGNED_INT16
             : bits[0] == 32 ? CU_AD_FORMAT_SIGNED_INT32 : (CUarray_format)0;
        break;
    case cudaChannelFormatKindUnsigned:
        *fmt = bits[0] == 8 ? CU_AD_FORMAT_UNSIGNED_INT8 : bits[0] == 16 ? CU_AD_FORMAT_UNSIGNED_INT16
             : bits[0] == 32 ? CU_AD_FORMAT_UNSIGNED_INT32 : (CUarray_format)0;
        break;
    case cudaChannelFormatKindFloat:
        *fmt = bits[0] == 16 ? CU_AD_FORMAT_HALF : bits[0] == 32 ? CU_AD_FORMAT_FLOAT : (CUarray_format)0;
        break;
    default:
        *fmt = (CUarray_format)0;
    }
    *channels = n;
    return *fmt != 0;
}

static int format_bits(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 8;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 16;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 32;
    default: return 0;
    }
}

static struct cudaChannelFormatDesc from_format(CUarray_format f, unsigned n)
{
    int b = format_bits(f);
    enum cudaChannelFormatKind k = (f == CU_AD_FORMAT_HALF || f == CU_AD_FORMAT_FLOAT) ? cudaChannelFormatKindFloat
                                 : (f == CU_AD_FORMAT_SIGNED_INT8 || f == CU_AD_FORMAT_SIGNED_INT16 ||
                                    f == CU_AD_FORMAT_SIGNED_INT32) ? cudaChannelFormatKindSigned
                                 : cudaChannelFormatKindUnsigned;
    struct cudaChannelFormatDesc d = { b, n > 1 ? b : 0, n > 2 ? b : 0, n > 3 ? b : 0, k };
    return d;
}

static int is_float_format(CUarray_format f) { return f == CU_AD_FORMAT_HALF || f == CU_AD_FORMAT_FLOAT; }

/* ------------------------------------------------------------- arrays */

/* The driver's descriptor of an array (or of a mipmapped array's level 0):
 * 0, or the channel descriptor has no CUarray_format. */
static int array_desc(const struct cudaChannelFormatDesc *desc, struct cudaExtent extent, unsigned int flags,
                      CUDA_ARRAY3D_DESCRIPTOR *a)
{
    memset(a, 0, sizeof *a);
    if (!to_format(desc, &a->Format, &a->NumChannels))
        return 0;
    a->Width = extent.width;
    a->Height = extent.height;
    a->Depth = extent.depth;
    a->Flags = flags;     /* cudaArrayLayered/SurfaceLoadStore/TextureGather are CUDA_ARRAY3D_* */
    return 1;
}

static cudaError_t malloc_array(cudaArray_t *array, const struct cudaChannelFormatDesc *desc, size_t w, size_t h,
                                size_t d, unsigned int flags)
{
    if (!array || !desc)
        return gp_rt_ret(cudaErrorInvalidValue);
    CUDA_ARRAY3D_DESCRIPTOR a;
    if (!array_desc(desc, (struct cudaExtent){ w, h, d }, flags, &a))
        return gp_rt_ret(cudaErrorInvalidChannelDescriptor);
    RT_INIT();
    RT_RETURN_CU(cuArray3DCreate((CUarray *)array, &a));
}

cudaError_t gpo_cudaMallocArray(cudaArray_t *array, const struct cudaChannelFormatDesc *desc, size_t width,
                                size_t height, unsigned int flags)
{
    return malloc_array(array, desc, width, height, 0, flags);
}

cudaError_t gpo_cudaMalloc3DArray(cudaArray_t *array, const struct cudaChannelFormatDesc *desc,
                                  struct cudaExtent extent, unsigned int flags)
{
    return malloc_array(array, desc, extent.width, extent.height, extent.depth, flags);
}

/* Mipmapped arrays (CUDA Runtime API, "Memory Management"): on
 * cuMipmappedArrayCreate/GetLevel/Destroy; a level is an ordinary array
 * handle for copies and texture/surface objects (proxyd/arrays.py). */
cudaError_t gpo_cudaMallocMipmappedArray(cudaMipmappedArray_t *mipmappedArray, const struct cudaChannelFormatDesc *desc,
                                         struct cudaExtent extent, unsigned int numLevels, unsigned int flags)
{
    if (!mipmappedArray || !desc)
        return gp_rt_ret(cudaErrorInvalidValue);
    CUDA_ARRAY3D_DESCRIPTOR a;
    if (!array_desc(desc, extent, flags, &a))
        return gp_rt_ret(cudaErrorInvalidChannelDescriptor);
    RT_INIT();
    RT_RETURN_CU(cuMipmappedArrayCreate((CUmipmappedArray *)mipmappedArray, &a, numLevels));
}

cudaError_t gpo_cudaGetMipmappedArrayLevel(cudaArray_t *levelArray, cudaMipmappedArray_const_t mipmappedArray,
                                           unsigned int level)
{
    if (!levelArray)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    RT_RETURN_CU(cuMipmappedArrayGetLevel((CUarray *)levelArray, (CUmipmappedArray)mipmappedArray, level));
}

cudaError_t gpo_cudaFreeMipmappedArray(cudaMipmappedArray_t mipmappedArray)
{
    if (!mipmappedArray)
        return cudaSuccess;
    RT_INIT();
    RT_RETURN_CU(cuMipmappedArrayDestroy((CUmipmappedArray)mipmappedArray));
}

cudaError_t gpo_cudaFreeArray(cudaArray_t array)
{
    if (!array)
        return cudaSuccess;
    RT_INIT();
    RT_RETURN_CU(cuArrayDestroy((CUarray)array));
}

cudaError_t gpo_cudaArrayGetInfo(struct cudaChannelFormatDesc *desc, struct cudaExtent *extent, unsigned int *flags,
                                 cudaArray_t array)
{
    RT_INIT();
    CUDA_ARRAY3D_DESCRIPTOR a;
    CUresult r = cuArray3DGetDescriptor(&a, (CUarray)array);
    if (r != CUDA_SUCCESS)
        RT_RETURN_CU(r);
    if (desc)
        *desc = from_format(a.Format, a.NumChannels);
    if (extent) {
        extent->width = a.Width;
        extent->height = a.Height;
        extent->depth = a.Depth;
    }
    if (flags)
        *flags = a.Flags;
    return cudaSuccess;
}

cudaError_t gpo_cudaGetChannelDesc(struct cudaChannelFormatDesc *desc, cudaArray_const_t array)
{
    if (!desc)
        return gp_rt_ret(cudaErrorInvalidValue);
    return gpo_cudaArrayGetInfo(desc, NULL, NULL, (cudaArray_t)array);
}

/* bytes per element of an array (0: not an array) */
static size_t elem_size(cudaArray_const_t array)
{
    CUDA_ARRAY3D_DESCRIPTOR a;
    if (cuArray3DGetDescriptor(&a, (CUarray)array) != CUDA_SUCCESS)
        return 0;
    return (size_t)format_bits(a.Format) / 8 * a.NumChannels;
}

/* ------------------------------------------------------------- copies */

/* kind -> whether each side is device memory (cudaMemcpyDefault: from the
 * address, as unified addressing defines it); -1: bad kind */
static int sides(enum cudaMemcpyKind kind, const void *src, const void *dst, int *sdev, int *ddev)
{
    switch (kind) {
    case cudaMemcpyHostToHost: *sdev = 0; *ddev = 0; return 0;
    case cudaMemcpyHostToDevice: *sdev = 0; *ddev = 1; return 0;
    case cudaMemcpyDeviceToHost: *sdev = 1; *ddev = 0; return 0;
    case cudaMemcpyDeviceToDevice: *sdev = 1; *ddev = 1; return 0;
    case cudaMemcpyDefault:
        gp_lock();
        *sdev = src ? gp_is_device_ptr(src) : 1;
        *ddev = dst ? gp_is_device_ptr(dst) : 1;
        gp_unlock();
        return 0;
    default:
        return -1;
    }
}

static void set_linear_src(CUDA_MEMCPY3D *c, const void *p, int dev, size_t pitch, size_t height)
{
    c->srcMemoryType = dev ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
    if (dev)
        c->srcDevice = (CUdeviceptr)(uintptr_t)p;
    else
        c->srcHost = p;
    c->srcPitch = pitch;
    c->srcHeight = height;
}

static void set_linear_dst(CUDA_MEMCPY3D *c, void *p, int dev, size_t pitch, size_t height)
{
    c->dstMemoryType = dev ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
    if (dev)
        c->dstDevice = (CUdeviceptr)(uintptr_t)p;
    else
        c->dstHost = p;
    c->dstPitch = pitch;
    c->dstHeight = height;
}

/* An array side of a copy: x in bytes, y in rows. */
static void set_array_src(CUDA_MEMCPY3D *c, cudaArray_const_t a, size_t x, size_t y)
{
    c->srcMemoryType = CU_MEMORYTYPE_ARRAY;
    c->srcArray = (CUarray)a;
    c->srcXInBytes = x;
    c->srcY = y;
}

static void set_array_dst(CUDA_MEMCPY3D *c, cudaArray_const_t a, size_t x, size_t y)
{
    c->dstMemoryType = CU_MEMORYTYPE_ARRAY;
    c->dstArray = (CUarray)a;
    c->dstXInBytes = x;
    c->dstY = y;
}

static cudaError_t run_copy(CUDA_MEMCPY3D *c, int async, cudaStream_t stream)
{
    int pt = gp_rt_ptds();
    if (async)
        RT_RETURN_CU(pt ? cuMemcpy3DAsync_v2_ptsz(c, gp_rt_stream(stream)) : cuMemcpy3DAsync(c, gp_rt_stream(stream)));
    RT_RETURN_CU(pt ? cuMemcpy3D_v2_ptds(c) : cuMemcpy3D(c));
}

static cudaError_t to_array(cudaArray_t dst, size_t wOffset, size_t hOffset, const void *src, size_t spitch,
                            size_t width, size_t height, enum cudaMemcpyKind kind, int async, cudaStream_t stream)
{
    RT_INIT();
    int sdev, ddev;
    if (sides(kind, src, NULL, &sdev, &ddev) < 0)
        return gp_rt_ret(cudaErrorInvalidMemcpyDirection);
    if (width > spitch)
        return gp_rt_ret(cudaErrorInvalidPitchValue);
    CUDA_MEMCPY3D c;
    memset(&c, 0, sizeof c);
    set_linear_src(&c, src, sdev, spitch, height);
    set_array_dst(&c, dst, wOffset, hOffset);
    c.WidthInBytes = width;
    c.Height = height;
    c.Depth = 1;
    return run_copy(&c, async, stream);
}

static cudaError_t from_array(void *dst, size_t dpitch, cudaArray_const_t src, size_t wOffset, size_t hOffset,
                              size_t width, size_t height, enum cudaMemcpyKind kind, int async, cudaStream_t stream)
{
    RT_INIT();
    int sdev, ddev;
    if (sides(kind, NULL, dst, &sdev, &ddev) < 0)
        return gp_rt_ret(cudaErrorInvalidMemcpyDirection);
    if (width > dpitch)
        return gp_rt_ret(cudaErrorInvalidPitchValue);
    CUDA_MEMCPY3D c;
    memset(&c, 0, sizeof c);
    set_array_src(&c, src, wOffset, hOffset);
    set_linear_dst(&c, dst, ddev, dpitch, height);
    c.WidthInBytes = width;
    c.Height = height;
    c.Depth = 1;
    return run_copy(&c, async, stream);
}

cudaError_t gpo_cudaMemcpy2DToArray(cudaArray_t dst, size_t wOffset, size_t hOffset, const void *src, size_t spitch,
                                    size_t width, size_t height, enum cudaMemcpyKind kind)
{
    return to_array(dst, wOffset, hOffset, src, spitch, width, height, kind, 0, NULL);
}

cudaError_t gpo_cudaMemcpy2DToArrayAsync(cudaArray_t dst, size_t wOffset, size_t hOffset, const void *src,
                                         size_t spitch, size_t width, size_t height, enum cudaMemcpyKind kind,
                                         cudaStream_t stream)
{
    return to_array(dst, wOffset, hOffset, src, spitch, width, height, kind, 1, stream);
}

cudaError_t gpo_cudaMemcpy2DFromArray(void *dst, size_t dpitch, cudaArray_const_t src, size_t wOffset,
                                      size_t hOffset, size_t width, size_t height, enum cudaMemcpyKind kind)
{
    return from_array(dst, dpitch, src, wOffset, hOffset, width, height, kind, 0, NULL);
}

cudaError_t gpo_cudaMemcpy2DFromArrayAsync(void *dst, size_t dpitch, cudaArray_const_t src, size_t wOffset,
                                           size_t hOffset, size_t width, size_t height, enum cudaMemcpyKind kind,
                                           cudaStream_t stream)
{
    return from_array(dst, dpitch, src, wOffset, hOffset, width, height, kind, 1, stream);
}

cudaError_t gpo_cudaMemcpy2DArrayToArray(cudaArray_t dst, size_t wOffsetDst, size_t hOffsetDst,
                                         cudaArray_const_t src, size_t wOffsetSrc, size_t hOffsetSrc, size_t width,
                                         size_t height, enum cudaMemcpyKind kind)
{
    RT_INIT();
    if (kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyDefault)
        return gp_rt_ret(cudaErrorInvalidMemcpyDirection);
    CUDA_MEMCPY3D c;
    memset(&c, 0, sizeof c);
    set_array_src(&c, src, wOffsetSrc, hOffsetSrc);
    set_array_dst(&c, dst, wOffsetDst, hOffsetDst);
    c.WidthInBytes = width;
    c.Height = height;
    c.Depth = 1;
    return run_copy(&c, 0, NULL);
}

/* The deprecated cudaMemcpyToArray family (still exported by CUDA 13):
 * count bytes from (wOffset bytes, hOffset rows) on, continuing on the next
 * row at the end of one (the array read row after row). Split into a
 * partial first row, whole rows (one 2D copy) and a partial last row. */
static size_t row_bytes(cudaArray_const_t array)
{
    CUDA_ARRAY3D_DESCRIPTOR a;
    if (cuArray3DGetDescriptor(&a, (CUarray)array) != CUDA_SUCCESS)
        return 0;
    return (size_t)format_bits(a.Format) / 8 * a.NumChannels * a.Width;
}

typedef cudaError_t (*piece_fn)(void *arg, size_t x, size_t y, size_t off, size_t w, size_t h);

static cudaError_t linear_pieces(cudaArray_const_t array, size_t wOffset, size_t hOffset, size_t count,
                                 piece_fn piece, void *arg)
{
    size_t rb = row_bytes(array);
    if (!rb)
        return cudaErrorInvalidResourceHandle;
    if (wOffset >= rb && count)
        return cudaErrorInvalidValue;
    size_t off = 0, x = wOffset, y = hOffset;
    while (off < count) {
        size_t w = rb - x, h = 1;
        if (x == 0 && count - off >= rb) {
            w = rb;
            h = (count - off) / rb;
        } else if (w > count - off) {
            w = count - off;
        }
        cudaError_t e = piece(arg, x, y, off, w, h);
        if (e != cudaSuccess)
            return e;
        off += w * h;
        y += h;
        x = 0;
    }
    return cudaSuccess;
}

struct lin_copy {
    cudaArray_t arr;
    char *mem;
    enum cudaMemcpyKind kind;
    int to, async;
    cudaStream_t stream;
};

static cudaError_t lin_piece(void *arg, size_t x, size_t y, size_t off, size_t w, size_t h)
{
    struct lin_copy *c = arg;
    if (c->to)
        return to_array(c->arr, x, y, c->mem + off, w, w, h, c->kind, c->async, c->stream);
    return from_array(c->mem + off, w, c->arr, x, y, w, h, c->kind, c->async, c->stream);
}

cudaError_t gpo_cudaMemcpyToArray(cudaArray_t dst, size_t wOffset, size_t hOffset, const void *src, size_t count,
                                  enum cudaMemcpyKind kind)
{
    RT_INIT();
    struct lin_copy c = { dst, (char *)src, kind, 1, 0, NULL };
    return gp_rt_ret(linear_pieces(dst, wOffset, hOffset, count, lin_piece, &c));
}

cudaError_t gpo_cudaMemcpyToArrayAsync(cudaArray_t dst, size_t wOffset, size_t hOffset, const void *src,
                                       size_t count, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    RT_INIT();
    struct lin_copy c = { dst, (char *)src, kind, 1, 1, stream };
    return gp_rt_ret(linear_pieces(dst, wOffset, hOffset, count, lin_piece, &c));
}

cudaError_t gpo_cudaMemcpyFromArray(void *dst, cudaArray_const_t src, size_t wOffset, size_t hOffset, size_t count,
                                    enum cudaMemcpyKind kind)
{
    RT_INIT();
    struct lin_copy c = { (cudaArray_t)src, dst, kind, 0, 0, NULL };
    return gp_rt_ret(linear_pieces(src, wOffset, hOffset, count, lin_piece, &c));
}

cudaError_t gpo_cudaMemcpyFromArrayAsync(void *dst, cudaArray_const_t src, size_t wOffset, size_t hOffset,
                                         size_t count, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    RT_INIT();
    struct lin_copy c = { (cudaArray_t)src, dst, kind, 0, 1, stream };
    return gp_rt_ret(linear_pieces(src, wOffset, hOffset, count, lin_piece, &c));
}

/* array to array with independent row splits: through a device buffer */
cudaError_t gpo_cudaMemcpyArrayToArray(cudaArray_t dst, size_t wOffsetDst, size_t hOffsetDst, cudaArray_const_t src,
                                       size_t wOffsetSrc, size_t hOffsetSrc, size_t count, enum cudaMemcpyKind kind)
{
    RT_INIT();
    if (kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyDefault)
        return gp_rt_ret(cudaErrorInvalidMemcpyDirection);
    if (!count)
        return cudaSuccess;
    CUdeviceptr tmp;
    CUresult r = cuMemAlloc(&tmp, count);
    if (r != CUDA_SUCCESS)
        RT_RETURN_CU(r);
    struct lin_copy c = { (cudaArray_t)src, (char *)(uintptr_t)tmp, cudaMemcpyDeviceToDevice, 0, 0, NULL };
    cudaError_t e = linear_pieces(src, wOffsetSrc, hOffsetSrc, count, lin_piece, &c);
    if (e == cudaSuccess) {
        struct lin_copy d = { dst, (char *)(uintptr_t)tmp, cudaMemcpyDeviceToDevice, 1, 0, NULL };
        e = linear_pieces(dst, wOffsetDst, hOffsetDst, count, lin_piece, &d);
    }
    r = cuMemFree(tmp);
    if (e == cudaSuccess && r != CUDA_SUCCESS)
        e = gp_rt_from_cu(r);
    return gp_rt_ret(e);
}

/* cudaMemcpy3D: an array side counts positions and the extent's width in
 * elements, a linear side in bytes (cuda_runtime_api.h, cudaMemcpy3D). */
static cudaError_t memcpy3d(const struct cudaMemcpy3DParms *p, int async, cudaStream_t stream)
{
    if (!p)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    if ((p->srcArray && p->srcPtr.ptr) || (p->dstArray && p->dstPtr.ptr))
        return gp_rt_ret(cudaErrorInvalidValue);
    size_t elem = 1;
    if (p->srcArray || p->dstArray) {
        elem = elem_size(p->srcArray ? p->srcArray : p->dstArray);
        if (!elem)
            return gp_rt_ret(cudaErrorInvalidResourceHandle);
    }
    int sdev, ddev;
    if (sides(p->kind, p->srcPtr.ptr, p->dstPtr.ptr, &sdev, &ddev) < 0)
        return gp_rt_ret(cudaErrorInvalidMemcpyDirection);
    CUDA_MEMCPY3D c;
    memset(&c, 0, sizeof c);
    if (p->srcArray) {
        set_array_src(&c, p->srcArray, p->srcPos.x * elem, p->srcPos.y);
    } else {
        set_linear_src(&c, p->srcPtr.ptr, sdev, p->srcPtr.pitch, p->srcPtr.ysize);
        c.srcXInBytes = p->srcPos.x;
        c.srcY = p->srcPos.y;
    }
    c.srcZ = p->srcPos.z;
    if (p->dstArray) {
        set_array_dst(&c, p->dstArray, p->dstPos.x * elem, p->dstPos.y);
    } else {
        set_linear_dst(&c, p->dstPtr.ptr, ddev, p->dstPtr.pitch, p->dstPtr.ysize);
        c.dstXInBytes = p->dstPos.x;
        c.dstY = p->dstPos.y;
    }
    c.dstZ = p->dstPos.z;
    c.WidthInBytes = p->extent.width * elem;
    c.Height = p->extent.height;
    c.Depth = p->extent.depth;
    return run_copy(&c, async, stream);
}

cudaError_t gpo_cudaMemcpy3D(const struct cudaMemcpy3DParms *p) { return memcpy3d(p, 0, NULL); }

cudaError_t gpo_cudaMemcpy3DAsync(const struct cudaMemcpy3DParms *p, cudaStream_t stream)
{
    return memcpy3d(p, 1, stream);
}

/* ------------------------------------------------- texture / surface */

static cudaError_t to_res(const struct cudaResourceDesc *r, CUDA_RESOURCE_DESC *d, CUarray_format *fmt)
{
    memset(d, 0, sizeof *d);
    d->resType = (CUresourcetype)r->resType;
    d->flags = r->flags;
    *fmt = (CUarray_format)0;
    switch (r->resType) {
    case cudaResourceTypeArray: {
        d->res.array.hArray = (CUarray)r->res.array.array;
        CUDA_ARRAY3D_DESCRIPTOR a;
        CUresult e = cuArray3DGetDescriptor(&a, d->res.array.hArray);
        if (e != CUDA_SUCCESS)
            return gp_rt_from_cu(e);
        *fmt = a.Format;
        return cudaSuccess;
    }
    case cudaResourceTypeLinear:
        d->res.linear.devPtr = (CUdeviceptr)(uintptr_t)r->res.linear.devPtr;
        if (!to_format(&r->res.linear.desc, &d->res.linear.format, &d->res.linear.numChannels))
            return cudaErrorInvalidChannelDescriptor;
        d->res.linear.sizeInBytes = r->res.linear.sizeInBytes;
        *fmt = d->res.linear.format;
        return cudaSuccess;
    case cudaResourceTypePitch2D:
        d->res.pitch2D.devPtr = (CUdeviceptr)(uintptr_t)r->res.pitch2D.devPtr;
        if (!to_format(&r->res.pitch2D.desc, &d->res.pitch2D.format, &d->res.pitch2D.numChannels))
            return cudaErrorInvalidChannelDescriptor;
        d->res.pitch2D.width = r->res.pitch2D.width;
        d->res.pitch2D.height = r->res.pitch2D.height;
        d->res.pitch2D.pitchInBytes = r->res.pitch2D.pitchInBytes;
        *fmt = d->res.pitch2D.format;
        return cudaSuccess;
    case cudaResourceTypeMipmappedArray: {
        /* the format (for the read-mode check) is level 0's */
        d->res.mipmap.hMipmappedArray = (CUmipmappedArray)r->res.mipmap.mipmap;
        CUarray l0;
        CUDA_ARRAY3D_DESCRIPTOR a;
        CUresult e = cuMipmappedArrayGetLevel(&l0, d->res.mipmap.hMipmappedArray, 0);
        if (e == CUDA_SUCCESS)
            e = cuArray3DGetDescriptor(&a, l0);
        if (e != CUDA_SUCCESS)
            return gp_rt_from_cu(e);
        *fmt = a.Format;
        return cudaSuccess;
    }
    default:
        return cudaErrorInvalidValue;
    }
}

static void from_res(const CUDA_RESOURCE_DESC *d, struct cudaResourceDesc *r)
{
    memset(r, 0, sizeof *r);
    r->resType = (enum cudaResourceType)d->resType;
    r->flags = d->flags;
    switch (d->resType) {
    case CU_RESOURCE_TYPE_ARRAY:
        r->res.array.array = (cudaArray_t)d->res.array.hArray;
        break;
    case CU_RESOURCE_TYPE_MIPMAPPED_ARRAY:
        r->res.mipmap.mipmap = (cudaMipmappedArray_t)d->res.mipmap.hMipmappedArray;
        break;
    case CU_RESOURCE_TYPE_LINEAR:
        r->res.linear.devPtr = (void *)(uintptr_t)d->res.linear.devPtr;
        r->res.linear.desc = from_format(d->res.linear.format, d->res.linear.numChannels);
        r->res.linear.sizeInBytes = d->res.linear.sizeInBytes;
        break;
    case CU_RESOURCE_TYPE_PITCH2D:
        r->res.pitch2D.devPtr = (void *)(uintptr_t)d->res.pitch2D.devPtr;
        r->res.pitch2D.desc = from_format(d->res.pitch2D.format, d->res.pitch2D.numChannels);
        r->res.pitch2D.width = d->res.pitch2D.width;
        r->res.pitch2D.height = d->res.pitch2D.height;
        r->res.pitch2D.pitchInBytes = d->res.pitch2D.pitchInBytes;
        break;
    default:
        break;
    }
}

cudaError_t gpo_cudaCreateTextureObject(cudaTextureObject_t *pTexObject, const struct cudaResourceDesc *pResDesc,
                                        const struct cudaTextureDesc *pTexDesc,
                                        const struct cudaResourceViewDesc *pResViewDesc)
{
    if (!pTexObject || !pResDesc || !pTexDesc)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUDA_RESOURCE_DESC res;
    CUarray_format fmt;
    cudaError_t e = to_res(pResDesc, &res, &fmt);
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    CUDA_TEXTURE_DESC t;
    memset(&t, 0, sizeof t);
    for (int i = 0; i < 3; i++)
        t.addressMode[i] = (CUaddress_mode)pTexDesc->addressMode[i];
    t.filterMode = (CUfilter_mode)pTexDesc->filterMode;
    /* cudaReadModeElementType on an integer format: integers, not
     * normalised floats (cuda.h, CU_TRSF_READ_AS_INTEGER) */
    if (pTexDesc->readMode == cudaReadModeElementType && !is_float_format(fmt))
        t.flags |= CU_TRSF_READ_AS_INTEGER;
    if (pTexDesc->normalizedCoords)
        t.flags |= CU_TRSF_NORMALIZED_COORDINATES;
    if (pTexDesc->sRGB)
        t.flags |= CU_TRSF_SRGB;
    if (pTexDesc->disableTrilinearOptimization)
        t.flags |= CU_TRSF_DISABLE_TRILINEAR_OPTIMIZATION;
    if (pTexDesc->seamlessCubemap)
        t.flags |= CU_TRSF_SEAMLESS_CUBEMAP;
    t.maxAnisotropy = pTexDesc->maxAnisotropy;
    t.mipmapFilterMode = (CUfilter_mode)pTexDesc->mipmapFilterMode;
    t.mipmapLevelBias = pTexDesc->mipmapLevelBias;
    t.minMipmapLevelClamp = pTexDesc->minMipmapLevelClamp;
    t.maxMipmapLevelClamp = pTexDesc->maxMipmapLevelClamp;
    memcpy(t.borderColor, pTexDesc->borderColor, sizeof t.borderColor);
    _Static_assert(sizeof(struct cudaResourceViewDesc) == sizeof(CUDA_RESOURCE_VIEW_DESC), "view layouts");
    RT_RETURN_CU(cuTexObjectCreate((CUtexObject *)pTexObject, &res, &t,
                                   (const CUDA_RESOURCE_VIEW_DESC *)pResViewDesc));
}

cudaError_t gpo_cudaDestroyTextureObject(cudaTextureObject_t texObject)
{
    RT_INIT();
    RT_RETURN_CU(cuTexObjectDestroy((CUtexObject)texObject));
}

cudaError_t gpo_cudaGetTextureObjectResourceDesc(struct cudaResourceDesc *pResDesc, cudaTextureObject_t texObject)
{
    if (!pResDesc)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUDA_RESOURCE_DESC d;
    CUresult r = cuTexObjectGetResourceDesc(&d, (CUtexObject)texObject);
    if (r == CUDA_SUCCESS)
        from_res(&d, pResDesc);
    RT_RETURN_CU(r);
}

cudaError_t gpo_cudaGetTextureObjectTextureDesc(struct cudaTextureDesc *pTexDesc, cudaTextureObject_t texObject)
{
    if (!pTexDesc)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUDA_TEXTURE_DESC t;
    CUresult r = cuTexObjectGetTextureDesc(&t, (CUtexObject)texObject);
    if (r != CUDA_SUCCESS)
        RT_RETURN_CU(r);
    memset(pTexDesc, 0, sizeof *pTexDesc);
    for (int i = 0; i < 3; i++)
        pTexDesc->addressMode[i] = (enum cudaTextureAddressMode)t.addressMode[i];
    pTexDesc->filterMode = (enum cudaTextureFilterMode)t.filterMode;
    /* no READ_AS_INTEGER flag: normalised floats (for float formats the
     * runtime's element type; cudaCreateTextureObject sets the flag only
     * for integer formats) */
    pTexDesc->readMode = (t.flags & CU_TRSF_READ_AS_INTEGER) ? cudaReadModeElementType : cudaReadModeNormalizedFloat;
    pTexDesc->normalizedCoords = !!(t.flags & CU_TRSF_NORMALIZED_COORDINATES);
    pTexDesc->sRGB = !!(t.flags & CU_TRSF_SRGB);
    pTexDesc->disableTrilinearOptimization = !!(t.flags & CU_TRSF_DISABLE_TRILINEAR_OPTIMIZATION);
    pTexDesc->seamlessCubemap = !!(t.flags & CU_TRSF_SEAMLESS_CUBEMAP);
    pTexDesc->maxAnisotropy = t.maxAnisotropy;
    pTexDesc->mipmapFilterMode = (enum cudaTextureFilterMode)t.mipmapFilterMode;
    pTexDesc->mipmapLevelBias = t.mipmapLevelBias;
    pTexDesc->minMipmapLevelClamp = t.minMipmapLevelClamp;
    pTexDesc->maxMipmapLevelClamp = t.maxMipmapLevelClamp;
    memcpy(pTexDesc->borderColor, t.borderColor, sizeof pTexDesc->borderColor);
    return cudaSuccess;
}

cudaError_t gpo_cudaGetTextureObjectResourceViewDesc(struct cudaResourceViewDesc *pResViewDesc,
                                                     cudaTextureObject_t texObject)
{
    if (!pResViewDesc)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    RT_RETURN_CU(cuTexObjectGetResourceViewDesc((CUDA_RESOURCE_VIEW_DESC *)pResViewDesc, (CUtexObject)texObject));
}

cudaError_t gpo_cudaCreateSurfaceObject(cudaSurfaceObject_t *pSurfObject, const struct cudaResourceDesc *pResDesc)
{
    if (!pSurfObject || !pResDesc)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUDA_RESOURCE_DESC res;
    CUarray_format fmt;
    if (pResDesc->resType != cudaResourceTypeArray)
        return gp_rt_ret(cudaErrorInvalidValue);
    cudaError_t e = to_res(pResDesc, &res, &fmt);
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    RT_RETURN_CU(cuSurfObjectCreate((CUsurfObject *)pSurfObject, &res));
}

cudaError_t gpo_cudaDestroySurfaceObject(cudaSurfaceObject_t surfObject)
{
    RT_INIT();
    RT_RETURN_CU(cuSurfObjectDestroy((CUsurfObject)surfObject));
}

cudaError_t gpo_cudaGetSurfaceObjectResourceDesc(struct cudaResourceDesc *pResDesc, cudaSurfaceObject_t surfObject)
{
    if (!pResDesc)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUDA_RESOURCE_DESC d;
    CUresult r = cuSurfObjectGetResourceDesc(&d, (CUsurfObject)surfObject);
    if (r == CUDA_SUCCESS)
        from_res(&d, pResDesc);
    RT_RETURN_CU(r);
}
