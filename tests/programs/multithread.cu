// multithread: 4 host threads share one CUDA context.
//  phase 1: each thread has its own stream, device and pinned buffers and runs
//           a loop of upload / kernel / download; every kernel also adds into
//           one shared device buffer with atomics.
//  phase 2: the threads share one stream, guarded by a mutex, and accumulate
//           into one shared device buffer through a shared staging buffer.
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>
#include <cuda_runtime.h>

#define NAME "multithread"
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

static const int kThreads = 4;
static const int kIters1 = 50;
static const int kIters2 = 20;
static const int kN = 4096;        // elements per buffer
static const int kBins = 64;       // shared totals

// acc[i] += in[i]; total[i % 64] += in[i] (atomic); grid-stride
__global__ void accumulate(int *acc, const int *in, int *total, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        int v = in[i];
        acc[i] += v;
        atomicAdd(&total[i & 63], v);
    }
}

// dst[i] += src[i] * mul
__global__ void add_scaled(int *dst, const int *src, int n, int mul)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] += src[i] * mul;
}

static int input1(int t, int it, int i) { return (t + 1) * (it + 1) + (i % 13); }
static int input2(int t, int it, int i) { return (i * (t + 3) + it) % 101; }

static int *g_total;          // device, kBins ints, phase 1
static int *g_shared_acc;     // device, kN ints, phase 2
static int *g_stage;          // device, kN ints, phase 2 staging
static cudaStream_t g_shared_stream;
static std::mutex g_mutex;
static std::vector<int> g_result1[kThreads];

static void worker1(int t)
{
    CHECK(cudaSetDevice(0));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    int *d_acc, *d_in, *h_in;
    CHECK(cudaMalloc(&d_acc, kN * sizeof(int)));
    CHECK(cudaMalloc(&d_in, kN * sizeof(int)));
    CHECK(cudaMallocHost(&h_in, kN * sizeof(int)));
    CHECK(cudaMemsetAsync(d_acc, 0, kN * sizeof(int), s));
    for (int it = 0; it < kIters1; ++it) {
        CHECK(cudaStreamSynchronize(s));           // h_in is free again
        for (int i = 0; i < kN; ++i) h_in[i] = input1(t, it, i);
        CHECK(cudaMemcpyAsync(d_in, h_in, kN * sizeof(int), cudaMemcpyHostToDevice, s));
        accumulate<<<8, 128, 0, s>>>(d_acc, d_in, g_total, kN);
        CHECK(cudaGetLastError());
    }
    g_result1[t].resize(kN);
    CHECK(cudaMemcpyAsync(g_result1[t].data(), d_acc, kN * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaFreeHost(h_in));
    CHECK(cudaFree(d_in));
    CHECK(cudaFree(d_acc));
    CHECK(cudaStreamDestroy(s));
}

static void worker2(int t)
{
    CHECK(cudaSetDevice(0));
    int *h;
    CHECK(cudaMallocHost(&h, kN * sizeof(int)));
    for (int it = 0; it < kIters2; ++it) {
        std::lock_guard<std::mutex> lock(g_mutex);
        for (int i = 0; i < kN; ++i) h[i] = input2(t, it, i);
        CHECK(cudaMemcpyAsync(g_stage, h, kN * sizeof(int), cudaMemcpyHostToDevice, g_shared_stream));
        add_scaled<<<kN / 256, 256, 0, g_shared_stream>>>(g_shared_acc, g_stage, kN, t + 1);
        CHECK(cudaGetLastError());
        CHECK(cudaStreamSynchronize(g_shared_stream));
    }
    CHECK(cudaFreeHost(h));
}

int main(void)
{
    CHECK(cudaSetDevice(0));
    CHECK(cudaMalloc(&g_total, kBins * sizeof(int)));
    CHECK(cudaMemset(g_total, 0, kBins * sizeof(int)));
    CHECK(cudaMalloc(&g_shared_acc, kN * sizeof(int)));
    CHECK(cudaMemset(g_shared_acc, 0, kN * sizeof(int)));
    CHECK(cudaMalloc(&g_stage, kN * sizeof(int)));
    CHECK(cudaStreamCreate(&g_shared_stream));

    // ---- phase 1
    {
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker1, t);
        for (auto &th : threads) th.join();
    }
    CHECK(cudaDeviceSynchronize());
    int h_total[kBins];
    CHECK(cudaMemcpy(h_total, g_total, sizeof h_total, cudaMemcpyDeviceToHost));
    long long want_total[kBins] = {0};
    long long sum1 = 0;
    for (int t = 0; t < kThreads; ++t) {
        for (int i = 0; i < kN; ++i) {
            int want = 0;
            for (int it = 0; it < kIters1; ++it) {
                want += input1(t, it, i);
                want_total[i & 63] += input1(t, it, i);
            }
            if (g_result1[t][i] != want) {
                printf("FAIL " NAME ": phase 1 thread %d element %d: got %d want %d\n", t, i, g_result1[t][i], want);
                return 1;
            }
            sum1 += want;
        }
    }
    long long total_sum = 0;
    for (int b = 0; b < kBins; ++b) {
        if (h_total[b] != want_total[b]) {
            printf("FAIL " NAME ": phase 1 total bin %d: got %d want %lld\n", b, h_total[b], want_total[b]);
            return 1;
        }
        total_sum += h_total[b];
    }
    printf("phase 1: %d threads x %d iterations, per-thread checksum %lld, shared total %lld\n",
           kThreads, kIters1, sum1, total_sum);

    // ---- phase 2
    {
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker2, t);
        for (auto &th : threads) th.join();
    }
    std::vector<int> acc(kN);
    CHECK(cudaMemcpy(acc.data(), g_shared_acc, kN * sizeof(int), cudaMemcpyDeviceToHost));
    long long sum2 = 0;
    for (int i = 0; i < kN; ++i) {
        int want = 0;
        for (int t = 0; t < kThreads; ++t)
            for (int it = 0; it < kIters2; ++it) want += input2(t, it, i) * (t + 1);
        if (acc[i] != want) {
            printf("FAIL " NAME ": phase 2 element %d: got %d want %d\n", i, acc[i], want);
            return 1;
        }
        sum2 += acc[i];
    }
    printf("phase 2: shared stream, checksum %lld\n", sum2);

    CHECK(cudaStreamDestroy(g_shared_stream));
    CHECK(cudaFree(g_total));
    CHECK(cudaFree(g_shared_acc));
    CHECK(cudaFree(g_stage));
    printf("PASS " NAME "\n");
    return 0;
}
