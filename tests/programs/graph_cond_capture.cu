// graph_cond_capture: conditional nodes added to a graph while a stream is
// captured into it (issue 26), the way CUDA's programming guide puts a
// conditional node into a stream capture: cudaStreamGetCaptureInfo gives
// the capture's graph and dependency set, cudaGraphConditionalHandleCreate
// makes a handle on that graph, cudaGraphAddNode adds the node on those
// dependencies, and cudaStreamUpdateCaptureDependencies
// (cudaStreamSetCaptureDependencies) makes the work captured after it
// follow it. The bodies are filled by a capture into them
// (cudaStreamBeginCaptureToGraph on a second stream; the IF's capture ends
// with a NULL graph pointer, as NVIDIA's samples end it).
//
// Captured on stream s:
//   k_fill: data[i] = i % 5, counter = 0
//   -> WHILE (handle hw, default 1 assigned at every launch): k_step adds
//      (i % 3) + 1 to every element, counts a pass and sets the condition
//      to (counter < limit)
//   -> k_scale: data[i] = 2 * data[i] + 1 (must see the whole loop)
//   -> k_check: condition of the IF = (counter is even)
//   -> IF (handle hi): k_add adds 100
//   -> k_last: data[i] -= i % 2 (must see the IF's result)
// `limit` is k + 1 at launch k. Every launch is checked element by element
// against a CPU computation. The graph cudaStreamEndCapture returns must
// be the one cudaStreamGetCaptureInfo named. Also: updating the
// dependencies of a stream that is not capturing is refused
// (cudaErrorIllegalState, cuda_runtime_api.h).
//
// Pacing (GPUPROXY_TEST_PACE=1): one stdin line before each launch, "step
// <k> done" after it (tests/test_corpus_checkpoint.py dumps and restores
// between launches).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

#define NAME "graph_cond_capture"
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

static const int N = 1024;
static const int BLOCK = 256;

extern "C" __global__ void k_fill(int *data, int n, int *counter)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        data[i] = i % 5;
    if (i == 0)
        *counter = 0;
}

extern "C" __global__ void k_step(int *data, int n, int *counter, const int *limit, cudaGraphConditionalHandle h)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        data[i] += i % 3 + 1;
    if (i == 0) {
        int c = *counter + 1;
        *counter = c;
        cudaGraphSetConditional(h, c < *limit);
    }
}

extern "C" __global__ void k_scale(int *data, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        data[i] = 2 * data[i] + 1;
}

extern "C" __global__ void k_check(const int *counter, cudaGraphConditionalHandle h)
{
    if (blockIdx.x == 0 && threadIdx.x == 0)
        cudaGraphSetConditional(h, *counter % 2 == 0);
}

extern "C" __global__ void k_add(int *data, int n, int v)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        data[i] += v;
}

extern "C" __global__ void k_last(int *data, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        data[i] -= i % 2;
}

// A conditional node on the capture's graph after the capture's current
// dependencies; the capture then follows it. Returns its body graph.
static cudaGraph_t cond_in_capture(cudaStream_t s, cudaGraph_t *graph_seen, cudaGraphConditionalHandle h,
                                   cudaGraphConditionalNodeType type)
{
    cudaStreamCaptureStatus st;
    cudaGraph_t cg = NULL;
    const cudaGraphNode_t *deps = NULL;
    size_t nd = 0;
    CHECK(cudaStreamGetCaptureInfo(s, &st, NULL, &cg, &deps, NULL, &nd));
    EXPECT(st == cudaStreamCaptureStatusActive && cg != NULL, "the stream is not capturing (status %d)", (int)st);
    EXPECT(*graph_seen == NULL || *graph_seen == cg, "the capture's graph changed");
    *graph_seen = cg;
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = h;
    p.conditional.type = type;
    p.conditional.size = 1;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddNode(&node, cg, deps, NULL, nd, &p));
    EXPECT(p.conditional.phGraph_out && p.conditional.phGraph_out[0], "no body graph");
    CHECK(cudaStreamUpdateCaptureDependencies(s, &node, (const cudaGraphEdgeData *)nullptr, 1, cudaStreamSetCaptureDependencies));
    return p.conditional.phGraph_out[0];
}

