// streams_events: streams, events and asynchronous copies.
//  phase 1: stream A uploads (pinned) and transforms buffer a; stream B clears
//           buffer b, waits for A's event and combines a into b (it must see A's
//           result), then downloads into pageable memory; timing events.
//  phase 2: pageable upload + memset + kernel + pinned download on one stream.
//  phase 3: legacy default stream + cudaDeviceSynchronize + stream queries.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#define NAME "streams_events"
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

// x[i] = x[i] * mul + add, grid-stride
__global__ void scale_add(int *x, int n, int mul, int add)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        x[i] = x[i] * mul + add;
}

// dst[i] = dst[i] + src[i] + i
__global__ void combine(int *dst, const int *src, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = dst[i] + src[i] + i;
}

// x[i] += v
__global__ void add_const(int *x, int n, int v)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += v;
}

static int fail(const char *what, int i)
{
    printf("FAIL " NAME ": %s mismatch at %d\n", what, i);
    return 1;
}

int main(void)
{
    const int n = 1 << 18;
    const size_t bytes = n * sizeof(int);
    const int threads = 256;
    const int blocks = (n + threads - 1) / threads;

    int *d_a, *d_b, *d_c;
    CHECK(cudaMalloc(&d_a, bytes));
    CHECK(cudaMalloc(&d_b, bytes));
    CHECK(cudaMalloc(&d_c, bytes));

    int *h_pinned_in, *h_pinned_out;
    CHECK(cudaMallocHost(&h_pinned_in, bytes));
    CHECK(cudaMallocHost(&h_pinned_out, bytes));
    int *h_pageable_in = (int *)malloc(bytes);
    int *h_pageable_out = (int *)malloc(bytes);
    if (!h_pageable_in || !h_pageable_out) { printf("FAIL " NAME ": malloc\n"); return 1; }

    for (int i = 0; i < n; ++i) {
        h_pinned_in[i] = i % 1000;
        h_pageable_in[i] = (i * 3) % 4096;
        h_pageable_out[i] = -1;
        h_pinned_out[i] = -1;
    }

    cudaStream_t sA, sB;
    CHECK(cudaStreamCreate(&sA));
    CHECK(cudaStreamCreateWithFlags(&sB, cudaStreamNonBlocking));
    cudaEvent_t evStart, evA, evStop;
    CHECK(cudaEventCreate(&evStart));
    CHECK(cudaEventCreateWithFlags(&evA, cudaEventDisableTiming));
    CHECK(cudaEventCreate(&evStop));

    // ---- phase 1: cross-stream dependency through an event
    CHECK(cudaEventRecord(evStart, sA));
    CHECK(cudaMemcpyAsync(d_a, h_pinned_in, bytes, cudaMemcpyHostToDevice, sA));
    scale_add<<<64, threads, 0, sA>>>(d_a, n, 3, 1);          // a = in*3 + 1
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(evA, sA));
    CHECK(cudaMemsetAsync(d_b, 0, bytes, sB));
    CHECK(cudaStreamWaitEvent(sB, evA, 0));
    combine<<<blocks, threads, 0, sB>>>(d_b, d_a, n);          // b = 0 + a + i
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpyAsync(h_pageable_out, d_b, bytes, cudaMemcpyDeviceToHost, sB));
    CHECK(cudaEventRecord(evStop, sB));

    // evA may or may not be complete yet: poll until it is
    cudaError_t q;
    while ((q = cudaEventQuery(evA)) == cudaErrorNotReady) {
    }
    CHECK(q);
    (void)cudaGetLastError();   // a cudaErrorNotReady seen above is not an error

    CHECK(cudaEventSynchronize(evStop));
    printf("event query after synchronize: %s\n", cudaGetErrorName(cudaEventQuery(evStop)));
    float ms = -1.0f;
    CHECK(cudaEventElapsedTime(&ms, evStart, evStop));
    printf("elapsed>=0: %s\n", ms >= 0.0f ? "yes" : "no");

    long long sum1 = 0;
    for (int i = 0; i < n; ++i) {
        int expect = (i % 1000) * 3 + 1 + i;
        if (h_pageable_out[i] != expect) return fail("phase 1", i);
        sum1 += h_pageable_out[i];
    }
    printf("phase 1 checksum %lld\n", sum1);

    // ---- phase 2: pageable upload of half the buffer over a memset, pinned download
    CHECK(cudaMemsetAsync(d_c, 0x01, bytes, sA));
    CHECK(cudaMemcpyAsync(d_c, h_pageable_in, bytes / 2, cudaMemcpyHostToDevice, sA));
    add_const<<<blocks, threads, 0, sA>>>(d_c, n, 5);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpyAsync(h_pinned_out, d_c, bytes, cudaMemcpyDeviceToHost, sA));
    CHECK(cudaStreamSynchronize(sA));
    printf("stream query after synchronize: %s\n", cudaGetErrorName(cudaStreamQuery(sA)));

    long long sum2 = 0;
    for (int i = 0; i < n; ++i) {
        int expect = (i < n / 2) ? ((i * 3) % 4096) + 5 : 0x01010101 + 5;
        if (h_pinned_out[i] != expect) return fail("phase 2", i);
        sum2 += h_pinned_out[i];
    }
    printf("phase 2 checksum %lld\n", sum2);

    // ---- phase 3: legacy default stream, blocking copies
    scale_add<<<blocks, threads>>>(d_b, n, 2, -7);            // b = 2*b - 7
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(h_pageable_out, d_b, bytes, cudaMemcpyDeviceToHost));
    long long sum3 = 0;
    for (int i = 0; i < n; ++i) {
        int expect = ((i % 1000) * 3 + 1 + i) * 2 - 7;
        if (h_pageable_out[i] != expect) return fail("phase 3", i);
        sum3 += h_pageable_out[i];
    }
    printf("phase 3 checksum %lld\n", sum3);
    printf("default stream query: %s\n", cudaGetErrorName(cudaStreamQuery(0)));

    CHECK(cudaEventDestroy(evStart));
    CHECK(cudaEventDestroy(evA));
    CHECK(cudaEventDestroy(evStop));
    CHECK(cudaStreamDestroy(sA));
    CHECK(cudaStreamDestroy(sB));
    CHECK(cudaFreeHost(h_pinned_in));
    CHECK(cudaFreeHost(h_pinned_out));
    free(h_pageable_in);
    free(h_pageable_out);
    CHECK(cudaFree(d_a));
    CHECK(cudaFree(d_b));
    CHECK(cudaFree(d_c));
    printf("PASS " NAME "\n");
    return 0;
}
