// vmm_app: the application's own virtual memory management (issue 10,
// group 4), as PyTorch's expandable segments use it: reserve a large
// address range, create physical allocations of the granularity, map them
// one after the other, grant access, run kernels over the contiguous range
// (across the boundary between two physical allocations), grow the mapping
// while the program runs, and tear it all down. Dumped and restored between
// iterations (tests/test_corpus_checkpoint.py), every mapping must come back
// at its address with its contents. The result is compared with a CPU
// computation.
//
// Pacing (GPUPROXY_TEST_PACE=1): one stdin line before each iteration,
// "step <k> done" after it.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>

#define NAME "vmm_app"
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
#define CHECK_CU(call)                                                          \
    do {                                                                        \
        CUresult err_ = (call);                                                 \
        if (err_ != CUDA_SUCCESS) {                                             \
            printf("FAIL " NAME ": %s -> %d at %s:%d\n", #call, (int)err_,      \
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

// x[i] += k + i % 13
__global__ void vmm_add(int *x, int n, int k)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += k + i % 13;
}

static const int GROW_AT = 3;      // the third physical allocation is mapped in this iteration
static const int SLOTS = 8;        // granules of address space reserved

int main(int argc, char **argv)
{
    int iters = (argc > 1) ? atoi(argv[1]) : 5;
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    const int pacing = pace_env && strcmp(pace_env, "1") == 0;
    int waiting = pacing;

    CHECK(cudaFree(0));
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g = 0, rec = 0;
    CHECK_CU(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CHECK_CU(cuMemGetAllocationGranularity(&rec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    EXPECT(g > 0 && rec >= g && rec % g == 0, "granularity %zu, recommended %zu", g, rec);
    printf("granularity %zu KiB\n", g >> 10);

    CUdeviceptr va = 0;
    CHECK_CU(cuMemAddressReserve(&va, SLOTS * g, 0, 0, 0));
    EXPECT(va % g == 0, "reservation %llx not aligned", (unsigned long long)va);
    CUmemGenericAllocationHandle h[3];
    for (int i = 0; i < 2; ++i) {
        CHECK_CU(cuMemCreate(&h[i], g, &prop, 0));
        CHECK_CU(cuMemMap(va + i * g, g, 0, h[i], 0));
    }
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK_CU(cuMemSetAccess(va, 2 * g, &acc, 1));      // one call over both mappings
    // a handle may go while its memory stays mapped (cuda.h, cuMemRelease)
    CUmemAllocationProp got;
    memset(&got, 0, sizeof got);
    CHECK_CU(cuMemGetAllocationPropertiesFromHandle(&got, h[0]));
    EXPECT(got.type == CU_MEM_ALLOCATION_TYPE_PINNED && got.location.id == 0, "handle properties");
    CHECK_CU(cuMemRelease(h[0]));
    int *x = (int *)(uintptr_t)va;
    CHECK(cudaMemset(x, 0, 2 * g));
    size_t mapped = 2 * g;

    const int T = 256;
    for (int k = 1; k <= iters; ++k) {
        if (waiting) {
            char line[256];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        if (k == GROW_AT) {
            CHECK_CU(cuMemCreate(&h[2], g, &prop, 0));
            CHECK_CU(cuMemMap(va + 2 * g, g, 0, h[2], 0));
            CHECK_CU(cuMemSetAccess(va + 2 * g, g, &acc, 1));
            CHECK(cudaMemset(x + 2 * g / sizeof(int), 0, g));
            mapped = 3 * g;
        }
        unsigned long long flags = 0;
        CUmemLocation loc;
        memset(&loc, 0, sizeof loc);
        loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
        loc.id = 0;
        CHECK_CU(cuMemGetAccess(&flags, &loc, va + g));
        EXPECT(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "access flags %llu", flags);
        int n = (int)(mapped / sizeof(int));
        vmm_add<<<(n + T - 1) / T, T>>>(x, n, k);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        printf("iter %d: %zu granules mapped\n", k, mapped / g);
        if (pacing)
            printf("step %d done\n", k);
        fflush(stdout);
    }

    int n = (int)(mapped / sizeof(int));
    std::vector<int> host(n);
    CHECK(cudaMemcpy(host.data(), x, mapped, cudaMemcpyDeviceToHost));
    int first = 2 * (int)(g / sizeof(int));       // where the late allocation starts
    long long total = 0;
    for (int i = 0; i < n; ++i) {
        long long want = 0;
        for (int k = (i >= first ? GROW_AT : 1); k <= iters; ++k)
            want += k + i % 13;
        EXPECT(host[i] == want, "element %d is %d, want %lld", i, host[i], want);
        total += host[i];
    }
    printf("sum %lld\n", total);
    for (size_t off = 0; off < mapped; off += g)
        CHECK_CU(cuMemUnmap(va + off, g));
    CHECK_CU(cuMemRelease(h[1]));
    if (mapped > 2 * g)
        CHECK_CU(cuMemRelease(h[2]));
    CHECK_CU(cuMemAddressFree(va, SLOTS * g));
    printf("PASS " NAME "\n");
    return 0;
}
