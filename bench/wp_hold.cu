// The whole-process checkpoint benchmark's program (bench/whole_process_bench.py):
// holds DEV_GIB of device memory (256 MiB allocations, position-dependent
// pattern) and HOST_GIB of ordinary malloc'd host memory (pattern too), then
// ticks: every 20 ms a kernel adds one to a device counter, the host reads it
// back and prints "tick N". It reads no stdin and holds no pipe, so CRIU can
// dump it like any batch job; it is driven through a control file instead:
//
//   wp_hold DEV_GIB HOST_GIB CTL_FILE
//
// CTL_FILE containing "verify": recompute both checksums and the counter and
// print "verify ok" (or "verify FAIL ..."); "quit": exit. The file is removed
// once read. The checksums are taken at start, before any checkpoint, so a
// verify after a restore compares the restored bytes with the originals.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <vector>

#include "hold_kernels.cuh"

__global__ void tick(unsigned long long *counter) { *counter += 1; }

static const size_t BLOCK = (size_t)256 << 20;

static unsigned long long device_sum(std::vector<unsigned *> &bufs, unsigned long long *dsum)
{
    CHECK(cudaMemset(dsum, 0, 8));
    for (auto *b : bufs)
        checksum<<<1024, 256>>>(b, BLOCK / 4, dsum);
    unsigned long long h = 0;
    CHECK(cudaMemcpy(&h, dsum, 8, cudaMemcpyDeviceToHost));
    return h;
}

static uint64_t host_sum(const uint64_t *h, size_t n)
{
    uint64_t acc = 0;
    for (size_t i = 0; i < n; i++)
        acc += h[i] * (i % 8191 + 1);
    return acc;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s DEV_GIB HOST_GIB CTL_FILE\n", argv[0]);
        return 2;
    }
    size_t nblocks = (size_t)(atof(argv[1]) * (1 << 30) / BLOCK + 0.5);
    size_t hwords = (size_t)(atof(argv[2]) * (1 << 30)) / 8;
    const char *ctl = argv[3];
    if (nblocks == 0)
        nblocks = 1;
    std::vector<unsigned *> bufs(nblocks);
    for (size_t b = 0; b < nblocks; b++) {
        CHECK(cudaMalloc(&bufs[b], BLOCK));
        fill<<<1024, 256>>>(bufs[b], BLOCK / 4, (unsigned)b);
    }
    unsigned long long *dsum, *counter;
    CHECK(cudaMalloc(&dsum, 8));
    CHECK(cudaMalloc(&counter, 8));
    CHECK(cudaMemset(counter, 0, 8));
    uint64_t *host = (uint64_t *)malloc(hwords * 8 + 8);
    if (!host) {
        fprintf(stderr, "cannot allocate %zu bytes of host memory\n", hwords * 8);
        return 1;
    }
    for (size_t i = 0; i < hwords; i++)
        host[i] = (uint64_t)i * 0x9E3779B97F4A7C15ull ^ (i >> 7);
    CHECK(cudaDeviceSynchronize());
    const unsigned long long dref = device_sum(bufs, dsum);
    const uint64_t href = host_sum(host, hwords);
    printf("ready %zu %zu\n", nblocks * BLOCK, hwords * 8);
    fflush(stdout);
    for (unsigned long long n = 1;; n++) {
        tick<<<1, 1>>>(counter);
        unsigned long long c = 0;
        CHECK(cudaMemcpy(&c, counter, 8, cudaMemcpyDeviceToHost));
        printf("tick %llu%s\n", c, c == n ? "" : " (counter out of step)");
        fflush(stdout);
        char cmd[32] = {0};
        FILE *f = fopen(ctl, "r");
        if (f) {
            size_t got = fread(cmd, 1, sizeof cmd - 1, f);
            fclose(f);
            cmd[got] = 0;
            unlink(ctl);
        }
        if (!strncmp(cmd, "quit", 4))
            break;
        if (!strncmp(cmd, "verify", 6)) {
            unsigned long long d = device_sum(bufs, dsum);
            uint64_t h = host_sum(host, hwords);
            if (d == dref && h == href && c == n)
                printf("verify ok\n");
            else
                printf("verify FAIL device %llu/%llu host %llu/%llu counter %llu/%llu\n", d, dref,
                       (unsigned long long)h, (unsigned long long)href, c, n);
            fflush(stdout);
        }
        usleep(20000);
    }
    return 0;
}
