// mempool_async: the stream-ordered allocator (issue 10, group 4):
// cudaMallocAsync / cudaFreeAsync from the default pool, an explicit pool
// (cudaMemPoolCreate) with its attributes and its device's access,
// cudaMallocFromPoolAsync, cudaDeviceSetMemPool / GetMemPool /
// GetDefaultMemPool. An accumulator allocated with cudaMallocAsync before
// the loop lives through every iteration (and through the checkpoints of
// tests/test_corpus_checkpoint.py: it must come back at the same address
// with its contents); each iteration allocates and frees scratch buffers in
// stream order. The explicit pool is exportable (POSIX file descriptors)
// and is exported at the end. The result is compared with a CPU computation.
//
// Pacing (GPUPROXY_TEST_PACE=1): one stdin line before each iteration,
// "step <k> done" after it.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <unistd.h>
#include <cuda_runtime.h>

#define NAME "mempool_async"
#define CHECK(call)                                                             \
    do {                                                                        \
        cudaError_t err_ = (call);                                              \
        if (err_ != cudaSuccess) {                                              \
            printf("FAIL " NAME ": %s -> %s at %s:%d\n", #call,                 \
                   cudaGetErrorName(err_), __FILE__, __LINE__);                 \
            fflush(stdout);                                                     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)
#define EXPECT(cond, ...)                                                       \
    do {                                                                        \
        if (!(cond)) {                                                          \
            printf("FAIL " NAME ": " __VA_ARGS__);                              \
            printf("\n");                                                       \
            fflush(stdout);                                                     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

static const int N = 1 << 16;

// a[i] = k * (i % 11) + 1
__global__ void fill(int *a, int n, int k)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        a[i] = k * (i % 11) + 1;
}

// acc[i] += a[i] * b[i]   (b from the pool: b[i] = a[i] + 3)
__global__ void combine(int *acc, const int *a, int *b, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        b[i] = a[i] + 3;
        acc[i] += a[i] * b[i];
    }
}

static unsigned long long attr64(cudaMemPool_t p, cudaMemPoolAttr a)
{
    unsigned long long v = 0;
    CHECK(cudaMemPoolGetAttribute(p, a, &v));
    return v;
}

int main(int argc, char **argv)
{
    int iters = (argc > 1) ? atoi(argv[1]) : 5;
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    const int pacing = pace_env && strcmp(pace_env, "1") == 0;
    int waiting = pacing;

    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaMemPool_t def, cur;
    CHECK(cudaDeviceGetDefaultMemPool(&def, 0));
    CHECK(cudaDeviceGetMemPool(&cur, 0));
    EXPECT(cur == def, "current pool is not the default pool");

    cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    // exportable (IPC) pool: its handle types must survive the checkpoints,
    // which the export after the loop checks
    props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
    cudaMemPool_t pool;
    CHECK(cudaMemPoolCreate(&pool, &props));
    unsigned long long thr = 64ull << 20;
    CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr));
    int follow = 0;
    CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolReuseFollowEventDependencies, &follow));
    // (cudaMemPoolSetAccess is for other devices than the pool's own; this
    // program runs on one. The pool's own device reads it read-write below.)

    int *acc;
    CHECK(cudaMallocAsync(&acc, N * sizeof(int), s));
    CHECK(cudaMemsetAsync(acc, 0, N * sizeof(int), s));
    CHECK(cudaStreamSynchronize(s));
    printf("pools ready\n");

    const int T = 256, B = (N + T - 1) / T;
    for (int k = 1; k <= iters; ++k) {
        if (waiting) {
            char line[256];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        // state set before the loop (and carried over any checkpoint)
        EXPECT(attr64(pool, cudaMemPoolAttrReleaseThreshold) == thr, "release threshold lost");
        int f = -1;
        CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolReuseFollowEventDependencies, &f));
        EXPECT(f == 0, "reuse policy %d", f);
        cudaMemAccessFlags fl = cudaMemAccessFlagsProtNone;
        cudaMemLocation loc;
        memset(&loc, 0, sizeof loc);
        loc.type = cudaMemLocationTypeDevice;
        loc.id = 0;
        CHECK(cudaMemPoolGetAccess(&fl, pool, &loc));
        EXPECT(fl == cudaMemAccessFlagsProtReadWrite, "access flags %d", (int)fl);
        CHECK(cudaDeviceGetMemPool(&cur, 0));
        EXPECT(cur == def, "current pool changed");

        int *a, *b;
        CHECK(cudaMallocAsync(&a, N * sizeof(int), s));
        CHECK(cudaMallocFromPoolAsync(&b, N * sizeof(int), pool, s));
        fill<<<B, T, 0, s>>>(a, N, k);
        combine<<<B, T, 0, s>>>(acc, a, b, N);
        CHECK(cudaGetLastError());
        CHECK(cudaStreamSynchronize(s));
        EXPECT(attr64(pool, cudaMemPoolAttrUsedMemCurrent) >= N * sizeof(int), "pool use not counted");
        CHECK(cudaFreeAsync(a, s));
        CHECK(cudaFreeAsync(b, s));
        CHECK(cudaStreamSynchronize(s));
        EXPECT(attr64(pool, cudaMemPoolAttrUsedMemCurrent) == 0, "pool memory still in use after the free");
        EXPECT(attr64(pool, cudaMemPoolAttrUsedMemHigh) >= N * sizeof(int), "high watermark");

        // the device's current pool: cudaMallocAsync then takes from it
        CHECK(cudaDeviceSetMemPool(0, pool));
        int *c;
        CHECK(cudaMallocAsync(&c, 4096, s));
        EXPECT(attr64(pool, cudaMemPoolAttrUsedMemCurrent) >= 4096, "allocation not from the current pool");
        CHECK(cudaFreeAsync(c, s));
        CHECK(cudaDeviceSetMemPool(0, def));
        CHECK(cudaStreamSynchronize(s));
        printf("iter %d ok\n", k);
        if (pacing)
            printf("step %d done\n", k);
        fflush(stdout);
    }
    unsigned long long zero = 0;
    CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
    EXPECT(attr64(pool, cudaMemPoolAttrUsedMemHigh) == 0, "high watermark not reset");
    CHECK(cudaMemPoolTrimTo(def, 0));

    std::vector<int> h(N);
    CHECK(cudaMemcpy(h.data(), acc, N * sizeof(int), cudaMemcpyDeviceToHost));
    long long total = 0;
    for (int i = 0; i < N; ++i) {
        long long want = 0;
        for (int k = 1; k <= iters; ++k) {
            long long a = k * (i % 11) + 1;
            want += a * (a + 3);
        }
        EXPECT(h[i] == want, "element %d is %d, want %lld", i, h[i], want);
        total += h[i];
    }
    printf("sum %lld\n", total);
    CHECK(cudaFreeAsync(acc, s));
    CHECK(cudaStreamSynchronize(s));
    int fd = -1;
    CHECK(cudaMemPoolExportToShareableHandle(&fd, pool, cudaMemHandleTypePosixFileDescriptor, 0));
    EXPECT(fd >= 0 && close(fd) == 0, "pool descriptor %d", fd);
    CHECK(cudaMemPoolDestroy(pool));
    CHECK(cudaStreamDestroy(s));
    printf("PASS " NAME "\n");
    return 0;
}
