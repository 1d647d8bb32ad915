// The messages proxyd's C serving loop answers (proxyd/native/gpxd.c), in a
// real program: launches, event records and queries, stream and event
// synchronisation, small synchronous copies both ways, memsets, device
// attributes, device printf; and, with the argument "fault", a kernel that
// faults, reported by the next synchronisation. tests/test_gpu_native_serve.py
// runs it natively and under the proxy with the loop on and off: the output
// must be the same.
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>

__global__ void add(int *p, int v) { p[threadIdx.x] += v + (int)threadIdx.x; }
__global__ void say(int i) { if (threadIdx.x == 0) printf("kernel says %d\n", i); }
__global__ void fault(int *p) { p[threadIdx.x] = 1; }

static unsigned fnv(const void *p, size_t n)
{
    unsigned h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * 16777619u;
    return h;
}

int main(int argc, char **argv)
{
    int *d;
    cudaMalloc(&d, 1024 * sizeof(int));
    cudaMemset(d, 0, 1024 * sizeof(int));
    cudaStream_t s;
    cudaStreamCreate(&s);
    cudaEvent_t e;
    cudaEventCreate(&e);
    if (argc > 1 && strcmp(argv[1], "fault") == 0) {
        fault<<<1, 32, 0, s>>>((int *)16);
        cudaError_t r = cudaStreamSynchronize(s);
        printf("after the fault: %s\n", cudaGetErrorName(r));
        return 0;
    }
    int attr = 0;
    cudaDeviceGetAttribute(&attr, cudaDevAttrMaxThreadsPerBlock, 0);
    printf("max threads per block %d\n", attr);
    long sum = 0;
    int queries = 0;
    for (int i = 0; i < 3000; i++) {
        add<<<1, 256, 0, s>>>(d, i);
        cudaEventRecord(e, s);
        if (i % 3 == 0)
            while (cudaEventQuery(e) == cudaErrorNotReady)
                queries++;
        if (i % 5 == 0)
            cudaStreamSynchronize(s);
        if (i % 7 == 0)
            cudaEventSynchronize(e);
        int h[4];
        cudaMemcpy(h, d + (i % 200), sizeof h, cudaMemcpyDeviceToHost);
        sum += h[0] + h[3];
        if (i % 11 == 0) {
            int v[2] = { i, -i };
            cudaMemcpy(d + 512 + (i % 100), v, sizeof v, cudaMemcpyHostToDevice);
        }
        if (i % 13 == 0)
            cudaMemsetAsync(d + 800, i & 0xff, 64, s);
        if (i % 17 == 0)
            cudaMemset(d + 900, 0x5a, 40);
        while (cudaStreamQuery(s) == cudaErrorNotReady)
            queries++;
        if (i % 1000 == 0) {
            say<<<1, 32>>>(i);
            cudaDeviceSynchronize();
            printf("host after kernel %d\n", i);
        }
    }
    int all[1024];
    cudaMemcpy(all, d, sizeof all, cudaMemcpyDeviceToHost);
    printf("sum %ld checksum %08x\n", sum, fnv(all, sizeof all));
    printf("last error %s\n", cudaGetErrorName(cudaGetLastError()));
    (void)queries;
    return 0;
}
