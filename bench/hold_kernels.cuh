// Shared by the checkpoint benchmarks' programs (bench/ckpt_hold.cu,
// bench/wp_hold.cu): the error check and the kernels that fill device memory
// with a position-dependent pattern and take its checksum (the emulated
// versions are in bench/ckpt_hold_emu.py).
#pragma once
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(x)                                                                     \
    do {                                                                             \
        cudaError_t e_ = (x);                                                        \
        if (e_ != cudaSuccess) {                                                     \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));               \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

__global__ void fill(unsigned *p, size_t n, unsigned seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned x = (unsigned)i * 2654435761u ^ seed;
        p[i] = x ^ (x >> 13);
    }
}

__global__ void checksum(const unsigned *p, size_t n, unsigned long long *out)
{
    unsigned long long acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc += (unsigned long long)p[i] * (i % 7919 + 1);
    atomicAdd(out, acc);
}
