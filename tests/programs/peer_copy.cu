// peer_copy: one process using two GPUs (issue 22, part 1). Peer access
// (cudaDeviceCanAccessPeer, cudaDeviceEnablePeerAccess/Disable and their
// errors), peer copies (cudaMemcpyPeer, cudaMemcpyPeerAsync, cudaMemcpy with
// cudaMemcpyDefault across devices, cudaMemcpy3DPeer(Async), the driver's
// cuMemcpyPeer(Async) and cuMemcpy3DPeer), and a kernel on device 1 that
// reads device 0's memory through its pointer. The host recomputes every
// value; the program prints checksums and ends with PASS.
//
// argv[1]: iterations (default 12). Pacing (GPUPROXY_TEST_PACE=1): before
// each iteration one line is read from stdin (at EOF it runs freely); after
// iteration k both devices are synchronized and "step <k> done" is printed.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>

#define NAME "peer_copy"
#define CHECK(call)                                                             \
    do {                                                                        \
        cudaError_t err_ = (call);                                              \
        if (err_ != cudaSuccess) {                                              \
            printf("FAIL " NAME ": %s -> %s at %s:%d\n", #call,                 \
                   cudaGetErrorName(err_), __FILE__, __LINE__);                 \
            exit(1);                                                            \
        }                                                                       \
    } while (0)
#define CHECK_CU(call)                                                          \
    do {                                                                        \
        CUresult err_ = (call);                                                 \
        if (err_ != CUDA_SUCCESS) {                                             \
            printf("FAIL " NAME ": %s -> %d at %s:%d\n", #call, (int)err_,      \
                   __FILE__, __LINE__);                                         \
            exit(1);                                                            \
        }                                                                       \
    } while (0)
#define EXPECT_ERR(call, want)                                                  \
    do {                                                                        \
        cudaError_t err_ = (call);                                              \
        if (err_ != (want)) {                                                   \
            printf("FAIL " NAME ": %s -> %s, expected %s\n", #call,             \
                   cudaGetErrorName(err_), cudaGetErrorName(want));             \
            exit(1);                                                            \
        }                                                                       \
        (void)cudaGetLastError();                                               \
    } while (0)

static const int N = 4096;

__global__ void step0(unsigned *a, int n, int k)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] = a[i] * 1664525u + 1013904223u + (unsigned)i + (unsigned)k;
}

// runs on device 1; `peer` is device 0's memory, read through its pointer
__global__ void peer_mix(unsigned *out, const unsigned *local, const unsigned *peer, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = local[i] ^ (peer[i] >> 3);
}

__global__ void accum(unsigned *acc, const unsigned *b, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) acc[i] += b[i];
}

static unsigned long long checksum(const std::vector<unsigned> &v)
{
    unsigned long long s = 0;
    for (size_t i = 0; i < v.size(); i++) s = s * 31 + v[i];
    return s;
}

static void compare(const char *what, const std::vector<unsigned> &got, const std::vector<unsigned> &want)
{
    for (size_t i = 0; i < want.size(); i++)
        if (got[i] != want[i]) {
            printf("FAIL " NAME ": %s[%zu] = %u, expected %u\n", what, i, got[i], want[i]);
            exit(1);
        }
}

