// cublas_gemm: cuBLAS and cuBLASLt single-precision matrix products, in both
// pointer modes, checked against a CPU loop (docs/libraries.md).
//
// Handles are made once, before the iterations: a cuBLAS handle set to a
// stream, a workspace, a math mode and (for the second handle) device
// pointer mode, and a cuBLASLt handle with a matmul descriptor (A
// transposed), layouts and a preference. Every iteration runs cublasSgemm
// (host and device alpha/beta), cublasGemmEx (fp32), cublasSgemmStridedBatched,
// cublasSgemv/cublasSaxpy/cublasSscal and cublasLtMatmul (host alpha/beta,
// then a descriptor in device pointer mode), and checks each result; so a dump/restore between iterations that
// lost a handle or one of its settings fails the program.
//
// Pacing (only when GPUPROXY_TEST_PACE=1): before each iteration one line is
// read from stdin; after iteration k "step <k> done" is printed.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>
#if __has_include(<cublas_v2.h>) && __has_include(<cublasLt.h>)
#include <cublas_v2.h>
#include <cublasLt.h>
#else
#include "cublas_decls.h"
#endif

#define NAME "cublas_gemm"

#define CHECK(call)                                                             \
    do {                                                                        \
        cudaError_t err_ = (call);                                              \
        if (err_ != cudaSuccess) {                                              \
            printf("FAIL " NAME ": %s -> %s at %s:%d\n", #call,                 \
                   cudaGetErrorName(err_), __FILE__, __LINE__);                 \
            fflush(stdout);                                                     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

#define CHECK_BLAS(call)                                                        \
    do {                                                                        \
        cublasStatus_t st_ = (call);                                            \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                     \
            printf("FAIL " NAME ": %s -> %s (%d) at %s:%d\n", #call,            \
                   cublasGetStatusName(st_), (int)st_, __FILE__, __LINE__);     \
            fflush(stdout);                                                     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

#define EXPECT(cond, ...)                                                       \
    do {                                                                        \
        if (!(cond)) {                                                          \
            printf("FAIL " NAME ": " __VA_ARGS__);                              \
            printf("\n");                                                       \
            fflush(stdout);                                                     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

// m x k times k x n, column-major
static const int M = 48, N = 40, K = 56, BATCH = 3;

// C = alpha * op(A) * op(B) + beta * C, column-major, as cuBLAS defines it
static void cpu_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *A, int lda, const float *B,
                     int ldb, float beta, float *C, int ldc)
{
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0.0;
            for (int p = 0; p < k; p++) {
                double a = ta ? A[p + (size_t)i * lda] : A[i + (size_t)p * lda];
                double b = tb ? B[j + (size_t)p * ldb] : B[p + (size_t)j * ldb];
                s += a * b;
            }
            C[i + (size_t)j * ldc] = (float)(alpha * s + beta * C[i + (size_t)j * ldc]);
        }
}

static void compare(const char *what, int iter, const std::vector<float> &got, const std::vector<float> &want)
{
    for (size_t i = 0; i < want.size(); i++) {
        float tol = 1e-4f * (1.0f + fabsf(want[i]));
        EXPECT(fabsf(got[i] - want[i]) <= tol, "%s (iteration %d): element %zu is %.6f, want %.6f", what, iter, i,
               got[i], want[i]);
    }
}

// the same values as pattern() below, made on the device: the library calls
// that follow on the same stream must see them (stream order between the
// application's own kernels and the library's)
__global__ void fill_pattern(float *x, size_t n, int seed)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = (float)((int)((i * 7 + seed * 13) % 17) - 8) / 8.0f;
}

static std::vector<float> pattern(size_t n, int seed)
{
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++)
        v[i] = (float)((int)((i * 7 + seed * 13) % 17) - 8) / 8.0f;
    return v;
}

static std::vector<float> download(const float *d, size_t n)
{
    std::vector<float> h(n);
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

static void upload(float *d, const std::vector<float> &h)
{
    CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
}

int main(int argc, char **argv)
{
    int iters = (argc > 1) ? atoi(argv[1]) : 4;
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    const int pacing = pace_env && strcmp(pace_env, "1") == 0;
    int waiting = pacing;

    CHECK(cudaFree(0));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    // A is m x k (lda M), Bt is n x k so that op(B) = Bt^T (ldb N), C is m x n
    const size_t nA = (size_t)M * K, nB = (size_t)N * K, nC = (size_t)M * N;
    float *dA, *dB, *dC, *dScal, *dWork, *dBatchA, *dBatchB, *dBatchC, *dX, *dY;
    CHECK(cudaMalloc(&dX, K * sizeof(float)));
    CHECK(cudaMalloc(&dY, M * sizeof(float)));
    CHECK(cudaMalloc(&dA, nA * sizeof(float)));
    CHECK(cudaMalloc(&dB, nB * sizeof(float)));
    CHECK(cudaMalloc(&dC, nC * sizeof(float)));
    CHECK(cudaMalloc(&dScal, 2 * sizeof(float)));
    const size_t WORK = 1 << 20;
    CHECK(cudaMalloc(&dWork, WORK));
    CHECK(cudaMalloc(&dBatchA, BATCH * nA * sizeof(float)));
    CHECK(cudaMalloc(&dBatchB, BATCH * nB * sizeof(float)));
    CHECK(cudaMalloc(&dBatchC, BATCH * nC * sizeof(float)));

    // handle 1: host pointer mode, on `stream`, with a workspace and a math mode
    cublasHandle_t h;
    CHECK_BLAS(cublasCreate(&h));
    CHECK_BLAS(cublasSetStream(h, stream));
    CHECK_BLAS(cublasSetWorkspace(h, dWork, WORK));
    CHECK_BLAS(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH));
    CHECK_BLAS(cublasSetAtomicsMode(h, CUBLAS_ATOMICS_NOT_ALLOWED));
    // handle 2: device pointer mode, alpha and beta in device memory
    cublasHandle_t hd;
    CHECK_BLAS(cublasCreate(&hd));
    CHECK_BLAS(cublasSetStream(hd, stream));
    CHECK_BLAS(cublasSetPointerMode(hd, CUBLAS_POINTER_MODE_DEVICE));

    // cuBLASLt: D = alpha * A^T(k x m stored) ... here op(A) = A (m x k) and
    // op(B) = Bt^T via TRANSB, fp32 compute and scale
    cublasLtHandle_t lt;
    CHECK_BLAS(cublasLtCreate(&lt));
    cublasLtMatmulDesc_t desc, desc_dev;
    CHECK_BLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CHECK_BLAS(cublasLtMatmulDescCreate(&desc_dev, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int32_t opT = CUBLAS_OP_T;
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opT, sizeof opT));
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc_dev, CUBLASLT_MATMUL_DESC_TRANSB, &opT, sizeof opT));
    int32_t pm_dev = CUBLASLT_POINTER_MODE_DEVICE;
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc_dev, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm_dev, sizeof pm_dev));
    cublasLtMatrixLayout_t la, lb, lc;
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, M, K, M));
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, N, K, N));
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, M, N, M));
    int32_t order = CUBLASLT_ORDER_COL;
    CHECK_BLAS(cublasLtMatrixLayoutSetAttribute(la, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof order));
    cublasLtMatmulPreference_t pref;
    CHECK_BLAS(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = WORK;
    CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));

    std::vector<float> A = pattern(nA, 1), B = pattern(nB, 2);
    upload(dA, A);
    upload(dB, B);
    double checksum = 0.0;

    for (int it = 1; it <= iters; it++) {
        if (waiting) {
            char line[64];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        // the settings are what they were set to (also after a restore)
        cublasPointerMode_t pm;
        CHECK_BLAS(cublasGetPointerMode(hd, &pm));
        EXPECT(pm == CUBLAS_POINTER_MODE_DEVICE, "pointer mode of the device handle is %d", (int)pm);
        CHECK_BLAS(cublasGetPointerMode(h, &pm));
        EXPECT(pm == CUBLAS_POINTER_MODE_HOST, "pointer mode of the host handle is %d", (int)pm);
        cublasMath_t mm;
        CHECK_BLAS(cublasGetMathMode(h, &mm));
        EXPECT(mm == CUBLAS_PEDANTIC_MATH, "math mode %d", (int)mm);
        int32_t got_pm = -1;
        size_t written = 0;
        CHECK_BLAS(cublasLtMatmulDescGetAttribute(desc_dev, CUBLASLT_MATMUL_DESC_POINTER_MODE, &got_pm,
                                                  sizeof got_pm, &written));
        EXPECT(got_pm == CUBLASLT_POINTER_MODE_DEVICE && written == sizeof got_pm, "Lt pointer mode %d", got_pm);

        // 1. cublasSgemm, host alpha/beta: C = 1.5 A Bt^T + 0.5 C
        std::vector<float> C = pattern(nC, it);
        upload(dC, C);
        float alpha = 1.5f, beta = 0.5f;
        CHECK_BLAS(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, M, N, K, &alpha, dA, M, dB, N, &beta, dC, M));
        CHECK(cudaStreamSynchronize(stream));
        cpu_gemm(false, true, M, N, K, alpha, A.data(), M, B.data(), N, beta, C.data(), M);
        compare("cublasSgemm (host scalars)", it, download(dC, nC), C);

        // 2. cublasSgemm, device alpha/beta (alpha varies per iteration)
        float scal[2] = {0.25f * it, -1.0f};
        CHECK(cudaMemcpy(dScal, scal, sizeof scal, cudaMemcpyHostToDevice));
        CHECK_BLAS(cublasSgemm(hd, CUBLAS_OP_N, CUBLAS_OP_T, M, N, K, dScal, dA, M, dB, N, dScal + 1, dC, M));
        CHECK(cudaStreamSynchronize(stream));
        cpu_gemm(false, true, M, N, K, scal[0], A.data(), M, B.data(), N, scal[1], C.data(), M);
        compare("cublasSgemm (device scalars)", it, download(dC, nC), C);

        // 3. cublasGemmEx, fp32 data and compute, C = A Bt^T
        alpha = 1.0f;
        beta = 0.0f;
        CHECK_BLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, M, N, K, &alpha, dA, CUDA_R_32F, M, dB, CUDA_R_32F, N,
                                &beta, dC, CUDA_R_32F, M, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT));
        CHECK(cudaStreamSynchronize(stream));
        cpu_gemm(false, true, M, N, K, alpha, A.data(), M, B.data(), N, beta, C.data(), M);
        compare("cublasGemmEx", it, download(dC, nC), C);

        // 4. strided batch: batch b uses A*(b+1) and B shifted by b
        std::vector<float> bA(BATCH * nA), bB(BATCH * nB), bC(BATCH * nC, 0.0f);
        for (int b = 0; b < BATCH; b++) {
            std::vector<float> pa = pattern(nA, 3 + b + it), pb = pattern(nB, 5 + b);
            std::copy(pa.begin(), pa.end(), bA.begin() + b * nA);
            std::copy(pb.begin(), pb.end(), bB.begin() + b * nB);
        }
        upload(dBatchA, bA);
        upload(dBatchB, bB);
        upload(dBatchC, bC);
        alpha = 2.0f;
        CHECK_BLAS(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_T, M, N, K, &alpha, dBatchA, M, nA, dBatchB,
                                             N, nB, &beta, dBatchC, M, nC, BATCH));
        CHECK(cudaStreamSynchronize(stream));
        for (int b = 0; b < BATCH; b++)
            cpu_gemm(false, true, M, N, K, alpha, bA.data() + b * nA, M, bB.data() + b * nB, N, beta,
                     bC.data() + b * nC, M);
        compare("cublasSgemmStridedBatched", it, download(dBatchC, BATCH * nC), bC);

        // 5. level 2 and 1: y = 1.25 A x + 0.5 y, y += 2 x[:M], then y *= beta' (device scalar, -1)
        std::vector<float> x = pattern(K, 11 + it), y = pattern(M, 13 + it);
        upload(dX, x);
        upload(dY, y);
        alpha = 1.25f;
        beta = 0.5f;
        float two = 2.0f;
        CHECK_BLAS(cublasSgemv(h, CUBLAS_OP_N, M, K, &alpha, dA, M, dX, 1, &beta, dY, 1));
        CHECK_BLAS(cublasSaxpy(h, M, &two, dX, 1, dY, 1));
        CHECK_BLAS(cublasSscal(hd, M, dScal + 1, dY, 1));
        CHECK(cudaStreamSynchronize(stream));
        for (int i = 0; i < M; i++) {
            double s = 0.0;
            for (int p = 0; p < K; p++)
                s += (double)A[i + (size_t)p * M] * x[p];
            y[i] = (float)(alpha * s + beta * y[i]);
            y[i] = y[i] + two * x[i];
            y[i] = scal[1] * y[i];
        }
        compare("cublasSgemv/Saxpy/Sscal", it, download(dY, M), y);

        // 6. cublasLtMatmul with host scalars, in place (D = C)
        cublasLtMatmulHeuristicResult_t res[2];
        int found = 0;
        CHECK_BLAS(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 2, res, &found));
        EXPECT(found >= 1, "no cuBLASLt algorithm found");
        C = pattern(nC, 7 * it);
        fill_pattern<<<(unsigned)((nC + 255) / 256), 256, 0, stream>>>(dC, nC, 7 * it);
        CHECK(cudaGetLastError());
        alpha = 0.75f;
        beta = 2.0f;
        CHECK_BLAS(cublasLtMatmul(lt, desc, &alpha, dA, la, dB, lb, &beta, dC, lc, dC, lc, &res[0].algo, dWork, WORK,
                                  stream));
        CHECK(cudaStreamSynchronize(stream));
        cpu_gemm(false, true, M, N, K, alpha, A.data(), M, B.data(), N, beta, C.data(), M);
        compare("cublasLtMatmul (host scalars)", it, download(dC, nC), C);

        // 7. cublasLtMatmul with device scalars (descriptor in device pointer mode)
        CHECK_BLAS(cublasLtMatmulAlgoGetHeuristic(lt, desc_dev, la, lb, lc, lc, pref, 1, res, &found));
        EXPECT(found >= 1, "no cuBLASLt algorithm found (device pointer mode)");
        CHECK_BLAS(cublasLtMatmul(lt, desc_dev, dScal, dA, la, dB, lb, dScal + 1, dC, lc, dC, lc, &res[0].algo,
                                  dWork, WORK, stream));
        CHECK(cudaStreamSynchronize(stream));
        cpu_gemm(false, true, M, N, K, scal[0], A.data(), M, B.data(), N, scal[1], C.data(), M);
        std::vector<float> last = download(dC, nC);
        compare("cublasLtMatmul (device scalars)", it, last, C);
        for (size_t i = 0; i < nC; i += 97)
            checksum += C[i];

        // 8. the cuBLAS handle cast to a cuBLASLt handle: the cuBLAS
        // documentation allows it (a cublasHandle_t encapsulates a
        // cublasLtHandle_t), and PyTorch passes its cuBLAS handle this way
        cublasLtHandle_t lt_of_h = (cublasLtHandle_t)h;
        CHECK_BLAS(cublasLtMatmulAlgoGetHeuristic(lt_of_h, desc, la, lb, lc, lc, pref, 1, res, &found));
        EXPECT(found >= 1, "no cuBLASLt algorithm found through the cuBLAS handle");
        alpha = 0.5f;
        beta = 0.0f;
        CHECK_BLAS(cublasLtMatmul(lt_of_h, desc, &alpha, dA, la, dB, lb, &beta, dC, lc, dC, lc, &res[0].algo, dWork,
                                  WORK, stream));
        CHECK(cudaStreamSynchronize(stream));
        cpu_gemm(false, true, M, N, K, alpha, A.data(), M, B.data(), N, beta, C.data(), M);
        compare("cublasLtMatmul (cuBLAS handle as cuBLASLt handle)", it, download(dC, nC), C);

        printf("iter %d ok\n", it);
        if (pacing) {
            printf("step %d done\n", it);
        }
        fflush(stdout);
    }

    CHECK_BLAS(cublasLtMatmulPreferenceDestroy(pref));
    CHECK_BLAS(cublasLtMatrixLayoutDestroy(la));
    CHECK_BLAS(cublasLtMatrixLayoutDestroy(lb));
    CHECK_BLAS(cublasLtMatrixLayoutDestroy(lc));
    CHECK_BLAS(cublasLtMatmulDescDestroy(desc));
    CHECK_BLAS(cublasLtMatmulDescDestroy(desc_dev));
    CHECK_BLAS(cublasLtDestroy(lt));
    CHECK_BLAS(cublasDestroy(hd));
    CHECK_BLAS(cublasDestroy(h));
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(dX));
    CHECK(cudaFree(dY));
    printf("checksum %.3f\n", checksum);
    printf("PASS " NAME "\n");
    return 0;
}
