// reduction: exact sum of 1<<22 ints.
//  pass 1: grid-stride per-thread sums, shared-memory tree reduction per block
//          (dynamic shared memory), atomicAdd of each block's partial into one
//          64-bit global accumulator.
//  pass 2: each block reduces 2*blockDim consecutive elements (first add during
//          the load, static shared memory) and writes its partial to an array.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define NAME "reduction"
#define CHECK(call)                                                             \
    do {                                                                        \
        cudaError_t err_ = (call);                                              \
        if (err_ != cudaSuccess) {                                              \
            printf("FAIL " NAME ": %s -> %s (%s) at %s:%d\n", #call,            \
                   cudaGetErrorName(err_), cudaGetErrorString(err_),            \
                   __FILE__, __LINE__);                                         \
            fflush(stdout);                                                     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

// blockDim.x must be a power of two; dynamic shared memory: blockDim.x ints
__global__ void reduce_atomic(const int *in, int n, unsigned long long *sum)
{
    extern __shared__ int sdata[];
    unsigned tid = threadIdx.x;
    int acc = 0;
    for (int i = blockIdx.x * blockDim.x + tid; i < n; i += blockDim.x * gridDim.x)
        acc += in[i];
    sdata[tid] = acc;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s)
            sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid == 0)
        atomicAdd(sum, (unsigned long long)(long long)sdata[0]);
}

// blockDim.x == 256; part[b] = sum of in[b*512 .. b*512+511] (bounded by n)
__global__ void reduce_partials(const int *in, int n, int *part)
{
    __shared__ int sdata[256];
    unsigned tid = threadIdx.x;
    unsigned i = blockIdx.x * (blockDim.x * 2) + tid;
    int v = 0;
    if (i < (unsigned)n) v = in[i];
    if (i + blockDim.x < (unsigned)n) v += in[i + blockDim.x];
    sdata[tid] = v;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (tid < s)
            sdata[tid] += sdata[tid + s];
        __syncthreads();
    }
    if (tid == 0)
        part[blockIdx.x] = sdata[0];
}

int main(void)
{
    const int n = 1 << 22;
    int *h = (int *)malloc(n * sizeof(int));
    long long want = 0;
    for (int i = 0; i < n; ++i) {
        h[i] = (int)(((unsigned)i * 2654435761u) >> 22) - 300;    // in [-300, 723]
        want += h[i];
    }
    int *d_in;
    unsigned long long *d_sum;
    CHECK(cudaMalloc(&d_in, n * sizeof(int)));
    CHECK(cudaMalloc(&d_sum, sizeof(unsigned long long)));
    CHECK(cudaMemcpy(d_in, h, n * sizeof(int), cudaMemcpyHostToDevice));

    // ---- pass 1, two launch configurations accumulating into the same global
    CHECK(cudaMemset(d_sum, 0, sizeof(unsigned long long)));
    reduce_atomic<<<1024, 256, 256 * sizeof(int)>>>(d_in, n, d_sum);
    CHECK(cudaGetLastError());
    unsigned long long got1 = 0;
    CHECK(cudaMemcpy(&got1, d_sum, sizeof got1, cudaMemcpyDeviceToHost));
    reduce_atomic<<<37, 128, 128 * sizeof(int)>>>(d_in, n, d_sum);
    CHECK(cudaGetLastError());
    unsigned long long got2 = 0;
    CHECK(cudaMemcpy(&got2, d_sum, sizeof got2, cudaMemcpyDeviceToHost));
    printf("n %d\n", n);
    printf("host sum %lld\n", want);
    printf("atomic sum %lld\n", (long long)got1);
    printf("atomic sum twice %lld\n", (long long)got2);
    if ((long long)got1 != want || (long long)got2 != 2 * want) {
        printf("FAIL " NAME ": atomic sum mismatch\n");
        return 1;
    }

    // ---- pass 2: per-block partials
    const int blocks = (n + 511) / 512;
    int *d_part;
    CHECK(cudaMalloc(&d_part, blocks * sizeof(int)));
    reduce_partials<<<blocks, 256>>>(d_in, n, d_part);
    CHECK(cudaGetLastError());
    int *part = (int *)malloc(blocks * sizeof(int));
    CHECK(cudaMemcpy(part, d_part, blocks * sizeof(int), cudaMemcpyDeviceToHost));
    long long psum = 0;
    for (int b = 0; b < blocks; ++b) {
        int pw = 0;
        for (int i = b * 512; i < (b + 1) * 512 && i < n; ++i) pw += h[i];
        if (part[b] != pw) {
            printf("FAIL " NAME ": partial %d: got %d want %d\n", b, part[b], pw);
            return 1;
        }
        psum += part[b];
    }
    printf("partials %d sum %lld\n", blocks, psum);
    if (psum != want) {
        printf("FAIL " NAME ": partial sum mismatch\n");
        return 1;
    }

    CHECK(cudaFree(d_in));
    CHECK(cudaFree(d_sum));
    CHECK(cudaFree(d_part));
    free(h);
    free(part);
    printf("PASS " NAME "\n");
    return 0;
}
