// devloc: device numbers inside structures after a restore onto other
// devices (issue 22). Everything lives on device 1: a VMM allocation
// (cuMemCreate with CUmemAllocationProp.location.id = 1, cuMemSetAccess
// with a descriptor per device) and a memory pool (cudaMemPoolCreate with
// cudaMemPoolProps.location.id = 1, cudaMemPoolSetAccess for device 0),
// data copied between them. With "wait" the program then pauses ("ready",
// one stdin line: the test checkpoints it and restores it with a device
// map), and afterwards asks where its objects are (every answer in its own
// numbering), makes a second VMM allocation and a second pool on device 1
// (the structures name device 1 as before), computes on all four and
// prints the result; with "wait" a second pause ("ready again") lets the
// test look where the worker put everything.
#include <cstdio>
#include <cstring>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("FAIL %s -> %s (line %d)\n", #x, \
    cudaGetErrorName(e_), __LINE__); return 1; } } while (0)
#define DK(x) do { CUresult e_ = (x); if (e_ != CUDA_SUCCESS) { printf("FAIL %s -> %d (line %d)\n", #x, (int)e_, \
    __LINE__); return 1; } } while (0)

static void pause_here(bool wait, const char *what)
{
    if (!wait) return;
    printf("%s\n", what);
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) { /* EOF: go on */ }
}

static CUmemAllocationProp dev_prop(int dev)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    return p;
}

static cudaMemPoolProps pool_props(int dev)
{
    cudaMemPoolProps p;
    memset(&p, 0, sizeof p);
    p.allocType = cudaMemAllocationTypePinned;
    p.location.type = cudaMemLocationTypeDevice;
    p.location.id = dev;
    return p;
}

int main(int argc, char **argv)
{
    bool wait = argc > 1 && strcmp(argv[1], "wait") == 0;
    CK(cudaSetDevice(1));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    CUmemAllocationProp prop = dev_prop(1);
    size_t g = 0;
    DK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    const size_t words = g / 4;
    std::vector<unsigned> hv(words), back(words), want(words);
    for (size_t i = 0; i < words; i++) hv[i] = 2654435761u * (unsigned)i + 12345u;

    // before the pause: a VMM allocation and a pool allocation on device 1
    CUmemGenericAllocationHandle h1;
    CUdeviceptr va1;
    DK(cuMemCreate(&h1, g, &prop, 0));
    DK(cuMemAddressReserve(&va1, g, 0, 0, 0));
    DK(cuMemMap(va1, g, 0, h1, 0));
    CUmemAccessDesc acc[2];
    for (int d = 0; d < 2; d++) {
        acc[d].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        acc[d].location.id = d;
        acc[d].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    DK(cuMemSetAccess(va1, g, acc, 2));
    DK(cuMemcpyHtoD(va1, hv.data(), g));
    cudaMemPoolProps pp = pool_props(1);
    cudaMemPool_t pool1;
    CK(cudaMemPoolCreate(&pool1, &pp));
    cudaMemAccessDesc pacc;
    pacc.location.type = cudaMemLocationTypeDevice;
    pacc.location.id = 0;
    pacc.flags = cudaMemAccessFlagsProtReadWrite;
    CK(cudaMemPoolSetAccess(pool1, &pacc, 1));
    unsigned *p1;
    CK(cudaMallocFromPoolAsync((void **)&p1, g, pool1, s));
    CK(cudaMemcpyAsync(p1, (void *)va1, g, cudaMemcpyDeviceToDevice, s));
    CK(cudaMemsetAsync(p1, 0x5a, 4096, s));
    CK(cudaStreamSynchronize(s));

    pause_here(wait, "ready");

    // after it: the objects from before answer in the program's numbers
    CUmemAllocationProp q;
    DK(cuMemGetAllocationPropertiesFromHandle(&q, h1));
    unsigned long long f0 = 0, f1 = 0;
    CUmemLocation l0 = {CU_MEM_LOCATION_TYPE_DEVICE, 0}, l1 = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
    DK(cuMemGetAccess(&f0, &l0, va1));
    DK(cuMemGetAccess(&f1, &l1, va1));
    printf("vmm allocation on device %d, access device 0: %llu, device 1: %llu\n", q.location.id, f0, f1);
    cudaMemLocation m0 = {cudaMemLocationTypeDevice, 0}, m1 = {cudaMemLocationTypeDevice, 1};
    cudaMemAccessFlags a0, a1;
    CK(cudaMemPoolGetAccess(&a0, pool1, &m0));
    CK(cudaMemPoolGetAccess(&a1, pool1, &m1));
    printf("pool access device 0: %d, device 1: %d\n", (int)a0, (int)a1);

    // new objects on device 1, made with the same structures as before
    size_t g2 = 0;
    DK(cuMemGetAllocationGranularity(&g2, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    CUmemGenericAllocationHandle h2;
    CUdeviceptr va2;
    DK(cuMemCreate(&h2, g, &prop, 0));
    DK(cuMemAddressReserve(&va2, g, 0, 0, 0));
    DK(cuMemMap(va2, g, 0, h2, 0));
    DK(cuMemSetAccess(va2, g, &acc[1], 1));
    DK(cuMemGetAllocationPropertiesFromHandle(&q, h2));
    DK(cuMemGetAccess(&f1, &l1, va2));
    printf("new vmm allocation on device %d, access device 1: %llu, granularity %s\n", q.location.id, f1,
           g2 >= g ? "ok" : "SMALLER");
    cudaMemPool_t pool2;
    CK(cudaMemPoolCreate(&pool2, &pp));
    CK(cudaMemPoolGetAccess(&a0, pool2, &m0));
    CK(cudaMemPoolGetAccess(&a1, pool2, &m1));
    printf("new pool access device 0: %d, device 1: %d\n", (int)a0, (int)a1);
    unsigned *p2;
    CK(cudaMallocFromPoolAsync((void **)&p2, g, pool2, s));
    // p2 = p1 with its second 4 KiB set to 7; va2 = p2's first half then va1's second half
    CK(cudaMemcpyAsync(p2, p1, g, cudaMemcpyDeviceToDevice, s));
    DK(cuMemsetD32Async((CUdeviceptr)(p2 + 1024), 7, 1024, s));
    CK(cudaMemcpyAsync((void *)va2, p2, g / 2, cudaMemcpyDeviceToDevice, s));
    CK(cudaMemcpyAsync((void *)(va2 + g / 2), (void *)(va1 + g / 2), g / 2, cudaMemcpyDeviceToDevice, s));
    CK(cudaStreamSynchronize(s));
    DK(cuMemcpyDtoH(back.data(), va2, g));
    for (size_t i = 0; i < words; i++)
        want[i] = i < 1024 ? 0x5a5a5a5au : i < 2048 ? 7u : hv[i];
    unsigned sum = 0;
    for (size_t i = 0; i < words; i++) sum = sum * 31u + back[i];
    printf("result %s, checksum %08x\n", back == want ? "equal" : "DIFFERENT", sum);

    pause_here(wait, "ready again");
    CK(cudaFreeAsync(p1, s));
    CK(cudaFreeAsync(p2, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemPoolDestroy(pool1));
    CK(cudaMemPoolDestroy(pool2));
    DK(cuMemUnmap(va1, g));
    DK(cuMemUnmap(va2, g));
    DK(cuMemRelease(h1));
    DK(cuMemRelease(h2));
    DK(cuMemAddressFree(va1, g));
    DK(cuMemAddressFree(va2, g));
    printf("PASS devloc\n");
    return 0;
}
