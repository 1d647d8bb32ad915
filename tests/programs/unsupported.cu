// unsupported: calls functions that the proxy does not support and checks that
// the process stays healthy afterwards.
//   cudaDeviceFlushGPUDirectRDMAWrites    -> proxy: 801 cudaErrorNotSupported
//   cuDeviceGetByPCIBusId (driver,       -> proxy: 801 CUDA_ERROR_NOT_SUPPORTED
//   obtained through cudaGetDriverEntryPointByVersion)
// Natively both calls succeed (0); the program then frees what they created and
// still passes, but its output differs from the expected (proxy) output, so the
// corpus marks this program proxy_only. Any other error code is a failure.
#include <cstdio>
#include <cstdlib>
#include <cuda.h>
#include <cuda_runtime.h>

#define NAME "unsupported"
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

typedef CUresult (*PFN_deviceGetByPCIBusId)(CUdevice *dev, const char *pciBusId);
typedef CUresult (*PFN_getErrorName)(CUresult error, const char **pStr);

// x[i] = x[i] * x[i] + 1
__global__ void square_plus_one(int *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = x[i] * x[i] + 1;
}

static void *entry_point(const char *symbol)
{
    void *fn = NULL;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
    CHECK(cudaGetDriverEntryPointByVersion(symbol, &fn, CUDART_VERSION, cudaEnableDefault, &status));
    if (status != cudaDriverEntryPointSuccess || fn == NULL) {
        printf("FAIL " NAME ": driver entry point %s not found (status %d)\n", symbol, (int)status);
        exit(1);
    }
    return fn;
}

int main(void)
{
    CHECK(cudaFree(0));    // create the context

    // ---- runtime: GPUDirect RDMA write flushing (graphs and graph memory are supported)
    cudaError_t e = cudaDeviceFlushGPUDirectRDMAWrites(cudaFlushGPUDirectRDMAWritesTargetCurrentDevice,
                                                       cudaFlushGPUDirectRDMAWritesToOwner);
    printf("cudaDeviceFlushGPUDirectRDMAWrites -> %d %s\n", (int)e, cudaGetErrorName(e));
    if (e != cudaSuccess && e != cudaErrorNotSupported) {
        printf("FAIL " NAME ": cudaDeviceFlushGPUDirectRDMAWrites returned an unexpected error\n");
        return 1;
    }
    (void)cudaGetLastError();   // clear the (non-sticky) error

    // ---- driver: a device by its PCI bus id, through a driver entry point
    PFN_deviceGetByPCIBusId deviceGetByPCIBusId = (PFN_deviceGetByPCIBusId)entry_point("cuDeviceGetByPCIBusId");
    PFN_getErrorName getErrorName = (PFN_getErrorName)entry_point("cuGetErrorName");
    char bus[64] = "";
    CHECK(cudaDeviceGetPCIBusId(bus, (int)sizeof bus, 0));
    CUdevice dev = -1;
    CUresult r = deviceGetByPCIBusId(&dev, bus);
    const char *rname = NULL;
    if (getErrorName(r, &rname) != CUDA_SUCCESS || rname == NULL) rname = "?";
    printf("cuDeviceGetByPCIBusId -> %d %s\n", (int)r, rname);
    if (r == CUDA_SUCCESS) {
        if (dev != 0) {
            printf("FAIL " NAME ": cuDeviceGetByPCIBusId found device %d, want 0\n", (int)dev);
            return 1;
        }
    } else if (r != CUDA_ERROR_NOT_SUPPORTED) {
        printf("FAIL " NAME ": cuDeviceGetByPCIBusId returned an unexpected error\n");
        return 1;
    }

    // ---- the process still works: a normal kernel
    const int n = 1000;
    int h[n];
    for (int i = 0; i < n; ++i) h[i] = i - 500;
    int *d;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    CHECK(cudaMemcpy(d, h, n * sizeof(int), cudaMemcpyHostToDevice));
    square_plus_one<<<(n + 127) / 128, 128>>>(d, n);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(h, d, n * sizeof(int), cudaMemcpyDeviceToHost));
    long long sum = 0;
    for (int i = 0; i < n; ++i) {
        int want = (i - 500) * (i - 500) + 1;
        if (h[i] != want) {
            printf("FAIL " NAME ": element %d: got %d want %d\n", i, h[i], want);
            return 1;
        }
        sum += h[i];
    }
    printf("kernel after unsupported calls: checksum %lld\n", sum);
    CHECK(cudaFree(d));
    printf("PASS " NAME "\n");
    return 0;
}
