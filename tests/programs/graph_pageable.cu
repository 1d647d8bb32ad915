// graph_pageable: copies between the device and pageable host memory
// (malloc) captured into a graph (issue 10, group 3; NVIDIA's
// simpleCudaGraphs does this). A capture on s1, forked to s2, holds
// host-to-device copies from pageable memory, kernels, and device-to-host
// copies into pageable memory, small (one message) and large (more than the
// shim's 64 KiB inline limit), on both streams. The graph is launched every
// iteration with new input written into the pageable source before the
// launch: a captured copy reads its host memory when the graph runs, not at
// capture, and writes its destination when it runs. Results are checked
// against a CPU computation every iteration (and across a dump and restore:
// tests/test_corpus_checkpoint.py).
//
// Pacing (GPUPROXY_TEST_PACE=1): one stdin line before each iteration,
// "step <k> done" after it.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#define NAME "graph_pageable"
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

static const int BIG = 1 << 18;     // 1 MiB of ints: the staged path
static const int SMALL = 1000;      // 4000 bytes: inline in the message

// x[i] = x[i] * m + i % 5
__global__ void p_scale(int *x, int n, int m)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = x[i] * m + i % 5;
}

static int src_value(int i, int k) { return (i * 7 + k) % 1000; }

int main(int argc, char **argv)
{
    int iters = (argc > 1) ? atoi(argv[1]) : 5;
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    const int pacing = pace_env && strcmp(pace_env, "1") == 0;
    int waiting = pacing;
    const int T = 256;

    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t fork, join;
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    int *d_big, *d_small;
    CHECK(cudaMalloc(&d_big, BIG * sizeof(int)));
    CHECK(cudaMalloc(&d_small, SMALL * sizeof(int)));
    int *in_big = (int *)malloc(BIG * sizeof(int)), *out_big = (int *)malloc(BIG * sizeof(int));
    int *in_small = (int *)malloc(SMALL * sizeof(int)), *out_small = (int *)malloc(SMALL * sizeof(int));
    EXPECT(in_big && out_big && in_small && out_small, "malloc");
    memset(in_big, 0, BIG * sizeof(int));
    memset(in_small, 0, SMALL * sizeof(int));
    memset(out_big, 0x5a, BIG * sizeof(int));
    memset(out_small, 0x5a, SMALL * sizeof(int));

    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    CHECK(cudaMemcpyAsync(d_big, in_big, BIG * sizeof(int), cudaMemcpyHostToDevice, s1));
    CHECK(cudaEventRecord(fork, s1));
    CHECK(cudaStreamWaitEvent(s2, fork, 0));
    CHECK(cudaMemcpyAsync(d_small, in_small, SMALL * sizeof(int), cudaMemcpyHostToDevice, s2));
    p_scale<<<(SMALL + T - 1) / T, T, 0, s2>>>(d_small, SMALL, 5);
    CHECK(cudaMemcpyAsync(out_small, d_small, SMALL * sizeof(int), cudaMemcpyDeviceToHost, s2));
    CHECK(cudaEventRecord(join, s2));
    p_scale<<<(BIG + T - 1) / T, T, 0, s1>>>(d_big, BIG, 3);
    CHECK(cudaMemcpyAsync(out_big, d_big, BIG * sizeof(int), cudaMemcpyDeviceToHost, s1));
    CHECK(cudaStreamWaitEvent(s1, join, 0));
    cudaGraph_t graph;
    CHECK(cudaStreamEndCapture(s1, &graph));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphDestroy(graph));
    // captured work does not run at capture: the destinations are untouched
    for (int i = 0; i < SMALL; ++i)
        EXPECT(out_small[i] == 0x5a5a5a5a, "small[%d] written at capture", i);
    for (int i = 0; i < BIG; ++i)
        EXPECT(out_big[i] == 0x5a5a5a5a, "big[%d] written at capture", i);
    printf("graph captured\n");

    for (int k = 1; k <= iters; ++k) {
        if (waiting) {
            char line[256];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        for (int i = 0; i < BIG; ++i)
            in_big[i] = src_value(i, k);
        for (int i = 0; i < SMALL; ++i)
            in_small[i] = src_value(i, 3 * k);
        memset(out_big, 0xff, BIG * sizeof(int));
        memset(out_small, 0xff, SMALL * sizeof(int));
        CHECK(cudaGraphLaunch(exec, s1));
        CHECK(cudaStreamSynchronize(s1));
        long long sb = 0, ss = 0;
        for (int i = 0; i < BIG; ++i) {
            int want = src_value(i, k) * 3 + i % 5;
            EXPECT(out_big[i] == want, "iteration %d: big[%d] = %d, want %d", k, i, out_big[i], want);
            sb += out_big[i];
        }
        for (int i = 0; i < SMALL; ++i) {
            int want = src_value(i, 3 * k) * 5 + i % 5;
            EXPECT(out_small[i] == want, "iteration %d: small[%d] = %d, want %d", k, i, out_small[i], want);
            ss += out_small[i];
        }
        printf("iter %d: big sum %lld small sum %lld\n", k, sb, ss);
        if (pacing)
            printf("step %d done\n", k);
        fflush(stdout);
    }

    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaFree(d_big));
    CHECK(cudaFree(d_small));
    free(in_big);
    free(out_big);
    free(in_small);
    free(out_small);
    CHECK(cudaEventDestroy(fork));
    CHECK(cudaEventDestroy(join));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s2));
    printf("PASS " NAME "\n");
    return 0;
}
