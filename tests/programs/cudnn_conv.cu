// cudnn_conv: a convolution forward through cuDNN 9's backend (graph) API,
// the way cudnn-frontend (and so PyTorch) drives it, checked against a CPU
// loop (docs/libraries.md, "cuDNN").
//
// Set up once, before the iterations: a cuDNN handle on a stream; tensor
// descriptors X (2x4x9x9), W (6x4x3x3), Y (2x6x5x5), all NCHW packed; a
// convolution descriptor (cross-correlation, padding 1, stride 2); the
// convolution-forward operation; an operation graph; engine heuristics
// (mode INSTANT), whose engine configs cuDNN fills into descriptors the
// program created; an execution plan for the first config that finalizes;
// a variant pack with the three device pointers and the plan's workspace.
// The heuristics descriptor and the configs not chosen are destroyed once
// the plan exists (cuDNN keeps what the plan needs). Every iteration
// fills X with a kernel of its own on the handle's stream (so the
// execution must run after it, in stream order), uploads a new W,
// executes the plan and checks Y; so a dump/restore
// between iterations that lost a descriptor, an attribute or the plan
// fails the program. Values are multiples of 1/8 in [-1, 1], so every
// product and sum is exact in fp32 and in TF32 tensor-core arithmetic.
//
// Pacing (only when GPUPROXY_TEST_PACE=1): before each iteration one line is
// read from stdin; after iteration k "step <k> done" is printed.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>
#if __has_include(<cudnn.h>)
#include <cudnn.h>
#else
#include "cudnn_decls.h"
#endif

#define NAME "cudnn_conv"

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

