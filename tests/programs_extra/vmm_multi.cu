// vmm_multi: virtual memory management over two GPUs (issue 22): one
// reservation with a 2 MiB mapping on device 0 and one on device 1 side by
// side, access for both devices set over the whole range in one
// cuMemSetAccess, copies within and between the halves, and one cuMemUnmap
// over both mappings (cuda.h allows a range spanning several mappings); the
// range is then mapped again. Prints "PASS vmm_multi".
#include <cstdio>
#include <cstring>
#include <vector>
#include <cuda.h>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *n_ = 0; cuGetErrorName(r_, &n_); \
    printf("FAIL %s -> %s (line %d)\n", #x, n_ ? n_ : "?", __LINE__); return 1; } } while (0)

int main()
{
    CK(cuInit(0));
    int n = 0;
    CK(cuDeviceGetCount(&n));
    if (n < 2) { printf("FAIL needs 2 devices, %d here\n", n); return 1; }
    CUcontext ctx[2];
    for (int d = 0; d < 2; d++) CK(cuDevicePrimaryCtxRetain(&ctx[d], d));
    CK(cuCtxSetCurrent(ctx[0]));
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    size_t g = 0;
    CK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    size_t half = g > (2u << 20) ? g : (2u << 20);
    CUdeviceptr base;
    CK(cuMemAddressReserve(&base, 2 * half, 0, 0, 0));
    CUmemGenericAllocationHandle h[2];
    for (int d = 0; d < 2; d++) {
        prop.location.id = d;
        CK(cuMemCreate(&h[d], half, &prop, 0));
        CK(cuMemMap(base + d * half, half, 0, h[d], 0));
    }
    CUmemAccessDesc acc[2];
    for (int d = 0; d < 2; d++) {
        acc[d].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        acc[d].location.id = d;
        acc[d].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    CK(cuMemSetAccess(base, 2 * half, acc, 2));
    unsigned long long flags = 0;
    CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
    CK(cuMemGetAccess(&flags, &loc, base));
    printf("device 1 access to device 0's half: %llu\n", flags);
    const size_t cnt = half / 4;
    std::vector<unsigned> hv(cnt), back(cnt);
    for (size_t i = 0; i < cnt; i++) hv[i] = (unsigned)(i * 2654435761u);
    CK(cuMemcpyHtoD(base, hv.data(), half));                       // device 0's half
    CK(cuCtxSetCurrent(ctx[1]));
    CK(cuMemsetD32(base + half, 0xdeadbeef, cnt));                 // device 1's half
    CK(cuMemcpyDtoD(base + half + 4096, base, 65536));             // device 0 -> device 1, by address
    CK(cuCtxSynchronize());
    CK(cuMemcpyDtoH(back.data(), base + half, half));
    for (size_t i = 0; i < cnt; i++) {
        unsigned want = (i >= 1024 && i < 1024 + 16384) ? hv[i - 1024] : 0xdeadbeefu;
        if (back[i] != want) { printf("FAIL word %zu = %#x, expected %#x\n", i, back[i], want); return 1; }
    }
    printf("copies across the two mappings ok\n");
    CK(cuMemUnmap(base, 2 * half));                                 // both mappings in one call
    for (int d = 0; d < 2; d++) CK(cuMemRelease(h[d]));
    // the range is free again: map a new allocation of device 1 over all of it
    prop.location.id = 1;
    CUmemGenericAllocationHandle big;
    CK(cuMemCreate(&big, 2 * half, &prop, 0));
    CK(cuMemMap(base, 2 * half, 0, big, 0));
    CK(cuMemSetAccess(base, 2 * half, &acc[1], 1));
    CK(cuMemsetD32(base, 7, 2 * cnt));
    unsigned last = 0;
    CK(cuMemcpyDtoH(&last, base + 2 * half - 4, 4));
    printf("mapped again: last word %u\n", last);
    CK(cuMemUnmap(base, 2 * half));
    CK(cuMemRelease(big));
    CK(cuMemAddressFree(base, 2 * half));
    printf("PASS vmm_multi\n");
    return 0;
}
