// Self-checking program for the isolation tests (tests/test_isolation.py):
// one client's long kernel, failing kernel or device printf must never reach
// another client of the same proxyd.
//
//   isolation spin MS      a kernel busy for about MS milliseconds, then "spun"
//   isolation iterate N    N small kernel + copy rounds, each checked: "iter i ok"
//   isolation assert       a kernel whose device-side assert fails: prints the error
//   isolation printf       host and device prints in program order
#include <cassert>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

__global__ void spin(long long cycles)
{
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}

__global__ void bump(int *v, int n, int k)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] = v[i] * 3 + k;
}

__global__ void trip(int x)
{
    assert(x == 0);
}

__global__ void say(int v)
{
    printf("kernel says %d\n", v);
}

#define CHECK(e) do { cudaError_t r_ = (e); if (r_ != cudaSuccess) { \
    printf("FAIL %s: %s\n", #e, cudaGetErrorString(r_)); return 1; } } while (0)

int main(int argc, char **argv)
{
    if (argc < 2) return 2;
    const char *mode = argv[1];
    if (!strcmp(mode, "spin")) {
        int ms = argc > 2 ? atoi(argv[2]) : 2000;
        int khz = 0;
        CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
        spin<<<1, 1>>>((long long)khz * ms);
        printf("spinning\n");
        fflush(stdout);
        CHECK(cudaDeviceSynchronize());
        printf("spun\n");
    } else if (!strcmp(mode, "iterate")) {
        int n = 4096, rounds = argc > 2 ? atoi(argv[2]) : 50;
        int *d, *h = (int *)malloc(n * sizeof(int)), *want = (int *)malloc(n * sizeof(int));
        for (int i = 0; i < n; i++) want[i] = h[i] = i;
        CHECK(cudaMalloc(&d, n * sizeof(int)));
        CHECK(cudaMemcpy(d, h, n * sizeof(int), cudaMemcpyHostToDevice));
        for (int r = 1; r <= rounds; r++) {
            bump<<<(n + 255) / 256, 256>>>(d, n, r);
            for (int i = 0; i < n; i++) want[i] = want[i] * 3 + r;
            CHECK(cudaMemcpy(h, d, n * sizeof(int), cudaMemcpyDeviceToHost));
            if (memcmp(h, want, n * sizeof(int))) { printf("iter %d WRONG\n", r); return 1; }
            printf("iter %d ok\n", r);
        }
        CHECK(cudaFree(d));
    } else if (!strcmp(mode, "assert")) {
        trip<<<1, 1>>>(1);
        cudaError_t e = cudaDeviceSynchronize();
        printf("after assert: %s\n", cudaGetErrorName(e));
        return e == cudaSuccess ? 1 : 0;
    } else if (!strcmp(mode, "printf")) {
        printf("host before\n");
        say<<<1, 1>>>(42);
        CHECK(cudaDeviceSynchronize());
        printf("host between\n");
        say<<<1, 1>>>(43);
        CHECK(cudaDeviceSynchronize());
        printf("host after\n");
    } else {
        return 2;
    }
    return 0;
}
