// api_helpers: calls real programs make that the proxy once refused
// (issue 26): cuBLAS's host<->device helpers in every form (strided vectors,
// matrices with leading dimensions, Async on a stream, _64), a managed
// buffer attached to streams (cudaStreamAttachMemAsync,
// cuStreamAttachMemAsync), one cuMemUnmap over two adjacent mappings, and
// the asynchronous copies to and from a __device__ variable.
// Every result is checked on the CPU; natively and proxied the output is
// the same.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>
#if __has_include(<cublas_v2.h>)
#include <cublas_v2.h>
#else
#include "api_helpers_decls.h"
#endif

#define NAME "api_helpers"
#define CHECK(call)                                                             \
    do {                                                                        \
        cudaError_t err_ = (call);                                              \
        if (err_ != cudaSuccess) {                                              \
            printf("FAIL " NAME ": %s -> %s at %s:%d\n", #call,                 \
                   cudaGetErrorName(err_), __FILE__, __LINE__);                 \
            exit(1);                                                            \
        }                                                                       \
    } while (0)
#define CHECK_CU(call)                                                          \
    do {                                                                        \
        CUresult err_ = (call);                                                 \
        if (err_ != CUDA_SUCCESS) {                                             \
            printf("FAIL " NAME ": %s -> %d at %s:%d\n", #call, (int)err_,      \
                   __FILE__, __LINE__);                                         \
            exit(1);                                                            \
        }                                                                       \
    } while (0)
#define CHECK_BLAS(call)                                                        \
    do {                                                                        \
        cublasStatus_t st_ = (call);                                            \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                     \
            printf("FAIL " NAME ": %s -> cublasStatus_t %d at %s:%d\n", #call,  \
                   (int)st_, __FILE__, __LINE__);                               \
            exit(1);                                                            \
        }                                                                       \
    } while (0)
