// stall_probe: an app that records, with its own clock, when each of its
// CUDA calls began and ended, for tests/test_stall_figures.py: the stall a
// whole-process checkpoint reports must be the one this app lived.
// argv[1]: the log file ("begin_ns end_ns" per call, CLOCK_MONOTONIC, the
// clock the shim's figure uses); argv[2]: how many seconds to run. One
// thread; each round copies 4 KiB to the device and back and checks it (no
// kernel, so it runs on the emulated backend as is). Prints PASS at the end.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <cuda_runtime.h>

static long long now_ns()
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: stall_probe LOG SECONDS\n");
        return 2;
    }
    FILE *log = fopen(argv[1], "w");
    if (!log)
        return 2;
    double secs = atof(argv[2]);
    const int n = 4096;
    unsigned char host[n], back[n];
    void *dev = nullptr;
    if (cudaMalloc(&dev, n) != cudaSuccess) {
        printf("FAIL stall_probe: cudaMalloc\n");
        return 1;
    }
    long long end = now_ns() + (long long)(secs * 1e9);
    for (int i = 0; now_ns() < end; i++) {
        memset(host, i & 0xff, n);
        long long b = now_ns();
        cudaError_t e1 = cudaMemcpy(dev, host, n, cudaMemcpyHostToDevice);
        long long m = now_ns();
        cudaError_t e2 = cudaMemcpy(back, dev, n, cudaMemcpyDeviceToHost);
        long long a = now_ns();
        if (e1 != cudaSuccess || e2 != cudaSuccess || memcmp(host, back, n) != 0) {
            printf("FAIL stall_probe: round %d\n", i);
            return 1;
        }
        fprintf(log, "%lld %lld\n%lld %lld\n", b, m, m, a);
        fflush(log);
    }
    fclose(log);
    cudaFree(dev);
    printf("PASS stall_probe\n");
    return 0;
}
