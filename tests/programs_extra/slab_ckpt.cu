// slab_ckpt: many small cudaMallocs (1 B to 64 KiB, a few of 200 KiB), the
// allocations gpuproxy's shim places in slabs (interceptor/slab.c), filled by
// a kernel or cudaMemset, a third freed each step, all checked against the
// host's own pattern. Each step also checks cudaFree's implicit device
// synchronisation: a slow kernel on a non-blocking stream writes a block,
// the block is freed and allocated again, and another non-blocking stream
// memsets the new block; if the free did not wait for the kernel, the
// kernel's late writes would show in the block.
//
// argv[1]: steps (default 12). Pacing (GPUPROXY_TEST_PACE=1) as in
// tests/programs/iterative.cu: one stdin line before each step, "step <k>
// done" after it.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

#define NAME "slab_ckpt"
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

// byte i of a kernel-filled block
__host__ __device__ static inline unsigned char pattern(unsigned seed, size_t i)
{
    return (unsigned char)((seed * 131u + (unsigned)i * 7u) & 0xFF);
}

__global__ void fill(unsigned char *p, unsigned n, unsigned seed)
{
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        p[i] = pattern(seed, i);
}

// spins for about `cycles` clock cycles, then writes 0x5A everywhere
__global__ void slow_fill(unsigned char *p, unsigned n, long long cycles)
{
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        p[i] = 0x5A;
}

struct Block {
    unsigned char *p;
    size_t n;
    int by_kernel;
    unsigned seed;
};

static unsigned lcg = 12345;
static unsigned next_rand()
{
    lcg = lcg * 1103515245u + 12345u;
    return lcg >> 8;
}

static size_t pick_size()
{
    unsigned r = next_rand() % 100;
    if (r < 2) return 200000 + next_rand() % 1000;
    if (r < 30) return 1 + next_rand() % 256;
    return 1 + next_rand() % 65536;
}

static std::vector<unsigned char> host_buf(300000);

static int check(const Block &b)
{
    CHECK(cudaMemcpy(host_buf.data(), b.p, b.n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < b.n; ++i) {
        unsigned char want = b.by_kernel ? pattern(b.seed, i) : (unsigned char)(b.seed & 0xFF);
        if (host_buf[i] != want) {
            printf("FAIL " NAME ": block of %zu bytes (seed %u) byte %zu: got %d want %d\n", b.n, b.seed, i,
                   host_buf[i], want);
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 12;
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    const int pacing = pace_env && strcmp(pace_env, "1") == 0;
    int waiting = pacing;
    cudaStream_t slow, other;
    CHECK(cudaStreamCreateWithFlags(&slow, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    int clock_khz = 0;
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    const long long spin = (long long)clock_khz * 20;   // about 20 ms
    std::vector<Block> live;
    unsigned seed = 1;
    int fence_reused = 0;
    for (int k = 1; k <= steps; ++k) {
        if (waiting) {
            char line[256];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        for (int i = 0; i < 300; ++i) {
            Block b;
            b.n = pick_size();
            b.seed = seed++;
            b.by_kernel = (int)(b.seed % 2);
            CHECK(cudaMalloc(&b.p, b.n));
            if ((uintptr_t)b.p % 256) {
                printf("FAIL " NAME ": cudaMalloc returned %p, not 256-byte aligned\n", (void *)b.p);
                return 1;
            }
            if (b.by_kernel) {
                fill<<<(unsigned)((b.n + 255) / 256), 256>>>(b.p, (unsigned)b.n, b.seed);
                CHECK(cudaGetLastError());
            } else {
                CHECK(cudaMemset(b.p, (int)(b.seed & 0xFF), b.n));
            }
            live.push_back(b);
        }
        // free every third live block
        std::vector<Block> keep;
        for (size_t i = 0; i < live.size(); ++i) {
            if (i % 3 == (size_t)(k % 3))
                CHECK(cudaFree(live[i].p));
            else
                keep.push_back(live[i]);
        }
        live.swap(keep);
        // cudaFree waits for the slow kernel before the block can come back
        unsigned char *a = nullptr, *b = nullptr;
        const size_t fn = 4096;
        CHECK(cudaMalloc(&a, fn));
        slow_fill<<<4, 256, 0, slow>>>(a, (unsigned)fn, spin);
        CHECK(cudaGetLastError());
        CHECK(cudaFree(a));
        CHECK(cudaMalloc(&b, fn));
        fence_reused += a == b;
        CHECK(cudaMemsetAsync(b, 0x77, fn, other));
        CHECK(cudaStreamSynchronize(other));
        CHECK(cudaStreamSynchronize(slow));
        CHECK(cudaMemcpy(host_buf.data(), b, fn, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < fn; ++i)
            if (host_buf[i] != 0x77) {
                printf("FAIL " NAME ": step %d: byte %zu of a block freed after a running kernel is %d: the kernel "
                       "wrote it after cudaFree returned\n", k, i, host_buf[i]);
                return 1;
            }
        CHECK(cudaFree(b));
        if (k % 4 == 0 || k == steps) {
            for (const Block &x : live)
                if (check(x))
                    return 1;
        }
        if (pacing) {
            CHECK(cudaDeviceSynchronize());
            printf("step %d done\n", k);
            fflush(stdout);
        }
    }
    size_t bytes = 0;
    for (const Block &x : live)
        bytes += x.n;
    printf("live blocks %zu bytes %zu\n", live.size(), bytes);
    printf("fence steps %d of %d reused the freed block\n", fence_reused, steps);
    for (const Block &x : live)
        CHECK(cudaFree(x.p));
    CHECK(cudaStreamDestroy(slow));
    CHECK(cudaStreamDestroy(other));
    printf("PASS " NAME "\n");
    return 0;
}
