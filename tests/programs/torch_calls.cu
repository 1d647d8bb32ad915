// torch_calls: the CUDA runtime and driver calls PyTorch 2.11 (CUDA 13)
// makes at import, at torch.cuda.init() and in its caching allocator, as
// collected by running torch under the shim (docs/pytorch.md), without
// PyTorch (CI does not install it):
//  * the driver functions c10::cuda::DriverAPI resolves by name through
//    cudaGetDriverEntryPointByVersion must come back as entry points of the
//    driver library the process uses (the shim's, under the proxy), and work
//    when called through the returned pointers;
//  * the expandable-segments allocator (PYTORCH_CUDA_ALLOC_CONF=
//    expandable_segments:True): a reservation of 9/8 of the device memory,
//    cuMemCreate asking for a POSIX fd handle (torch always asks, for IPC),
//    mapped granule by granule, filled with cuMemsetD32Async, a kernel over
//    both granules, read back strided with cudaMemcpy2DAsync (torch's
//    strided device-to-host copies);
//  * stream priorities, capture-status queries, events, peer and memory
//    queries, pinned host memory, pointer attributes.
// The fabric handle type (tried first by torch) and exporting a handle may
// be refused (a GPU without fabric support does; the proxy refuses exports):
// both are allowed to fail, but the memory must work either way.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <dlfcn.h>
#include <unistd.h>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>

#define NAME "torch_calls"
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

// x[i] += 1: an elementwise kernel on the allocator's stream
__global__ void add_one(unsigned *x, unsigned long long n)
{
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += 1;
}

// What c10/cuda/driver_api.h resolves (name, the CUDA version it asks for),
// in the order torch asked under the shim.
static const struct { const char *name; unsigned version; } TORCH_DRIVER_API[] = {
    {"cuDeviceGet", 12000}, {"cuDeviceGetAttribute", 12000}, {"cuMemAddressReserve", 12000},
    {"cuMemRelease", 12000}, {"cuMemMap", 12000}, {"cuMemAddressFree", 12000},
    {"cuMemSetAccess", 12000}, {"cuMemUnmap", 12000}, {"cuMemCreate", 12000},
    {"cuMemGetAllocationGranularity", 12000}, {"cuMemExportToShareableHandle", 12000},
    {"cuMemImportFromShareableHandle", 12000}, {"cuMemRetainAllocationHandle", 12000},
    {"cuMemGetAllocationPropertiesFromHandle", 12000}, {"cuMemsetD32Async", 12000},
    {"cuStreamWriteValue32", 12000}, {"cuGetErrorString", 12000}, {"cuCtxGetCurrent", 12080},
    {"cuCtxPopCurrent", 12080}, {"cuCtxPushCurrent", 12080}, {"cuCtxSetCurrent", 12080},
    {"cuGreenCtxCreate", 12080}, {"cuGreenCtxDestroy", 12080}, {"cuMulticastCreate", 12030},
};

template <class F> static F resolve(const char *name, unsigned version)
{
    void *p = nullptr;
    cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
    CHECK(cudaGetDriverEntryPointByVersion(name, &p, version, cudaEnableDefault, &st));
    EXPECT(st == cudaDriverEntryPointSuccess && p, "%s not resolved (status %d)", name, (int)st);
    return reinterpret_cast<F>(p);
}

// The shared object a function pointer lies in.
static std::string library_of(void *p)
{
    Dl_info info;
    if (!dladdr(p, &info) || !info.dli_fname)
        return "?";
    return info.dli_fname;
}