#define EXPECT(cond, ...)                                                       \
    do {                                                                        \
        if (!(cond)) {                                                          \
            printf("FAIL " NAME ": " __VA_ARGS__);                              \
            printf("\n");                                                       \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

// x[i] = x[i] * 2 + 1
__global__ void twice_plus_one(float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = x[i] * 2.0f + 1.0f;
}

static float val(int i) { return (float)((i * 7) % 23) - 11.0f; }

// ------------------------------------------------------------ cuBLAS helpers
static void blas_helpers()
{
    cublasHandle_t h;
    CHECK_BLAS(cublasCreate(&h));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    // vector: every second host element in, scaled on the device, out to
    // every third host element (the others keep their -1)
    const int n = 100;
    std::vector<float> hx(2 * n), hy(3 * n, -1.0f);
    for (int i = 0; i < 2 * n; i++)
        hx[i] = val(i);
    float *d;
    CHECK(cudaMalloc(&d, 4 * n * sizeof(float)));
    CHECK_BLAS(cublasSetVector(n, sizeof(float), hx.data(), 2, d, 1));
    const float two = 2.0f;
    CHECK_BLAS(cublasSscal(h, n, &two, d, 1));
    CHECK_BLAS(cublasGetVector(n, sizeof(float), d, 1, hy.data(), 3));
    for (int i = 0; i < 3 * n; i++)
        EXPECT(hy[i] == (i % 3 ? -1.0f : 2.0f * hx[2 * (i / 3)]), "GetVector: y[%d] = %g", i, hy[i]);

    // _64 forms, device stride 2
    std::vector<float> hz(n, 0.0f);
    CHECK_BLAS(cublasSetVector_64(n, sizeof(float), hx.data(), 1, d, 2));
    CHECK_BLAS(cublasGetVector_64(n, sizeof(float), d, 2, hz.data(), 1));
    for (int i = 0; i < n; i++)
        EXPECT(hz[i] == hx[i], "GetVector_64: z[%d] = %g, want %g", i, hz[i], hx[i]);

    // Async vector forms on a stream, ordered with a kernel on it
    std::vector<float> ha(n, 0.0f);
    CHECK_BLAS(cublasSetVectorAsync(n, sizeof(float), hx.data(), 1, d, 1, s));
    twice_plus_one<<<(n + 127) / 128, 128, 0, s>>>(d, n);
    CHECK(cudaGetLastError());
    CHECK_BLAS(cublasGetVectorAsync(n, sizeof(float), d, 1, ha.data(), 1, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++)
        EXPECT(ha[i] == hx[i] * 2.0f + 1.0f, "GetVectorAsync: a[%d] = %g", i, ha[i]);
    CHECK_BLAS(cublasSetVectorAsync_64(n, sizeof(float), hx.data(), 2, d, 1, s));
    CHECK_BLAS(cublasGetVectorAsync_64(n, sizeof(float), d, 1, ha.data(), 1, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++)
        EXPECT(ha[i] == hx[2 * i], "GetVectorAsync_64: a[%d] = %g", i, ha[i]);

    // matrix: 5 x 7 doubles, host lda 8, device ldb 6 (row 5 of the device
    // matrix is padding that must stay as it was), back with ldc 5
    const int rows = 5, cols = 7, lda = 8, ldb = 6;
    std::vector<double> A(lda * cols), C(rows * cols, 0.0), P(ldb * cols, -7.0);
    for (int i = 0; i < lda * cols; i++)
        A[i] = val(i) * 0.5;
    double *B;
    CHECK(cudaMalloc(&B, ldb * cols * sizeof(double)));
    CHECK(cudaMemset(B, 0, ldb * cols * sizeof(double)));
    CHECK_BLAS(cublasSetMatrix(rows, cols, sizeof(double), A.data(), lda, B, ldb));
    CHECK_BLAS(cublasGetMatrix(rows, cols, sizeof(double), B, ldb, C.data(), rows));
    for (int j = 0; j < cols; j++)
        for (int i = 0; i < rows; i++)
            EXPECT(C[j * rows + i] == A[j * lda + i], "GetMatrix: C(%d,%d) = %g", i, j, C[j * rows + i]);
    CHECK_BLAS(cublasGetMatrix_64(ldb, cols, sizeof(double), B, ldb, P.data(), ldb));
    for (int j = 0; j < cols; j++)
        for (int i = 0; i < ldb; i++)
            EXPECT(P[j * ldb + i] == (i < rows ? A[j * lda + i] : 0.0), "GetMatrix_64: B(%d,%d) = %g", i, j,
                   P[j * ldb + i]);
    // Async and _64 matrix forms: a 3 x 4 block of A into the device matrix
    std::vector<double> D(3 * 4, 0.0);
    CHECK_BLAS(cublasSetMatrixAsync(3, 4, sizeof(double), A.data() + 1, lda, B, ldb, s));
    CHECK_BLAS(cublasGetMatrixAsync(3, 4, sizeof(double), B, ldb, D.data(), 3, s));
    CHECK(cudaStreamSynchronize(s));
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 3; i++)
            EXPECT(D[j * 3 + i] == A[j * lda + i + 1], "GetMatrixAsync: D(%d,%d) = %g", i, j, D[j * 3 + i]);
    CHECK_BLAS(cublasSetMatrixAsync_64(rows, cols, sizeof(double), A.data(), lda, B, ldb, s));
    CHECK_BLAS(cublasGetMatrixAsync_64(rows, cols, sizeof(double), B, ldb, C.data(), rows, s));
    CHECK(cudaStreamSynchronize(s));
    for (int j = 0; j < cols; j++)
        for (int i = 0; i < rows; i++)
            EXPECT(C[j * rows + i] == A[j * lda + i], "GetMatrixAsync_64: C(%d,%d) = %g", i, j, C[j * rows + i]);

    // the guide's invalid values: an increment or element size <= 0
    EXPECT(cublasSetVector(n, sizeof(float), hx.data(), 0, d, 1) == CUBLAS_STATUS_INVALID_VALUE, "incx 0 accepted");
    EXPECT(cublasGetMatrix(rows, cols, 0, B, ldb, C.data(), rows) == CUBLAS_STATUS_INVALID_VALUE,
           "elemSize 0 accepted");
    // nothing to copy is a success
    CHECK_BLAS(cublasSetVector(0, sizeof(float), hx.data(), 1, d, 1));

    CHECK(cudaFree(B));
    CHECK(cudaFree(d));
    CHECK(cudaStreamDestroy(s));
    CHECK_BLAS(cublasDestroy(h));
    printf("cublas helpers ok\n");
}

// ----------------------------------------------- managed memory on streams
static void managed_attach()
{
    const int n = 1000;
    float *m;
    CHECK(cudaMallocManaged(&m, n * sizeof(float)));
    for (int i = 0; i < n; i++)
        m[i] = val(i);
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    // attached to one stream, a kernel on it, then the host reads
    CHECK(cudaStreamAttachMemAsync(s, m, 0, cudaMemAttachSingle));
    twice_plus_one<<<(n + 255) / 256, 256, 0, s>>>(m, n);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++)
        EXPECT(m[i] == val(i) * 2.0f + 1.0f, "after the single-stream kernel m[%d] = %g", i, m[i]);
    // to the host, written there, back to every stream (driver API, the
    // whole allocation's size as length)
    CHECK(cudaStreamAttachMemAsync(s, m, 0, cudaMemAttachHost));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++)
        m[i] = (float)i;
    CHECK_CU(cuStreamAttachMemAsync((CUstream)s, (CUdeviceptr)(uintptr_t)m, n * sizeof(float), CU_MEM_ATTACH_GLOBAL));
    twice_plus_one<<<(n + 255) / 256, 256>>>(m, n);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < n; i++)
        EXPECT(m[i] == (float)i * 2.0f + 1.0f, "after the global kernel m[%d] = %g", i, m[i]);
    // cuda.h: "It is illegal to attach singly to the NULL stream"
    EXPECT(cudaStreamAttachMemAsync(0, m, 0, cudaMemAttachSingle) == cudaErrorInvalidValue,
           "single attach to the NULL stream accepted");
    (void)cudaGetLastError();
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(m));
    printf("managed attach ok\n");
}

