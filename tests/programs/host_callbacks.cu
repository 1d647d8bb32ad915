// host_callbacks: host functions in stream order (issue 10, group 2):
// cudaLaunchHostFunc, cudaStreamAddCallback and the driver's
// cuLaunchHostFunc, between a kernel, a device-to-host copy into pinned
// memory and a host-to-device copy back. Each iteration's host function
// rewrites the pinned buffer; the copy enqueued after it must see the
// rewritten values (work after a host function waits until it returned),
// and the callback enqueued after that must see the copy done. The final
// device array is compared with a CPU computation of the same recurrence.
//
// Pacing (GPUPROXY_TEST_PACE=1): one stdin line before each iteration,
// "step <k> done" after it. GPUPROXY_TEST_HOSTFN_GATE=<path>: in iteration 2
// the first host function creates <path>.started and returns only once
// <path> exists (tests/test_host_functions.py dumps the program meanwhile).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <unistd.h>
#include <cuda.h>
#include <cuda_runtime.h>

#define NAME "host_callbacks"
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
#define CHECK_CU(call)                                                          \
    do {                                                                        \
        CUresult err_ = (call);                                                 \
        if (err_ != CUDA_SUCCESS) {                                             \
            printf("FAIL " NAME ": %s -> %d at %s:%d\n", #call, (int)err_,      \
                   __FILE__, __LINE__);                                         \
            fflush(stdout);                                                     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

static const int N = 1 << 15;

// x[i] += k + i % 5
__global__ void add_k(int *x, int n, int k)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += k + i % 5;
}

struct State {
    int *h;                 // pinned, N ints
    cudaStream_t s;
    int iter;
    int seq;                // order in which the functions ran
    int rewrite_seq, cb_seq, drv_seq, legacy_seq;
    int rewrites, callbacks, drivers, legacies;
    long long cb_sum;       // sum of h seen by the callback
    const char *gate;       // GPUPROXY_TEST_HOSTFN_GATE
    int bad;
};

static long long sum(const int *h)
{
    long long s = 0;
    for (int i = 0; i < N; ++i)
        s += h[i];
    return s;
}

// h[i] = 2 * h[i] - i % 3 (the copy enqueued next must carry these values)
static void CUDART_CB rewrite(void *p)
{
    State *st = (State *)p;
    if (st->gate && st->iter == 2) {
        std::string started = std::string(st->gate) + ".started";
        FILE *f = fopen(started.c_str(), "w");
        if (f)
            fclose(f);
        while (access(st->gate, F_OK) != 0)
            usleep(10000);
    }
    usleep(st->iter == 1 ? 20000 : 0);   // a slow function: later work must still wait
    for (int i = 0; i < N; ++i)
        st->h[i] = 2 * st->h[i] - i % 3;
    st->rewrite_seq = ++st->seq;
    st->rewrites++;
}

static void CUDART_CB after_copy(cudaStream_t s, cudaError_t status, void *p)
{
    State *st = (State *)p;
    if (s != st->s || status != cudaSuccess)
        st->bad = 1;
    st->cb_sum = sum(st->h);
    st->cb_seq = ++st->seq;
    st->callbacks++;
}

static void CUDA_CB driver_fn(void *p)
{
    State *st = (State *)p;
    st->drv_seq = ++st->seq;
    st->drivers++;
}

static void CUDART_CB legacy_fn(void *p)
{
    State *st = (State *)p;
    st->legacy_seq = ++st->seq;
    st->legacies++;
}

int main(int argc, char **argv)
{
    int iters = (argc > 1) ? atoi(argv[1]) : 5;
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    const int pacing = pace_env && strcmp(pace_env, "1") == 0;
    int waiting = pacing;

    State st;
    memset(&st, 0, sizeof st);
    st.gate = getenv("GPUPROXY_TEST_HOSTFN_GATE");
    CHECK(cudaStreamCreateWithFlags(&st.s, cudaStreamNonBlocking));
    CHECK(cudaMallocHost(&st.h, N * sizeof(int)));
    int *d;
    CHECK(cudaMalloc(&d, N * sizeof(int)));
    CHECK(cudaMemset(d, 0, N * sizeof(int)));
    CHECK(cudaDeviceSynchronize());

    // flags must be 0 (cuda_runtime_api.h)
    cudaError_t e = cudaStreamAddCallback(st.s, after_copy, &st, 1);
    printf("callback with flags 1: %s\n", cudaGetErrorName(e));
    (void)cudaGetLastError();

    const int T = 256, B = (N + T - 1) / T;
    for (int k = 1; k <= iters; ++k) {
        if (waiting) {
            char line[256];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        st.iter = k;
        add_k<<<B, T, 0, st.s>>>(d, N, k);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpyAsync(st.h, d, N * sizeof(int), cudaMemcpyDeviceToHost, st.s));
        CHECK(cudaLaunchHostFunc(st.s, rewrite, &st));
        CHECK(cudaMemcpyAsync(d, st.h, N * sizeof(int), cudaMemcpyHostToDevice, st.s));
        CHECK(cudaStreamAddCallback(st.s, after_copy, &st, 0));
        CHECK_CU(cuLaunchHostFunc((CUstream)st.s, driver_fn, &st));
        CHECK(cudaStreamSynchronize(st.s));
        // the legacy default stream, after everything above
        CHECK(cudaLaunchHostFunc(0, legacy_fn, &st));
        CHECK(cudaDeviceSynchronize());
        if (st.bad)
            { printf("FAIL " NAME ": callback got the wrong stream or status\n"); return 1; }
        if (st.rewrites != k || st.callbacks != k || st.drivers != k || st.legacies != k) {
            printf("FAIL " NAME ": iteration %d: %d/%d/%d/%d functions ran\n", k, st.rewrites, st.callbacks,
                   st.drivers, st.legacies);
            return 1;
        }
        if (!(st.rewrite_seq < st.cb_seq && st.cb_seq < st.drv_seq && st.drv_seq < st.legacy_seq)) {
            printf("FAIL " NAME ": iteration %d: order %d %d %d %d\n", k, st.rewrite_seq, st.cb_seq, st.drv_seq,
                   st.legacy_seq);
            return 1;
        }
        printf("iter %d: 4 host functions in order, callback saw sum %lld\n", k, st.cb_sum);
        if (pacing)
            printf("step %d done\n", k);
        fflush(stdout);
    }

    std::vector<int> out(N);
    CHECK(cudaMemcpy(out.data(), d, N * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; ++i) {
        long long want = 0;
        for (int k = 1; k <= iters; ++k)
            want = 2 * (want + k + i % 5) - i % 3;
        if (out[i] != want) {
            printf("FAIL " NAME ": element %d is %d, want %lld\n", i, out[i], want);
            return 1;
        }
    }
    printf("final sum %lld\n", sum(out.data()));
    CHECK(cudaFree(d));
    CHECK(cudaFreeHost(st.h));
    CHECK(cudaStreamDestroy(st.s));
    printf("PASS " NAME "\n");
    return 0;
}
