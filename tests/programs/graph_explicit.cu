// graph_explicit: CUDA graphs built node by node (issue 10, group 3), with
// the runtime API and then the driver API.
//
// Runtime part: one graph with a host node (fills the input, in the
// application, in graph order), memcpy nodes host->device from page-locked
// memory, device->device (inside a child graph) and device->host (a
// cudaMemcpy3DParms one into page-locked memory, a 1D one into pageable
// memory), a memset node, kernel nodes, an event-wait node (on an event the
// program records on another stream), an event-record node, an empty join
// node, a child-graph node, and an edge added afterwards with
// cudaGraphAddDependencies (and one added and removed again). Topology
// queries (nodes, root nodes, edges, node types, the DOT print) are checked,
// a node is destroyed, the graph is cloned (and an executable graph of the
// clone refuses an update from a graph of another shape). The executable
// graph is launched every iteration; before launch 3 a kernel node's
// parameters change in the executable graph
// (cudaGraphExecKernelNodeSetParams), before launch 4 the graph's node
// changes and the executable graph takes it over (cudaGraphExecUpdate).
// Every launch is checked element by element against a CPU computation.
//
// Driver part: cuGraphCreate, cuGraphAddNode (generic parameters, memset),
// cuGraphAddKernelNode (kernelParams) and cuGraphAddNode for a kernel with
// its arguments in the `extra` form, instantiate, launch, node parameters
// changed in the graph and taken over by cuGraphExecUpdate.
//
// Pacing (GPUPROXY_TEST_PACE=1): one stdin line before each iteration,
// "step <k> done" after it (tests/test_corpus_checkpoint.py dumps and
// restores the program between launches).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>

#define NAME "graph_explicit"
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

static const int N = 4096;

// x[i] = x[i] * a + i % 5
__global__ void k_scale(int *x, int n, int a)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = x[i] * a + i % 5;
}

// y[i] += x[i]
__global__ void k_add(int *y, const int *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] += x[i];
}

// x[i] = v + i % 3
__global__ void k_fill(int *x, int n, int v)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = v + i % 3;
}

struct HostState {
    int runs;
    int *in;
};

// the host node: counts its runs and writes the input of this launch
static void CUDART_CB fill_input(void *p)
{
    HostState *s = (HostState *)p;
    ++s->runs;
    for (int i = 0; i < N; ++i)
        s->in[i] = i % 11 + s->runs;
}

// the multiplier of launch k: the graph's 2, then 5 set in the executable
// graph before launch 3, then 4 from the updated clone from launch 4 on
static int mult(int k) { return k < 3 ? 2 : k == 3 ? 5 : 4; }

static void driver_part(void);

