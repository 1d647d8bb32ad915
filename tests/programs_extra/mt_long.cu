// mt_long: 4 host threads in CUDA calls all the time, for whole-process
// checkpoint tests (tests/test_whole_process.py): whenever a dump starts,
// threads are inside cudaMemcpyAsync, a launch or cudaStreamSynchronize.
// Each thread has its own stream, device buffer and page-locked host buffer
// (cudaMallocHost: it must come back usable after a restore) and adds into a
// shared device total with atomics. argv[1]: iterations per thread (default
// 2000). The result does not depend on how the threads interleave; the host
// recomputes it and prints PASS or FAIL.
//
// MT_LONG_GATE=PATH: halfway, every thread keeps copying its input to the
// device and synchronizing (CUDA calls that change no result) until PATH
// exists, so a test can dump the app while all threads are inside CUDA calls
// however fast the machine runs it, and let it finish after the restore.
//
// The kernel is multithread.cu's accumulate (same signature), so
// tests/programs/multithread_emu.py emulates it.
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <thread>
#include <vector>
#include <cuda_runtime.h>

#define CHECK(call)                                                             \
    do {                                                                        \
        cudaError_t err_ = (call);                                              \
        if (err_ != cudaSuccess) {                                              \
            printf("FAIL mt_long: %s -> %s at %s:%d\n", #call,                  \
                   cudaGetErrorName(err_), __FILE__, __LINE__);                 \
            fflush(stdout);                                                     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

static const int kThreads = 4;
static const int kN = 1024;

__global__ void accumulate(int *acc, const int *in, int *total, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        int v = in[i];
        acc[i] += v;
        atomicAdd(&total[i & 63], v);
    }
}

static int input(int t, int it, int i) { return (i * (t + 3) + it * 7 + t) % 97; }

static int *g_total;
static long long g_sum[kThreads];

static void worker(int t, int iters)
{
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    int *d_acc, *d_in, *h_buf;
    CHECK(cudaMalloc(&d_acc, kN * sizeof(int)));
    CHECK(cudaMalloc(&d_in, kN * sizeof(int)));
    CHECK(cudaMallocHost(&h_buf, kN * sizeof(int)));
    CHECK(cudaMemsetAsync(d_acc, 0, kN * sizeof(int), s));
    const char *gate = getenv("MT_LONG_GATE");
    for (int it = 0; it < iters; ++it) {
        for (int i = 0; i < kN; ++i) h_buf[i] = input(t, it, i);
        while (gate && it == iters / 2 && access(gate, F_OK) != 0) {
            CHECK(cudaMemcpyAsync(d_in, h_buf, kN * sizeof(int), cudaMemcpyHostToDevice, s));
            CHECK(cudaStreamSynchronize(s));
        }
        CHECK(cudaMemcpyAsync(d_in, h_buf, kN * sizeof(int), cudaMemcpyHostToDevice, s));
        accumulate<<<4, 128, 0, s>>>(d_acc, d_in, g_total, kN);
        CHECK(cudaGetLastError());
        CHECK(cudaStreamSynchronize(s));     // h_buf is free again
    }
    CHECK(cudaMemcpyAsync(h_buf, d_acc, kN * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    long long sum = 0;
    for (int i = 0; i < kN; ++i) sum += h_buf[i] * (long long)(i + 1);
    g_sum[t] = sum;
    CHECK(cudaFreeHost(h_buf));
    CHECK(cudaFree(d_in));
    CHECK(cudaFree(d_acc));
    CHECK(cudaStreamDestroy(s));
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 2000;
    CHECK(cudaMalloc(&g_total, 64 * sizeof(int)));
    CHECK(cudaMemset(g_total, 0, 64 * sizeof(int)));
    std::vector<std::thread> th;
    for (int t = 0; t < kThreads; ++t) th.emplace_back(worker, t, iters);
    for (auto &x : th) x.join();
    int total[64];
    CHECK(cudaMemcpy(total, g_total, sizeof total, cudaMemcpyDeviceToHost));
    bool ok = true;
    long long want_total[64] = {0};
    for (int t = 0; t < kThreads; ++t) {
        long long want = 0;
        for (int i = 0; i < kN; ++i) {
            long long acc = 0;
            for (int it = 0; it < iters; ++it) acc += input(t, it, i);
            want += (int)acc * (long long)(i + 1);
            want_total[i & 63] += acc;
        }
        printf("thread %d checksum %lld\n", t, g_sum[t]);
        ok = ok && want == g_sum[t];
    }
    long long tsum = 0;
    for (int i = 0; i < 64; ++i) {
        ok = ok && (int)want_total[i] == total[i];
        tsum += total[i];
    }
    printf("shared total %lld\n%s mt_long\n", tsum, ok ? "PASS" : "FAIL");
    return ok ? 0 : 1;
}
