// hostmem: host memory that kernels reach directly (issue 10, group 1).
// Mapped page-locked memory (cudaHostAlloc with cudaHostAllocMapped, its
// device pointer from cudaHostGetDevicePointer), plain page-locked memory
// used in a kernel through its host pointer (unified addressing), the
// program's own malloc'd memory registered with cudaHostRegister, and
// managed memory (cudaMallocManaged) that the host reads and writes between
// kernels, with cudaMemPrefetchAsync and cudaMemAdvise. Every iteration the
// host writes some of that memory, a kernel reads and writes all of it, and
// the host checks every element against values it computes itself, so a
// dump/restore between iterations that lost a mapping or its contents fails.
//
// Pacing (only when GPUPROXY_TEST_PACE=1): before each iteration one line is
// read from stdin; after iteration k the device is synchronized and
// "step <k> done" is printed.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

#define NAME "hostmem"
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

// reg[i] += a[i]; pin[i] = 2 * a[i]; m[i] = m[i] * 3 + reg[i] % 5; d[i] += m[i] % 11
__global__ void zc_step(const int *a, int *pin, int *reg, int *m, int *d, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        int r = reg[i] + a[i];
        reg[i] = r;
        pin[i] = 2 * a[i];
        int v = m[i] * 3 + r % 5;
        m[i] = v;
        d[i] += v % 11;
    }
}

