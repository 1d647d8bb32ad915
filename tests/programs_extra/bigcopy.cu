// bigcopy: large host <-> device copies through the runtime API, checked
// byte for byte. Host-only code (no kernels), compiled by tests/test_shim.py
// with `nvcc -cudart shared`.
//
//   bigcopy MODE MIB SEED
//     MODE  pageable        malloc'd buffers, cudaMemcpy
//           pinned          cudaMallocHost buffers, cudaMemcpy
//           async_pageable  malloc'd buffers, cudaMemcpyAsync on a stream + cudaStreamSynchronize
//           async_pinned    cudaMallocHost buffers, cudaMemcpyAsync + cudaStreamSynchronize
//     MIB   size of the copy in MiB
//     SEED  seed of the data pattern
//
// Copies MIB MiB of a pattern host -> device, clears the host buffer, copies
// device -> host and compares. Then copies odd-sized ranges at odd offsets in
// both directions (across the shim's chunk and inline-size boundaries) and
// compares again. Prints the checksum of the data that came back (the test
// recomputes it from the pattern) and "PASS bigcopy" on success; any
// mismatch or CUDA error prints "FAIL ..." and exits 1.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#define CHECK(call)                                                                      \
    do {                                                                                 \
        cudaError_t err_ = (call);                                                       \
        if (err_ != cudaSuccess) {                                                       \
            printf("FAIL bigcopy: %s -> %s (%s) at line %d\n", #call, cudaGetErrorName(err_), \
                   cudaGetErrorString(err_), __LINE__);                                  \
            fflush(stdout);                                                              \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

static uint64_t pattern(uint64_t i, uint64_t seed)
{
    uint64_t x = (i + seed) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return x;
}

// sum over 64-bit words w[i] * (2i + 1), modulo 2^64
static uint64_t checksum(const uint64_t *w, size_t n)
{
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++)
        s += w[i] * (2 * (uint64_t)i + 1);
    return s;
}

static int pinned, async_mode;
static cudaStream_t stream;

static void copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
    if (async_mode) {
        CHECK(cudaMemcpyAsync(dst, src, n, kind, stream));
        CHECK(cudaStreamSynchronize(stream));
    } else {
        CHECK(cudaMemcpy(dst, src, n, kind));
    }
}

static void *host_alloc(size_t n)
{
    void *p = NULL;
    if (pinned) {
        CHECK(cudaMallocHost(&p, n));
    } else {
        p = malloc(n);
    }
    if (!p) {
        printf("FAIL bigcopy: host allocation of %zu bytes\n", n);
        exit(1);
    }
    return p;
}

static void host_free(void *p)
{
    if (pinned)
        CHECK(cudaFreeHost(p));
    else
        free(p);
}

static void compare(const unsigned char *got, const unsigned char *want, size_t n, const char *what)
{
    if (memcmp(got, want, n) == 0)
        return;
    size_t i = 0;
    while (got[i] == want[i])
        i++;
    printf("FAIL bigcopy: %s: first difference at byte %zu of %zu (got 0x%02x, want 0x%02x)\n", what, i, n,
           got[i], want[i]);
    exit(1);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: bigcopy pageable|pinned|async_pageable|async_pinned MIB SEED\n");
        return 2;
    }
    const char *mode = argv[1];
    if (!strcmp(mode, "pageable")) { pinned = 0; async_mode = 0; }
    else if (!strcmp(mode, "pinned")) { pinned = 1; async_mode = 0; }
    else if (!strcmp(mode, "async_pageable")) { pinned = 0; async_mode = 1; }
    else if (!strcmp(mode, "async_pinned")) { pinned = 1; async_mode = 1; }
    else { fprintf(stderr, "bigcopy: unknown mode %s\n", mode); return 2; }
    const size_t n = (size_t)strtoull(argv[2], NULL, 10) << 20;
    const uint64_t seed = strtoull(argv[3], NULL, 10);
    const size_t words = n / 8;

    if (async_mode)
        CHECK(cudaStreamCreate(&stream));
    uint64_t *src = (uint64_t *)host_alloc(n);
    uint64_t *dst = (uint64_t *)host_alloc(n);
    for (size_t i = 0; i < words; i++)
        src[i] = pattern(i, seed);
    memset(dst, 0, n);

    unsigned char *dev = NULL;
    CHECK(cudaMalloc((void **)&dev, n));

    // ---- the whole buffer, there and back
    copy(dev, src, n, cudaMemcpyHostToDevice);
    copy(dst, dev, n, cudaMemcpyDeviceToHost);
    compare((unsigned char *)dst, (unsigned char *)src, n, "full round trip");
    printf("%s %zu bytes: checksum %016llx\n", mode, n, (unsigned long long)checksum(dst, words));

    // ---- odd ranges at odd offsets, both directions
    const size_t M = 1u << 20;
    const size_t ranges[][2] = {
        {1, 1}, {3, 4095}, {5, 16383}, {7, 16384}, {9, 16385}, {11, 65535}, {13, 65536}, {15, 65537},
        {12345, 3 * M + 7}, {16 * M - 5, 16 * M + 10}, {32 * M - 1, 32 * M + 3}, {0, 64 * M + 1},
    };
    unsigned char *s8 = (unsigned char *)src, *d8 = (unsigned char *)dst;
    int checked = 0;
    for (size_t k = 0; k < sizeof ranges / sizeof ranges[0]; k++) {
        size_t off = ranges[k][0], len = ranges[k][1];
        if (off + len > n)
            continue;
        char what[96];
        // device -> host of a range: only that range of dst changes
        memset(d8 + off, 0, len);
        copy(d8 + off, dev + off, len, cudaMemcpyDeviceToHost);
        snprintf(what, sizeof what, "DtoH of [%zu, +%zu)", off, len);
        compare(d8, s8, n, what);
        // host -> device of a range with new data: only that range of the device changes
        for (size_t i = 0; i < len; i++)
            s8[off + i] = (unsigned char)(s8[off + i] ^ (0x5a + k));
        copy(dev + off, s8 + off, len, cudaMemcpyHostToDevice);
        // read back a window around the range (its neighbours must be unchanged)
        size_t lo = off > 4096 ? off - 4096 : 0, hi = off + len + 4096 < n ? off + len + 4096 : n;
        memset(d8 + lo, 0, hi - lo);
        copy(d8 + lo, dev + lo, hi - lo, cudaMemcpyDeviceToHost);
        snprintf(what, sizeof what, "HtoD of [%zu, +%zu)", off, len);
        compare(d8, s8, n, what);
        checked++;
    }
    printf("%d odd ranges ok\n", checked);

    CHECK(cudaFree(dev));
    host_free(src);
    host_free(dst);
    if (async_mode)
        CHECK(cudaStreamDestroy(stream));
    printf("PASS bigcopy\n");
    return 0;
}