int main(int argc, char **argv)
{
    int iters = (argc > 1) ? atoi(argv[1]) : 5;
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    const int pacing = pace_env && strcmp(pace_env, "1") == 0;
    int waiting = pacing;

    cudaStream_t s, s2;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t ev_bias, ev_done;
    CHECK(cudaEventCreateWithFlags(&ev_bias, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&ev_done, cudaEventDisableTiming));
    int *x, *y, *z, *w, *bias, *pin_w;
    CHECK(cudaMalloc(&x, N * sizeof(int)));
    CHECK(cudaMalloc(&y, N * sizeof(int)));
    CHECK(cudaMalloc(&z, N * sizeof(int)));
    CHECK(cudaMalloc(&w, N * sizeof(int)));
    CHECK(cudaMalloc(&bias, N * sizeof(int)));
    CHECK(cudaMallocHost(&pin_w, N * sizeof(int)));
    CHECK(cudaMemset(y, 0, N * sizeof(int)));
    CHECK(cudaDeviceSynchronize());
    const int T = 128, B = (N + T - 1) / T;
    k_fill<<<B, T, 0, s2>>>(bias, N, 7);
    CHECK(cudaEventRecord(ev_bias, s2));

    // the input is page-locked: a memcpy node reading pageable memory that a
    // host node of the same graph writes does not see the host node's bytes
    // natively (H100, driver 580: the copy of launch 1 read the buffer
    // before the host node ran), so a program cannot rely on it; z's copy
    // back goes to pageable memory, w's to page-locked
    int *in;
    CHECK(cudaMallocHost(&in, N * sizeof(int)));
    std::vector<int> page_z(N);
    HostState hs = { 0, in };
    int n = N, a = 2;
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    cudaGraphNode_t h1, c1, m0, w1, k1, ch, k3, k4, e1, r1, c2, c3, extra;
    cudaHostNodeParams hp = { fill_input, &hs };
    CHECK(cudaGraphAddHostNode(&h1, g, NULL, 0, &hp));
    CHECK(cudaGraphAddMemcpyNode1D(&c1, g, &h1, 1, x, in, N * sizeof(int), cudaMemcpyHostToDevice));
    cudaMemsetParams mp = {};
    mp.dst = z, mp.value = 0, mp.elementSize = 4, mp.width = N, mp.height = 1;
    CHECK(cudaGraphAddMemsetNode(&m0, g, NULL, 0, &mp));
    CHECK(cudaGraphAddEventWaitNode(&w1, g, NULL, 0, ev_bias));
    void *k1_args[] = { &x, &n, &a };
    cudaKernelNodeParams kp = {};
    kp.func = (void *)k_scale, kp.gridDim = dim3(B), kp.blockDim = dim3(T), kp.kernelParams = k1_args;
    CHECK(cudaGraphAddKernelNode(&k1, g, &c1, 1, &kp));

    // the child graph: y += x, then w = y
    cudaGraph_t child;
    CHECK(cudaGraphCreate(&child, 0));
    cudaGraphNode_t kc, cc;
    void *add_yx[] = { &y, &x, &n };
    cudaKernelNodeParams kpc = {};
    kpc.func = (void *)k_add, kpc.gridDim = dim3(B), kpc.blockDim = dim3(T), kpc.kernelParams = add_yx;
    CHECK(cudaGraphAddKernelNode(&kc, child, NULL, 0, &kpc));
    CHECK(cudaGraphAddMemcpyNode1D(&cc, child, &kc, 1, w, y, N * sizeof(int), cudaMemcpyDeviceToDevice));
    CHECK(cudaGraphAddChildGraphNode(&ch, g, &k1, 1, child));

    // z = 0 + bias + x; the edge k1 -> k4 comes later
    void *add_zb[] = { &z, &bias, &n };
    cudaKernelNodeParams kp3 = kpc;
    kp3.kernelParams = add_zb;
    cudaGraphNode_t k3deps[] = { m0, w1 };
    CHECK(cudaGraphAddKernelNode(&k3, g, k3deps, 2, &kp3));
    void *add_zx[] = { &z, &x, &n };
    cudaKernelNodeParams kp4 = kpc;
    kp4.kernelParams = add_zx;
    CHECK(cudaGraphAddKernelNode(&k4, g, &k3, 1, &kp4));
    CHECK(cudaGraphAddDependencies(g, &k1, &k4, NULL, 1));
    cudaGraphNode_t e1deps[] = { ch, k4 };
    CHECK(cudaGraphAddEmptyNode(&e1, g, e1deps, 2));
    CHECK(cudaGraphAddDependencies(g, &m0, &e1, NULL, 1));     // added and removed again
    CHECK(cudaGraphRemoveDependencies(g, &m0, &e1, NULL, 1));
    CHECK(cudaGraphAddEventRecordNode(&r1, g, &e1, 1, ev_done));
    cudaMemcpy3DParms cp = {};
    cp.srcPtr = make_cudaPitchedPtr(w, N * sizeof(int), N * sizeof(int), 1);
    cp.dstPtr = make_cudaPitchedPtr(pin_w, N * sizeof(int), N * sizeof(int), 1);
    cp.extent = make_cudaExtent(N * sizeof(int), 1, 1);
    cp.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaGraphAddMemcpyNode(&c2, g, &e1, 1, &cp));
    CHECK(cudaGraphAddMemcpyNode1D(&c3, g, &e1, 1, page_z.data(), z, N * sizeof(int), cudaMemcpyDefault));
    CHECK(cudaGraphAddEmptyNode(&extra, g, &c3, 1));
    CHECK(cudaGraphDestroyNode(extra));

    // topology as built
    size_t count = 0;
    CHECK(cudaGraphGetNodes(g, NULL, &count));
    EXPECT(count == 12, "%zu nodes, want 12", count);
    std::vector<cudaGraphNode_t> nodes(count);
    CHECK(cudaGraphGetNodes(g, nodes.data(), &count));
    const cudaGraphNode_t made[] = { h1, c1, m0, w1, k1, ch, k3, k4, e1, r1, c2, c3 };
    for (int i = 0; i < 12; ++i) {
        int seen = 0;
        for (size_t j = 0; j < count; ++j)
            seen += nodes[j] == made[i];
        EXPECT(seen == 1, "node %d listed %d times", i, seen);
    }
    cudaGraphNode_t roots[8];
    size_t nroots = 8;
    CHECK(cudaGraphGetRootNodes(g, roots, &nroots));
    EXPECT(nroots == 3, "%zu root nodes, want 3", nroots);
    for (size_t i = 0; i < nroots; ++i)
        EXPECT(roots[i] == h1 || roots[i] == m0 || roots[i] == w1, "root node %zu is not a root", i);
    size_t nedges = 0;
    CHECK(cudaGraphGetEdges(g, NULL, NULL, NULL, &nedges));
    EXPECT(nedges == 12, "%zu edges, want 12", nedges);
    std::vector<cudaGraphNode_t> from(nedges), to(nedges);
    CHECK(cudaGraphGetEdges(g, from.data(), to.data(), NULL, &nedges));
    int k1k4 = 0;
    for (size_t i = 0; i < nedges; ++i)
        k1k4 += from[i] == k1 && to[i] == k4;
    EXPECT(k1k4 == 1, "edge k1 -> k4 missing");
    const cudaGraphNode_t typed[] = { h1, c1, m0, w1, k1, ch, e1, r1 };
    const cudaGraphNodeType want[] = { cudaGraphNodeTypeHost, cudaGraphNodeTypeMemcpy, cudaGraphNodeTypeMemset,
                                       cudaGraphNodeTypeWaitEvent, cudaGraphNodeTypeKernel, cudaGraphNodeTypeGraph,
                                       cudaGraphNodeTypeEmpty, cudaGraphNodeTypeEventRecord };
    for (int i = 0; i < 8; ++i) {
        cudaGraphNodeType t;
        CHECK(cudaGraphNodeGetType(typed[i], &t));
        EXPECT(t == want[i], "node %d has type %d, want %d", i, (int)t, (int)want[i]);
    }
    EXPECT(hs.runs == 0, "the host node ran while the graph was built");
    // the DOT picture of the graph (its details differ from the driver's)
    char dot[64];
    snprintf(dot, sizeof dot, "/tmp/graph_explicit-%d.dot", (int)getpid());
    CHECK(cudaGraphDebugDotPrint(g, dot, 0));
    FILE *df = fopen(dot, "r");
    EXPECT(df != NULL, "no DOT file");
    char head[64] = "";
    EXPECT(fgets(head, sizeof head, df) && strncmp(head, "digraph", 7) == 0, "DOT file starts with %s", head);
    fclose(df);
    unlink(dot);

    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, g, 0));
    // a clone has the same shape; an executable graph of it refuses an
    // update from a graph of another shape
    cudaGraph_t clone;
    CHECK(cudaGraphClone(&clone, g));
    size_t ccount = 0;
    CHECK(cudaGraphGetNodes(clone, NULL, &ccount));
    EXPECT(ccount == count, "the clone has %zu nodes", ccount);
    cudaGraphExec_t exec2;
    CHECK(cudaGraphInstantiate(&exec2, clone, 0));
    cudaGraphExecUpdateResultInfo info;
    cudaError_t ue = cudaGraphExecUpdate(exec2, child, &info);
    EXPECT(ue == cudaErrorGraphExecUpdateFailure && info.result == cudaGraphExecUpdateErrorTopologyChanged,
           "update from another topology: %s, result %d", cudaGetErrorName(ue), (int)info.result);
    (void)cudaGetLastError();
    CHECK(cudaGraphExecDestroy(exec2));
    printf("graph built: %zu nodes, %zu edges\n", count, nedges);

    std::vector<long long> ref_y(N, 0);
    for (int k = 1; k <= iters; ++k) {
        if (waiting) {
            char line[256];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        if (k == 3) {
            int a5 = 5;
            void *args5[] = { &x, &n, &a5 };
            cudaKernelNodeParams kp5 = kp;
            kp5.kernelParams = args5;
            CHECK(cudaGraphExecKernelNodeSetParams(exec, k1, &kp5));
        }
        if (k == 4) {
            // the graph's k1 multiplies by 4 now; the executable graph takes it over
            int a4 = 4;
            void *args4[] = { &x, &n, &a4 };
            cudaKernelNodeParams kp4b = kp;
            kp4b.kernelParams = args4;
            CHECK(cudaGraphKernelNodeSetParams(k1, &kp4b));
            CHECK(cudaGraphExecUpdate(exec, g, &info));
            EXPECT(info.result == cudaGraphExecUpdateSuccess, "update result %d", (int)info.result);
        }
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        EXPECT(hs.runs == k, "host node ran %d times after %d launches", hs.runs, k);
        CHECK(cudaEventQuery(ev_done));
        long long ws = 0, zs = 0;
        for (int i = 0; i < N; ++i) {
            long long xv = (long long)(i % 11 + k) * mult(k) + i % 5;
            ref_y[i] += xv;
            long long zv = 7 + i % 3 + xv;
            EXPECT(pin_w[i] == ref_y[i] && page_z[i] == zv, "launch %d element %d: w %d z %d, want %lld %lld", k,
                   i, pin_w[i], page_z[i], ref_y[i], zv);
            ws += pin_w[i];
            zs += page_z[i];
        }
        printf("iter %d: w sum %lld z sum %lld\n", k, ws, zs);
        if (pacing)
            printf("step %d done\n", k);
        fflush(stdout);
    }
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(clone));
    CHECK(cudaGraphDestroy(child));
    CHECK(cudaGraphDestroy(g));

    driver_part();

    CHECK(cudaFreeHost(pin_w));
    CHECK(cudaFreeHost(in));
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    CHECK(cudaFree(z));
    CHECK(cudaFree(w));
    CHECK(cudaFree(bias));
    CHECK(cudaEventDestroy(ev_bias));
    CHECK(cudaEventDestroy(ev_done));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaStreamDestroy(s2));
    printf("PASS " NAME "\n");
    return 0;
}

