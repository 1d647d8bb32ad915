// graph_capture: CUDA graphs from stream capture (issue 10, group 3). A
// capture on stream s1 forks to s2 through an event and joins back, and
// holds kernels on both streams, a device-to-device copy, a memset, a copy
// into page-locked memory and a host function; the graph is instantiated
// once and launched every iteration (and keeps working after a dump and
// restore: tests/test_corpus_checkpoint.py). Capture status queries and
// cudaThreadExchangeStreamCaptureMode are checked on the way. The result is
// compared with a CPU computation.
//
// Pacing (GPUPROXY_TEST_PACE=1): one stdin line before each iteration,
// "step <k> done" after it.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

#define NAME "graph_capture"
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
#define EXPECT(cond, ...)                                                       \
    do {                                                                        \
        if (!(cond)) {                                                          \
            printf("FAIL " NAME ": " __VA_ARGS__);                              \
            printf("\n");                                                       \
            fflush(stdout);                                                     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

static const int N = 1 << 14;

// x[i] = x[i] * 3 + i % 7
__global__ void g_step(int *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = x[i] * 3 + i % 7;
}

// y[i] += x[i] - 1
__global__ void g_mix(int *y, const int *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] += x[i] - 1;
}

static int host_runs;
static void CUDART_CB count_run(void *p) { ++*(int *)p; }

int main(int argc, char **argv)
{
    int iters = (argc > 1) ? atoi(argv[1]) : 5;
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    const int pacing = pace_env && strcmp(pace_env, "1") == 0;
    int waiting = pacing;

    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t fork, join;
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    int *x, *y, *z, *scratch, *pinned;
    CHECK(cudaMalloc(&x, N * sizeof(int)));
    CHECK(cudaMalloc(&y, N * sizeof(int)));
    CHECK(cudaMalloc(&z, N * sizeof(int)));
    CHECK(cudaMalloc(&scratch, N * sizeof(int)));
    CHECK(cudaMallocHost(&pinned, N * sizeof(int)));
    CHECK(cudaMemset(x, 0, N * sizeof(int)));
    CHECK(cudaMemset(y, 0, N * sizeof(int)));
    CHECK(cudaDeviceSynchronize());

    cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    EXPECT(mode == cudaStreamCaptureModeGlobal, "initial capture mode %d", (int)mode);
    mode = cudaStreamCaptureModeGlobal;
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    EXPECT(mode == cudaStreamCaptureModeThreadLocal, "capture mode %d", (int)mode);

    const int T = 256, B = (N + T - 1) / T;
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusActive;
    CHECK(cudaStreamIsCapturing(s1, &st));
    EXPECT(st == cudaStreamCaptureStatusNone, "capturing before the capture");
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    CHECK(cudaStreamIsCapturing(s1, &st));
    EXPECT(st == cudaStreamCaptureStatusActive, "not capturing after begin");
    // what PyTorch asks when it begins a graph capture: status and capture id
    unsigned long long cap_id = 0, cap_id2 = 0;
    cudaGraph_t cap_graph = NULL;
    CHECK(cudaStreamGetCaptureInfo(s1, &st, &cap_id, &cap_graph));
    EXPECT(st == cudaStreamCaptureStatusActive && cap_id != 0 && cap_graph != NULL, "capture info %d", (int)st);
    g_step<<<B, T, 0, s1>>>(x, N);
    CHECK(cudaEventRecord(fork, s1));
    CHECK(cudaStreamWaitEvent(s2, fork, 0));            // s2 joins the capture
    CHECK(cudaStreamIsCapturing(s2, &st));
    EXPECT(st == cudaStreamCaptureStatusActive, "forked stream not capturing");
    CHECK(cudaStreamGetCaptureInfo(s2, &st, &cap_id2));
    EXPECT(st == cudaStreamCaptureStatusActive && cap_id2 == cap_id, "forked stream in another capture");
    g_mix<<<B, T, 0, s2>>>(y, x, N);
    CHECK(cudaMemcpyAsync(scratch, x, N * sizeof(int), cudaMemcpyDeviceToDevice, s2));
    CHECK(cudaEventRecord(join, s2));
    CHECK(cudaStreamWaitEvent(s1, join, 0));            // joined back
    CHECK(cudaMemsetAsync(z, 0, N * sizeof(int), s1));
    g_mix<<<B, T, 0, s1>>>(z, scratch, N);
    CHECK(cudaMemcpyAsync(pinned, z, N * sizeof(int), cudaMemcpyDeviceToHost, s1));
    CHECK(cudaLaunchHostFunc(s1, count_run, &host_runs));
    cudaGraph_t graph;
    CHECK(cudaStreamEndCapture(s1, &graph));
    CHECK(cudaStreamIsCapturing(s1, &st));
    EXPECT(st == cudaStreamCaptureStatusNone, "still capturing after end");
    CHECK(cudaStreamGetCaptureInfo(s1, &st, &cap_id2));
    EXPECT(st == cudaStreamCaptureStatusNone, "capture info says capturing after end");
    EXPECT(host_runs == 0, "a captured host function ran at capture");
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphDestroy(graph));                     // the executable graph stays usable
    printf("graph captured\n");

    for (int k = 1; k <= iters; ++k) {
        if (waiting) {
            char line[256];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        CHECK(cudaGraphLaunch(exec, s1));
        CHECK(cudaStreamSynchronize(s1));
        EXPECT(host_runs == k, "host node ran %d times after %d launches", host_runs, k);
        long long zs = 0;
        for (int i = 0; i < N; ++i)
            zs += pinned[i];
        printf("iter %d: z sum %lld\n", k, zs);
        if (pacing)
            printf("step %d done\n", k);
        fflush(stdout);
    }

    std::vector<int> hy(N);
    CHECK(cudaMemcpy(hy.data(), y, N * sizeof(int), cudaMemcpyDeviceToHost));
    long long ys = 0;
    for (int i = 0; i < N; ++i) {
        long long xv = 0, yv = 0, zv = 0;
        for (int k = 1; k <= iters; ++k) {
            xv = xv * 3 + i % 7;
            yv += xv - 1;
            zv = xv - 1;
        }
        EXPECT(hy[i] == yv && pinned[i] == zv, "element %d: y %d z %d, want %lld %lld", i, hy[i], pinned[i], yv, zv);
        ys += hy[i];
    }
    printf("y sum %lld\n", ys);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    CHECK(cudaFree(z));
    CHECK(cudaFree(scratch));
    CHECK(cudaEventDestroy(fork));
    CHECK(cudaEventDestroy(join));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s2));
    printf("PASS " NAME "\n");
    return 0;
}
