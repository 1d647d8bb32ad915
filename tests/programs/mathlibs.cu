// mathlibs: cuFFT, cuRAND (host API), cuSPARSE and cuSOLVER, each checked
// against a CPU loop (docs/libraries.md).
//
// Plans, generators, handles and descriptors are made once, before the
// iterations, with settings a restore must bring back: a cuFFT plan made by
// cufftCreate + cufftSetAutoAllocation(0) + cufftMakePlan1d with the
// program's own work area (cufftSetWorkArea) and stream, a batched R2C plan
// (cufftPlanMany) and a C2R plan (cufftPlan1d); a cuRAND generator with a
// seed and a stream; a cuSPARSE handle with CSR and dense-vector
// descriptors; a cuSOLVER handle. Every iteration runs, on one
// non-blocking stream:
//   * cuFFT C2C forward and inverse, R2C and C2R, against a CPU DFT;
//   * curandGenerateUniform of CHUNK numbers: in (0, 1], mean near 1/2;
//   * cusparseSpMV (alpha 2, beta 1/2) against a CPU CSR loop;
//   * cusolverDnSpotrf + Spotrs and Sgetrf + Sgetrs, the residual of the
//     solution checked on the CPU.
// The C2C input is made by a kernel of the program on the same stream.
// After the last iteration a second generator with the same seed, making
// the same calls, must give exactly the numbers the first one gave across
// all iterations (and so across a dump/restore between them), and one with
// another seed other numbers.
//
// Pacing (only when GPUPROXY_TEST_PACE=1): before each iteration one line is
// read from stdin; after iteration k "step <k> done" is printed.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>
#if __has_include(<cufft.h>) && __has_include(<curand.h>) && __has_include(<cusparse.h>) && \
    __has_include(<cusolverDn.h>)
#include <cufft.h>
#include <curand.h>
#include <cusparse.h>
#include <cusolverDn.h>
#else
#include "mathlibs_decls.h"
#endif

#define NAME "mathlibs"

#define FAIL(...)                                                               \
    do {                                                                        \
        printf("FAIL " NAME ": " __VA_ARGS__);                                  \
        printf("\n");                                                           \
        fflush(stdout);                                                         \
        exit(1);                                                                \
    } while (0)

