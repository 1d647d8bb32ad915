// graph_memory: graph memory nodes (issue 10, group 3). Three executable
// graphs, launched every iteration:
//  A, captured on s1 with a fork to s2 (a stream created and destroyed
//    inside the capture): cudaMallocAsync of a, b, c inside
//    the capture, a copy from page-locked memory into a, b = a*a, acc += b
//    on s2, a freed, c allocated after it, c = -b copied out to page-locked
//    memory, b and c freed; every allocation lives and dies inside the graph;
//  B, built explicitly: an alloc node d, a kernel node filling it and no
//    free node, so d outlives the launch: a stream kernel reads it after the
//    graph, then it is freed by cudaFreeAsync (odd iterations) or by a
//    fourth graph that holds only a free node (even iterations);
//  C, built explicitly and instantiated with cudaGraphInstantiateFlag-
//    AutoFreeOnLaunch: its allocation e is never freed by the program
//    between launches (each launch frees it first); e's bytes from the
//    previous iteration are read before the next launch, across a dump and
//    restore too (tests/test_corpus_checkpoint.py).
// Node parameter queries, the graph-memory attributes and
// cudaDeviceGraphMemTrim are checked on the way. acc is compared with a
// CPU computation at the end.
//
// Pacing (GPUPROXY_TEST_PACE=1): one stdin line before each iteration,
// "step <k> done" after it.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

#define NAME "graph_memory"
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

__global__ void k_square(const int *in, int *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = in[i] * in[i];
}

__global__ void k_neg(const int *in, int *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = -in[i];
}

__global__ void k_acc(int *acc, const int *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        acc[i] += x[i];
}

// d[i] = v + i % 3
__global__ void k_fill(int *d, int n, int v)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        d[i] = v + i % 3;
}

static int input(int i, int k) { return (i + k) % 13 + 1; }

static cudaMemAllocNodeParams alloc_params(int device, size_t bytes)
{
    cudaMemAllocNodeParams p;
    memset(&p, 0, sizeof p);
    p.poolProps.allocType = cudaMemAllocationTypePinned;
    p.poolProps.location.type = cudaMemLocationTypeDevice;
    p.poolProps.location.id = device;
    p.bytesize = bytes;
    return p;
}

