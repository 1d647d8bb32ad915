/* devprops: cudaGetDeviceProperties read in the layout of the CUDA runtime
 * this program is compiled for (built by tests/oldcuda_kit.py against the
 * CUDA 12.4 or 11.8 headers of NVIDIA's wheels and linked against that
 * wheel's libcudart). Prints one "name value" line per field; the test
 * compares them with the emulated device's description. */
#include <stdio.h>
#include <cuda_runtime_api.h>

int main(void)
{
    int rt = 0, drv = 0, n = 0;
    cudaError_t e = cudaRuntimeGetVersion(&rt);
    if (e == cudaSuccess)
        e = cudaDriverGetVersion(&drv);
    if (e == cudaSuccess)
        e = cudaGetDeviceCount(&n);
    struct cudaDeviceProp p;
    if (e == cudaSuccess)
        e = cudaGetDeviceProperties(&p, 0);
    if (e != cudaSuccess) {
        fprintf(stderr, "devprops: %s (%s)\n", cudaGetErrorName(e), cudaGetErrorString(e));
        return 1;
    }
    printf("runtime %d\n", rt);
    printf("devices %d\n", n);
    printf("name %s\n", p.name);
    printf("totalGlobalMem %zu\n", p.totalGlobalMem);
    printf("sharedMemPerBlock %zu\n", p.sharedMemPerBlock);
    printf("regsPerBlock %d\n", p.regsPerBlock);
    printf("warpSize %d\n", p.warpSize);
    printf("maxThreadsPerBlock %d\n", p.maxThreadsPerBlock);
    printf("maxThreadsDim %d %d %d\n", p.maxThreadsDim[0], p.maxThreadsDim[1], p.maxThreadsDim[2]);
    printf("maxGridSize %d %d %d\n", p.maxGridSize[0], p.maxGridSize[1], p.maxGridSize[2]);
    printf("clockRate %d\n", p.clockRate);
    printf("totalConstMem %zu\n", p.totalConstMem);
    printf("major %d\n", p.major);
    printf("minor %d\n", p.minor);
    printf("multiProcessorCount %d\n", p.multiProcessorCount);
    printf("asyncEngineCount %d\n", p.asyncEngineCount);
    printf("memoryClockRate %d\n", p.memoryClockRate);
    printf("memoryBusWidth %d\n", p.memoryBusWidth);
    printf("l2CacheSize %d\n", p.l2CacheSize);
    printf("maxThreadsPerMultiProcessor %d\n", p.maxThreadsPerMultiProcessor);
    printf("sharedMemPerMultiprocessor %zu\n", p.sharedMemPerMultiprocessor);
    printf("regsPerMultiprocessor %d\n", p.regsPerMultiprocessor);
    printf("managedMemory %d\n", p.managedMemory);
    printf("concurrentKernels %d\n", p.concurrentKernels);
    printf("sharedMemPerBlockOptin %zu\n", p.sharedMemPerBlockOptin);
    printf("maxBlocksPerMultiProcessor %d\n", p.maxBlocksPerMultiProcessor);
    printf("persistingL2CacheMaxSize %d\n", p.persistingL2CacheMaxSize);
    return 0;
}
