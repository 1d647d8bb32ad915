// Kernels of launch_variants.cu that it loads from a cubin file with
// cuModuleLoad(path) (compiled with nvcc -cubin; the path is argv[1]).
// extern "C": the names are not mangled.

// data[i] = base + i * step, grid-stride
extern "C" __global__ void fill_pattern(int *data, int n, int base, int step)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        data[i] = base + i * step;
}