int main()
{
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    const int pacing = pace_env && strcmp(pace_env, "1") == 0;
    int waiting = pacing;
    const int iters = 4;
    const int grid = (N + BLOCK - 1) / BLOCK;
    int n = N;

    int *data, *counter, *limit;
    CHECK(cudaMalloc(&data, N * sizeof(int)));
    CHECK(cudaMalloc(&counter, sizeof(int)));
    CHECK(cudaMalloc(&limit, sizeof(int)));
    cudaStream_t s, sb;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));

    // not capturing: nothing to update
    cudaGraphNode_t none = NULL;
    cudaError_t e = cudaStreamUpdateCaptureDependencies(s, &none, (const cudaGraphEdgeData *)nullptr, 0, cudaStreamSetCaptureDependencies);
    EXPECT(e == cudaErrorIllegalState, "cudaStreamUpdateCaptureDependencies outside a capture: %s",
           cudaGetErrorName(e));
    cudaGetLastError();

    cudaGraph_t cg = NULL;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    k_fill<<<grid, BLOCK, 0, s>>>(data, n, counter);
    CHECK(cudaGetLastError());
    {
        cudaStreamCaptureStatus st;
        CHECK(cudaStreamGetCaptureInfo(s, &st, NULL, &cg, NULL, NULL, NULL));
    }
    cudaGraphConditionalHandle hw, hi;
    CHECK(cudaGraphConditionalHandleCreate(&hw, cg, 1, cudaGraphCondAssignDefault));
    CHECK(cudaGraphConditionalHandleCreate(&hi, cg, 0, 0));

    cudaGraph_t wbody = cond_in_capture(s, &cg, hw, cudaGraphCondTypeWhile);
    CHECK(cudaStreamBeginCaptureToGraph(sb, wbody, NULL, NULL, 0, cudaStreamCaptureModeRelaxed));
    k_step<<<grid, BLOCK, 0, sb>>>(data, n, counter, limit, hw);
    CHECK(cudaGetLastError());
    cudaGraph_t got;
    CHECK(cudaStreamEndCapture(sb, &got));
    EXPECT(got == wbody, "the WHILE body's capture ended in another graph");

    k_scale<<<grid, BLOCK, 0, s>>>(data, n);
    k_check<<<1, 1, 0, s>>>(counter, hi);
    CHECK(cudaGetLastError());
    cudaGraph_t ibody = cond_in_capture(s, &cg, hi, cudaGraphCondTypeIf);
    CHECK(cudaStreamBeginCaptureToGraph(sb, ibody, NULL, NULL, 0, cudaStreamCaptureModeRelaxed));
    k_add<<<grid, BLOCK, 0, sb>>>(data, n, 100);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamEndCapture(sb, nullptr));        // as NVIDIA's samples end a capture into a body
    k_last<<<grid, BLOCK, 0, s>>>(data, n);
    CHECK(cudaGetLastError());
    cudaGraph_t g;
    CHECK(cudaStreamEndCapture(s, &g));
    EXPECT(g == cg, "cudaStreamEndCapture returned another graph than the capture's");
    printf("graph captured: WHILE and IF added in the capture\n");

    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    std::vector<int> host(N);
    for (int k = 1; k <= iters; ++k) {
        if (waiting) {
            char line[256];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        int lim = k + 1;
        CHECK(cudaMemcpy(limit, &lim, sizeof lim, cudaMemcpyHostToDevice));
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        int cnt = -1;
        CHECK(cudaMemcpy(&cnt, counter, sizeof cnt, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(host.data(), data, N * sizeof(int), cudaMemcpyDeviceToHost));
        EXPECT(cnt == lim, "launch %d: the while loop ran %d times, want %d", k, cnt, lim);
        long long sum = 0;
        for (int i = 0; i < N; ++i) {
            int want = 2 * (i % 5 + lim * (i % 3 + 1)) + 1 + (cnt % 2 == 0 ? 100 : 0) - i % 2;
            EXPECT(host[i] == want, "launch %d element %d: %d, want %d", k, i, host[i], want);
            sum += host[i];
        }
        printf("iter %d: loop %d passes, if %s, sum %lld\n", k, cnt, cnt % 2 == 0 ? "then" : "skipped", sum);
        if (pacing)
            printf("step %d done\n", k);
        fflush(stdout);
    }
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaStreamDestroy(sb));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(data));
    CHECK(cudaFree(counter));
    CHECK(cudaFree(limit));
    printf("PASS " NAME "\n");
    return 0;
}
