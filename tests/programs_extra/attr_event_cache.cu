// tests/test_attr_event_cache.py: round trips of cudaFuncGetAttributes and
// cudaEventCreate under the proxy (shim function-attribute cache,
// asynchronous event creation). Usage: attr_event_cache REPS
// Every check prints a line; any failure exits 1 with the reason.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void scale(int *p, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] *= 2;
}

#define CHECK(x)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (x);                                                             \
        if (e_ != cudaSuccess) {                                                          \
            printf("FAIL %s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

#define EXPECT(c, ...)                  \
    do {                                \
        if (!(c)) {                     \
            printf("FAIL line %d: ", __LINE__); \
            printf(__VA_ARGS__);        \
            printf("\n");               \
            exit(1);                    \
        }                               \
    } while (0)

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 1;
    const int n = 256;
    int *d;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    int h[n];
    for (int i = 0; i < n; i++)
        h[i] = i;
    CHECK(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice));

    // the same kernel's attributes, reps times: all answers equal
    cudaFuncAttributes first;
    CHECK(cudaFuncGetAttributes(&first, scale));
    EXPECT(first.maxThreadsPerBlock > 0, "maxThreadsPerBlock %d", first.maxThreadsPerBlock);
    for (int r = 1; r < reps; r++) {
        cudaFuncAttributes a;
        CHECK(cudaFuncGetAttributes(&a, scale));
        EXPECT(a.maxThreadsPerBlock == first.maxThreadsPerBlock && a.numRegs == first.numRegs
                   && a.maxDynamicSharedSizeBytes == first.maxDynamicSharedSizeBytes
                   && a.binaryVersion == first.binaryVersion,
               "attributes changed between calls");
    }
    printf("attrs ok maxThreadsPerBlock=%d maxDynamicSharedSizeBytes=%d\n", first.maxThreadsPerBlock,
           first.maxDynamicSharedSizeBytes);

    // a set is seen by the next get (cached or not), twice, then back
    int want[3] = {first.maxDynamicSharedSizeBytes + 1024, 2048, first.maxDynamicSharedSizeBytes};
    for (int w : want) {
        CHECK(cudaFuncSetAttribute(scale, cudaFuncAttributeMaxDynamicSharedMemorySize, w));
        cudaFuncAttributes a;
        CHECK(cudaFuncGetAttributes(&a, scale));
        EXPECT(a.maxDynamicSharedSizeBytes == w, "maxDynamicSharedSizeBytes %d after setting %d",
               a.maxDynamicSharedSizeBytes, w);
        int v = -1;
        CHECK(cudaFuncGetAttributes(&a, scale));
        CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxThreadsPerBlock, 0));
        EXPECT(a.maxDynamicSharedSizeBytes == w, "second read %d after setting %d", a.maxDynamicSharedSizeBytes, w);
    }
    printf("set ok\n");

    // events: reps pairs, each used for a timed launch
    for (int r = 0; r < reps; r++) {
        cudaEvent_t a, b;
        CHECK(cudaEventCreate(&a));
        CHECK(cudaEventCreateWithFlags(&b, cudaEventDefault));
        CHECK(cudaEventRecord(a, 0));
        scale<<<(n + 127) / 128, 128>>>(d, n);
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(b, 0));
        CHECK(cudaEventSynchronize(b));
        CHECK(cudaEventQuery(b));
        float ms = -1;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        EXPECT(ms >= 0, "elapsed %f", ms);
        CHECK(cudaEventDestroy(a));
        CHECK(cudaEventDestroy(b));
    }
    // a stream waiting on an event of another stream, no timing
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e;
    CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync));
    scale<<<(n + 127) / 128, 128, 0, s>>>(d, n);
    CHECK(cudaEventRecord(e, s));
    CHECK(cudaStreamWaitEvent(0, e, 0));
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++)
        EXPECT(h[i] == i << (reps + 1), "h[%d] = %d, want %d", i, h[i], i << (reps + 1));
    float ms;
    EXPECT(cudaEventElapsedTime(&ms, e, e) == cudaErrorInvalidResourceHandle, "elapsed time of a no-timing event");
    (void)cudaGetLastError();
    CHECK(cudaEventDestroy(e));
    CHECK(cudaStreamDestroy(s));
    printf("events ok\n");

    // flags cuda.h does not define, and interprocess without disable-timing
    unsigned bad[2] = {0x100, cudaEventInterprocess};
    for (unsigned f : bad) {
        cudaEvent_t x = 0;
        cudaError_t rc = cudaEventCreateWithFlags(&x, f);
        EXPECT(rc == cudaErrorInvalidValue, "flags %#x: %s", f, cudaGetErrorString(rc));
        (void)cudaGetLastError();
    }
    CHECK(cudaDeviceSynchronize());
    printf("bad flags ok\n");
    CHECK(cudaFree(d));
    printf("PASS attr_event_cache\n");
    return 0;
}
