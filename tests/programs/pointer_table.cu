// pointer_table: device pointers stored in device memory.
//  phase 1: a table of the 8 buffers' base pointers (and a table of their
//           sizes) is copied to the device; one kernel writes every buffer
//           through the table: buffer b, element i := base + b*1000 + i.
//  phase 2: the table is rewritten reversed and with interior pointers
//           (buffer base + 3 elements); a kernel adds the table position to
//           every element it reaches through it.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define NAME "pointer_table"
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

static const int kBuffers = 8;
static const int kBase = 7000000;
static const int kSkip = 3;

// blockIdx.y selects the table entry; grid-stride over its elements in x
__global__ void fill_through_table(int *const *table, const int *sizes, int nbuf, int base)
{
    int b = blockIdx.y;
    if (b >= nbuf) return;
    int *buf = table[b];
    int n = sizes[b];
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        buf[i] = base + b * 1000 + i;
}

// entry b of the table gets b added to each of its elements; one block per entry
__global__ void add_position(int *const *table, const int *sizes, int nbuf)
{
    for (int b = blockIdx.x; b < nbuf; b += gridDim.x) {
        int *buf = table[b];
        int n = sizes[b];
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            buf[i] += b;
    }
}

int main(void)
{
    int *bufs[kBuffers];
    int sizes[kBuffers];
    for (int b = 0; b < kBuffers; ++b) {
        sizes[b] = 1000 + b * 537;
        CHECK(cudaMalloc(&bufs[b], sizes[b] * sizeof(int)));
        CHECK(cudaMemset(bufs[b], 0, sizes[b] * sizeof(int)));
    }
    int **d_table;
    int *d_sizes;
    CHECK(cudaMalloc(&d_table, kBuffers * sizeof(int *)));
    CHECK(cudaMalloc(&d_sizes, kBuffers * sizeof(int)));

    // ---- phase 1
    CHECK(cudaMemcpy(d_table, bufs, kBuffers * sizeof(int *), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_sizes, sizes, kBuffers * sizeof(int), cudaMemcpyHostToDevice));
    fill_through_table<<<dim3(4, kBuffers), 256>>>(d_table, d_sizes, kBuffers, kBase);
    CHECK(cudaGetLastError());
    long long sum1 = 0;
    for (int b = 0; b < kBuffers; ++b) {
        int *h = (int *)malloc(sizes[b] * sizeof(int));
        CHECK(cudaMemcpy(h, bufs[b], sizes[b] * sizeof(int), cudaMemcpyDeviceToHost));
        for (int i = 0; i < sizes[b]; ++i) {
            if (h[i] != kBase + b * 1000 + i) {
                printf("FAIL " NAME ": phase 1 buffer %d element %d: got %d\n", b, i, h[i]);
                return 1;
            }
            sum1 += h[i];
        }
        free(h);
    }
    printf("phase 1: %d buffers written through the table, checksum %lld\n", kBuffers, sum1);

    // ---- phase 2: reversed table of interior pointers
    int *table2[kBuffers];
    int sizes2[kBuffers];
    for (int p = 0; p < kBuffers; ++p) {
        int b = kBuffers - 1 - p;
        table2[p] = bufs[b] + kSkip;
        sizes2[p] = sizes[b] - kSkip;
    }
    CHECK(cudaMemcpy(d_table, table2, kBuffers * sizeof(int *), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_sizes, sizes2, kBuffers * sizeof(int), cudaMemcpyHostToDevice));
    add_position<<<3, 128>>>(d_table, d_sizes, kBuffers);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    long long sum2 = 0;
    for (int b = 0; b < kBuffers; ++b) {
        int *h = (int *)malloc(sizes[b] * sizeof(int));
        CHECK(cudaMemcpy(h, bufs[b], sizes[b] * sizeof(int), cudaMemcpyDeviceToHost));
        int pos = kBuffers - 1 - b;
        for (int i = 0; i < sizes[b]; ++i) {
            int want = kBase + b * 1000 + i + (i >= kSkip ? pos : 0);
            if (h[i] != want) {
                printf("FAIL " NAME ": phase 2 buffer %d element %d: got %d want %d\n", b, i, h[i], want);
                return 1;
            }
            sum2 += h[i];
        }
        free(h);
    }
    printf("phase 2: reversed interior pointers, checksum %lld\n", sum2);

    for (int b = 0; b < kBuffers; ++b) CHECK(cudaFree(bufs[b]));
    CHECK(cudaFree(d_table));
    CHECK(cudaFree(d_sizes));
    printf("PASS " NAME "\n");
    return 0;
}