int main(int argc, char **argv)
{
    int iters = (argc > 1) ? atoi(argv[1]) : 6;
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    const int pacing = pace_env && strcmp(pace_env, "1") == 0;
    int waiting = pacing;
    const size_t bytes = N * sizeof(int);

    CHECK(cudaFree(0));
    int dev = 0;
    CHECK(cudaGetDevice(&dev));
    int can_map = 0, managed = 0;
    CHECK(cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, dev));
    CHECK(cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, dev));
    EXPECT(can_map == 1 && managed == 1, "device cannot map host memory (%d) or lacks managed memory (%d)", can_map,
           managed);

    // mapped page-locked memory; with unified addressing its device pointer is its host pointer
    int *a = NULL, *da = NULL;
    CHECK(cudaHostAlloc((void **)&a, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    CHECK(cudaHostGetDevicePointer((void **)&da, a, 0));
    EXPECT(da == a, "device pointer %p of mapped memory %p differs", (void *)da, (void *)a);
    unsigned flags = 0;
    CHECK(cudaHostGetFlags(&flags, a));
    EXPECT((flags & cudaHostAllocMapped) && (flags & cudaHostAllocPortable), "host flags %#x", flags);

    // plain page-locked memory, used by a kernel through the host pointer
    int *pin = NULL;
    CHECK(cudaMallocHost((void **)&pin, bytes));
    memset(pin, 0xff, bytes);

    // the program's own memory, filled before it is registered: registering keeps the contents
    int *reg = (int *)malloc(bytes);
    EXPECT(reg != NULL, "malloc");
    for (int i = 0; i < N; ++i)
        reg[i] = i % 13;
    CHECK(cudaHostRegister(reg, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
    int *dreg = NULL;
    CHECK(cudaHostGetDevicePointer((void **)&dreg, reg, 0));
    EXPECT(dreg == reg, "device pointer %p of registered memory %p differs", (void *)dreg, (void *)reg);
    EXPECT(cudaHostRegister(reg, bytes, 0) == cudaErrorHostMemoryAlreadyRegistered, "registered twice");
    (void)cudaGetLastError();
    for (int i = 0; i < N; ++i)
        EXPECT(reg[i] == i % 13, "registered element %d changed to %d", i, reg[i]);

    // managed memory: written by the host, prefetched and advised (accepted)
    int *m = NULL;
    CHECK(cudaMallocManaged((void **)&m, bytes, cudaMemAttachGlobal));
    for (int i = 0; i < N; ++i)
        m[i] = i % 9;
    cudaMemLocation loc;
    memset(&loc, 0, sizeof loc);
    loc.type = cudaMemLocationTypeDevice;
    loc.id = dev;
    CHECK(cudaMemAdvise(m, bytes, cudaMemAdviseSetPreferredLocation, loc));
    CHECK(cudaMemPrefetchAsync(m, bytes, loc, 0, 0));
    CHECK(cudaStreamSynchronize(0));

    cudaPointerAttributes at;
    CHECK(cudaPointerGetAttributes(&at, m));
    EXPECT(at.type == cudaMemoryTypeManaged && at.devicePointer == m && at.hostPointer == m, "managed attributes %d",
           (int)at.type);
    CHECK(cudaPointerGetAttributes(&at, a));
    EXPECT(at.type == cudaMemoryTypeHost && at.devicePointer == a, "mapped attributes %d", (int)at.type);

    int *d = NULL;
    CHECK(cudaMalloc((void **)&d, bytes));
    CHECK(cudaMemset(d, 0, bytes));

    // the host's own reference values
    std::vector<int> wreg(N), wm(N), wd(N, 0);
    for (int i = 0; i < N; ++i) {
        wreg[i] = i % 13;
        wm[i] = i % 9;
    }

    const int T = 256, B = (N + T - 1) / T;
    for (int k = 1; k <= iters; ++k) {
        if (waiting) {
            char line[256];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        // the host writes mapped and managed memory between kernels
        for (int i = 0; i < N; ++i) {
            a[i] = (i * 7 + k) % 1000;
            m[i] = (m[i] + k) % 100003;
            wm[i] = (wm[i] + k) % 100003;
        }
        zc_step<<<B, T>>>(da, pin, dreg, m, d, N);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        for (int i = 0; i < N; ++i) {
            int ai = (i * 7 + k) % 1000;
            wreg[i] += ai;
            wm[i] = wm[i] * 3 + wreg[i] % 5;
            wd[i] += wm[i] % 11;
            EXPECT(reg[i] == wreg[i], "iter %d: registered element %d is %d, want %d", k, i, reg[i], wreg[i]);
            EXPECT(pin[i] == 2 * ai, "iter %d: page-locked element %d is %d, want %d", k, i, pin[i], 2 * ai);
            EXPECT(m[i] == wm[i], "iter %d: managed element %d is %d, want %d", k, i, m[i], wm[i]);
        }
        // keep managed values small: the host folds them back (host write between kernels)
        for (int i = 0; i < N; ++i) {
            m[i] %= 100003;
            wm[i] %= 100003;
        }
        printf("iter %d host memory ok\n", k);
        if (pacing) {
            CHECK(cudaDeviceSynchronize());
            printf("step %d done\n", k);
        }
        fflush(stdout);
    }

    // copies and memsets with managed memory on either side
    std::vector<int> hd(N);
    CHECK(cudaMemcpy(hd.data(), d, bytes, cudaMemcpyDeviceToHost));
    long long sd = 0, sm = 0, sr = 0;
    for (int i = 0; i < N; ++i) {
        EXPECT(hd[i] == wd[i], "device element %d is %d, want %d", i, hd[i], wd[i]);
        sd += hd[i];
        sm += m[i];
        sr += reg[i];
    }
    CHECK(cudaMemcpy(d, m, bytes, cudaMemcpyDefault));
    CHECK(cudaMemset(m, 0, bytes));
    CHECK(cudaDeviceSynchronize());
    EXPECT(m[0] == 0 && m[N - 1] == 0, "managed memset");
    CHECK(cudaMemcpy(m, d, bytes, cudaMemcpyDeviceToDevice));
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < N; ++i)
        EXPECT(m[i] == wm[i], "managed element %d after copies is %d, want %d", i, m[i], wm[i]);
    printf("sums %lld %lld %lld\n", sd, sm, sr);

    // unregistering keeps the program's bytes; the memory is pageable again
    CHECK(cudaHostUnregister(reg));
    for (int i = 0; i < N; ++i)
        EXPECT(reg[i] == wreg[i], "registered element %d lost after unregistering", i);
    CHECK(cudaPointerGetAttributes(&at, reg));
    EXPECT(at.type == cudaMemoryTypeUnregistered, "unregistered memory has type %d", (int)at.type);
    EXPECT(cudaHostUnregister(reg) == cudaErrorHostMemoryNotRegistered, "unregistered twice");
    (void)cudaGetLastError();
    free(reg);
    CHECK(cudaFree(m));
    CHECK(cudaFreeHost(a));
    CHECK(cudaFreeHost(pin));
    CHECK(cudaFree(d));
    printf("PASS " NAME "\n");
    return 0;
}
