// Kernels of driver_api.cu. Built by the harness with `nvcc -cubin -arch=...`
// and loaded at run time with cuModuleLoadData (the path is argv[1]).
// extern "C": the names are not mangled.

__device__ int dev_scale = 3;

// data[i] = data[i] * dev_scale + add
extern "C" __global__ void scale_add(int *data, int n, int add)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        data[i] = data[i] * dev_scale + add;
}

// parameter layout: data@0, n@8, c@12, big@16; 24 bytes
// data[i] += c + (int)(big % 1000)
extern "C" __global__ void mix(int *data, int n, char c, long long big)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        data[i] += c + (int)(big % 1000);
}

// data[i] = base + i * step, grid-stride
extern "C" __global__ void fill_seq(int *data, int n, int base, int step)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        data[i] = base + i * step;
}
