// devnum: device numbers after a restore onto other devices (issue 22).
// Device 0 is used, then the program pauses ("ready", then one stdin line:
// the test checkpoints it and restores it with a device map meanwhile).
// Afterwards device 1 is used for the first time, and every answer must be
// in the program's own numbering: cudaGetDevice, the two devices'
// contexts distinct, pointer attributes' device, cudaMemcpyPeer between
// them, cudaDeviceCanAccessPeer, cuDeviceGet/cuCtxGetDevice, and the data
// written before the pause.
#include <cstdio>
#include <cstring>
#include <cuda.h>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("FAIL %s -> %s\n", #x, \
    cudaGetErrorName(e_)); return 1; } } while (0)
#define DK(x) do { CUresult e_ = (x); if (e_ != CUDA_SUCCESS) { printf("FAIL %s -> %d\n", #x, (int)e_); \
    return 1; } } while (0)

int main(int argc, char **argv)
{
    const int N = 1 << 16;
    static unsigned h[N], g[N];
    for (int i = 0; i < N; i++) h[i] = 2654435761u * (unsigned)i;
    CK(cudaSetDevice(0));
    unsigned *a;
    CK(cudaMalloc(&a, sizeof h));
    CK(cudaMemcpy(a, h, sizeof h, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
    if (argc > 1 && strcmp(argv[1], "wait") == 0) {
        printf("ready\n");
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof line, stdin)) { /* EOF: go on */ }
    }
    CUcontext c0, c1;
    DK(cuCtxGetCurrent(&c0));
    CK(cudaSetDevice(1));            // first use of device 1
    int cur = -1;
    CK(cudaGetDevice(&cur));
    DK(cuCtxGetCurrent(&c1));
    CUdevice dev = -1, cd = -1;
    DK(cuDeviceGet(&dev, 1));
    DK(cuCtxGetDevice(&cd));
    printf("current device %d, ctx device %d, contexts %s\n", cur, (int)cd, c0 != c1 ? "distinct" : "SHARED");
    unsigned *b;
    CK(cudaMalloc(&b, sizeof h));
    cudaPointerAttributes pa, pb;
    CK(cudaPointerGetAttributes(&pa, a));
    CK(cudaPointerGetAttributes(&pb, b));
    printf("pointer devices %d %d\n", pa.device, pb.device);
    int can = -1;
    CK(cudaDeviceCanAccessPeer(&can, 1, 0));
    printf("device 1 reaches device 0: %d\n", can);
    CK(cudaMemcpyPeer(b, 1, a, 0, sizeof h));
    CK(cudaMemcpy(g, b, sizeof g, cudaMemcpyDeviceToHost));
    printf("peer copy of the data from before: %s\n", memcmp(g, h, sizeof h) == 0 ? "equal" : "DIFFERENT");
    // a context made explicitly for device 1 after the restore
    CUcontext mine;
    DK(cuCtxCreate(&mine, NULL, 0, dev));     // cuda.h 13: cuCtxCreate_v4 (no create params)
    CUdevice md = -1;
    DK(cuCtxGetDevice(&md));
    unsigned *m;
    CK(cudaMalloc(&m, 4096));
    CK(cudaPointerGetAttributes(&pb, m));
    printf("created context: device %d, memory on device %d\n", (int)md, pb.device);
    DK(cuCtxDestroy(mine));
    if (argc > 1 && strcmp(argv[1], "wait") == 0) {
        printf("ready again\n");       // a second pause: the test looks where things are now
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof line, stdin)) { /* EOF: go on */ }
    }
    printf("PASS devnum\n");
    return 0;
}
