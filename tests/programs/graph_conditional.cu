// graph_conditional: conditional graph nodes (CUDA 12.4+; issue 26), the
// nodes XLA's command buffers build `while` and `cond` from.
//
// One graph, launched once per iteration:
//   memset marks = 0
//   -> k_reset: counter = 0, condition of the WHILE = (limit > 0)
//   -> WHILE (handle hw): k_body adds (i % 7) + 1 to every element, counts
//      one pass in `counter` and sets the condition to (counter < limit)
//   -> k_check: condition of the IF = (counter is even)
//   -> IF/ELSE (handle hi, size 2): then adds 100 (a kernel node); else
//      subtracts 3 (a kernel captured into the else body with
//      cudaStreamBeginCaptureToGraph)
//   -> k_pick: sets the SWITCH's condition to counter % 3 when it is not 0
//      (0 comes from the handle's default, assigned at every launch:
//      cudaGraphCondAssignDefault)
//   -> SWITCH (handle hs, size 3): body 0 adds 1000, body 1 memsets marks to
//      5, body 2 subtracts 7.
// `limit` (device memory) is k + 1 at launch k, so the loop runs k + 1
// times and every branch of the IF and the SWITCH is taken over the run.
// A second graph made with the driver API (cuGraphConditionalHandleCreate,
// cuGraphAddNode with CU_GRAPH_NODE_TYPE_CONDITIONAL): IF (counter > 3)
// adds 1 to `aux`. Every launch is checked element by element against a
// CPU computation.
//
// Pacing (GPUPROXY_TEST_PACE=1): one stdin line before each iteration,
// "step <k> done" after it (tests/test_corpus_checkpoint.py dumps and
// restores the program between launches: the handles must keep their
// values, which the kernel nodes hold in their parameters).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>

#define NAME "graph_conditional"
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
#define CU(call)                                                                \
    do {                                                                        \
        CUresult r_ = (call);                                                   \
        if (r_ != CUDA_SUCCESS) {                                               \
            const char *n_ = "?";                                               \
            cuGetErrorName(r_, &n_);                                            \
            printf("FAIL " NAME ": %s -> %s at %s:%d\n", #call, n_,             \
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

static const int N = 2048;
static const int BLOCK = 256;

extern "C" __global__ void k_reset(int *counter, const int *limit, cudaGraphConditionalHandle h)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        *counter = 0;
        cudaGraphSetConditional(h, *limit > 0);
    }
}

extern "C" __global__ void k_body(int *data, int n, int *counter, const int *limit, cudaGraphConditionalHandle h)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        data[i] += i % 7 + 1;
    if (i == 0) {
        int c = *counter + 1;
        *counter = c;
        cudaGraphSetConditional(h, c < *limit);
    }
}

extern "C" __global__ void k_check(const int *counter, cudaGraphConditionalHandle h)
{
    if (blockIdx.x == 0 && threadIdx.x == 0)
        cudaGraphSetConditional(h, *counter % 2 == 0);
}

extern "C" __global__ void k_pick(const int *counter, cudaGraphConditionalHandle h)
{
    if (blockIdx.x == 0 && threadIdx.x == 0 && *counter % 3 != 0)
        cudaGraphSetConditional(h, *counter % 3);
}

extern "C" __global__ void k_more(const int *counter, cudaGraphConditionalHandle h)
{
    if (blockIdx.x == 0 && threadIdx.x == 0)
        cudaGraphSetConditional(h, *counter > 3);
}

extern "C" __global__ void k_add(int *data, int n, int v)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        data[i] += v;
}

static cudaGraphNode_t kernel_node(cudaGraph_t g, const cudaGraphNode_t *dep, void *fn, void **args, int grid)
{
    cudaKernelNodeParams kp = {};
    kp.func = fn;
    kp.gridDim = dim3(grid);
    kp.blockDim = dim3(BLOCK);
    kp.kernelParams = args;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddKernelNode(&node, g, dep, dep ? 1 : 0, &kp));
    return node;
}

static cudaGraphNode_t cond_node(cudaGraph_t g, cudaGraphNode_t dep, cudaGraphConditionalHandle h,
                                 cudaGraphConditionalNodeType type, unsigned size, cudaGraph_t *bodies)
{
    cudaGraphNodeParams p = {};
    p.type = cudaGraphNodeTypeConditional;
    p.conditional.handle = h;
    p.conditional.type = type;
    p.conditional.size = size;
    cudaGraphNode_t node;
    CHECK(cudaGraphAddNode(&node, g, &dep, NULL, 1, &p));
    for (unsigned i = 0; i < size; ++i) {
        EXPECT(p.conditional.phGraph_out[i] != NULL, "body graph %u of a conditional node is NULL", i);
        bodies[i] = p.conditional.phGraph_out[i];
    }
    return node;
}

