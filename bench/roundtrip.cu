// Round-trip latency of single synchronous CUDA calls (issue 13, target 4).
// The same binary runs natively and under the shim (bench/run_bench.py
// --suite roundtrip), so both are measured by identical code in one run.
//
//   roundtrip [iterations] [which]     which: a comma list of the names below
//
// Each case is timed call by call with the host's steady clock; the first
// 10 % of iterations are a warm-up and are not kept. Prints one JSON object
// per case: {"bench": name, "min", "median", "p90", "p99", "max" (us), "n"}.
//
//   null_call     cudaDeviceGetAttribute: a synchronous call with no GPU work
//                 (under the proxy it crosses to the worker: cuDeviceGetAttribute
//                 is not answered by the shim)
//   stream_query  cudaStreamQuery on an idle stream (crosses too)
//   sync_copy     one-thread kernel launch + synchronous 4-byte D2H cudaMemcpy
//   malloc_free   cudaMalloc + cudaFree of 256 bytes (one pair per sample)
//   malloc_launch_free  cudaMalloc of 256 bytes, a one-thread kernel on it,
//                 cudaFree (which waits for the kernel)
//
// A check value ("check") makes the copy's result visible, so that a wrong
// answer is not hidden behind a good time.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CHECK(x)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (x);                                                                 \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_));                 \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

__global__ void bump(int *p) { p[0] += 1; }

static inline double now_us()
{
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static void report(const char *name, std::vector<double> t, const char *extra)
{
    std::sort(t.begin(), t.end());
    auto q = [&](double f) { return t[(size_t)(f * (double)(t.size() - 1))]; };
    printf("{\"bench\": \"%s\", \"unit\": \"us\", \"n\": %zu, \"min\": %.2f, \"median\": %.2f, \"p90\": %.2f, "
           "\"p99\": %.2f, \"max\": %.2f%s}\n",
           name, t.size(), t.front(), q(0.5), q(0.9), q(0.99), t.back(), extra);
    fflush(stdout);
}

static bool wanted(const std::string &which, const char *name)
{
    if (which.empty())
        return true;
    std::string w = "," + which + ",";
    return w.find(std::string(",") + name + ",") != std::string::npos;
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 5000;
    std::string which = argc > 2 ? argv[2] : "";
    if (iters < 20)
        iters = 20;
    int warm = iters / 10;
    CHECK(cudaFree(0));
    int *d;
    CHECK(cudaMalloc(&d, 4));
    CHECK(cudaMemset(d, 0, 4));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    if (wanted(which, "null_call")) {
        std::vector<double> t;
        int v = 0;
        for (int i = 0; i < iters + warm; i++) {
            double a = now_us();
            CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0));
            double b = now_us();
            if (i >= warm)
                t.push_back(b - a);
        }
        char extra[64];
        snprintf(extra, sizeof extra, ", \"check\": %d", v > 0);
        report("null_call", t, extra);
    }
    if (wanted(which, "stream_query")) {
        std::vector<double> t;
        for (int i = 0; i < iters + warm; i++) {
            double a = now_us();
            CHECK(cudaStreamQuery(s));
            double b = now_us();
            if (i >= warm)
                t.push_back(b - a);
        }
        report("stream_query", t, "");
    }
    if (wanted(which, "sync_copy")) {
        std::vector<double> t;
        int h = 0;
        for (int i = 0; i < iters + warm; i++) {
            double a = now_us();
            bump<<<1, 1>>>(d);
            CHECK(cudaMemcpy(&h, d, 4, cudaMemcpyDeviceToHost));
            double b = now_us();
            if (i >= warm)
                t.push_back(b - a);
        }
        char extra[64];
        // every launch added one: the last copy saw them all
        snprintf(extra, sizeof extra, ", \"check\": %d, \"value\": %d", h == iters + warm, h);
        report("sync_copy", t, extra);
    }
    if (wanted(which, "malloc_free")) {
        std::vector<double> t;
        for (int i = 0; i < iters + warm; i++) {
            void *p = nullptr;
            double a = now_us();
            CHECK(cudaMalloc(&p, 256));
            CHECK(cudaFree(p));
            double b = now_us();
            if (i >= warm)
                t.push_back(b - a);
        }
        report("malloc_free", t, "");
    }
    if (wanted(which, "malloc_launch_free")) {
        // cudaFree after GPU work: natively an implicit device synchronisation
        // (the kernel must finish first); under the proxy the one round trip
        // of the pair (interceptor/slab.c: the block is placed in the shim)
        std::vector<double> t;
        for (int i = 0; i < iters + warm; i++) {
            int *p = nullptr;
            double a = now_us();
            CHECK(cudaMalloc(&p, 256));
            bump<<<1, 1>>>(p);
            CHECK(cudaFree(p));
            double b = now_us();
            if (i >= warm)
                t.push_back(b - a);
        }
        report("malloc_launch_free", t, "");
    }
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d));
    return 0;
}
