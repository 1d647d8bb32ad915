// One client of the many-clients benchmark (bench/multi_client_bench.py,
// issue 13 target 5). After setting up it prints "ready", waits for a line
// on stdin, runs its loop for SECONDS and prints one JSON line:
//   mc_loop launch SECONDS   empty-kernel launches, a stream synchronisation
//                            every 256: {"launches": n, "per_s": ...}
//   mc_loop copy SECONDS MB  MB host->device then device->host, page-locked
//                            host memory: {"bytes": n, "gbps": ...}
//   mc_loop sync SECONDS     launch + synchronous 4-byte device->host copy,
//                            latencies: {"n", "p50_us", "p99_us"}
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(x)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (x);                                                             \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                    \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

__global__ void mc_empty() {}
__global__ void mc_touch(int *p) { p[0] += 1; }

static double now()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: mc_loop launch|copy|sync SECONDS [MB]\n");
        return 2;
    }
    const char *mode = argv[1];
    double secs = atof(argv[2]);
    size_t mb = argc > 3 ? strtoull(argv[3], nullptr, 10) : 64;
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    int *d;
    CHECK(cudaMalloc(&d, 4));
    void *host = nullptr, *dev = nullptr;
    size_t n = mb << 20;
    if (!strcmp(mode, "copy")) {
        CHECK(cudaMallocHost(&host, n));
        memset(host, 1, n);
        CHECK(cudaMalloc(&dev, n));
    }
    mc_empty<<<1, 1, 0, s>>>();
    CHECK(cudaStreamSynchronize(s));
    printf("ready\n");
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin))
        return 1;
    double t0 = now(), t = t0;
    if (!strcmp(mode, "launch")) {
        unsigned long long k = 0;
        while ((t = now()) - t0 < secs) {
            for (int i = 0; i < 256; i++)
                mc_empty<<<1, 1, 0, s>>>();
            CHECK(cudaStreamSynchronize(s));
            k += 256;
        }
        printf("{\"mode\": \"launch\", \"launches\": %llu, \"seconds\": %.4f, \"per_s\": %.1f}\n", k, t - t0,
               k / (t - t0));
    } else if (!strcmp(mode, "copy")) {
        unsigned long long bytes = 0;
        while ((t = now()) - t0 < secs) {
            CHECK(cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, s));
            CHECK(cudaMemcpyAsync(host, dev, n, cudaMemcpyDeviceToHost, s));
            CHECK(cudaStreamSynchronize(s));
            bytes += 2 * n;
        }
        printf("{\"mode\": \"copy\", \"bytes\": %llu, \"seconds\": %.4f, \"gbps\": %.3f}\n", bytes, t - t0,
               bytes / (t - t0) / 1e9);
    } else {
        std::vector<double> lat;
        int v = 0;
        while ((t = now()) - t0 < secs) {
            double a = now();
            mc_touch<<<1, 1, 0, s>>>(d);
            CHECK(cudaMemcpyAsync(&v, d, 4, cudaMemcpyDeviceToHost, s));
            CHECK(cudaStreamSynchronize(s));
            lat.push_back((now() - a) * 1e6);
        }
        std::sort(lat.begin(), lat.end());
        size_t m = lat.size();
        printf("{\"mode\": \"sync\", \"n\": %zu, \"seconds\": %.4f, \"p50_us\": %.2f, \"p99_us\": %.2f}\n", m, t - t0,
               m ? lat[m / 2] : 0.0, m ? lat[std::min(m - 1, m * 99 / 100)] : 0.0);
    }
    return 0;
}