int main(int argc, char **argv)
{
    int iters = (argc > 1) ? atoi(argv[1]) : 5;
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    const int pacing = pace_env && strcmp(pace_env, "1") == 0;
    int waiting = pacing;

    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *data, *marks, *counter, *limit, *aux;
    CHECK(cudaMalloc(&data, N * sizeof(int)));
    CHECK(cudaMalloc(&marks, N * sizeof(int)));
    CHECK(cudaMalloc(&aux, N * sizeof(int)));
    CHECK(cudaMalloc(&counter, sizeof(int)));
    CHECK(cudaMalloc(&limit, sizeof(int)));
    std::vector<int> init(N);
    for (int i = 0; i < N; ++i)
        init[i] = i % 13;
    CHECK(cudaMemcpy(data, init.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(aux, 0, N * sizeof(int)));
    int n = N, grid = (N + BLOCK - 1) / BLOCK;

    // ---- the runtime graph
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphConditionalHandle hw, hi, hs;
    CHECK(cudaGraphConditionalHandleCreate(&hw, g, 1, cudaGraphCondAssignDefault));
    CHECK(cudaGraphConditionalHandleCreate(&hi, g, 0, 0));
    CHECK(cudaGraphConditionalHandleCreate(&hs, g, 0, cudaGraphCondAssignDefault));
    EXPECT(hw != hi && hi != hs && hw != hs, "conditional handles are not distinct");

    cudaMemsetParams mp = {};
    mp.dst = marks;
    mp.value = 0;
    mp.elementSize = 4;
    mp.width = N;
    mp.height = 1;
    cudaGraphNode_t m0;
    CHECK(cudaGraphAddMemsetNode(&m0, g, NULL, 0, &mp));
    void *a_reset[] = { &counter, &limit, &hw };
    cudaGraphNode_t r = kernel_node(g, &m0, (void *)k_reset, a_reset, 1);
    cudaGraph_t wbody;
    cudaGraphNode_t w = cond_node(g, r, hw, cudaGraphCondTypeWhile, 1, &wbody);
    void *a_body[] = { &data, &n, &counter, &limit, &hw };
    kernel_node(wbody, NULL, (void *)k_body, a_body, grid);

    void *a_check[] = { &counter, &hi };
    cudaGraphNode_t c = kernel_node(g, &w, (void *)k_check, a_check, 1);
    cudaGraph_t ibodies[2];
    cudaGraphNode_t ifn = cond_node(g, c, hi, cudaGraphCondTypeIf, 2, ibodies);
    int plus100 = 100, minus3 = -3;
    void *a_then[] = { &data, &n, &plus100 };
    kernel_node(ibodies[0], NULL, (void *)k_add, a_then, grid);
    // the else body through a capture into it
    CHECK(cudaStreamBeginCaptureToGraph(s, ibodies[1], NULL, NULL, 0, cudaStreamCaptureModeGlobal));
    k_add<<<grid, BLOCK, 0, s>>>(data, n, minus3);
    cudaGraph_t captured;
    CHECK(cudaStreamEndCapture(s, &captured));
    EXPECT(captured == ibodies[1], "the capture ended into another graph");

    void *a_pick[] = { &counter, &hs };
    cudaGraphNode_t pk = kernel_node(g, &ifn, (void *)k_pick, a_pick, 1);
    cudaGraph_t sbodies[3];
    cond_node(g, pk, hs, cudaGraphCondTypeSwitch, 3, sbodies);
    int plus1000 = 1000, minus7 = -7;
    void *a_s0[] = { &data, &n, &plus1000 };
    kernel_node(sbodies[0], NULL, (void *)k_add, a_s0, grid);
    cudaMemsetParams mp5 = mp;
    mp5.value = 5;
    cudaGraphNode_t m5;
    CHECK(cudaGraphAddMemsetNode(&m5, sbodies[1], NULL, 0, &mp5));
    void *a_s2[] = { &data, &n, &minus7 };
    kernel_node(sbodies[2], NULL, (void *)k_add, a_s2, grid);

    size_t count = 0;
    CHECK(cudaGraphGetNodes(g, NULL, &count));
    cudaGraphNode_t nodes[16];
    size_t got = 16;
    CHECK(cudaGraphGetNodes(g, nodes, &got));
    int nconds = 0;
    for (size_t i = 0; i < got; ++i) {
        cudaGraphNodeType t;
        CHECK(cudaGraphNodeGetType(nodes[i], &t));
        nconds += t == cudaGraphNodeTypeConditional;
    }
    printf("graph built: %zu nodes, %d conditional\n", count, nconds);
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));

    // ---- the driver graph: IF (counter > 3) adds 1 to aux
    CU(cuInit(0));
    CUcontext ctx;
    CU(cuCtxGetCurrent(&ctx));
    CUgraph gd;
    CU(cuGraphCreate(&gd, 0));
    CUgraphConditionalHandle hd;
    CU(cuGraphConditionalHandleCreate(&hd, gd, ctx, 0, CU_GRAPH_COND_ASSIGN_DEFAULT));
    void *a_more[] = { &counter, &hd };
    cudaGraphNode_t mo = kernel_node((cudaGraph_t)gd, NULL, (void *)k_more, a_more, 1);
    CUgraphNodeParams dp;
    memset(&dp, 0, sizeof dp);
    dp.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    dp.conditional.handle = hd;
    dp.conditional.type = CU_GRAPH_COND_TYPE_IF;
    dp.conditional.size = 1;
    dp.conditional.ctx = ctx;
    CUgraphNode dn;
    CUgraphNode dep = (CUgraphNode)mo;
    CU(cuGraphAddNode(&dn, gd, &dep, NULL, 1, &dp));     // cuGraphAddNode_v2 (cuda.h), no edge data
    int plus1 = 1;
    void *a_aux[] = { &aux, &n, &plus1 };
    kernel_node((cudaGraph_t)dp.conditional.phGraph_out[0], NULL, (void *)k_add, a_aux, grid);
    CUgraphExec execd;
    CU(cuGraphInstantiate(&execd, gd, 0));

    std::vector<long long> ref(N);
    for (int i = 0; i < N; ++i)
        ref[i] = init[i];
    std::vector<int> host(N), hmarks(N), haux(N);
    long long ref_aux = 0;
    for (int k = 1; k <= iters; ++k) {
        if (waiting) {
            char line[256];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        int lim = k + 1;
        CHECK(cudaMemcpy(limit, &lim, sizeof lim, cudaMemcpyHostToDevice));
        CHECK(cudaGraphLaunch(exec, s));
        CU(cuGraphLaunch(execd, (CUstream)s));
        CHECK(cudaStreamSynchronize(s));
        int cnt = -1;
        CHECK(cudaMemcpy(&cnt, counter, sizeof cnt, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(host.data(), data, N * sizeof(int), cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(hmarks.data(), marks, N * sizeof(int), cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(haux.data(), aux, N * sizeof(int), cudaMemcpyDeviceToHost));
        EXPECT(cnt == lim, "launch %d: the while loop ran %d times, want %d", k, cnt, lim);
        const char *branch = cnt % 2 == 0 ? "then" : "else";
        int sw = cnt % 3;
        if (cnt > 3)
            ref_aux += 1;
        long long sum = 0, msum = 0, asum = 0;
        for (int i = 0; i < N; ++i) {
            ref[i] += (long long)lim * (i % 7 + 1);
            ref[i] += cnt % 2 == 0 ? 100 : -3;
            ref[i] += sw == 0 ? 1000 : (sw == 2 ? -7 : 0);
            int want_mark = sw == 1 ? 5 : 0;
            EXPECT(host[i] == ref[i], "launch %d element %d: %d, want %lld", k, i, host[i], ref[i]);
            EXPECT(hmarks[i] == want_mark, "launch %d mark %d: %d, want %d", k, i, hmarks[i], want_mark);
            EXPECT(haux[i] == ref_aux, "launch %d aux %d: %d, want %lld", k, i, haux[i], ref_aux);
            sum += host[i];
            msum += hmarks[i];
            asum += haux[i];
        }
        printf("iter %d: loop %d passes, if %s, switch %d, sum %lld marks %lld aux %lld\n", k, cnt, branch, sw, sum,
               msum, asum);
        if (pacing)
            printf("step %d done\n", k);
        fflush(stdout);
    }
    CU(cuGraphExecDestroy(execd));
    CU(cuGraphDestroy(gd));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaFree(data));
    CHECK(cudaFree(marks));
    CHECK(cudaFree(aux));
    CHECK(cudaFree(counter));
    CHECK(cudaFree(limit));
    CHECK(cudaStreamDestroy(s));
    printf("PASS " NAME "\n");
    return 0;
}
