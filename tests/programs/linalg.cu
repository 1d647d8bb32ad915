// linalg: the cuBLAS and cuSOLVER calls behind CuPy's and PyTorch's linear
// algebra (cupy.dot of vectors, cupy.linalg.inv/matrix_power(-k), qr, svd,
// eigh, cupyx.scipy.linalg.solve_triangular), in double precision, each
// result checked on the CPU against its defining property (docs/libraries.md).
//
// Made once, before the iterations: a cuBLAS handle in host pointer mode, a
// second one in device pointer mode, a cuSOLVER handle, all on one stream,
// and a syevjInfo_t with a tolerance and a sweep limit. Every iteration
// (matrices depend on the iteration number):
//   cublasDdot (result to the host, then to device memory), cublasDnrm2,
//   cublasIdamax; cublasDgeam (A^T + B); cublasDtrsm (lower, left);
//   cublasDgetrfBatched + cublasDgetriBatched over device arrays of matrix
//   pointers (A times the inverse is I), cublasDgetrsBatched (its info is a
//   host value); cusolverDnDgeqrf + Dorgqr (Q R = A, Q^T Q = I);
//   cusolverDnDsyevj with the syevjInfo_t (A v = lambda v, ascending);
//   cusolverDnDgesvd (U S V^T = A, S descending).
// So a dump/restore between iterations that lost a handle, its pointer mode
// or the syevjInfo_t fails the program.
//
// Pacing (only when GPUPROXY_TEST_PACE=1): before each iteration one line is
// read from stdin; after iteration k "step <k> done" is printed.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>
#if __has_include(<cublas_v2.h>) && __has_include(<cusolverDn.h>)
#include <cublas_v2.h>
#include <cusolverDn.h>
#else
#include "linalg_decls.h"
#endif

#define NAME "linalg"

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

#define CHECK_LIB(call)                                                         \
    do {                                                                        \
        int st_ = (int)(call);                                                  \
        if (st_ != 0) {                                                         \
            printf("FAIL " NAME ": %s -> status %d at %s:%d\n", #call, st_,     \
                   __FILE__, __LINE__);                                         \
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

typedef std::vector<double> Mat;     // column-major

static const int NV = 20;            // vector length
static const int NS = 6;             // square matrices (LU, trsm, eigen)
static const int BATCH = 3;
static const int QM = 8, QN = 5;     // QR
static const int SM = 7, SN = 5;     // SVD (gesvd: m >= n)

// deterministic entries in [-1, 1) that depend on (i, seed)
static double val(int i, int seed)
{
    return (double)((i * 37 + seed * 101) % 29 - 14) / 14.5;
}

// the same values made on the device: the library calls that follow on the
// same stream must see them (stream order between the application's own
// kernels and the libraries')
__global__ void fill_pattern(double *x, int n, int seed)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = (double)((i * 37 + seed * 101) % 29 - 14) / 14.5;
}

static Mat pattern(int n, int seed)
{
    Mat v(n);
    for (int i = 0; i < n; i++)
        v[i] = val(i, seed);
    return v;
}

// a well-conditioned n x n matrix: pattern plus n on the diagonal
static Mat dominant(int n, int seed)
{
    Mat a = pattern(n * n, seed);
    for (int i = 0; i < n; i++)
        a[i + i * n] += n;
    return a;
}

// C = op(A) op(B), column-major, m x n result, inner dimension k
static Mat matmul(const Mat &A, int lda, bool ta, const Mat &B, int ldb, bool tb, int m, int n, int k)
{
    Mat C((size_t)m * n);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int p = 0; p < k; p++)
                s += (ta ? A[p + i * lda] : A[i + p * lda]) * (tb ? B[j + p * ldb] : B[p + j * ldb]);
            C[i + j * m] = s;
        }
    return C;
}

