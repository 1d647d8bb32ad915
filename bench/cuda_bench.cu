// Micro-benchmarks of the CUDA runtime paths gpuproxy forwards. The same
// binary runs natively and under the shim (bench/run_bench.py), so the two
// are measured by identical code in the same run.
//
// Prints one JSON object per line: {"bench": name, "value": x, "unit": u, ...}.
// Timing uses the host's steady clock around complete, synchronised work.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(x)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (x);                                                                 \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s failed: %s\n", #x, cudaGetErrorString(e_));                 \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

__global__ void empty_kernel() {}
__global__ void touch(int *p) { p[0] += 1; }

static double now_us()
{
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static double pct(std::vector<double> v, double q)
{
    std::sort(v.begin(), v.end());
    return v[(size_t)(q * (v.size() - 1))];
}

int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : "";
    size_t big = (size_t)1 << 30;
    if (getenv("BENCH_COPY_MB"))
        big = (size_t)atol(getenv("BENCH_COPY_MB")) << 20;
    CHECK(cudaFree(0));
    int *d;
    CHECK(cudaMalloc(&d, 4));
    CHECK(cudaMemset(d, 0, 4));

    if (!*only || strstr(only, "roundtrip")) {
        // launch + synchronous 4-byte device-to-host copy
        std::vector<double> t;
        int h = 0;
        for (int i = 0; i < 3000; i++) {
            double a = now_us();
            touch<<<1, 1>>>(d);
            CHECK(cudaMemcpy(&h, d, 4, cudaMemcpyDeviceToHost));
            double b = now_us();
            if (i >= 200)
                t.push_back(b - a);
        }
        printf("{\"bench\": \"sync_roundtrip\", \"value\": %.2f, \"p10\": %.2f, \"p90\": %.2f, \"unit\": \"us\", \"check\": %d}\n",
               median(t), pct(t, 0.1), pct(t, 0.9), h);
    }
    if (!*only || strstr(only, "null")) {
        // one synchronous API call with no GPU work: the proxy's bare round trip
        std::vector<double> t;
        int v = 0;
        for (int i = 0; i < 3000; i++) {
            double a = now_us();
            CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0));
            double b = now_us();
            if (i >= 200)
                t.push_back(b - a);
        }
        printf("{\"bench\": \"null_call\", \"value\": %.2f, \"p10\": %.2f, \"p90\": %.2f, \"unit\": \"us\"}\n",
               median(t), pct(t, 0.1), pct(t, 0.9));
    }
    if (!*only || strstr(only, "launch")) {
        // asynchronous empty-kernel launches, per-launch cost at steady state
        const int n = 20000;
        std::vector<double> t;
        for (int r = 0; r < 7; r++) {
            CHECK(cudaDeviceSynchronize());
            double a = now_us();
            for (int i = 0; i < n; i++)
                empty_kernel<<<1, 1>>>();
            CHECK(cudaDeviceSynchronize());
            t.push_back((now_us() - a) / n);
        }
        CHECK(cudaGetLastError());
        printf("{\"bench\": \"async_launch\", \"value\": %.3f, \"unit\": \"us/launch\"}\n", median(t));
    }
    if (!*only || strstr(only, "copy")) {
        char *dev;
        CHECK(cudaMalloc(&dev, big));
        char *pageable = (char *)malloc(big);
        char *pinned;
        CHECK(cudaMallocHost(&pinned, big));
        memset(pageable, 1, big);
        memset(pinned, 2, big);
        struct { const char *name; char *host; } kinds[] = { { "pageable", pageable }, { "pinned", pinned } };
        for (auto &k : kinds) {
            std::vector<double> h2d, d2h;
            for (int r = 0; r < 4; r++) {
                double a = now_us();
                CHECK(cudaMemcpy(dev, k.host, big, cudaMemcpyHostToDevice));
                double b = now_us();
                CHECK(cudaMemcpy(k.host, dev, big, cudaMemcpyDeviceToHost));
                double c = now_us();
                if (r > 0) {   // the first round pays page faults and lazy set-up
                    h2d.push_back(big / (b - a) / 1e3);
                    d2h.push_back(big / (c - b) / 1e3);
                }
            }
            printf("{\"bench\": \"h2d_%s\", \"value\": %.2f, \"unit\": \"GB/s\", \"bytes\": %zu}\n", k.name, median(h2d), big);
            printf("{\"bench\": \"d2h_%s\", \"value\": %.2f, \"unit\": \"GB/s\", \"bytes\": %zu}\n", k.name, median(d2h), big);
        }
        CHECK(cudaFreeHost(pinned));
        free(pageable);
        CHECK(cudaFree(dev));
    }
    if (!*only || strstr(only, "malloc")) {
        size_t sizes[] = { 256, (size_t)1 << 20, (size_t)64 << 20 };
        for (size_t s : sizes) {
            const int n = s > ((size_t)1 << 20) ? 100 : 500;
            std::vector<void *> p(n);
            double a = now_us();
            for (int i = 0; i < n; i++)
                CHECK(cudaMalloc(&p[i], s));
            for (int i = 0; i < n; i++)
                CHECK(cudaFree(p[i]));
            double t = (now_us() - a) / (2 * n);
            printf("{\"bench\": \"malloc_free_%zu\", \"value\": %.2f, \"unit\": \"us/op\"}\n", s, t);
        }
    }
    CHECK(cudaFree(d));
    return 0;
}
