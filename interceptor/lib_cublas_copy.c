/* cuBLAS's host<->device helpers in the libcublas.so.13 stand-in:
 * cublasSetVector/GetVector/SetMatrix/GetMatrix, their Async and _64 forms
 * (spec: shim: override, restore: memory).
 *
 * They call no GPU routine of cuBLAS: each is a strided copy between host
 * memory and device memory (cuBLAS library guide, "Helper Function
 * Reference"), so the stand-in does them itself as 2D copies through the
 * runtime stand-in, whose copies are remoted and restored like any other:
 *
 *   vector: n elements of elemSize bytes, x[i*incx] -> y[i*incy]: a 2D copy
 *           of n rows of elemSize bytes with pitches incx*elemSize and
 *           incy*elemSize;
 *   matrix: a rows x cols column-major block, A with leading dimension lda,
 *           B with ldb: cols rows of rows*elemSize bytes with pitches
 *           lda*elemSize and ldb*elemSize.
 *
 * Status codes as the guide lists them per helper: CUBLAS_STATUS_INVALID_VALUE
 * for incx, incy, elemSize <= 0 (vector) or rows, cols < 0 and elemSize, lda,
 * ldb <= 0 (matrix; also a leading dimension below rows, which no 2D copy
 * can express), CUBLAS_STATUS_MAPPING_ERROR when the copy fails. Negative
 * increments are not in the guide's list but cannot be a pitch: refused
 * with INVALID_VALUE too. The Async forms order the copy on the stream
 * (cudaMemcpy2DAsync); the others return when it is done.
 *
 * Locking: none of its own; the runtime calls take the shim's lock. */
#include <stddef.h>
#include <stdint.h>

#include "gp_lib_cublas.h"

/* cuda_runtime_api.h (the runtime stand-in exports them) */
extern int cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                        int kind);
extern int cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                             int kind, void *stream);

enum { H2D = 1, D2H = 2 };     /* cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost (driver_types.h) */
enum { ST_OK = 0, ST_INVALID_VALUE = 7, ST_MAPPING_ERROR = 11 };      /* cublas_api.h */

static cublasStatus_t copy2d(void *dst, int64_t dld, const void *src, int64_t sld, int64_t width_elems,
                             int64_t height, int64_t elem, int kind, int async, void *stream)
{
    if (width_elems == 0 || height == 0)
        return (cublasStatus_t)ST_OK;
    /* pitch overflow: a request no memory could hold */
    if (elem > INT64_MAX / (dld > sld ? dld : sld) || elem > INT64_MAX / (width_elems ? width_elems : 1))
        return (cublasStatus_t)ST_INVALID_VALUE;
    size_t dp = (size_t)(dld * elem), sp = (size_t)(sld * elem), w = (size_t)(width_elems * elem);
    int rc = async ? cudaMemcpy2DAsync(dst, dp, src, sp, w, (size_t)height, kind, stream)
                   : cudaMemcpy2D(dst, dp, src, sp, w, (size_t)height, kind);
    return (cublasStatus_t)(rc == 0 ? ST_OK : ST_MAPPING_ERROR);
}

static cublasStatus_t vec(int64_t n, int64_t elem, const void *x, int64_t incx, void *y, int64_t incy, int kind,
                          int async, void *stream)
{
    if (elem <= 0 || incx <= 0 || incy <= 0 || n < 0)
        return (cublasStatus_t)ST_INVALID_VALUE;
    if (n > 0 && (!x || !y))
        return (cublasStatus_t)ST_INVALID_VALUE;
    /* n rows of one element each */
    return copy2d(y, incy, x, incx, 1, n, elem, kind, async, stream);
}

static cublasStatus_t mat(int64_t rows, int64_t cols, int64_t elem, const void *a, int64_t lda, void *b, int64_t ldb,
                          int kind, int async, void *stream)
{
    if (rows < 0 || cols < 0 || elem <= 0 || lda <= 0 || ldb <= 0 || lda < rows || ldb < rows)
        return (cublasStatus_t)ST_INVALID_VALUE;
    if (rows > 0 && cols > 0 && (!a || !b))
        return (cublasStatus_t)ST_INVALID_VALUE;
    return copy2d(b, ldb, a, lda, rows, cols, elem, kind, async, stream);
}

#define VEC(Name, T, kind, async)                                                                        \
    cublasStatus_t gpo_##Name(T n, T elemSize, const void *x, T incx, void *y, T incy)                   \
    {                                                                                                    \
        return vec(n, elemSize, x, incx, y, incy, kind, 0, NULL);                                        \
    }
#define VEC_ASYNC(Name, T, kind)                                                                         \
    cublasStatus_t gpo_##Name(T n, T elemSize, const void *x, T incx, void *y, T incy, cudaStream_t s)   \
    {                                                                                                    \
        return vec(n, elemSize, x, incx, y, incy, kind, 1, (void *)s);                                   \
    }
#define MAT(Name, T, kind)                                                                               \
    cublasStatus_t gpo_##Name(T rows, T cols, T elemSize, const void *A, T lda, void *B, T ldb)          \
    {                                                                                                    \
        return mat(rows, cols, elemSize, A, lda, B, ldb, kind, 0, NULL);                                 \
    }
#define MAT_ASYNC(Name, T, kind)                                                                         \
    cublasStatus_t gpo_##Name(T rows, T cols, T elemSize, const void *A, T lda, void *B, T ldb,          \
                              cudaStream_t s)                                                            \
    {                                                                                                    \
        return mat(rows, cols, elemSize, A, lda, B, ldb, kind, 1, (void *)s);                            \
    }

VEC(cublasSetVector, int, H2D, 0)
VEC(cublasGetVector, int, D2H, 0)
VEC(cublasSetVector_64, int64_t, H2D, 0)
VEC(cublasGetVector_64, int64_t, D2H, 0)
VEC_ASYNC(cublasSetVectorAsync, int, H2D)
VEC_ASYNC(cublasGetVectorAsync, int, D2H)
VEC_ASYNC(cublasSetVectorAsync_64, int64_t, H2D)
VEC_ASYNC(cublasGetVectorAsync_64, int64_t, D2H)
MAT(cublasSetMatrix, int, H2D)
MAT(cublasGetMatrix, int, D2H)
MAT(cublasSetMatrix_64, int64_t, H2D)
MAT(cublasGetMatrix_64, int64_t, D2H)
MAT_ASYNC(cublasSetMatrixAsync, int, H2D)
MAT_ASYNC(cublasGetMatrixAsync, int, D2H)
MAT_ASYNC(cublasSetMatrixAsync_64, int64_t, H2D)
MAT_ASYNC(cublasGetMatrixAsync_64, int64_t, D2H)
