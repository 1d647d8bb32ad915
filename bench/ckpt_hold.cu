// Holds N GiB of device memory for the checkpoint benchmark
// (bench/checkpoint_bench.py), in 256 MiB allocations filled with a
// position-dependent pattern, then serves commands from stdin, one per line.
//   ckpt_hold GIB            GIB in 256 MiB allocations
//   ckpt_hold 0 COUNT        COUNT small allocations instead, of 4 KiB to
//                            1 MiB (log-uniform, from a fixed seed: what
//                            caching allocators and pycuda produce)
// Commands:
//   sum             prints "sum <64-bit checksum of all memory>"
//   touch P SEED    rewrites the first P per mille of every allocation
//   quit
// Every command's answer ends with a line "ok".
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <vector>

#include "hold_kernels.cuh"

int main(int argc, char **argv)
{
    double gib = argc > 1 ? atof(argv[1]) : 1.0;
    size_t count = argc > 2 ? strtoull(argv[2], nullptr, 10) : 0;
    const size_t block = (size_t)256 << 20;
    size_t nblocks = count ? count : (size_t)(gib * (1 << 30) / block + 0.5);
    if (nblocks == 0)
        nblocks = 1;
    std::vector<unsigned *> bufs(nblocks);
    std::vector<size_t> sizes(nblocks, block);
    unsigned long long rng = 0x9E3779B97F4A7C15ull, total = 0;
    for (size_t b = 0; b < nblocks; b++) {
        if (count) {
            // log-uniform in [4 KiB, 1 MiB], a multiple of 4 bytes
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            double u = (double)(rng >> 11) / (double)(1ull << 53);
            sizes[b] = ((size_t)(4096.0 * pow(256.0, u)) + 3) & ~(size_t)3;
        }
        CHECK(cudaMalloc(&bufs[b], sizes[b]));
        fill<<<count ? 64 : 1024, 256>>>(bufs[b], sizes[b] / 4, (unsigned)b);
        total += sizes[b];
    }
    unsigned long long *dsum;
    CHECK(cudaMalloc(&dsum, 8));
    CHECK(cudaDeviceSynchronize());
    printf("ready %llu %zu\n", total, nblocks);
    fflush(stdout);
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "sum", 3)) {
            CHECK(cudaMemset(dsum, 0, 8));
            for (size_t b = 0; b < nblocks; b++)
                checksum<<<count ? 64 : 1024, 256>>>(bufs[b], sizes[b] / 4, dsum);
            unsigned long long h = 0;
            CHECK(cudaMemcpy(&h, dsum, 8, cudaMemcpyDeviceToHost));
            printf("sum %llu\n", h);
        } else if (!strncmp(line, "touch", 5)) {
            unsigned permille = 0, seed = 0;
            sscanf(line + 5, "%u %u", &permille, &seed);
            for (size_t b = 0; b < nblocks; b++) {
                size_t n = sizes[b] / 4 * permille / 1000;
                if (n)
                    fill<<<count ? 64 : 1024, 256>>>(bufs[b], n, seed + (unsigned)b);
            }
            CHECK(cudaDeviceSynchronize());
        } else if (!strncmp(line, "quit", 4)) {
            break;
        }
        printf("ok\n");
        fflush(stdout);
    }
    return 0;
}