#define CHECK(call)                                                             \
    do {                                                                        \
        cudaError_t err_ = (call);                                              \
        if (err_ != cudaSuccess)                                                \
            FAIL("%s -> %s at %s:%d", #call, cudaGetErrorName(err_), __FILE__, __LINE__); \
    } while (0)

// each library's success status is 0 (cufft.h, curand.h, cusparse.h, cusolver_common.h)
#define CHECK_LIB(call)                                                         \
    do {                                                                        \
        int st_ = (int)(call);                                                  \
        if (st_ != 0)                                                           \
            FAIL("%s -> status %d at %s:%d", #call, st_, __FILE__, __LINE__);   \
    } while (0)

#define EXPECT(cond, ...)                                                       \
    do {                                                                        \
        if (!(cond))                                                            \
            FAIL(__VA_ARGS__);                                                  \
    } while (0)

static const int NFFT = 64, FBATCH = 3, RBATCH = 2;   // FFT length and batches
static const size_t CHUNK = 4096;                     // random numbers per iteration
static const int SR = 48, SC = 40;                    // sparse matrix rows, cols
static const int NS = 24;                             // order of the dense systems
static const unsigned long long SEED = 1234ULL;

static cudaStream_t stream;

template <typename T> static std::vector<T> download(const T *d, size_t n)
{
    std::vector<T> h(n);
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

template <typename T> static void upload(T *d, const std::vector<T> &h)
{
    CHECK(cudaMemcpyAsync(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
    CHECK(cudaStreamSynchronize(stream));
}

static float val(int i, int seed) { return (float)((i * 7 + seed * 13) % 17 - 8) / 8.0f; }

static void close_to(const char *what, int it, size_t i, double got, double want, double tol)
{
    EXPECT(fabs(got - want) <= tol * (1.0 + fabs(want)), "%s (iteration %d): element %zu is %.6f, want %.6f", what,
           it, i, got, want);
}

// X[k] = sum_j x[j] e^(sign 2 pi i jk/n) (cuFFT docs, "Fourier transform types"; not normalised)
static void cpu_dft(const double *re, const double *im, int n, int sign, double *ore, double *oim)
{
    for (int k = 0; k < n; k++) {
        double sr = 0, si = 0;
        for (int j = 0; j < n; j++) {
            double a = sign * 2.0 * M_PI * (double)j * k / n;
            sr += re[j] * cos(a) - im[j] * sin(a);
            si += re[j] * sin(a) + im[j] * cos(a);
        }
        ore[k] = sr;
        oim[k] = si;
    }
}

// the C2C input, made on the device by the program's own kernel: the cuFFT
// call that follows on the same stream must see it (stream order between
// the application's kernels and the library's)
__global__ void fill_complex(cufftComplex *x, int n, int seed)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = make_cuComplex((float)((i * 7 + seed * 13) % 17 - 8) / 8.0f,
                              (float)(((i + 5) * 7 + (seed + 1) * 13) % 17 - 8) / 8.0f);
}

static void fft_iteration(int it, cufftHandle pc2c, cufftHandle pr2c, cufftHandle pc2r, cufftComplex *dC,
                          cufftComplex *dF, float *dR, cufftComplex *dRF, float *dRB)
{
    // C2C, FBATCH signals of NFFT, forward into dF, then inverse in place
    std::vector<cufftComplex> x((size_t)NFFT * FBATCH);
    for (size_t i = 0; i < x.size(); i++)
        x[i] = make_cuComplex(val((int)i, it), val((int)i + 5, it + 1));
    fill_complex<<<(NFFT * FBATCH + 127) / 128, 128, 0, stream>>>(dC, NFFT * FBATCH, it);
    CHECK(cudaGetLastError());
    CHECK_LIB(cufftExecC2C(pc2c, dC, dF, CUFFT_FORWARD));
    std::vector<cufftComplex> f = download(dF, x.size());
    std::vector<double> re(NFFT), im(NFFT), ore(NFFT), oim(NFFT);
    for (int b = 0; b < FBATCH; b++) {
        for (int j = 0; j < NFFT; j++) {
            re[j] = cuCrealf(x[b * NFFT + j]);
            im[j] = cuCimagf(x[b * NFFT + j]);
        }
        cpu_dft(re.data(), im.data(), NFFT, -1, ore.data(), oim.data());
        for (int k = 0; k < NFFT; k++) {
            close_to("cufftExecC2C forward (re)", it, b * NFFT + k, cuCrealf(f[b * NFFT + k]), ore[k], 1e-4);
            close_to("cufftExecC2C forward (im)", it, b * NFFT + k, cuCimagf(f[b * NFFT + k]), oim[k], 1e-4);
        }
    }
    CHECK_LIB(cufftExecC2C(pc2c, dF, dF, CUFFT_INVERSE));
    std::vector<cufftComplex> back = download(dF, x.size());
    for (size_t i = 0; i < x.size(); i++) {
        close_to("cufftExecC2C inverse (re)", it, i, cuCrealf(back[i]) / NFFT, cuCrealf(x[i]), 1e-5);
        close_to("cufftExecC2C inverse (im)", it, i, cuCimagf(back[i]) / NFFT, cuCimagf(x[i]), 1e-5);
    }

    // R2C (RBATCH real signals, NFFT / 2 + 1 outputs each), then C2R of the first
    const int H = NFFT / 2 + 1;
    std::vector<float> r((size_t)NFFT * RBATCH);
    for (size_t i = 0; i < r.size(); i++)
        r[i] = val((int)i * 3 + 1, it + 2);
    upload(dR, r);
    CHECK_LIB(cufftExecR2C(pr2c, dR, dRF));
    std::vector<cufftComplex> rf = download(dRF, (size_t)H * RBATCH);
    std::vector<double> zero(NFFT, 0.0);
    for (int b = 0; b < RBATCH; b++) {
        for (int j = 0; j < NFFT; j++)
            re[j] = r[b * NFFT + j];
        cpu_dft(re.data(), zero.data(), NFFT, -1, ore.data(), oim.data());
        for (int k = 0; k < H; k++) {
            close_to("cufftExecR2C (re)", it, b * H + k, cuCrealf(rf[b * H + k]), ore[k], 1e-4);
            close_to("cufftExecR2C (im)", it, b * H + k, cuCimagf(rf[b * H + k]), oim[k], 1e-4);
        }
    }
    CHECK_LIB(cufftExecC2R(pc2r, dRF, dRB));
    std::vector<float> rb = download(dRB, NFFT);
    for (int j = 0; j < NFFT; j++)
        close_to("cufftExecC2R", it, j, rb[j] / NFFT, r[j], 1e-5);
}

static void rand_iteration(int it, curandGenerator_t gen, float *dU)
{
    CHECK_LIB(curandGenerateUniform(gen, dU + (size_t)it * CHUNK, CHUNK));
    std::vector<float> u = download(dU + (size_t)it * CHUNK, CHUNK);
    double sum = 0;
    for (size_t i = 0; i < CHUNK; i++) {
        // curand.h, curandGenerateUniform: 0.0 excluded, 1.0 included
        EXPECT(u[i] > 0.0f && u[i] <= 1.0f, "curandGenerateUniform (iteration %d): element %zu is %.9f", it, i,
               u[i]);
        sum += u[i];
    }
    // the mean of CHUNK uniforms has a standard deviation of 0.0045
    EXPECT(fabs(sum / CHUNK - 0.5) < 0.03, "curandGenerateUniform (iteration %d): mean %.4f", it, sum / CHUNK);
}

struct Csr {
    std::vector<int> rp, ci;
    std::vector<float> v;
};

// about one entry in five, a fixed pattern
static Csr make_csr()
{
    Csr m;
    m.rp.push_back(0);
    for (int i = 0; i < SR; i++) {
        for (int j = 0; j < SC; j++)
            if ((i * 31 + j * 17) % 5 == 0) {
                m.ci.push_back(j);
                m.v.push_back(val(i * SC + j, 3));
            }
        m.rp.push_back((int)m.ci.size());
    }
    return m;
}

static void sparse_iteration(int it, cusparseHandle_t sp, const Csr &m, cusparseSpMatDescr_t A,
                             cusparseDnVecDescr_t vx, cusparseDnVecDescr_t vy, float *dx, float *dy, void *dBuf)
{
    std::vector<float> x(SC), y(SR);
    for (int j = 0; j < SC; j++)
        x[j] = val(j, it + 4);
    for (int i = 0; i < SR; i++)
        y[i] = val(i, it + 5);
    upload(dx, x);
    upload(dy, y);
    const float alpha = 2.0f, beta = 0.5f;
    CHECK_LIB(cusparseSpMV(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, A, vx, &beta, vy, CUDA_R_32F,
                           CUSPARSE_SPMV_ALG_DEFAULT, dBuf));
    std::vector<float> got = download(dy, SR);
    for (int i = 0; i < SR; i++) {
        double s = 0;
        for (int p = m.rp[i]; p < m.rp[i + 1]; p++)
            s += (double)m.v[p] * x[m.ci[p]];
        close_to("cusparseSpMV", it, i, got[i], alpha * s + beta * y[i], 1e-5);
    }
}

static void solver_iteration(int it, cusolverDnHandle_t so, float *dA, float *dB, float *dWork, int lwork,
                             int *dPiv, int *dInfo)
{
    // SPD: M M^T + NS I, column-major; right-hand side b
    std::vector<float> a((size_t)NS * NS), b(NS);
    for (int i = 0; i < NS; i++)
        for (int j = 0; j < NS; j++) {
            double s = 0;
            for (int k = 0; k < NS; k++)
                s += (double)val(i * NS + k, it + 6) * val(j * NS + k, it + 6);
            a[i + (size_t)j * NS] = (float)(s + (i == j ? NS : 0));
        }
    for (int i = 0; i < NS; i++)
        b[i] = val(i, it + 7);
    upload(dA, a);
    upload(dB, b);
    CHECK_LIB(cusolverDnSpotrf(so, CUBLAS_FILL_MODE_LOWER, NS, dA, NS, dWork, lwork, dInfo));
    CHECK_LIB(cusolverDnSpotrs(so, CUBLAS_FILL_MODE_LOWER, NS, 1, dA, NS, dB, NS, dInfo));
    std::vector<int> info = download(dInfo, 1);
    EXPECT(info[0] == 0, "cusolverDnSpotrf/potrs (iteration %d): info %d", it, info[0]);
    std::vector<float> x = download(dB, NS);
    for (int i = 0; i < NS; i++) {
        double s = 0;
        for (int j = 0; j < NS; j++)
            s += (double)a[i + (size_t)j * NS] * x[j];
        close_to("cusolverDnSpotrs residual", it, i, s, b[i], 1e-3);
    }

    // general (not symmetric): LU with partial pivoting, then solve
    for (int i = 0; i < NS; i++)
        for (int j = 0; j < NS; j++)
            a[i + (size_t)j * NS] = val(i * 5 + j * 3, it + 8) + (i == j ? 4.0f : 0.0f);
    upload(dA, a);
    upload(dB, b);
    CHECK_LIB(cusolverDnSgetrf(so, NS, NS, dA, NS, dWork, dPiv, dInfo));
    CHECK_LIB(cusolverDnSgetrs(so, CUBLAS_OP_N, NS, 1, dA, NS, dPiv, dB, NS, dInfo));
    info = download(dInfo, 1);
    EXPECT(info[0] == 0, "cusolverDnSgetrf/getrs (iteration %d): info %d", it, info[0]);
    x = download(dB, NS);
    for (int i = 0; i < NS; i++) {
        double s = 0;
        for (int j = 0; j < NS; j++)
            s += (double)a[i + (size_t)j * NS] * x[j];
        close_to("cusolverDnSgetrs residual", it, i, s, b[i], 1e-3);
    }
}

int main(int argc, char **argv)
{
    int iters = (argc > 1) ? atoi(argv[1]) : 4;
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    const int pacing = pace_env && strcmp(pace_env, "1") == 0;
    int waiting = pacing;

    CHECK(cudaFree(0));
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    // ---- cuFFT
    cufftComplex *dC, *dF, *dRF;
    float *dR, *dRB;
    CHECK(cudaMalloc(&dC, sizeof(cufftComplex) * NFFT * FBATCH));
    CHECK(cudaMalloc(&dF, sizeof(cufftComplex) * NFFT * FBATCH));
    CHECK(cudaMalloc(&dR, sizeof(float) * NFFT * RBATCH));
    CHECK(cudaMalloc(&dRF, sizeof(cufftComplex) * (NFFT / 2 + 1) * RBATCH));
    CHECK(cudaMalloc(&dRB, sizeof(float) * NFFT));
    cufftHandle pc2c, pr2c, pc2r;
    size_t fws = 0;
    CHECK_LIB(cufftCreate(&pc2c));
    CHECK_LIB(cufftSetAutoAllocation(pc2c, 0));
    CHECK_LIB(cufftMakePlan1d(pc2c, NFFT, CUFFT_C2C, FBATCH, &fws));
    void *dFftWork = NULL;
    CHECK(cudaMalloc(&dFftWork, fws ? fws : 1));
    CHECK_LIB(cufftSetWorkArea(pc2c, dFftWork));
    CHECK_LIB(cufftSetStream(pc2c, stream));
    int nfft = NFFT;
    CHECK_LIB(cufftPlanMany(&pr2c, 1, &nfft, NULL, 1, 0, NULL, 1, 0, CUFFT_R2C, RBATCH));
    CHECK_LIB(cufftSetStream(pr2c, stream));
    CHECK_LIB(cufftPlan1d(&pc2r, NFFT, CUFFT_C2R, 1));
    CHECK_LIB(cufftSetStream(pc2r, stream));

    // ---- cuRAND
    float *dU;
    CHECK(cudaMalloc(&dU, sizeof(float) * CHUNK * (iters > 0 ? iters : 1)));
    curandGenerator_t gen;
    CHECK_LIB(curandCreateGenerator(&gen, CURAND_RNG_PSEUDO_DEFAULT));
    CHECK_LIB(curandSetPseudoRandomGeneratorSeed(gen, SEED));
    CHECK_LIB(curandSetStream(gen, stream));

    // ---- cuSPARSE
    Csr m = make_csr();
    int *dRp, *dCi;
    float *dV, *dx, *dy;
    CHECK(cudaMalloc(&dRp, sizeof(int) * m.rp.size()));
    CHECK(cudaMalloc(&dCi, sizeof(int) * m.ci.size()));
    CHECK(cudaMalloc(&dV, sizeof(float) * m.v.size()));
    CHECK(cudaMalloc(&dx, sizeof(float) * SC));
    CHECK(cudaMalloc(&dy, sizeof(float) * SR));
    upload(dRp, m.rp);
    upload(dCi, m.ci);
    upload(dV, m.v);
    cusparseHandle_t sp;
    cusparseSpMatDescr_t A;
    cusparseDnVecDescr_t vx, vy;
    CHECK_LIB(cusparseCreate(&sp));
    CHECK_LIB(cusparseSetStream(sp, stream));
    CHECK_LIB(cusparseCreateCsr(&A, SR, SC, (int64_t)m.v.size(), dRp, dCi, dV, CUSPARSE_INDEX_32I,
                                CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    CHECK_LIB(cusparseCreateDnVec(&vx, SC, dx, CUDA_R_32F));
    CHECK_LIB(cusparseCreateDnVec(&vy, SR, dy, CUDA_R_32F));
    const float one = 1.0f;
    size_t sbuf = 0;
    CHECK_LIB(cusparseSpMV_bufferSize(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, A, vx, &one, vy, CUDA_R_32F,
                                      CUSPARSE_SPMV_ALG_DEFAULT, &sbuf));
    void *dBuf;
    CHECK(cudaMalloc(&dBuf, sbuf ? sbuf : 1));

    // ---- cuSOLVER
    float *dA, *dB, *dWork;
    int *dPiv, *dInfo;
    CHECK(cudaMalloc(&dA, sizeof(float) * NS * NS));
    CHECK(cudaMalloc(&dB, sizeof(float) * NS));
    CHECK(cudaMalloc(&dPiv, sizeof(int) * NS));
    CHECK(cudaMalloc(&dInfo, sizeof(int)));
    cusolverDnHandle_t so;
    CHECK_LIB(cusolverDnCreate(&so));
    CHECK_LIB(cusolverDnSetStream(so, stream));
    int lw1 = 0, lw2 = 0;
    CHECK_LIB(cusolverDnSpotrf_bufferSize(so, CUBLAS_FILL_MODE_LOWER, NS, dA, NS, &lw1));
    CHECK_LIB(cusolverDnSgetrf_bufferSize(so, NS, NS, dA, NS, &lw2));
    int lwork = lw1 > lw2 ? lw1 : lw2;
    CHECK(cudaMalloc(&dWork, sizeof(float) * (lwork > 0 ? lwork : 1)));

    for (int it = 0; it < iters; it++) {
        if (waiting) {
            char line[64];
            if (!fgets(line, sizeof line, stdin))
                waiting = 0;
        }
        fft_iteration(it, pc2c, pr2c, pc2r, dC, dF, dR, dRF, dRB);
        rand_iteration(it, gen, dU);
        sparse_iteration(it, sp, m, A, vx, vy, dx, dy, dBuf);
        solver_iteration(it, so, dA, dB, dWork, lwork, dPiv, dInfo);
        printf("iter %d ok\n", it + 1);
        if (pacing)
            printf("step %d done\n", it + 1);
        fflush(stdout);
    }

    // the same seed and the same calls: the same numbers, bit for bit
    if (iters > 0) {
        std::vector<float> first = download(dU, CHUNK * iters);
        curandGenerator_t g2, g3;
        CHECK_LIB(curandCreateGenerator(&g2, CURAND_RNG_PSEUDO_DEFAULT));
        CHECK_LIB(curandSetPseudoRandomGeneratorSeed(g2, SEED));
        CHECK_LIB(curandSetStream(g2, stream));
        for (int it = 0; it < iters; it++)
            CHECK_LIB(curandGenerateUniform(g2, dU + (size_t)it * CHUNK, CHUNK));
        std::vector<float> again = download(dU, CHUNK * iters);
        for (size_t i = 0; i < again.size(); i++)
            EXPECT(memcmp(&first[i], &again[i], sizeof(float)) == 0,
                   "curand: number %zu of seed %llu is %.9f, and %.9f the second time", i, SEED, first[i],
                   again[i]);
        CHECK_LIB(curandCreateGenerator(&g3, CURAND_RNG_PSEUDO_DEFAULT));
        CHECK_LIB(curandSetPseudoRandomGeneratorSeed(g3, SEED + 1));
        CHECK_LIB(curandSetStream(g3, stream));
        CHECK_LIB(curandGenerateUniform(g3, dU, CHUNK));
        std::vector<float> other = download(dU, CHUNK);
        size_t same = 0;
        for (size_t i = 0; i < CHUNK; i++)
            same += memcmp(&first[i], &other[i], sizeof(float)) == 0;
        EXPECT(same < CHUNK / 100, "curand: seeds %llu and %llu give %zu of %zu numbers equal", SEED, SEED + 1,
               same, CHUNK);
        CHECK_LIB(curandDestroyGenerator(g2));
        CHECK_LIB(curandDestroyGenerator(g3));
        printf("curand sequence ok\n");
    }

    CHECK_LIB(cufftDestroy(pc2c));
    CHECK_LIB(cufftDestroy(pr2c));
    CHECK_LIB(cufftDestroy(pc2r));
    CHECK_LIB(curandDestroyGenerator(gen));
    CHECK_LIB(cusparseDestroySpMat(A));
    CHECK_LIB(cusparseDestroyDnVec(vx));
    CHECK_LIB(cusparseDestroyDnVec(vy));
    CHECK_LIB(cusparseDestroy(sp));
    CHECK_LIB(cusolverDnDestroy(so));
    CHECK(cudaStreamDestroy(stream));
    printf("PASS " NAME "\n");
    return 0;
}
