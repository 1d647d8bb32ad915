// alloc_loop: 2000 iterations of cudaMalloc (4 B, 3 MiB and sizes in between),
// filling (cudaMemset or a kernel), copy-back check and cudaFree in a varying
// order; up to 12 buffers stay live across iterations and are re-checked every
// 100 iterations and at the end to prove that they keep their contents.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#define NAME "alloc_loop"
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

static const int kIters = 2000;
static const int kMaxLive = 12;
static const size_t kBig = 3u << 20;
static const size_t kWindow = 4096;     // bytes checked at each end of a large buffer

// p[i] = seed * 65599 + i, grid-stride
__global__ void fill_pattern(int *p, int n, int seed)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        p[i] = seed * 65599 + i;
}

struct Buf {
    char *p;
    size_t bytes;
    int memset_fill;    // 1: cudaMemset with a byte, 0: fill_pattern
    int iter;
};

static unsigned char *g_host;   // kBig bytes of scratch

static size_t size_for(int it)
{
    switch (it % 5) {
    case 0: return kBig;
    case 1:
    case 2: return 4;
    default: return ((size_t)((it * 7919) % 65536) + 1) * 4;
    }
}

static int byte_for(int it) { return (it * 13 + 7) & 0xFF; }

// check bytes [off, off+len) of b
static int check_range(const Buf &b, size_t off, size_t len)
{
    CHECK(cudaMemcpy(g_host, b.p + off, len, cudaMemcpyDeviceToHost));
    if (b.memset_fill) {
        unsigned char want = (unsigned char)byte_for(b.iter);
        for (size_t k = 0; k < len; ++k)
            if (g_host[k] != want) {
                printf("FAIL " NAME ": buffer of iteration %d byte %zu: got %d want %d\n", b.iter, off + k, g_host[k], want);
                return 1;
            }
    } else {
        const int *v = (const int *)g_host;
        for (size_t k = 0; k < len / 4; ++k) {
            int idx = (int)(off / 4 + k);
            int want = b.iter * 65599 + idx;
            if (v[k] != want) {
                printf("FAIL " NAME ": buffer of iteration %d element %d: got %d want %d\n", b.iter, idx, v[k], want);
                return 1;
            }
        }
    }
    return 0;
}

// full == 0: large buffers are checked at both ends only
static int check_buf(const Buf &b, int full)
{
    if (full || b.bytes <= 2 * kWindow)
        return check_range(b, 0, b.bytes);
    return check_range(b, 0, kWindow) || check_range(b, b.bytes - kWindow, kWindow);
}

int main(void)
{
    CHECK(cudaMallocHost(&g_host, kBig));
    Buf live[kMaxLive + 1];
    int nlive = 0;
    int nbig = 0, ntiny = 0, nother = 0, nmemset = 0, nkernel = 0, nfree = 0, nperiodic = 0;

    for (int it = 0; it < kIters; ++it) {
        Buf b;
        b.bytes = size_for(it);
        b.iter = it;
        b.memset_fill = (it % 3 == 0);
        if (b.bytes == kBig) ++nbig; else if (b.bytes == 4) ++ntiny; else ++nother;
        CHECK(cudaMalloc(&b.p, b.bytes));
        if (b.memset_fill) {
            CHECK(cudaMemset(b.p, byte_for(it), b.bytes));
            ++nmemset;
        } else {
            int n = (int)(b.bytes / 4);
            int blocks = (n + 255) / 256;
            if (blocks > 64) blocks = 64;
            fill_pattern<<<blocks, 256>>>((int *)b.p, n, it);
            CHECK(cudaGetLastError());
            ++nkernel;
        }
        if (check_buf(b, 0)) return 1;
        live[nlive++] = b;
        if (nlive > kMaxLive) {
            int victim = (it * 7) % nlive;
            if (check_buf(live[victim], 0)) return 1;
            CHECK(cudaFree(live[victim].p));
            ++nfree;
            live[victim] = live[nlive - 1];     // varying order of frees and of the live set
            --nlive;
        }
        if ((it + 1) % 100 == 0) {
            for (int k = 0; k < nlive; ++k)
                if (check_buf(live[k], 0)) return 1;
            ++nperiodic;
        }
    }
    printf("iterations %d\n", kIters);
    printf("allocations: %d of 3 MiB, %d of 4 B, %d of other sizes\n", nbig, ntiny, nother);
    printf("fills: %d by cudaMemset, %d by kernel\n", nmemset, nkernel);
    printf("periodic checks of live buffers: %d\n", nperiodic);

    long long live_bytes = 0;
    for (int k = 0; k < nlive; ++k) {
        if (check_buf(live[k], 1)) return 1;
        live_bytes += (long long)live[k].bytes;
    }
    printf("live at end: %d buffers, %lld bytes, contents intact\n", nlive, live_bytes);
    for (int k = nlive - 1; k >= 0; --k) {
        CHECK(cudaFree(live[k].p));
        ++nfree;
    }
    printf("frees %d\n", nfree);
    CHECK(cudaFreeHost(g_host));
    printf("PASS " NAME "\n");
    return 0;
}