int main(int argc, char **argv)
{
    int iters = (argc > 1) ? atoi(argv[1]) : 5;
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    const int pacing = pace_env && strcmp(pace_env, "1") == 0;
    int waiting = pacing;
    const size_t bytes = N * sizeof(int);
    const int T = 256, B = (N + T - 1) / T;
    int device = 0;
    CHECK(cudaGetDevice(&device));

    cudaStream_t s1;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    cudaEvent_t fork, join;
    CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    int *acc, *h_in, *h_out;
    CHECK(cudaMalloc(&acc, bytes));
    CHECK(cudaMemset(acc, 0, bytes));
    CHECK(cudaMallocHost(&h_in, bytes));
    CHECK(cudaMallocHost(&h_out, bytes));

    // ---- A: captured, allocations inside the graph only
    int *a = NULL, *b = NULL, *c = NULL;
    CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    CHECK(cudaMallocAsync(&a, bytes, s1));
    CHECK(cudaMallocAsync(&b, bytes, s1));
    EXPECT(a && b && a != b, "captured allocations %p %p", (void *)a, (void *)b);
    CHECK(cudaMemcpyAsync(a, h_in, bytes, cudaMemcpyHostToDevice, s1));
    k_square<<<B, T, 0, s1>>>(a, b, N);
    // the forked stream is created and destroyed inside the capture, as
    // NVIDIA's graphMemoryNodes does
    cudaStream_t s2;
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    CHECK(cudaEventRecord(fork, s1));
    CHECK(cudaStreamWaitEvent(s2, fork, 0));
    k_acc<<<B, T, 0, s2>>>(acc, b, N);
    CHECK(cudaEventRecord(join, s2));
    CHECK(cudaFreeAsync(a, s1));
    CHECK(cudaMallocAsync(&c, bytes, s1));
    k_neg<<<B, T, 0, s1>>>(b, c, N);
    CHECK(cudaMemcpyAsync(h_out, c, bytes, cudaMemcpyDeviceToHost, s1));
    CHECK(cudaStreamWaitEvent(s1, join, 0));
    CHECK(cudaFreeAsync(b, s1));
    CHECK(cudaFreeAsync(c, s1));
    CHECK(cudaStreamDestroy(s2));
    cudaGraph_t ga;
    CHECK(cudaStreamEndCapture(s1, &ga));
    cudaGraphExec_t xa;
    CHECK(cudaGraphInstantiate(&xa, ga, 0));
    CHECK(cudaGraphDestroy(ga));

    // ---- B: explicit, the allocation outlives the launch
    cudaGraph_t gb;
    CHECK(cudaGraphCreate(&gb, 0));
    cudaMemAllocNodeParams ap = alloc_params(device, bytes);
    cudaGraphNode_t alloc_d, fill_d;
    CHECK(cudaGraphAddMemAllocNode(&alloc_d, gb, NULL, 0, &ap));
    int *d = (int *)ap.dptr;
    EXPECT(d != NULL, "alloc node without an address");
    cudaGraphNodeType ty;
    CHECK(cudaGraphNodeGetType(alloc_d, &ty));
    EXPECT(ty == cudaGraphNodeTypeMemAlloc, "alloc node type %d", (int)ty);
    cudaMemAllocNodeParams got;
    CHECK(cudaGraphMemAllocNodeGetParams(alloc_d, &got));
    EXPECT(got.dptr == (void *)d && got.bytesize == bytes && got.poolProps.location.id == device,
           "alloc node parameters %p %zu", got.dptr, got.bytesize);
    int n = N, v_d = 2, v_e = 7;
    void *fill_d_args[] = { &d, &n, &v_d };
    cudaKernelNodeParams kp;
    memset(&kp, 0, sizeof kp);
    kp.func = (void *)k_fill;
    kp.gridDim = dim3(B);
    kp.blockDim = dim3(T);
    kp.kernelParams = fill_d_args;
    CHECK(cudaGraphAddKernelNode(&fill_d, gb, &alloc_d, 1, &kp));
    cudaGraphExec_t xb;
    CHECK(cudaGraphInstantiate(&xb, gb, 0));

    // a graph that only frees d
    cudaGraph_t gf;
    cudaGraphNode_t free_d;
    CHECK(cudaGraphCreate(&gf, 0));
    CHECK(cudaGraphAddMemFreeNode(&free_d, gf, NULL, 0, d));
    void *fp = NULL;
    CHECK(cudaGraphMemFreeNodeGetParams(free_d, &fp));
    EXPECT(fp == (void *)d, "free node frees %p, not %p", fp, (void *)d);
    cudaGraphExec_t xf;
    CHECK(cudaGraphInstantiate(&xf, gf, 0));
    CHECK(cudaGraphDestroy(gf));

    // ---- C: explicit, freed by the next launch (auto free on launch)
    cudaGraph_t gc;
    CHECK(cudaGraphCreate(&gc, 0));
    cudaGraphNode_t alloc_e, fill_e;
    ap = alloc_params(device, bytes);
    CHECK(cudaGraphAddMemAllocNode(&alloc_e, gc, NULL, 0, &ap));
    int *e = (int *)ap.dptr;
    EXPECT(e != NULL && e != d, "second alloc node address %p", (void *)e);
    void *fill_e_args[] = { &e, &n, &v_e };
    kp.kernelParams = fill_e_args;
    CHECK(cudaGraphAddKernelNode(&fill_e, gc, &alloc_e, 1, &kp));
    cudaGraphExec_t xc;
    CHECK(cudaGraphInstantiateWithFlags(&xc, gc, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    CHECK(cudaGraphDestroy(gc));
    printf("graphs built\n");

    for (int k = 1; k <= iters; ++k) {
        if (waiting) {
            char line[256];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        for (int i = 0; i < N; ++i)
            h_in[i] = input(i, k);
        if (k > 1)   // e from the previous launch of C is still allocated
            k_acc<<<B, T, 0, s1>>>(acc, e, N);
        CHECK(cudaGraphLaunch(xa, s1));
        CHECK(cudaGraphLaunch(xb, s1));
        k_acc<<<B, T, 0, s1>>>(acc, d, N);
        if (k % 2)
            CHECK(cudaFreeAsync(d, s1));
        else
            CHECK(cudaGraphLaunch(xf, s1));
        CHECK(cudaGraphLaunch(xc, s1));
        k_acc<<<B, T, 0, s1>>>(acc, e, N);
        CHECK(cudaStreamSynchronize(s1));
        long long os = 0;
        for (int i = 0; i < N; ++i) {
            EXPECT(h_out[i] == -input(i, k) * input(i, k), "iteration %d: out[%d] = %d", k, i, h_out[i]);
            os += h_out[i];
        }
        if (k == 1) {
            unsigned long long used = 0, high = 0, zero = 0;
            CHECK(cudaDeviceGetGraphMemAttribute(device, cudaGraphMemAttrUsedMemCurrent, &used));
            CHECK(cudaDeviceGetGraphMemAttribute(device, cudaGraphMemAttrReservedMemHigh, &high));
            EXPECT(high >= used, "reserved high %llu below used %llu", high, used);
            CHECK(cudaDeviceSetGraphMemAttribute(device, cudaGraphMemAttrUsedMemHigh, &zero));
            CHECK(cudaDeviceGraphMemTrim(device));
        }
        printf("iter %d: out sum %lld\n", k, os);
        if (pacing)
            printf("step %d done\n", k);
        fflush(stdout);
    }

    std::vector<int> h(N);
    CHECK(cudaMemcpy(h.data(), acc, bytes, cudaMemcpyDeviceToHost));
    long long total = 0;
    for (int i = 0; i < N; ++i) {
        long long want = 0;
        for (int k = 1; k <= iters; ++k)
            want += (long long)input(i, k) * input(i, k) + (v_d + i % 3) + (v_e + i % 3) * (k > 1 ? 2 : 1);
        EXPECT(h[i] == want, "acc[%d] = %d, want %lld", i, h[i], want);
        total += h[i];
    }
    printf("acc sum %lld\n", total);
    CHECK(cudaFree(e));             // still allocated by C's last launch
    CHECK(cudaGraphExecDestroy(xa));
    CHECK(cudaGraphExecDestroy(xb));
    CHECK(cudaGraphExecDestroy(xf));
    CHECK(cudaGraphExecDestroy(xc));
    CHECK(cudaGraphDestroy(gb));
    CHECK(cudaFree(acc));
    CHECK(cudaFreeHost(h_in));
    CHECK(cudaFreeHost(h_out));
    CHECK(cudaEventDestroy(fork));
    CHECK(cudaEventDestroy(join));
    CHECK(cudaStreamDestroy(s1));
    printf("PASS " NAME "\n");
    return 0;
}
