// Holds N GiB of device memory for the checkpoint benchmark
// (bench/checkpoint_bench.py), in 256 MiB allocations filled with a
// position-dependent pattern, then serves commands from stdin, one per line:
//   sum             prints "sum <64-bit checksum of all memory>"
//   touch P SEED    rewrites the first P per mille of every allocation
//   quit
// Every command's answer ends with a line "ok".
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "hold_kernels.cuh"

int main(int argc, char **argv)
{
    double gib = argc > 1 ? atof(argv[1]) : 1.0;
    const size_t block = (size_t)256 << 20;
    size_t nblocks = (size_t)(gib * (1 << 30) / block + 0.5);
    if (nblocks == 0)
        nblocks = 1;
    std::vector<unsigned *> bufs(nblocks);
    for (size_t b = 0; b < nblocks; b++) {
        CHECK(cudaMalloc(&bufs[b], block));
        fill<<<1024, 256>>>(bufs[b], block / 4, (unsigned)b);
    }
    unsigned long long *dsum;
    CHECK(cudaMalloc(&dsum, 8));
    CHECK(cudaDeviceSynchronize());
    printf("ready %zu\n", nblocks * block);
    fflush(stdout);
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "sum", 3)) {
            CHECK(cudaMemset(dsum, 0, 8));
            for (size_t b = 0; b < nblocks; b++)
                checksum<<<1024, 256>>>(bufs[b], block / 4, dsum);
            unsigned long long h = 0;
            CHECK(cudaMemcpy(&h, dsum, 8, cudaMemcpyDeviceToHost));
            printf("sum %llu\n", h);
        } else if (!strncmp(line, "touch", 5)) {
            unsigned permille = 0, seed = 0;
            sscanf(line + 5, "%u %u", &permille, &seed);
            size_t n = block / 4 * permille / 1000;
            for (size_t b = 0; b < nblocks; b++)
                if (n)
                    fill<<<1024, 256>>>(bufs[b], n, seed + (unsigned)b);
            CHECK(cudaDeviceSynchronize());
        } else if (!strncmp(line, "quit", 4)) {
            break;
        }
        printf("ok\n");
        fflush(stdout);
    }
    return 0;
}
