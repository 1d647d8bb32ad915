// stream_state: stream priorities, stream attributes, device limits, the
// profiler switches, a P2P attribute query and a recorded event -- state that
// a checkpoint must carry over (issue 10, group 7). Two priority streams
// accumulate into two device arrays for argv[1] iterations (default 6); every
// iteration re-reads all that state and checks it, so a dump/restore between
// iterations that lost any of it fails the program.
//
// Pacing (only when GPUPROXY_TEST_PACE=1): before each iteration one line is
// read from stdin; after iteration k the device is synchronized and
// "step <k> done" is printed.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>
#include <cuda_profiler_api.h>

#define NAME "stream_state"
#define CHECK(call)                                                             \
    do {                                                                        \
        cudaError_t err_ = (call);                                              \
        if (err_ != cudaSuccess) {                                              \
            printf("FAIL " NAME ": %s -> %s (%s) at %s:%d\n", #call,            \
                   cudaGetErrorName(err_), cudaGetErrorString(err_),            \
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

static const int N = 1 << 16;

// x[i] += v + i % 7
__global__ void add_step(int *x, int n, int v)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += v + i % 7;
}

// y[i] += x[i]
__global__ void mix_into(int *y, const int *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] += x[i];
}

static const size_t STACK = 4096;
static const size_t HEAP = 16u << 20;

static void check_state(cudaStream_t lo, cudaStream_t hi, int least, int greatest, cudaEvent_t ev)
{
    int p = 99;
    CHECK(cudaStreamGetPriority(lo, &p));
    EXPECT(p == least, "low stream priority %d, want %d", p, least);
    CHECK(cudaStreamGetPriority(hi, &p));
    EXPECT(p == greatest, "high stream priority %d, want %d", p, greatest);
    cudaLaunchAttributeValue v;
    memset(&v, 0, sizeof v);
    CHECK(cudaStreamGetAttribute(hi, cudaLaunchAttributeSynchronizationPolicy, &v));
    EXPECT(v.syncPolicy == cudaSyncPolicyYield, "sync policy %d", (int)v.syncPolicy);
    memset(&v, 0, sizeof v);
    CHECK(cudaStreamGetAttribute(lo, cudaLaunchAttributeMemSyncDomain, &v));
    EXPECT(v.memSyncDomain == cudaLaunchMemSyncDomainRemote, "mem sync domain %d", (int)v.memSyncDomain);
    size_t lim = 0;
    CHECK(cudaDeviceGetLimit(&lim, cudaLimitStackSize));
    EXPECT(lim == STACK, "stack size limit %zu", lim);
    CHECK(cudaDeviceGetLimit(&lim, cudaLimitMallocHeapSize));
    EXPECT(lim == HEAP, "malloc heap limit %zu", lim);
    // recorded before the first iteration and long complete
    EXPECT(cudaEventQuery(ev) == cudaSuccess, "first event not complete");
    CHECK(cudaEventSynchronize(ev));
}

int main(int argc, char **argv)
{
    int iters = (argc > 1) ? atoi(argv[1]) : 6;
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    const int pacing = pace_env && strcmp(pace_env, "1") == 0;
    int waiting = pacing;

    CHECK(cudaFree(0));
    CHECK(cudaProfilerStart());

    int least = 0, greatest = 0;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    EXPECT(greatest <= least, "priority range %d..%d", least, greatest);
    printf("priority range has %d levels\n", least - greatest + 1 > 1 ? 2 : 1);
    cudaStream_t lo, hi;
    CHECK(cudaStreamCreateWithPriority(&lo, cudaStreamNonBlocking, least));
    CHECK(cudaStreamCreateWithPriority(&hi, cudaStreamNonBlocking, greatest));

    cudaLaunchAttributeValue v;
    memset(&v, 0, sizeof v);
    v.syncPolicy = cudaSyncPolicyYield;
    CHECK(cudaStreamSetAttribute(hi, cudaLaunchAttributeSynchronizationPolicy, &v));
    memset(&v, 0, sizeof v);
    v.memSyncDomain = cudaLaunchMemSyncDomainRemote;
    CHECK(cudaStreamSetAttribute(lo, cudaLaunchAttributeMemSyncDomain, &v));
    CHECK(cudaDeviceSetLimit(cudaLimitStackSize, STACK));
    CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, HEAP));

    // P2P attributes: a device is not its own peer (documented error); with
    // two devices, the access attribute is a boolean
    int ndev = 0, val = -1;
    CHECK(cudaGetDeviceCount(&ndev));
    cudaError_t e = cudaDeviceGetP2PAttribute(&val, cudaDevP2PAttrAccessSupported, 0, 0);
    printf("p2p attribute of device 0 with itself: %s\n", cudaGetErrorName(e));
    (void)cudaGetLastError();
    if (ndev > 1) {
        CHECK(cudaDeviceGetP2PAttribute(&val, cudaDevP2PAttrAccessSupported, 0, 1));
        EXPECT(val == 0 || val == 1, "p2p access attribute %d", val);
    }

    int *x, *y;
    CHECK(cudaMalloc(&x, N * sizeof(int)));
    CHECK(cudaMalloc(&y, N * sizeof(int)));
    CHECK(cudaMemset(x, 0, N * sizeof(int)));
    CHECK(cudaMemset(y, 0, N * sizeof(int)));
    CHECK(cudaDeviceSynchronize());
    cudaEvent_t first, ev;
    CHECK(cudaEventCreate(&first));
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CHECK(cudaEventRecord(first, lo));
    CHECK(cudaEventSynchronize(first));

    const int T = 256, B = (N + T - 1) / T;
    for (int k = 1; k <= iters; ++k) {
        if (waiting) {
            char line[256];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        check_state(lo, hi, least, greatest, first);
        add_step<<<B, T, 0, lo>>>(x, N, k);
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(ev, lo));
        add_step<<<B, T, 0, hi>>>(y, N, 2 * k);
        CHECK(cudaStreamWaitEvent(hi, ev, 0));
        mix_into<<<B, T, 0, hi>>>(y, x, N);
        CHECK(cudaGetLastError());
        CHECK(cudaStreamSynchronize(hi));
        printf("iter %d state ok\n", k);
        if (pacing) {
            CHECK(cudaDeviceSynchronize());
            printf("step %d done\n", k);
        }
        fflush(stdout);
    }
    CHECK(cudaProfilerStop());

    std::vector<int> hx(N), hy(N);
    CHECK(cudaMemcpy(hx.data(), x, N * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hy.data(), y, N * sizeof(int), cudaMemcpyDeviceToHost));
    long long sx = 0, sy = 0;
    for (int i = 0; i < N; ++i) {
        long long wx = 0, wy = 0;
        for (int k = 1; k <= iters; ++k) {
            wx += k + i % 7;
            wy += 2 * k + i % 7 + wx;
        }
        EXPECT(hx[i] == wx && hy[i] == wy, "element %d: x %d y %d, want %lld %lld", i, hx[i], hy[i], wx, wy);
        sx += hx[i];
        sy += hy[i];
    }
    printf("sums %lld %lld\n", sx, sy);
    CHECK(cudaEventDestroy(first));
    CHECK(cudaEventDestroy(ev));
    CHECK(cudaStreamDestroy(lo));
    CHECK(cudaStreamDestroy(hi));
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    printf("PASS " NAME "\n");
    return 0;
}
