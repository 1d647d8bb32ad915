// nccl_initall: NCCL's single-process form (issue 22): ncclCommInitAll over
// two devices, then one group with an all-reduce per device (each on its
// device's stream) and a broadcast from device 1; the values are computed
// here. Prints "PASS nccl_initall".
#include <cstdio>
#include <vector>
#include <cuda_runtime.h>
#include "nccl_decls.h"

#define NK(x) do { ncclResult_t r_ = (x); if (r_ != ncclSuccess) { printf("FAIL %s -> %d\n", #x, (int)r_); \
    return 1; } } while (0)

int main()
{
    const int ND = 2, N = 4096;
    int n = 0;
    cudaGetDeviceCount(&n);
    if (n < ND) { printf("FAIL %d devices, needs %d\n", n, ND); return 1; }
    ncclComm_t comms[ND];
    NK(ncclCommInitAll(comms, ND, NULL));
    float *buf[ND], *bc[ND];
    cudaStream_t st[ND];
    for (int d = 0; d < ND; d++) {
        int dev = -1, rank = -1;
        NK(ncclCommCuDevice(comms[d], &dev));
        NK(ncclCommUserRank(comms[d], &rank));
        if (dev != d || rank != d) { printf("FAIL comm %d: device %d rank %d\n", d, dev, rank); return 1; }
        cudaSetDevice(d);
        cudaStreamCreate(&st[d]);
        std::vector<float> h(N);
        for (int i = 0; i < N; i++) h[i] = 0.5f * i + d;
        cudaMalloc(&buf[d], N * sizeof(float));
        cudaMalloc(&bc[d], 8 * sizeof(float));
        cudaMemcpy(buf[d], h.data(), N * sizeof(float), cudaMemcpyHostToDevice);
        float v[8];
        for (int i = 0; i < 8; i++) v[i] = d == 1 ? 3.0f * i : -1.0f;
        cudaMemcpy(bc[d], v, sizeof v, cudaMemcpyHostToDevice);
    }
    NK(ncclGroupStart());
    for (int d = 0; d < ND; d++) {
        NK(ncclAllReduce(buf[d], buf[d], N, ncclFloat32, ncclSum, comms[d], st[d]));
        NK(ncclBroadcast(bc[d], bc[d], 8, ncclFloat32, 1, comms[d], st[d]));
    }
    NK(ncclGroupEnd());
    for (int d = 0; d < ND; d++) {
        cudaSetDevice(d);
        cudaStreamSynchronize(st[d]);
        std::vector<float> h(N);
        float v[8];
        cudaMemcpy(h.data(), buf[d], N * sizeof(float), cudaMemcpyDeviceToHost);
        cudaMemcpy(v, bc[d], sizeof v, cudaMemcpyDeviceToHost);
        for (int i = 0; i < N; i++)
            if (h[i] != 1.0f * i + 1.0f) { printf("FAIL device %d [%d] = %g\n", d, i, h[i]); return 1; }
        for (int i = 0; i < 8; i++)
            if (v[i] != 3.0f * i) { printf("FAIL broadcast device %d [%d] = %g\n", d, i, v[i]); return 1; }
    }
    for (int d = 0; d < ND; d++) NK(ncclCommDestroy(comms[d]));
    printf("PASS nccl_initall\n");
    return 0;
}
