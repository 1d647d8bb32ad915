/* NVIDIA's libraries from a program built for an older CUDA major (issue 24):
 * cuBLAS, cuFFT, cuRAND, cuSPARSE and cuSOLVER through their stand-ins of
 * that major's soname (libcublas.so.12 / .11, libcufft.so.11 / .10,
 * libcurand.so.10, libcusparse.so.12 / .11, libcusolver.so.11), with the
 * program's own NVIDIA runtime (libcudart.so.12 / .11.0) making the memory
 * and the stream. Each result is checked against a reference computed here
 * on the host; every value is printed, so that a native run (the same source
 * built against CUDA 13 with NVIDIA's libraries) and the proxied one can be
 * compared line by line on a GPU. Exit status 0 only if every check holds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>
#include <cublas_v2.h>
#include <cufft.h>
#include <curand.h>
#include <cusparse.h>
#include <cusolverDn.h>

static int failures;

#define CK(call, ok) do { long long _r = (long long)(call); if (_r != (ok)) { \
    printf("FAIL %s = %lld (line %d)\n", #call, _r, __LINE__); exit(2); } } while (0)

static void check(const char *what, double err, double tol)
{
    printf("check %s: %s\n", what, err <= tol ? "ok" : "FAIL");
    if (!(err <= tol)) {
        printf("  error %.3g > %.3g\n", err, tol);
        failures++;
    }
}

int main(void)
{
    cudaStream_t s;
    CK(cudaStreamCreate(&s), cudaSuccess);

    /* cuBLAS: C = alpha A B + beta C (column-major, 64x48 = 64x32 * 32x48) */
    enum { M = 64, N = 48, K = 32 };
    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * N);
    float *c = malloc(sizeof(float) * M * N), *ref = malloc(sizeof(float) * M * N);
    for (int i = 0; i < M * K; i++) a[i] = (float)((i * 7) % 13) / 8.0f - 0.5f;
    for (int i = 0; i < K * N; i++) b[i] = (float)((i * 5) % 11) / 4.0f - 1.0f;
    for (int i = 0; i < M * N; i++) c[i] = (float)(i % 3);
    const float alpha = 1.5f, beta = -0.25f;
    for (int j = 0; j < N; j++)
        for (int i = 0; i < M; i++) {
            double acc = 0;
            for (int k = 0; k < K; k++) acc += (double)a[i + k * M] * b[k + j * K];
            ref[i + j * M] = (float)(alpha * acc + beta * c[i + j * M]);
        }
    float *da, *db, *dc;
    CK(cudaMalloc((void **)&da, sizeof(float) * M * K), cudaSuccess);
    CK(cudaMalloc((void **)&db, sizeof(float) * K * N), cudaSuccess);
    CK(cudaMalloc((void **)&dc, sizeof(float) * M * N), cudaSuccess);
    CK(cudaMemcpy(da, a, sizeof(float) * M * K, cudaMemcpyHostToDevice), cudaSuccess);
    CK(cudaMemcpy(db, b, sizeof(float) * K * N, cudaMemcpyHostToDevice), cudaSuccess);
    CK(cudaMemcpy(dc, c, sizeof(float) * M * N, cudaMemcpyHostToDevice), cudaSuccess);
    cublasHandle_t h;
    CK(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    CK(cublasSetStream(h, s), CUBLAS_STATUS_SUCCESS);
    CK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, M, N, K, &alpha, da, M, db, K, &beta, dc, M), CUBLAS_STATUS_SUCCESS);
    CK(cudaStreamSynchronize(s), cudaSuccess);
    CK(cudaMemcpy(c, dc, sizeof(float) * M * N, cudaMemcpyDeviceToHost), cudaSuccess);
    double err = 0;
    for (int i = 0; i < M * N; i++) err = fmax(err, fabs(c[i] - ref[i]));
    check("cublasSgemm", err, 1e-3);
    for (int i = 0; i < M * N; i += 401) printf("sgemm c[%d] = %.9g\n", i, c[i]);

    /* cuBLAS level 1 in double: y = 2x + y, then dot(x, y) into a host scalar */
    enum { L = 1000 };
    double *x = malloc(sizeof(double) * L), *y = malloc(sizeof(double) * L), dot = 0, rdot = 0;
    for (int i = 0; i < L; i++) { x[i] = (i % 17) * 0.125; y[i] = 1.0 - (i % 5) * 0.5; }
    double *dx, *dy;
    CK(cudaMalloc((void **)&dx, sizeof(double) * L), cudaSuccess);
    CK(cudaMalloc((void **)&dy, sizeof(double) * L), cudaSuccess);
    CK(cudaMemcpy(dx, x, sizeof(double) * L, cudaMemcpyHostToDevice), cudaSuccess);
    CK(cudaMemcpy(dy, y, sizeof(double) * L, cudaMemcpyHostToDevice), cudaSuccess);
    const double two = 2.0;
    CK(cublasDaxpy(h, L, &two, dx, 1, dy, 1), CUBLAS_STATUS_SUCCESS);
    CK(cublasDdot(h, L, dx, 1, dy, 1, &dot), CUBLAS_STATUS_SUCCESS);
    for (int i = 0; i < L; i++) rdot += x[i] * (2.0 * x[i] + y[i]);
    check("cublasDaxpy+Ddot", fabs(dot - rdot) / fabs(rdot), 1e-12);
    printf("ddot = %.17g\n", dot);
    CK(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);

    /* cuFFT: a 64-point complex forward transform against a direct DFT */
    enum { F = 64 };
    cufftComplex *in = malloc(sizeof(cufftComplex) * F), *out = malloc(sizeof(cufftComplex) * F);
    for (int i = 0; i < F; i++) { in[i].x = (float)cos(0.3 * i) + (i % 4) * 0.25f; in[i].y = (float)sin(0.7 * i); }
    cufftComplex *din;
    CK(cudaMalloc((void **)&din, sizeof(cufftComplex) * F), cudaSuccess);
    CK(cudaMemcpy(din, in, sizeof(cufftComplex) * F, cudaMemcpyHostToDevice), cudaSuccess);
    cufftHandle plan;
    CK(cufftPlan1d(&plan, F, CUFFT_C2C, 1), CUFFT_SUCCESS);
    CK(cufftSetStream(plan, s), CUFFT_SUCCESS);
    CK(cufftExecC2C(plan, din, din, CUFFT_FORWARD), CUFFT_SUCCESS);
    CK(cudaStreamSynchronize(s), cudaSuccess);
    CK(cudaMemcpy(out, din, sizeof(cufftComplex) * F, cudaMemcpyDeviceToHost), cudaSuccess);
    err = 0;
    for (int k = 0; k < F; k++) {
        double re = 0, im = 0;
        for (int n = 0; n < F; n++) {
            double w = -2.0 * M_PI * k * n / F;
            re += in[n].x * cos(w) - in[n].y * sin(w);
            im += in[n].x * sin(w) + in[n].y * cos(w);
        }
        err = fmax(err, fmax(fabs(re - out[k].x), fabs(im - out[k].y)));
    }
    check("cufftExecC2C", err, 1e-3);
    for (int k = 0; k < F; k += 9) printf("fft[%d] = %.9g %.9g\n", k, out[k].x, out[k].y);
    CK(cufftDestroy(plan), CUFFT_SUCCESS);

    /* cuRAND host API: uniform floats in (0, 1], their mean near 1/2 */
    enum { R = 4096 };
    float *dr, *r = malloc(sizeof(float) * R);
    CK(cudaMalloc((void **)&dr, sizeof(float) * R), cudaSuccess);
    curandGenerator_t g;
    CK(curandCreateGenerator(&g, CURAND_RNG_PSEUDO_PHILOX4_32_10), CURAND_STATUS_SUCCESS);
    CK(curandSetStream(g, s), CURAND_STATUS_SUCCESS);
    CK(curandSetPseudoRandomGeneratorSeed(g, 1234ULL), CURAND_STATUS_SUCCESS);
    CK(curandGenerateUniform(g, dr, R), CURAND_STATUS_SUCCESS);
    CK(cudaStreamSynchronize(s), cudaSuccess);
    CK(cudaMemcpy(r, dr, sizeof(float) * R, cudaMemcpyDeviceToHost), cudaSuccess);
    double mean = 0;
    int inrange = 1;
    for (int i = 0; i < R; i++) { mean += r[i]; inrange &= r[i] > 0.0f && r[i] <= 1.0f; }
    mean /= R;
    check("curandGenerateUniform range", inrange ? 0 : 1, 0);
    check("curandGenerateUniform mean", fabs(mean - 0.5), 0.02);
    for (int i = 0; i < R; i += 1000) printf("uniform[%d] = %.9g\n", i, r[i]);
    CK(curandDestroyGenerator(g), CURAND_STATUS_SUCCESS);

    /* cuSPARSE generic API: y = A x with A a tridiagonal CSR matrix (n = 100) */
    enum { S = 100 };
    int rowptr[S + 1], cols[3 * S], nnz = 0;
    double vals[3 * S], xs[S], ys[S], ry[S];
    for (int i = 0; i < S; i++) {
        rowptr[i] = nnz;
        for (int j = i - 1; j <= i + 1; j++)
            if (j >= 0 && j < S) { cols[nnz] = j; vals[nnz] = j == i ? 4.0 : -1.0 - 0.01 * i; nnz++; }
        xs[i] = 0.5 + (i % 7) * 0.25;
    }
    rowptr[S] = nnz;
    for (int i = 0; i < S; i++) {
        ry[i] = 0;
        for (int k = rowptr[i]; k < rowptr[i + 1]; k++) ry[i] += vals[k] * xs[cols[k]];
    }
    int *drow, *dcol;
    double *dval, *dxs, *dys;
    CK(cudaMalloc((void **)&drow, sizeof rowptr), cudaSuccess);
    CK(cudaMalloc((void **)&dcol, sizeof(int) * nnz), cudaSuccess);
    CK(cudaMalloc((void **)&dval, sizeof(double) * nnz), cudaSuccess);
    CK(cudaMalloc((void **)&dxs, sizeof xs), cudaSuccess);
    CK(cudaMalloc((void **)&dys, sizeof ys), cudaSuccess);
    CK(cudaMemcpy(drow, rowptr, sizeof rowptr, cudaMemcpyHostToDevice), cudaSuccess);
    CK(cudaMemcpy(dcol, cols, sizeof(int) * nnz, cudaMemcpyHostToDevice), cudaSuccess);
    CK(cudaMemcpy(dval, vals, sizeof(double) * nnz, cudaMemcpyHostToDevice), cudaSuccess);
    CK(cudaMemcpy(dxs, xs, sizeof xs, cudaMemcpyHostToDevice), cudaSuccess);
    cusparseHandle_t sp;
    cusparseSpMatDescr_t A;
    cusparseDnVecDescr_t vx, vy;
    CK(cusparseCreate(&sp), CUSPARSE_STATUS_SUCCESS);
    CK(cusparseSetStream(sp, s), CUSPARSE_STATUS_SUCCESS);
    CK(cusparseCreateCsr(&A, S, S, nnz, drow, dcol, dval, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                         CUSPARSE_INDEX_BASE_ZERO, CUDA_R_64F), CUSPARSE_STATUS_SUCCESS);
    CK(cusparseCreateDnVec(&vx, S, dxs, CUDA_R_64F), CUSPARSE_STATUS_SUCCESS);
    CK(cusparseCreateDnVec(&vy, S, dys, CUDA_R_64F), CUSPARSE_STATUS_SUCCESS);
    const double one = 1.0, zero = 0.0;
    size_t bufsz = 0;
    void *dbuf = NULL;
    CK(cusparseSpMV_bufferSize(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, A, vx, &zero, vy, CUDA_R_64F,
                               CUSPARSE_SPMV_ALG_DEFAULT, &bufsz), CUSPARSE_STATUS_SUCCESS);
    CK(cudaMalloc(&dbuf, bufsz ? bufsz : 16), cudaSuccess);
    CK(cusparseSpMV(sp, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, A, vx, &zero, vy, CUDA_R_64F,
                    CUSPARSE_SPMV_ALG_DEFAULT, dbuf), CUSPARSE_STATUS_SUCCESS);
    CK(cudaStreamSynchronize(s), cudaSuccess);
    CK(cudaMemcpy(ys, dys, sizeof ys, cudaMemcpyDeviceToHost), cudaSuccess);
    err = 0;
    for (int i = 0; i < S; i++) err = fmax(err, fabs(ys[i] - ry[i]));
    check("cusparseSpMV", err, 1e-12);
    for (int i = 0; i < S; i += 33) printf("spmv y[%d] = %.17g\n", i, ys[i]);
    CK(cusparseDestroySpMat(A), CUSPARSE_STATUS_SUCCESS);
    CK(cusparseDestroyDnVec(vx), CUSPARSE_STATUS_SUCCESS);
    CK(cusparseDestroyDnVec(vy), CUSPARSE_STATUS_SUCCESS);
    CK(cusparseDestroy(sp), CUSPARSE_STATUS_SUCCESS);

    /* cuSOLVER: Cholesky of a symmetric positive definite 16x16 matrix, L L^T = A */
    enum { P = 16 };
    double spd[P * P], fac[P * P];
    for (int j = 0; j < P; j++)
        for (int i = 0; i < P; i++)
            spd[i + j * P] = (i == j ? P + 1.0 : 0.0) + 1.0 / (1.0 + i + j);
    double *dspd, *dwork;
    int *dinfo, info = -1, lwork = 0;
    CK(cudaMalloc((void **)&dspd, sizeof spd), cudaSuccess);
    CK(cudaMalloc((void **)&dinfo, sizeof(int)), cudaSuccess);
    CK(cudaMemcpy(dspd, spd, sizeof spd, cudaMemcpyHostToDevice), cudaSuccess);
    cusolverDnHandle_t dn;
    CK(cusolverDnCreate(&dn), CUSOLVER_STATUS_SUCCESS);
    CK(cusolverDnSetStream(dn, s), CUSOLVER_STATUS_SUCCESS);
    CK(cusolverDnDpotrf_bufferSize(dn, CUBLAS_FILL_MODE_LOWER, P, dspd, P, &lwork), CUSOLVER_STATUS_SUCCESS);
    CK(cudaMalloc((void **)&dwork, sizeof(double) * (lwork ? lwork : 1)), cudaSuccess);
    CK(cusolverDnDpotrf(dn, CUBLAS_FILL_MODE_LOWER, P, dspd, P, dwork, lwork, dinfo), CUSOLVER_STATUS_SUCCESS);
    CK(cudaStreamSynchronize(s), cudaSuccess);
    CK(cudaMemcpy(fac, dspd, sizeof fac, cudaMemcpyDeviceToHost), cudaSuccess);
    CK(cudaMemcpy(&info, dinfo, sizeof info, cudaMemcpyDeviceToHost), cudaSuccess);
    err = info == 0 ? 0 : 1;
    for (int i = 0; i < P; i++)
        for (int j = 0; j <= i; j++) {
            double acc = 0;
            for (int k = 0; k <= j; k++) acc += fac[i + k * P] * fac[j + k * P];
            err = fmax(err, fabs(acc - spd[i + j * P]));
        }
    check("cusolverDnDpotrf", err, 1e-10);
    for (int i = 0; i < P; i += 5) printf("potrf L[%d,%d] = %.17g\n", i, i, fac[i + i * P]);
    CK(cusolverDnDestroy(dn), CUSOLVER_STATUS_SUCCESS);

    cudaFree(drow); cudaFree(dcol); cudaFree(dval); cudaFree(dxs); cudaFree(dys); cudaFree(dbuf);
    cudaFree(dspd); cudaFree(dinfo); cudaFree(dwork);
    cudaFree(da); cudaFree(db); cudaFree(dc); cudaFree(dx); cudaFree(dy); cudaFree(din); cudaFree(dr);
    CK(cudaStreamDestroy(s), cudaSuccess);
    printf("%s\n", failures ? "FAILED" : "PASSED");
    return failures ? 1 : 0;
}