// ------------------------------------------------- one unmap, two mappings
static void vmm_unmap_two()
{
    CHECK(cudaFree(0));
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g = 0;
    CHECK_CU(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUdeviceptr va;
    CHECK_CU(cuMemAddressReserve(&va, 2 * g, 0, 0, 0));
    CUmemGenericAllocationHandle h[2];
    for (int i = 0; i < 2; i++) {
        CHECK_CU(cuMemCreate(&h[i], g, &prop, 0));
        CHECK_CU(cuMemMap(va + i * g, g, 0, h[i], 0));
    }
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK_CU(cuMemSetAccess(va, 2 * g, &acc, 1));
    const int n = (int)(2 * g / sizeof(float));
    std::vector<float> host(n);
    for (int i = 0; i < n; i++)
        host[i] = val(i);
    float *p = (float *)(uintptr_t)va;
    CHECK(cudaMemcpy(p, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    twice_plus_one<<<(n + 255) / 256, 256>>>(p, n);       // across the two mappings
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(host.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        EXPECT(host[i] == val(i) * 2.0f + 1.0f, "mapped range [%d] = %g", i, host[i]);
    // one cuMemUnmap for both mappings (the driver accepts it)
    CHECK_CU(cuMemUnmap(va, 2 * g));
    CHECK_CU(cuMemRelease(h[0]));
    CHECK_CU(cuMemRelease(h[1]));
    // the range is a reservation again: a new allocation maps there
    CUmemGenericAllocationHandle h2;
    CHECK_CU(cuMemCreate(&h2, g, &prop, 0));
    CHECK_CU(cuMemMap(va + g, g, 0, h2, 0));
    CHECK_CU(cuMemSetAccess(va + g, g, &acc, 1));
    CHECK(cudaMemset((void *)(uintptr_t)(va + g), 0, g));
    CHECK(cudaDeviceSynchronize());
    CHECK_CU(cuMemUnmap(va + g, g));
    CHECK_CU(cuMemRelease(h2));
    CHECK_CU(cuMemAddressFree(va, 2 * g));
    printf("vmm unmap ok\n");
}

// ------------------------------------------ symbol copies, asynchronous
// cudaMemcpy{To,From}Symbol[Async] with the kinds cuda_runtime_api.h
// documents. NVIDIA's static runtime copies them with cuMemcpyAsync (the
// direction from the pointers, unified addressing), so under the shim a
// __device__ variable's address must be known as the device's.
__device__ int sym_words[4];

static void symbol_async()
{
    const int in[4] = {11, 22, 33, 44}, twice[4] = {2, 4, 6, 8};
    int out[4] = {0, 0, 0, 0};
    const size_t sz = sizeof in;
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMemcpyToSymbolAsync(sym_words, in, sz, 0, cudaMemcpyHostToDevice, s));
    CHECK(cudaMemcpyFromSymbolAsync(out, sym_words, sz, 0, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < 4; i++)
        EXPECT(out[i] == in[i], "after the Async copies word %d = %d", i, out[i]);
    int *d;
    CHECK(cudaMalloc(&d, sz));
    CHECK(cudaMemcpy(d, twice, sz, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpyToSymbolAsync(sym_words, d, sz, 0, cudaMemcpyDeviceToDevice, s));
    CHECK(cudaMemcpyFromSymbolAsync(out, sym_words, sz, 0, cudaMemcpyDefault, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < 4; i++)
        EXPECT(out[i] == twice[i], "after the device-to-device copy word %d = %d", i, out[i]);
    CHECK(cudaFree(d));
    CHECK(cudaStreamDestroy(s));
    printf("symbol copies ok\n");
}

int main()
{
    blas_helpers();
    managed_attach();
    vmm_unmap_two();
    symbol_async();
    printf("PASS " NAME "\n");
    return 0;
}