int main()
{
    CHECK(cudaFree(0));
    int dev = 0, ndev = 0;
    CHECK(cudaGetDeviceCount(&ndev));
    CHECK(cudaGetDevice(&dev));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, dev));
    EXPECT(prop.totalGlobalMem > 0 && prop.major >= 7, "device properties");

    // ---- entry points: every one in the driver library this process uses
    std::string driver_lib = library_of(dlsym(RTLD_DEFAULT, "cuInit"));
    int n_resolved = 0;
    for (const auto &e : TORCH_DRIVER_API) {
        void *p = resolve<void *>(e.name, e.version);
        EXPECT(library_of(p) == driver_lib, "%s resolved into %s, not the driver library %s", e.name,
               library_of(p).c_str(), driver_lib.c_str());
        void *q = nullptr;
        CUdriverProcAddressQueryResult st;
        CHECK_CU(cuGetProcAddress(e.name, &q, (int)e.version, CU_GET_PROC_ADDRESS_DEFAULT, &st));
        EXPECT(q == p && st == CU_GET_PROC_ADDRESS_SUCCESS, "cuGetProcAddress(%s) disagrees", e.name);
        n_resolved++;
    }
    void *none = (void *)1;
    cudaDriverEntryPointQueryResult nst;
    // NVIDIA's runtime answers cudaErrorSymbolNotFound (what the static
    // runtime does on the shim's driver); the status says it either way
    cudaError_t ne = cudaGetDriverEntryPointByVersion("cuNoSuchFunction", &none, 13000, cudaEnableDefault, &nst);
    EXPECT(ne == cudaSuccess || ne == cudaErrorSymbolNotFound, "missing symbol: %s", cudaGetErrorName(ne));
    (void)cudaGetLastError();
    EXPECT(none == nullptr && nst == cudaDriverEntryPointSymbolNotFound, "a missing symbol was found");
    printf("entry points: %d resolved in the driver library\n", n_resolved);

    // ---- the expandable-segments allocator, through the resolved pointers
    auto pGranularity = resolve<decltype(&cuMemGetAllocationGranularity)>("cuMemGetAllocationGranularity", 12000);
    auto pReserve = resolve<decltype(&cuMemAddressReserve)>("cuMemAddressReserve", 12000);
    auto pCreate = resolve<decltype(&cuMemCreate)>("cuMemCreate", 12000);
    auto pMap = resolve<decltype(&cuMemMap)>("cuMemMap", 12000);
    auto pSetAccess = resolve<decltype(&cuMemSetAccess)>("cuMemSetAccess", 12000);
    auto pUnmap = resolve<decltype(&cuMemUnmap)>("cuMemUnmap", 12000);
    auto pRelease = resolve<decltype(&cuMemRelease)>("cuMemRelease", 12000);
    auto pFree = resolve<decltype(&cuMemAddressFree)>("cuMemAddressFree", 12000);
    auto pExport = resolve<decltype(&cuMemExportToShareableHandle)>("cuMemExportToShareableHandle", 12000);
    auto pProps = resolve<decltype(&cuMemGetAllocationPropertiesFromHandle)>(
        "cuMemGetAllocationPropertiesFromHandle", 12000);
    auto pMemsetD32Async = resolve<decltype(&cuMemsetD32Async)>("cuMemsetD32Async", 12000);
    auto pAttr = resolve<decltype(&cuDeviceGetAttribute)>("cuDeviceGetAttribute", 12000);
    auto pErrStr = resolve<decltype(&cuGetErrorString)>("cuGetErrorString", 12000);

    int rdma = -1;
    CHECK_CU(pAttr(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev));
    EXPECT(rdma == 0 || rdma == 1, "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED = %d", rdma);
    const char *text = nullptr;
    CHECK_CU(pErrStr(CUDA_ERROR_OUT_OF_MEMORY, &text));
    EXPECT(text && *text, "cuGetErrorString");

    CUmemAllocationProp ap;
    memset(&ap, 0, sizeof ap);
    ap.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    ap.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    ap.location.id = dev;
    size_t g = 0;
    CHECK_CU(pGranularity(&g, &ap, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    EXPECT(g >= 4096, "granularity %zu", g);
    // one segment of the allocator's size: 9/8 of the device memory
    size_t total = prop.totalGlobalMem;
    size_t segments = (total + total / 8 + g - 1) / g;
    CUdeviceptr va = 0;
    CHECK_CU(pReserve(&va, segments * g, 0, 0, 0));

    // fabric first, as torch tries it: may be refused
    CUmemGenericAllocationHandle h[2];
    ap.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
    if (pCreate(&h[0], g, &ap, 0) == CUDA_SUCCESS)
        CHECK_CU(pRelease(h[0]));
    ap.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = ap.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (int i = 0; i < 2; i++) {
        CHECK_CU(pCreate(&h[i], g, &ap, 0));
        CHECK_CU(pMap(va + i * g, g, 0, h[i], 0));
    }
    CHECK_CU(pSetAccess(va, 2 * g, &acc, 1));
    CUmemAllocationProp got;
    CHECK_CU(pProps(&got, h[1]));
    EXPECT(got.requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR && got.location.id == dev,
           "allocation properties");
    int fd = -1;
    if (pExport(&fd, h[0], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS)
        close(fd);

    cudaStream_t s;
    int least = 0, greatest = 0;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    EXPECT(greatest <= least, "priority range %d..%d", least, greatest);
    CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
    int prio = 1;
    unsigned flags = 0;
    CHECK(cudaStreamGetPriority(s, &prio));
    CHECK(cudaStreamGetFlags(s, &flags));
    EXPECT(prio == greatest && flags == cudaStreamNonBlocking, "stream priority %d flags %u", prio, flags);

    // words across the boundary of the two granules: word i = i, then read
    // every third word of the rows of a 3-column view
    const size_t words = 2 * g / 4;
    for (size_t i = 0; i < words; i += 4096)
        CHECK_CU(pMemsetD32Async(va + 4 * i, (unsigned)i, words - i < 4096 ? words - i : 4096, (CUstream)s));
    add_one<<<(unsigned)((words + 255) / 256), 256, 0, s>>>((unsigned *)va, words);
    CHECK(cudaGetLastError());
    const size_t rows = words / 4096;
    std::vector<unsigned> col(rows, 7);
    unsigned *pinned = nullptr;
    CHECK(cudaHostAlloc((void **)&pinned, rows * sizeof(unsigned), cudaHostAllocDefault));
    CHECK(cudaMemcpy2DAsync(pinned, sizeof(unsigned), (void *)(va + 4 * 4095), 4096 * 4, sizeof(unsigned), rows,
                            cudaMemcpyDeviceToHost, s));
    cudaEvent_t done;
    CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CHECK(cudaEventRecord(done, s));
    CHECK(cudaEventSynchronize(done));
    for (size_t r = 0; r < rows; r++)
        EXPECT(pinned[r] == r * 4096 + 1, "row %zu: %u", r, pinned[r]);
    printf("expandable segment: 2 granules mapped, every row read back strided\n");

    // ---- capture-status and stream queries (asked before nearly every copy)
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusActive;
    CHECK(cudaStreamIsCapturing(s, &cs));
    EXPECT(cs == cudaStreamCaptureStatusNone, "capture status %d", (int)cs);
    cs = cudaStreamCaptureStatusActive;
    CHECK(cudaStreamIsCapturing(0, &cs));
    EXPECT(cs == cudaStreamCaptureStatusNone, "legacy stream capture status %d", (int)cs);
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    EXPECT(mode == cudaStreamCaptureModeGlobal, "capture mode %d", (int)mode);
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    CHECK(cudaStreamQuery(s));
    CHECK(cudaEventQuery(done));

    cudaEvent_t t0, t1;
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));
    CHECK(cudaEventRecord(t0, s));
    CHECK(cudaMemsetAsync((void *)va, 0, 2 * g, s));
    CHECK(cudaEventRecord(t1, s));
    CHECK(cudaStreamWaitEvent(0, t1, 0));
    CHECK(cudaDeviceSynchronize());
    float ms = -1;
    CHECK(cudaEventElapsedTime(&ms, t0, t1));
    EXPECT(ms >= 0, "elapsed %f", ms);

    // ---- device, peer and memory queries
    for (int p = 0; p < ndev; p++) {
        int can = -1;
        CHECK(cudaDeviceCanAccessPeer(&can, dev, p));
        EXPECT(can == 0 || can == 1, "peer %d -> %d: %d", dev, p, can);
    }
    size_t free_b = 0, total_b = 0;
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    EXPECT(total_b == prop.totalGlobalMem && free_b <= total_b, "memory info %zu / %zu", free_b, total_b);
    cudaPointerAttributes pa;
    CHECK(cudaPointerGetAttributes(&pa, (void *)(va + g)));
    EXPECT(pa.type == cudaMemoryTypeDevice && pa.device == dev, "device pointer attributes (type %d)", (int)pa.type);
    CHECK(cudaPointerGetAttributes(&pa, pinned));
    EXPECT(pa.type == cudaMemoryTypeHost, "pinned pointer attributes (type %d)", (int)pa.type);
    int v = 0;
    CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    EXPECT(v == prop.multiProcessorCount, "multiprocessor count");

    // ---- tear down as the allocator does on empty_cache()
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < 2; i++) {
        CHECK_CU(pUnmap(va + i * g, g));
        CHECK_CU(pRelease(h[i]));
    }
    CHECK_CU(pFree(va, segments * g));
    CHECK(cudaFreeHost(pinned));
    CHECK(cudaEventDestroy(done));
    CHECK(cudaEventDestroy(t0));
    CHECK(cudaEventDestroy(t1));
    CHECK(cudaStreamDestroy(s));
    printf("PASS " NAME "\n");
    return 0;
}