// d = 1 (memset node); d = d * a1 + i % 5 (kernelParams); d = d * a2 + i % 5 (`extra`)
static void driver_part(void)
{
    const int T = 128, B = (N + T - 1) / T;
    CUdeviceptr d;
    CU(cuMemAlloc(&d, N * sizeof(int)));
    cudaFunction_t fscale;
    CHECK(cudaGetFuncBySymbol(&fscale, (const void *)k_scale));
    CUfunction f = (CUfunction)fscale;
    CUstream st;
    CU(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));

    CUgraph g;
    CU(cuGraphCreate(&g, 0));
    CUgraphNode n0, n1, n2;
    CUgraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_MEMSET;
    np.memset.dst = d, np.memset.value = 1, np.memset.elementSize = 4, np.memset.width = N, np.memset.height = 1;
    CU(cuCtxGetCurrent(&np.memset.ctx));     // the context the node runs in (cuda.h)
    CU(cuGraphAddNode(&n0, g, NULL, NULL, 0, &np));
    int n = N, a1 = 3;
    void *args1[] = { &d, &n, &a1 };
    CUDA_KERNEL_NODE_PARAMS kp;
    memset(&kp, 0, sizeof kp);
    kp.func = f, kp.gridDimX = B, kp.gridDimY = kp.gridDimZ = 1, kp.blockDimX = T, kp.blockDimY = kp.blockDimZ = 1;
    kp.kernelParams = args1;
    CU(cuGraphAddKernelNode(&n1, g, &n0, 1, &kp));
    // k_scale(int *, int, int) packed by hand: pointer at 0, n at 8, a at 12
    unsigned char buf[16];
    size_t bufsize = sizeof buf;
    int a2 = 2;
    memcpy(buf, &d, 8);
    memcpy(buf + 8, &n, 4);
    memcpy(buf + 12, &a2, 4);
    void *extra[] = { CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &bufsize, CU_LAUNCH_PARAM_END };
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_KERNEL;
    np.kernel.func = f, np.kernel.gridDimX = B, np.kernel.gridDimY = np.kernel.gridDimZ = 1;
    np.kernel.blockDimX = T, np.kernel.blockDimY = np.kernel.blockDimZ = 1, np.kernel.extra = extra;
    CU(cuGraphAddNode(&n2, g, &n1, NULL, 1, &np));
    CUgraphNodeType t;
    CU(cuGraphNodeGetType(n2, &t));
    EXPECT(t == CU_GRAPH_NODE_TYPE_KERNEL, "driver node type %d", (int)t);

    CUgraphExec ge;
    CU(cuGraphInstantiateWithFlags(&ge, g, 0));
    std::vector<int> h(N);
    for (int round = 0; round < 2; ++round) {
        if (round == 1) {
            // the graph's kernel node multiplies by 4 now; the executable graph takes it over
            int a4 = 4;
            void *args4[] = { &d, &n, &a4 };
            kp.kernelParams = args4;
            CU(cuGraphKernelNodeSetParams(n1, &kp));
            CUgraphExecUpdateResultInfo info;
            CU(cuGraphExecUpdate(ge, g, &info));
            EXPECT(info.result == CU_GRAPH_EXEC_UPDATE_SUCCESS, "driver update result %d", (int)info.result);
        }
        CU(cuGraphLaunch(ge, st));
        CU(cuStreamSynchronize(st));
        CU(cuMemcpyDtoH(h.data(), d, N * sizeof(int)));
        long long sum = 0;
        int m = round == 0 ? 3 : 4;
        for (int i = 0; i < N; ++i) {
            int want = (1 * m + i % 5) * 2 + i % 5;
            EXPECT(h[i] == want, "driver round %d element %d: %d, want %d", round, i, h[i], want);
            sum += h[i];
        }
        printf("driver graph round %d: sum %lld\n", round, sum);
    }
    CU(cuGraphExecDestroy(ge));
    CU(cuGraphDestroy(g));
    CU(cuStreamDestroy(st));
    CU(cuMemFree(d));
}