static void close_to(const char *what, int iter, const Mat &got, const Mat &want, double tol)
{
    EXPECT(got.size() == want.size(), "%s: size", what);
    for (size_t i = 0; i < want.size(); i++)
        EXPECT(fabs(got[i] - want[i]) <= tol * (1.0 + fabs(want[i])),
               "%s (iteration %d): element %zu is %.12g, want %.12g", what, iter, i, got[i], want[i]);
}

static double *upload(const Mat &h)
{
    double *d;
    CHECK(cudaMalloc(&d, h.size() * sizeof(double)));
    CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(double), cudaMemcpyHostToDevice));
    return d;
}

// The library calls run on a non-blocking stream, which cudaMemcpy (legacy
// stream) does not wait for, and a pageable host-to-device cudaMemcpy may
// return before its DMA has landed (CUDA Runtime API, "API synchronization
// behavior"): put and get synchronise the device so that neither races the
// libraries' work.
static void put(double *d, const Mat &h)
{
    CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(double), cudaMemcpyHostToDevice));
    CHECK(cudaDeviceSynchronize());
}

static Mat get(const double *d, size_t n)
{
    Mat h(n);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(double), cudaMemcpyDeviceToHost));
    return h;
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

    cublasHandle_t h, hd;
    CHECK_LIB(cublasCreate(&h));
    CHECK_LIB(cublasSetStream(h, stream));
    CHECK_LIB(cublasCreate(&hd));
    CHECK_LIB(cublasSetStream(hd, stream));
    CHECK_LIB(cublasSetPointerMode(hd, CUBLAS_POINTER_MODE_DEVICE));
    cusolverDnHandle_t so;
    CHECK_LIB(cusolverDnCreate(&so));
    CHECK_LIB(cusolverDnSetStream(so, stream));
    syevjInfo_t jinfo;
    CHECK_LIB(cusolverDnCreateSyevjInfo(&jinfo));
    CHECK_LIB(cusolverDnXsyevjSetTolerance(jinfo, 1e-12));
    CHECK_LIB(cusolverDnXsyevjSetMaxSweeps(jinfo, 60));

    // device buffers, made once (their addresses survive a restore)
    double *dx = upload(Mat(NV)), *dy = upload(Mat(NV)), *dres = upload(Mat(1));
    double *dGa = upload(Mat(SM * SN)), *dGb = upload(Mat(SN * SM)), *dGc = upload(Mat(SN * SM));
    double *dT = upload(Mat(NS * NS)), *dTb = upload(Mat(NS * 3));
    double *dLU[BATCH], *dInv[BATCH], *dRhs[BATCH];
    for (int b = 0; b < BATCH; b++) {
        dLU[b] = upload(Mat(NS * NS));
        dInv[b] = upload(Mat(NS * NS));
        dRhs[b] = upload(Mat(NS * 2));
    }
    // device arrays of device pointers (cublas<t>getrfBatched's A[])
    double **dLUarr, **dInvArr, **dRhsArr;
    CHECK(cudaMalloc(&dLUarr, sizeof dLU));
    CHECK(cudaMalloc(&dInvArr, sizeof dInv));
    CHECK(cudaMalloc(&dRhsArr, sizeof dRhs));
    CHECK(cudaMemcpy(dLUarr, dLU, sizeof dLU, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dInvArr, dInv, sizeof dInv, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dRhsArr, dRhs, sizeof dRhs, cudaMemcpyHostToDevice));
    int *dPiv, *dInfo;
    CHECK(cudaMalloc(&dPiv, BATCH * NS * sizeof(int)));
    CHECK(cudaMalloc(&dInfo, BATCH * sizeof(int)));
    double *dQ = upload(Mat(QM * QN)), *dTau = upload(Mat(QN));
    double *dE = upload(Mat(NS * NS)), *dW = upload(Mat(NS));
    double *dS = upload(Mat(SM * SN)), *dSv = upload(Mat(SN)), *dU = upload(Mat(SM * SN)), *dVT = upload(Mat(SN * SN));
    int lw_qr = 0, lw_orgqr = 0, lw_ev = 0, lw_svd = 0;
    CHECK_LIB(cusolverDnDgeqrf_bufferSize(so, QM, QN, dQ, QM, &lw_qr));
    CHECK_LIB(cusolverDnDorgqr_bufferSize(so, QM, QN, QN, dQ, QM, dTau, &lw_orgqr));
    CHECK_LIB(cusolverDnDsyevj_bufferSize(so, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, NS, dE, NS, dW,
                                          &lw_ev, jinfo));
    CHECK_LIB(cusolverDnDgesvd_bufferSize(so, SM, SN, &lw_svd));
    EXPECT(lw_qr >= 0 && lw_orgqr >= 0 && lw_ev >= 0 && lw_svd >= 0, "negative workspace sizes");
    int lw = lw_qr;
    if (lw_orgqr > lw) lw = lw_orgqr;
    if (lw_ev > lw) lw = lw_ev;
    if (lw_svd > lw) lw = lw_svd;
    double *dWork = upload(Mat(lw + 1));

    for (int it = 1; it <= iters; it++) {
        if (waiting) {
            char line[64];
            if (!fgets(line, sizeof line, stdin))
                waiting = 0;
        }
        // ---- level 1: dot, nrm2, iamax; the result in host, then device memory
        Mat x = pattern(NV, it), y = pattern(NV, it + 7);
        fill_pattern<<<1, 32, 0, stream>>>(dx, NV, it);
        CHECK(cudaGetLastError());
        put(dy, y);
        double dot = 0, nrm = 0, want_dot = 0, want_nrm = 0;
        int imax = 0, want_imax = 1;
        for (int i = 0; i < NV; i++) {
            want_dot += x[i] * y[i];
            want_nrm += x[i] * x[i];
            if (fabs(x[i]) > fabs(x[want_imax - 1]))
                want_imax = i + 1;
        }
        want_nrm = sqrt(want_nrm);
        CHECK_LIB(cublasDdot(h, NV, dx, 1, dy, 1, &dot));
        CHECK_LIB(cublasDnrm2(h, NV, dx, 1, &nrm));
        CHECK_LIB(cublasIdamax(h, NV, dx, 1, &imax));
        close_to("cublasDdot (host result)", it, Mat{dot}, Mat{want_dot}, 1e-12);
        close_to("cublasDnrm2", it, Mat{nrm}, Mat{want_nrm}, 1e-12);
        EXPECT(imax == want_imax, "cublasIdamax (iteration %d): %d, want %d", it, imax, want_imax);
        CHECK_LIB(cublasDdot(hd, NV, dx, 1, dy, 1, dres));
        CHECK(cudaStreamSynchronize(stream));
        close_to("cublasDdot (device result)", it, get(dres, 1), Mat{want_dot}, 1e-12);

        // ---- geam: C = 2 A^T - B, A is SM x SN, B and C SN x SM
        Mat ga = pattern(SM * SN, it + 1), gb = pattern(SN * SM, it + 2);
        put(dGa, ga);
        put(dGb, gb);
        double two = 2.0, minus = -1.0;
        CHECK_LIB(cublasDgeam(h, CUBLAS_OP_T, CUBLAS_OP_N, SN, SM, &two, dGa, SM, &minus, dGb, SN, dGc, SN));
        Mat gc(SN * SM);
        for (int j = 0; j < SM; j++)
            for (int i = 0; i < SN; i++)
                gc[i + j * SN] = 2.0 * ga[j + i * SM] - gb[i + j * SN];
        CHECK(cudaStreamSynchronize(stream));
        close_to("cublasDgeam", it, get(dGc, SN * SM), gc, 1e-12);

        // ---- trsm: L X = 0.5 B with L lower triangular (left side)
        Mat tl = dominant(NS, it + 3), tb = pattern(NS * 3, it + 4);
        put(dT, tl);
        put(dTb, tb);
        double half = 0.5;
        CHECK_LIB(cublasDtrsm(h, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, CUBLAS_DIAG_NON_UNIT, NS, 3,
                              &half, dT, NS, dTb, NS));
        Mat lower = tl;
        for (int j = 0; j < NS; j++)
            for (int i = 0; i < j; i++)
                lower[i + j * NS] = 0;          // the upper triangle is not referenced
        Mat X = get(dTb, NS * 3);
        Mat lx = matmul(lower, NS, false, X, NS, false, NS, 3, NS);
        for (double &v : tb)
            v *= 0.5;
        close_to("cublasDtrsm", it, lx, tb, 1e-10);

        // ---- batched LU, inverse and solve over device pointer arrays
        std::vector<Mat> A(BATCH), B(BATCH);
        for (int b = 0; b < BATCH; b++) {
            A[b] = dominant(NS, it * 10 + b);
            B[b] = pattern(NS * 2, it * 10 + b + 5);
            put(dLU[b], A[b]);
            put(dRhs[b], B[b]);
        }
        CHECK_LIB(cublasDgetrfBatched(h, NS, dLUarr, NS, dPiv, dInfo, BATCH));
        CHECK_LIB(cublasDgetriBatched(h, NS, (const double *const *)dLUarr, NS, dPiv, dInvArr, NS, dInfo, BATCH));
        int hinfo = -99;
        CHECK_LIB(cublasDgetrsBatched(h, CUBLAS_OP_N, NS, 2, (const double *const *)dLUarr, NS, dPiv, dRhsArr, NS,
                                      &hinfo, BATCH));
        EXPECT(hinfo == 0, "cublasDgetrsBatched (iteration %d): host info %d", it, hinfo);
        CHECK(cudaStreamSynchronize(stream));
        int infos[BATCH];
        CHECK(cudaMemcpy(infos, dInfo, sizeof infos, cudaMemcpyDeviceToHost));
        Mat eye(NS * NS, 0.0);
        for (int i = 0; i < NS; i++)
            eye[i + i * NS] = 1.0;
        for (int b = 0; b < BATCH; b++) {
            EXPECT(infos[b] == 0, "cublasDgetriBatched (iteration %d): info[%d] = %d", it, b, infos[b]);
            Mat inv = get(dInv[b], NS * NS);
            close_to("cublasDgetrfBatched + cublasDgetriBatched: A A^-1", it,
                     matmul(A[b], NS, false, inv, NS, false, NS, NS, NS), eye, 1e-10);
            Mat sol = get(dRhs[b], NS * 2);
            close_to("cublasDgetrsBatched: A X", it, matmul(A[b], NS, false, sol, NS, false, NS, 2, NS), B[b], 1e-10);
        }

        // ---- QR: geqrf, then orgqr forms Q (QM x QN)
        Mat qa = pattern(QM * QN, it + 20);
        for (int i = 0; i < QN; i++)
            qa[i + i * QM] += 3.0;
        put(dQ, qa);
        CHECK_LIB(cusolverDnDgeqrf(so, QM, QN, dQ, QM, dTau, dWork, lw, dInfo));
        Mat rf = get(dQ, QM * QN);             // R is the upper triangle
        CHECK_LIB(cusolverDnDorgqr(so, QM, QN, QN, dQ, QM, dTau, dWork, lw, dInfo));
        CHECK(cudaStreamSynchronize(stream));
        int qinfo = -1;
        CHECK(cudaMemcpy(&qinfo, dInfo, sizeof qinfo, cudaMemcpyDeviceToHost));
        EXPECT(qinfo == 0, "cusolverDnDgeqrf/orgqr (iteration %d): info %d", it, qinfo);
        Mat R(QN * QN, 0.0);
        for (int j = 0; j < QN; j++)
            for (int i = 0; i <= j; i++)
                R[i + j * QN] = rf[i + j * QM];
        Mat Q = get(dQ, QM * QN);
        close_to("cusolverDnDgeqrf + Dorgqr: Q R", it, matmul(Q, QM, false, R, QN, false, QM, QN, QN), qa, 1e-10);
        Mat eyeq(QN * QN, 0.0);
        for (int i = 0; i < QN; i++)
            eyeq[i + i * QN] = 1.0;
        close_to("cusolverDnDorgqr: Q^T Q", it, matmul(Q, QM, true, Q, QM, false, QN, QN, QM), eyeq, 1e-10);

        // ---- symmetric eigenproblem (Jacobi, with the syevjInfo_t made before the loop)
        Mat s = pattern(NS * NS, it + 30);
        for (int j = 0; j < NS; j++)
            for (int i = 0; i < j; i++)
                s[i + j * NS] = s[j + i * NS];  // symmetric: the lower triangle mirrored
        put(dE, s);
        CHECK_LIB(cusolverDnDsyevj(so, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, NS, dE, NS, dW, dWork, lw,
                                   dInfo, jinfo));
        CHECK(cudaStreamSynchronize(stream));
        int einfo = -1;
        CHECK(cudaMemcpy(&einfo, dInfo, sizeof einfo, cudaMemcpyDeviceToHost));
        EXPECT(einfo == 0, "cusolverDnDsyevj (iteration %d): info %d", it, einfo);
        Mat V = get(dE, NS * NS), w = get(dW, NS);
        Mat av = matmul(s, NS, false, V, NS, false, NS, NS, NS), vl(NS * NS);
        for (int j = 0; j < NS; j++) {
            if (j)
                EXPECT(w[j] >= w[j - 1], "cusolverDnDsyevj (iteration %d): eigenvalues not ascending", it);
            for (int i = 0; i < NS; i++)
                vl[i + j * NS] = V[i + j * NS] * w[j];
        }
        close_to("cusolverDnDsyevj: A V = V diag(w)", it, av, vl, 1e-9);

        // ---- SVD: A = U diag(S) V^T (jobu = jobvt = 'S')
        Mat sa = pattern(SM * SN, it + 40);
        put(dS, sa);
        CHECK_LIB(cusolverDnDgesvd(so, 'S', 'S', SM, SN, dS, SM, dSv, dU, SM, dVT, SN, dWork, lw, NULL, dInfo));
        CHECK(cudaStreamSynchronize(stream));
        int sinfo = -1;
        CHECK(cudaMemcpy(&sinfo, dInfo, sizeof sinfo, cudaMemcpyDeviceToHost));
        EXPECT(sinfo == 0, "cusolverDnDgesvd (iteration %d): info %d", it, sinfo);
        Mat U = get(dU, SM * SN), sv = get(dSv, SN), VT = get(dVT, SN * SN);
        for (int j = 0; j < SN; j++) {
            EXPECT(sv[j] >= 0 && (j == 0 || sv[j] <= sv[j - 1]), "cusolverDnDgesvd (iteration %d): S not descending",
                   it);
            for (int i = 0; i < SM; i++)
                U[i + j * SM] *= sv[j];
        }
        close_to("cusolverDnDgesvd: U S V^T", it, matmul(U, SM, false, VT, SN, false, SM, SN, SN), sa, 1e-10);

        printf("iter %d ok\n", it);
        if (pacing)
            printf("step %d done\n", it);
        fflush(stdout);
    }

    CHECK_LIB(cusolverDnDestroySyevjInfo(jinfo));
    CHECK_LIB(cusolverDnDestroy(so));
    CHECK_LIB(cublasDestroy(hd));
    CHECK_LIB(cublasDestroy(h));
    CHECK(cudaStreamDestroy(stream));
    printf("PASS " NAME "\n");
    return 0;
}