// The one-time API checks: peer access and its errors, 3D and driver copies.
static void api_checks(unsigned *a0, unsigned *c1)
{
    int can01 = -1, can10 = -1, can00 = -1;
    CHECK(cudaDeviceCanAccessPeer(&can01, 0, 1));
    CHECK(cudaDeviceCanAccessPeer(&can10, 1, 0));
    CHECK(cudaDeviceCanAccessPeer(&can00, 0, 0));
    printf("can access peer: 0->1 %d, 1->0 %d, 0->0 %d\n", can01, can10, can00);
    if (!can01 || !can10) {
        printf("FAIL " NAME ": the two devices cannot access each other\n");
        exit(1);
    }
    CHECK(cudaSetDevice(0));
    CHECK(cudaDeviceEnablePeerAccess(1, 0));
    EXPECT_ERR(cudaDeviceEnablePeerAccess(1, 0), cudaErrorPeerAccessAlreadyEnabled);
    EXPECT_ERR(cudaDeviceEnablePeerAccess(0, 0), cudaErrorPeerAccessUnsupported);   // driver 580's answer
    CHECK(cudaSetDevice(1));
    EXPECT_ERR(cudaDeviceDisablePeerAccess(0), cudaErrorPeerAccessNotEnabled);
    CHECK(cudaDeviceEnablePeerAccess(0, 0));
    printf("peer access enabled both ways\n");

    // a pitched 2D block from device 0 to device 1, synchronous and on a stream
    const int W = 100, H = 37;                       // W ints per row
    std::vector<unsigned> h(W * H), back(W * H);
    for (int i = 0; i < W * H; i++) h[i] = 7u * i + 3u;
    size_t sp, dp;
    void *src, *dst;
    CHECK(cudaSetDevice(0));
    CHECK(cudaMallocPitch(&src, &sp, W * sizeof(unsigned), H));
    CHECK(cudaMemcpy2D(src, sp, h.data(), W * sizeof(unsigned), W * sizeof(unsigned), H, cudaMemcpyHostToDevice));
    CHECK(cudaSetDevice(1));
    CHECK(cudaMallocPitch(&dst, &dp, W * sizeof(unsigned), H));
    CHECK(cudaMemset2D(dst, dp, 0, W * sizeof(unsigned), H));
    cudaMemcpy3DPeerParms p;
    memset(&p, 0, sizeof p);
    p.srcPtr = make_cudaPitchedPtr(src, sp, W * sizeof(unsigned), H);
    p.srcDevice = 0;
    p.dstPtr = make_cudaPitchedPtr(dst, dp, W * sizeof(unsigned), H);
    p.dstDevice = 1;
    p.extent = make_cudaExtent(W * sizeof(unsigned), H, 1);
    CHECK(cudaMemcpy3DPeer(&p));
    CHECK(cudaMemcpy2D(back.data(), W * sizeof(unsigned), dst, dp, W * sizeof(unsigned), H, cudaMemcpyDeviceToHost));
    compare("cudaMemcpy3DPeer", back, h);
    // the lower half of the rows again, on a stream of device 1, after zeroing
    CHECK(cudaMemset2D(dst, dp, 0, W * sizeof(unsigned), H));
    cudaStream_t s1;
    CHECK(cudaStreamCreate(&s1));
    p.srcPos = make_cudaPos(0, H / 2, 0);
    p.dstPos = make_cudaPos(0, H / 2, 0);
    p.extent = make_cudaExtent(W * sizeof(unsigned), H - H / 2, 1);
    CHECK(cudaMemcpy3DPeerAsync(&p, s1));
    CHECK(cudaStreamSynchronize(s1));
    CHECK(cudaMemcpy2D(back.data(), W * sizeof(unsigned), dst, dp, W * sizeof(unsigned), H, cudaMemcpyDeviceToHost));
    std::vector<unsigned> half(h);
    for (int i = 0; i < W * (H / 2); i++) half[i] = 0;
    compare("cudaMemcpy3DPeerAsync", back, half);
    CHECK(cudaStreamDestroy(s1));
    printf("3D peer copies ok\n");

    // the driver API: contexts name the sides
    CUcontext ctx0, ctx1;
    CHECK(cudaSetDevice(0));
    CHECK_CU(cuCtxGetCurrent(&ctx0));
    CHECK(cudaSetDevice(1));
    CHECK_CU(cuCtxGetCurrent(&ctx1));
    std::vector<unsigned> v(N), got(N);
    for (int i = 0; i < N; i++) v[i] = 0x9e3779b9u * (unsigned)i;
    CHECK(cudaMemcpy(a0, v.data(), N * sizeof(unsigned), cudaMemcpyHostToDevice));
    CHECK_CU(cuMemcpyPeer((CUdeviceptr)c1, ctx1, (CUdeviceptr)a0, ctx0, N * sizeof(unsigned)));
    CHECK(cudaMemcpy(got.data(), c1, N * sizeof(unsigned), cudaMemcpyDeviceToHost));
    compare("cuMemcpyPeer", got, v);
    CUstream ds;
    CHECK_CU(cuStreamCreate(&ds, CU_STREAM_NON_BLOCKING));
    CHECK(cudaMemset(c1, 0, N * sizeof(unsigned)));
    CHECK(cudaDeviceSynchronize());
    CHECK_CU(cuMemcpyPeerAsync((CUdeviceptr)c1 + 64, ctx1, (CUdeviceptr)a0 + 64, ctx0, 1024, ds));
    CHECK_CU(cuStreamSynchronize(ds));
    CHECK(cudaMemcpy(got.data(), c1, N * sizeof(unsigned), cudaMemcpyDeviceToHost));
    std::vector<unsigned> part(N, 0);
    for (int i = 16; i < 16 + 256; i++) part[i] = v[i];
    compare("cuMemcpyPeerAsync", got, part);
    CHECK_CU(cuStreamDestroy(ds));
    // cuMemcpy3DPeer: rows of the 2D block into c1, tightly packed
    CUDA_MEMCPY3D_PEER q;
    memset(&q, 0, sizeof q);
    q.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    q.srcDevice = (CUdeviceptr)src;
    q.srcPitch = sp;
    q.srcHeight = H;
    q.srcContext = ctx0;
    q.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    q.dstDevice = (CUdeviceptr)c1;
    q.dstPitch = W * sizeof(unsigned);
    q.dstHeight = H;
    q.dstContext = ctx1;
    q.WidthInBytes = W * sizeof(unsigned);
    q.Height = H;
    q.Depth = 1;
    CHECK_CU(cuMemcpy3DPeer(&q));
    CHECK(cudaMemcpy(got.data(), c1, W * H * sizeof(unsigned), cudaMemcpyDeviceToHost));
    got.resize(W * H);
    compare("cuMemcpy3DPeer", got, h);
    printf("driver peer copies ok\n");
    CHECK(cudaSetDevice(0));
    CHECK(cudaFree(src));
    CHECK(cudaSetDevice(1));
    CHECK(cudaFree(dst));
    CHECK(cudaMemset(c1, 0, N * sizeof(unsigned)));
    CHECK(cudaSetDevice(0));
    CHECK(cudaMemset(a0, 0, N * sizeof(unsigned)));
    CHECK(cudaDeviceSynchronize());
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 12;
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    const int pacing = pace_env && strcmp(pace_env, "1") == 0;
    int n = 0;
    CHECK(cudaGetDeviceCount(&n));
    if (n < 2) {
        printf("FAIL " NAME ": %d device(s), needs 2\n", n);
        return 1;
    }
    const size_t bytes = N * sizeof(unsigned);
    unsigned *a0, *acc0, *b0, *c1, *b1;
    CHECK(cudaSetDevice(0));
    CHECK(cudaMalloc(&a0, bytes));
    CHECK(cudaMalloc(&acc0, bytes));
    CHECK(cudaMalloc(&b0, bytes));
    CHECK(cudaSetDevice(1));
    CHECK(cudaMalloc(&c1, bytes));
    CHECK(cudaMalloc(&b1, bytes));
    cudaStream_t s1;
    CHECK(cudaStreamCreate(&s1));
    api_checks(a0, c1);
    cudaPointerAttributes pa;
    CHECK(cudaPointerGetAttributes(&pa, c1));
    printf("c1 lives on device %d\n", pa.device);
    CHECK(cudaSetDevice(0));
    CHECK(cudaMemset(acc0, 0, bytes));
    CHECK(cudaDeviceSynchronize());

    std::vector<unsigned> ha(N, 0), hacc(N, 0), hc(N, 0), hb(N), got(N);
    const int T = 256, B = (N + T - 1) / T;
    for (int k = 1; k <= iters; k++) {
        if (pacing) {
            char line[64];
            if (!fgets(line, sizeof line, stdin)) { /* EOF: run freely */ }
        }
        CHECK(cudaSetDevice(0));
        step0<<<B, T>>>(a0, N, k);
        CHECK(cudaGetLastError());
        CHECK(cudaSetDevice(1));
        if (k % 2)       // device 0's memory into device 1's, serialized with both devices
            CHECK(cudaMemcpyPeer(c1, 1, acc0, 0, bytes));
        else {           // on a stream of device 1: wait for device 0's work first
            CHECK(cudaSetDevice(0));
            CHECK(cudaDeviceSynchronize());
            CHECK(cudaSetDevice(1));
            CHECK(cudaMemcpyPeerAsync(c1, 1, acc0, 0, bytes, s1));
            CHECK(cudaStreamSynchronize(s1));
        }
        peer_mix<<<B, T>>>(b1, c1, a0, N);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaSetDevice(0));
        CHECK(cudaMemcpy(b0, b1, bytes, cudaMemcpyDefault));     // device 1 -> device 0 by address
        accum<<<B, T>>>(acc0, b0, N);
        CHECK(cudaGetLastError());

        for (int i = 0; i < N; i++) {
            ha[i] = ha[i] * 1664525u + 1013904223u + (unsigned)i + (unsigned)k;
            hc[i] = hacc[i];
            hb[i] = hc[i] ^ (ha[i] >> 3);
            hacc[i] += hb[i];
        }
        if (k % 4 == 0) {
            CHECK(cudaMemcpy(got.data(), acc0, bytes, cudaMemcpyDeviceToHost));
            compare("acc", got, hacc);
            printf("iter %d checksum %llu\n", k, checksum(got));
        }
        if (pacing) {
            CHECK(cudaDeviceSynchronize());
            CHECK(cudaSetDevice(1));
            CHECK(cudaDeviceSynchronize());
            printf("step %d done\n", k);
            fflush(stdout);
        }
    }
    CHECK(cudaSetDevice(0));
    CHECK(cudaMemcpy(got.data(), a0, bytes, cudaMemcpyDeviceToHost));
    compare("a0", got, ha);
    CHECK(cudaMemcpy(got.data(), acc0, bytes, cudaMemcpyDeviceToHost));
    compare("acc0", got, hacc);
    CHECK(cudaSetDevice(1));
    CHECK(cudaMemcpy(got.data(), c1, bytes, cudaMemcpyDeviceToHost));
    compare("c1", got, hc);
    CHECK(cudaDeviceDisablePeerAccess(0));
    EXPECT_ERR(cudaDeviceDisablePeerAccess(0), cudaErrorPeerAccessNotEnabled);
    CHECK(cudaSetDevice(0));
    CHECK(cudaDeviceDisablePeerAccess(1));
    printf("final checksum %llu\n", checksum(got));
    printf("PASS " NAME "\n");
    return 0;
}
