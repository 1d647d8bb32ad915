// vector_add: the classic CUDA sample. C = A + B for 50000 floats whose values
// are small integers, so every sum is exact on the GPU and in numpy.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define NAME "vector_add"
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

__global__ void vectorAdd(const float *A, const float *B, float *C, int numElements)
{
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < numElements) {
        C[i] = A[i] + B[i];
    }
}

int main(void)
{
    const int numElements = 50000;
    const size_t size = numElements * sizeof(float);
    printf("[Vector addition of %d elements]\n", numElements);

    float *h_A = (float *)malloc(size);
    float *h_B = (float *)malloc(size);
    float *h_C = (float *)malloc(size);
    if (!h_A || !h_B || !h_C) { printf("FAIL " NAME ": host malloc\n"); return 1; }
    for (int i = 0; i < numElements; ++i) {
        h_A[i] = (float)(i % 1000);
        h_B[i] = (float)((i * 7) % 500);
        h_C[i] = -1.0f;
    }

    float *d_A = NULL, *d_B = NULL, *d_C = NULL;
    CHECK(cudaMalloc((void **)&d_A, size));
    CHECK(cudaMalloc((void **)&d_B, size));
    CHECK(cudaMalloc((void **)&d_C, size));
    CHECK(cudaMemcpy(d_A, h_A, size, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_B, h_B, size, cudaMemcpyHostToDevice));

    int threadsPerBlock = 256;
    int blocksPerGrid = (numElements + threadsPerBlock - 1) / threadsPerBlock;
    printf("CUDA kernel launch with %d blocks of %d threads\n", blocksPerGrid, threadsPerBlock);
    vectorAdd<<<blocksPerGrid, threadsPerBlock>>>(d_A, d_B, d_C, numElements);
    CHECK(cudaGetLastError());

    CHECK(cudaMemcpy(h_C, d_C, size, cudaMemcpyDeviceToHost));

    long long checksum = 0;
    for (int i = 0; i < numElements; ++i) {
        if (h_C[i] != h_A[i] + h_B[i]) {
            printf("FAIL " NAME ": result mismatch at element %d\n", i);
            return 1;
        }
        checksum += (long long)h_C[i];
    }
    printf("checksum %lld\n", checksum);

    CHECK(cudaFree(d_A));
    CHECK(cudaFree(d_B));
    CHECK(cudaFree(d_C));
    free(h_A);
    free(h_B);
    free(h_C);
    printf("PASS " NAME "\n");
    return 0;
}