#define CHECK_DNN(call)                                                         \
    do {                                                                        \
        cudnnStatus_t st_ = (call);                                             \
        if (st_ != CUDNN_STATUS_SUCCESS) {                                      \
            printf("FAIL " NAME ": %s -> %s (%d) at %s:%d\n", #call,            \
                   cudnnGetErrorString(st_), (int)st_, __FILE__, __LINE__);     \
            fflush(stdout);                                                     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

#define EXPECT(cond, ...)                                                       \
    do {                                                                        \
        if (!(cond)) {                                                          \
            printf("FAIL " NAME ": ");                                          \
            printf(__VA_ARGS__);                                                \
            printf("\n");                                                       \
            fflush(stdout);                                                     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

enum { N = 2, C = 4, H = 9, W = 9, K = 6, R = 3, S = 3, PAD = 1, STRIDE = 2 };
enum { P = (H + 2 * PAD - R) / STRIDE + 1, Q = (W + 2 * PAD - S) / STRIDE + 1 };
enum { UID_X = 'x', UID_W = 'w', UID_Y = 'y' };

static cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t t)
{
    cudnnBackendDescriptor_t d;
    CHECK_DNN(cudnnBackendCreateDescriptor(t, &d));
    return d;
}

static void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t,
                int64_t n, const void *v)
{
    CHECK_DNN(cudnnBackendSetAttribute(d, a, t, n, v));
}

// a packed NCHW fp32 tensor descriptor
static cudnnBackendDescriptor_t tensor(int64_t uid, int64_t n, int64_t c, int64_t h, int64_t w)
{
    cudnnBackendDescriptor_t d = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    int64_t dims[4] = {n, c, h, w};
    int64_t strides[4] = {c * h * w, h * w, w, 1};
    int64_t align = 16;
    cudnnDataType_t dt = CUDNN_DATA_FLOAT;
    set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
    set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
    set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    CHECK_DNN(cudnnBackendFinalize(d));
    return d;
}

// x[i] = ((i * 7 + seed * 13) % 17 - 8) / 8, as fill() below
__global__ void fill_input(float *x, size_t n, int seed)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = (float)((int)((i * 7 + (size_t)seed * 13) % 17) - 8) / 8.0f;
}

static void fill(std::vector<float> &v, int seed)
{
    for (size_t i = 0; i < v.size(); i++)
        v[i] = (float)((int)((i * 7 + (size_t)seed * 13) % 17) - 8) / 8.0f;
}

// y[n][k][p][q] = sum over c, r, s of x[n][c][p*2-1+r][q*2-1+s] * w[k][c][r][s]
static void cpu_conv(const std::vector<float> &x, const std::vector<float> &w, std::vector<float> &y)
{
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            for (int p = 0; p < P; p++)
                for (int q = 0; q < Q; q++) {
                    double acc = 0.0;
                    for (int c = 0; c < C; c++)
                        for (int r = 0; r < R; r++)
                            for (int s = 0; s < S; s++) {
                                int h = p * STRIDE - PAD + r, ww = q * STRIDE - PAD + s;
                                if (h < 0 || h >= H || ww < 0 || ww >= W)
                                    continue;
                                acc += (double)x[((n * C + c) * H + h) * W + ww] * w[((k * C + c) * R + r) * S + s];
                            }
                    y[((n * K + k) * P + p) * Q + q] = (float)acc;
                }
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
    cudnnHandle_t dnn;
    CHECK_DNN(cudnnCreate(&dnn));
    CHECK_DNN(cudnnSetStream(dnn, stream));
    EXPECT(cudnnGetVersion() >= 90000, "cuDNN version %zu, expected 9.x", (size_t)cudnnGetVersion());

    const size_t nx = (size_t)N * C * H * W, nw = (size_t)K * C * R * S, ny = (size_t)N * K * P * Q;
    float *dx, *dw, *dy;
    CHECK(cudaMalloc(&dx, nx * sizeof(float)));
    CHECK(cudaMalloc(&dw, nw * sizeof(float)));
    CHECK(cudaMalloc(&dy, ny * sizeof(float)));

    // --- the graph: X * W -> Y
    cudnnBackendDescriptor_t tx = tensor(UID_X, N, C, H, W), tw = tensor(UID_W, K, C, R, S),
                             ty = tensor(UID_Y, N, K, P, Q);
    cudnnBackendDescriptor_t conv = make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    int64_t dims = 2, pad[2] = {PAD, PAD}, stride[2] = {STRIDE, STRIDE}, dil[2] = {1, 1};
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims);
    set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    set(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
    set(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
    set(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride);
    set(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil);
    CHECK_DNN(cudnnBackendFinalize(conv));

    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
    float alpha = 1.0f, beta = 0.0f;
    set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tx);
    set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &tw);
    set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ty);
    set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv);
    set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1, &alpha);
    set(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
    CHECK_DNN(cudnnBackendFinalize(op));

    cudnnBackendDescriptor_t graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op);
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &dnn);
    CHECK_DNN(cudnnBackendFinalize(graph));

    // --- heuristics: cuDNN fills engine configs the program created
    cudnnBackendDescriptor_t heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    cudnnBackendHeurMode_t hmode = CUDNN_HEUR_MODE_INSTANT;
    set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
    set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &hmode);
    CHECK_DNN(cudnnBackendFinalize(heur));
    int64_t count = 0;
    CHECK_DNN(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                       &count, NULL));
    EXPECT(count >= 1, "the heuristics found no engine");
    if (count > 8)
        count = 8;
    cudnnBackendDescriptor_t cfgs[8];
    for (int64_t i = 0; i < count; i++)
        cfgs[i] = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t got = 0;
    CHECK_DNN(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                       &got, cfgs));
    EXPECT(got >= 1, "the heuristics returned %lld configs", (long long)got);

    // --- the plan: the first config that finalizes
    cudnnBackendDescriptor_t plan = NULL;
    int chosen = -1;
    for (int64_t i = 0; i < (got < count ? got : count) && !plan; i++) {
        cudnnBackendDescriptor_t p = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        set(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &dnn);
        set(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
        if (cudnnBackendFinalize(p) == CUDNN_STATUS_SUCCESS) {
            plan = p;
            chosen = (int)i;
        } else {
            CHECK_DNN(cudnnBackendDestroyDescriptor(p));
        }
    }
    EXPECT(plan != NULL, "no engine config gave an execution plan");
    int64_t wsize = -1;
    CHECK_DNN(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got,
                                       &wsize));
    EXPECT(wsize >= 0 && got == 1, "workspace size %lld", (long long)wsize);
    void *dws = NULL;
    if (wsize > 0)
        CHECK(cudaMalloc(&dws, (size_t)wsize));
    // what the plan does not need any more
    CHECK_DNN(cudnnBackendDestroyDescriptor(heur));
    for (int64_t i = 0; i < count; i++)
        if (i != chosen)
            CHECK_DNN(cudnnBackendDestroyDescriptor(cfgs[i]));

    cudnnBackendDescriptor_t pack = make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    int64_t uids[3] = {UID_X, UID_W, UID_Y};
    void *ptrs[3] = {dx, dw, dy};
    set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids);
    set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs);
    set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &dws);
    CHECK_DNN(cudnnBackendFinalize(pack));

    std::vector<float> x(nx), w(nw), y(ny), ref(ny);
    double checksum = 0.0;
    for (int it = 1; it <= iters; it++) {
        if (waiting) {
            char line[64];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        // the handle's stream is what it was set to (also after a restore)
        cudaStream_t s = NULL;
        CHECK_DNN(cudnnGetStream(dnn, &s));
        EXPECT(s == stream, "the cuDNN handle's stream changed");

        fill(x, it);
        fill(w, 3 * it + 1);
        CHECK(cudaMemcpy(dw, w.data(), nw * sizeof(float), cudaMemcpyHostToDevice));
        CHECK(cudaMemset(dx, 0, nx * sizeof(float)));
        CHECK(cudaMemset(dy, 0xff, ny * sizeof(float)));     // NaNs: a skipped execution shows
        CHECK(cudaDeviceSynchronize());
        fill_input<<<(unsigned)((nx + 127) / 128), 128, 0, stream>>>(dx, nx, it);
        CHECK(cudaGetLastError());
        CHECK_DNN(cudnnBackendExecute(dnn, plan, pack));
        CHECK(cudaStreamSynchronize(stream));
        CHECK(cudaMemcpy(y.data(), dy, ny * sizeof(float), cudaMemcpyDeviceToHost));
        cpu_conv(x, w, ref);
        // exact for direct and implicit-gemm engines (see the top); Winograd
        // and FFT engines round in their transforms
        for (size_t i = 0; i < ny; i++)
            EXPECT(fabs((double)y[i] - ref[i]) <= 1e-4 * (1.0 + fabs((double)ref[i])),
                   "iteration %d: y[%zu] = %g, expected %g", it, i, (double)y[i], (double)ref[i]);
        for (size_t i = 0; i < ny; i++)
            checksum += ref[i];
        printf("iter %d ok\n", it);
        if (pacing)
            printf("step %d done\n", it);
        fflush(stdout);
    }

    CHECK_DNN(cudnnBackendDestroyDescriptor(pack));
    CHECK_DNN(cudnnBackendDestroyDescriptor(plan));
    CHECK_DNN(cudnnBackendDestroyDescriptor(cfgs[chosen]));
    CHECK_DNN(cudnnBackendDestroyDescriptor(graph));
    CHECK_DNN(cudnnBackendDestroyDescriptor(op));
    CHECK_DNN(cudnnBackendDestroyDescriptor(conv));
    CHECK_DNN(cudnnBackendDestroyDescriptor(tx));
    CHECK_DNN(cudnnBackendDestroyDescriptor(tw));
    CHECK_DNN(cudnnBackendDestroyDescriptor(ty));
    CHECK_DNN(cudnnDestroy(dnn));
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dw));
    CHECK(cudaFree(dy));
    if (dws)
        CHECK(cudaFree(dws));
    printf("checksum %.3f\n", checksum);
    printf("PASS " NAME "\n");
    return 0;
}
