// device_reset: cudaDeviceReset in the middle of a program, then the device
// is used again. A reset destroys the primary context: the runtime must load
// its module anew in the next context (a __device__ variable starts again
// from its initializer) and memory from before the reset is gone. With the
// static runtime (-cudart static) this exercises the driver's context-local
// storage: the runtime's per-context state is destroyed with the context
// (its destructor runs) and created again (interceptor/export_tables.c).
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define NAME "device_reset"
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

__device__ int offset = 5;

__global__ void fill(int *out, int n)
{
    int i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i < n)
        out[i] = 3 * i + offset;
}

__global__ void bump(int by) { offset += by; }   // launched <<<1, 1>>>

static const int N = 1000;

// Fills on the device and checks every element against 3 * i + want.
static void fill_and_check(const char *phase, int want)
{
    int *d = NULL;
    int h[N];
    CHECK(cudaMalloc(&d, N * sizeof(int)));
    fill<<<(N + 255) / 256, 256>>>(d, N);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(cudaFree(d));
    for (int i = 0; i < N; i++)
        if (h[i] != 3 * i + want) {
            printf("FAIL " NAME ": %s: element %d is %d, expected %d\n", phase, i, h[i], 3 * i + want);
            exit(1);
        }
    printf("%s: offset %d ok\n", phase, want);
}

int main(void)
{
    fill_and_check("start", 5);
    bump<<<1, 1>>>(100);
    CHECK(cudaGetLastError());
    fill_and_check("after bump", 105);
    CHECK(cudaDeviceReset());
    fill_and_check("after reset", 5);    // a new context: the variable is initialised again
    bump<<<1, 1>>>(7);
    CHECK(cudaGetLastError());
    fill_and_check("after second bump", 12);
    CHECK(cudaDeviceReset());
    printf("PASS " NAME "\n");
    return 0;
}
