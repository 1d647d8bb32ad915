// memset2d: 2D and 3D memsets of pitched memory (issue 10), runtime and
// driver API: cudaMemset2D/2DAsync on cudaMallocPitch memory,
// cudaMemset3D/3DAsync on cudaMalloc3D memory (a box that covers whole
// slices, and one that does not), cuMemsetD2D8/16/32 and their Async forms
// on cuMemAllocPitch memory, and a graph memset node of several rows.
//
// Every check copies the whole allocation back, padding included, and
// compares each byte with a host model of what the memsets wrote: the bytes
// between a row's end and the next row (the pitch's padding) and the rows
// and slices outside the box must keep their earlier values.
//
// Each iteration k memsets a rectangle that depends on k with value k, and
// a kernel adds the bytes of the pitched buffer into a float accumulator:
// the accumulator and the volume carry state from iteration to iteration,
// and through the checkpoints of tests/test_corpus_checkpoint.py.
//
// Pacing (GPUPROXY_TEST_PACE=1): one stdin line before each iteration,
// "step <k> done" after it.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>

#define NAME "memset2d"
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
            const char *n_ = "?";                                               \
            cuGetErrorName(err_, &n_);                                          \
            printf("FAIL " NAME ": %s -> %s at %s:%d\n", #call, n_,             \
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

static const int W = 200, H = 24;                 // the 2D byte buffer (bytes x rows)
static const int VX = 40, VY = 6, VZ = 5;         // the volume (bytes x rows x slices)

// acc(x, y) += b(x, y) for x < w, y < h; rows of b are bpitch bytes apart,
// rows of acc apitch bytes
__global__ void accum(float *acc, size_t apitch, const unsigned char *b, size_t bpitch, int w, int h)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x < w && y < h) {
        float *row = (float *)((char *)acc + y * apitch);
        row[x] += (float)b[y * bpitch + x];
    }
}

// host model of a 2D memset: rows of w bytes, pitch bytes apart
static void model2d(std::vector<unsigned char> &m, size_t off, size_t pitch, unsigned char v, size_t w, size_t h)
{
    for (size_t y = 0; y < h; ++y)
        memset(&m[off + y * pitch], v, w);
}

static void compare(const std::vector<unsigned char> &got, const std::vector<unsigned char> &want, const char *what)
{
    for (size_t i = 0; i < want.size(); ++i)
        EXPECT(got[i] == want[i], "%s: byte %zu is %d, want %d", what, i, got[i], want[i]);
}

static void check_bytes(const void *dev, const std::vector<unsigned char> &want, const char *what)
{
    std::vector<unsigned char> got(want.size());
    CHECK(cudaMemcpy(got.data(), dev, want.size(), cudaMemcpyDeviceToHost));
    compare(got, want, what);
}

int main(int argc, char **argv)
{
    int iters = (argc > 1) ? atoi(argv[1]) : 5;
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    const int pacing = pace_env && strcmp(pace_env, "1") == 0;
    int waiting = pacing;

    // ---- runtime 2D: cudaMallocPitch, whole buffer to 0xEE, then a rectangle
    unsigned char *b = nullptr;
    size_t bp = 0;
    CHECK(cudaMallocPitch((void **)&b, &bp, W, H));
    EXPECT(bp >= (size_t)W, "pitch %zu < %d", bp, W);
    std::vector<unsigned char> mb(bp * H);
    CHECK(cudaMemset(b, 0xEE, bp * H));
    model2d(mb, 0, bp, 0xEE, bp, H);
    CHECK(cudaMemset2D(b + 3 * bp + 5, bp, 0x11, W - 9, H - 7));
    model2d(mb, 3 * bp + 5, bp, 0x11, W - 9, H - 7);
    check_bytes(b, mb, "cudaMemset2D");
    // on a stream, the whole row width
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    CHECK(cudaMemset2DAsync(b + bp, bp, 0x22, W, 2, st));
    model2d(mb, bp, bp, 0x22, W, 2);
    CHECK(cudaStreamSynchronize(st));
    check_bytes(b, mb, "cudaMemset2DAsync");
    // an empty memset changes nothing
    CHECK(cudaMemset2D(b, bp, 0x33, 0, H));
    check_bytes(b, mb, "empty cudaMemset2D");

    // ---- runtime 3D: cudaMalloc3D, whole volume to 0x5A
    cudaPitchedPtr vol;
    CHECK(cudaMalloc3D(&vol, make_cudaExtent(VX, VY, VZ)));
    EXPECT(vol.pitch >= (size_t)VX && vol.xsize == (size_t)VX && vol.ysize == (size_t)VY,
           "cudaMalloc3D: pitch %zu xsize %zu ysize %zu", vol.pitch, vol.xsize, vol.ysize);
    const size_t slice = vol.pitch * VY;
    std::vector<unsigned char> mv(slice * VZ);
    CHECK(cudaMemset3D(vol, 0x5A, make_cudaExtent(VX, VY, VZ)));
    for (int z = 0; z < VZ; ++z)
        model2d(mv, z * slice, vol.pitch, 0x5A, VX, VY);
    check_bytes(vol.ptr, mv, "cudaMemset3D (whole volume)");

    // ---- driver 2D: cuMemAllocPitch with 4-byte elements, D32, D16, D8
    CUdeviceptr dp;
    size_t dpitch = 0;
    const int DW = 33, DH = 9;   // elements of 4 bytes x rows
    CHECK_CU(cuMemAllocPitch(&dp, &dpitch, DW * 4, DH, 4));
    std::vector<unsigned char> md(dpitch * DH);
    CHECK_CU(cuMemsetD8(dp, 0, dpitch * DH));
    CHECK_CU(cuMemsetD2D32(dp + dpitch, dpitch, 0xA1B2C3D4u, DW - 1, DH - 2));
    for (int y = 1; y < DH - 1; ++y)
        for (int x = 0; x < DW - 1; ++x) {
            unsigned int v = 0xA1B2C3D4u;
            memcpy(&md[y * dpitch + x * 4], &v, 4);
        }
    CHECK_CU(cuMemsetD2D16(dp + 8, dpitch, 0x7E81, 5, DH));
    for (int y = 0; y < DH; ++y)
        for (int x = 0; x < 5; ++x) {
            unsigned short v = 0x7E81;
            memcpy(&md[y * dpitch + 8 + x * 2], &v, 2);
        }
    CUstream cs;
    CHECK_CU(cuStreamCreate(&cs, CU_STREAM_NON_BLOCKING));
    CHECK_CU(cuMemsetD2D8Async(dp + 2 * dpitch + 1, dpitch, 0x44, 7, 3, cs));
    model2d(md, 2 * dpitch + 1, dpitch, 0x44, 7, 3);
    CHECK_CU(cuMemsetD2D32Async(dp + 6 * dpitch + 16, dpitch, 0x01020304u, 2, 2, cs));
    for (int y = 6; y < 8; ++y)
        for (int x = 0; x < 2; ++x) {
            unsigned int v = 0x01020304u;
            memcpy(&md[y * dpitch + 16 + x * 4], &v, 4);
        }
    CHECK_CU(cuMemsetD2D16Async(dp + dpitch * (DH - 1), dpitch, 0xBEEF, DW * 2, 1, cs));
    for (int x = 0; x < DW * 2; ++x) {
        unsigned short v = 0xBEEF;
        memcpy(&md[(DH - 1) * dpitch + x * 2], &v, 2);
    }
    CHECK_CU(cuStreamSynchronize(cs));
    check_bytes((void *)dp, md, "cuMemsetD2D*");

    // ---- a graph memset node of several rows (CUDA_MEMSET_NODE_PARAMS.height > 1)
    {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CHECK(cudaGraphCreate(&g, 0));
        cudaMemsetParams mp;
        memset(&mp, 0, sizeof mp);
        mp.dst = b + 10 * bp + 20;
        mp.pitch = bp;
        mp.value = 0x66;
        mp.elementSize = 1;
        mp.width = 30;
        mp.height = 4;
        cudaGraphNode_t n;
        CHECK(cudaGraphAddMemsetNode(&n, g, nullptr, 0, &mp));
        CHECK(cudaGraphInstantiate(&ge, g, 0));
        CHECK(cudaGraphLaunch(ge, st));
        CHECK(cudaStreamSynchronize(st));
        model2d(mb, 10 * bp + 20, bp, 0x66, 30, 4);
        check_bytes(b, mb, "graph memset node");
        CHECK(cudaGraphExecDestroy(ge));
        CHECK(cudaGraphDestroy(g));
        // a 2D memset captured from a stream: nothing is set until the graph runs
        CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        CHECK(cudaMemset2DAsync(b + 15 * bp + 2, bp, 0x77, 9, 5, st));
        CHECK(cudaStreamEndCapture(st, &g));
        check_bytes(b, mb, "captured memset before launch");
        CHECK(cudaGraphInstantiate(&ge, g, 0));
        CHECK(cudaGraphLaunch(ge, st));
        CHECK(cudaStreamSynchronize(st));
        model2d(mb, 15 * bp + 2, bp, 0x77, 9, 5);
        check_bytes(b, mb, "captured memset");
        CHECK(cudaGraphExecDestroy(ge));
        CHECK(cudaGraphDestroy(g));
    }

    float *acc = nullptr;
    size_t ap = 0;
    CHECK(cudaMallocPitch((void **)&acc, &ap, W * sizeof(float), H));
    CHECK(cudaMemset2D(acc, ap, 0, W * sizeof(float), H));
    std::vector<float> macc(W * H, 0.0f), gacc(W * H);
    printf("memsets ready\n");

    for (int k = 1; k <= iters; ++k) {
        if (waiting) {
            char line[256];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        // a rectangle that moves with k, value k
        size_t x0 = k * 7, y0 = k % 4, w = W - 2 * k * 7, h = H - 5;
        CHECK(cudaMemset2DAsync(b + y0 * bp + x0, bp, k, w, h, st));
        model2d(mb, y0 * bp + x0, bp, (unsigned char)k, w, h);
        accum<<<dim3((W + 127) / 128, H), 128, 0, st>>>(acc, ap, b, bp, W, H);
        CHECK(cudaGetLastError());
        for (int y = 0; y < H; ++y)
            for (int x = 0; x < W; ++x)
                macc[y * W + x] += (float)mb[y * bp + x];
        // the volume: odd k a box of whole slices (one run of rows), even k a
        // box of rows 1 .. VY-2 of slices 1 .. VZ-1 (slice by slice)
        cudaPitchedPtr at = vol;
        cudaExtent e;
        if (k % 2) {
            at.ptr = (char *)vol.ptr + (k % VZ) * slice;
            e = make_cudaExtent(VX - k, VY, VZ - k % VZ);
            for (size_t z = 0; z < e.depth; ++z)
                model2d(mv, (k % VZ + z) * slice, vol.pitch, (unsigned char)(0x80 + k), e.width, VY);
        } else {
            at.ptr = (char *)vol.ptr + slice + vol.pitch + k;
            e = make_cudaExtent(VX - 2 * k, VY - 2, VZ - 1);
            for (size_t z = 0; z < e.depth; ++z)
                model2d(mv, (1 + z) * slice + vol.pitch + k, vol.pitch, (unsigned char)(0x80 + k), e.width, e.height);
        }
        CHECK(cudaMemset3DAsync(at, 0x80 + k, e, st));
        CHECK(cudaStreamSynchronize(st));
        CHECK(cudaMemcpy2D(gacc.data(), W * sizeof(float), acc, ap, W * sizeof(float), H, cudaMemcpyDeviceToHost));
        for (int i = 0; i < W * H; ++i)
            EXPECT(gacc[i] == macc[i], "iteration %d: acc(%d, %d) is %g, want %g", k, i % W, i / W, gacc[i], macc[i]);
        check_bytes(b, mb, "iteration buffer");
        check_bytes(vol.ptr, mv, "iteration volume");
        printf("iter %d ok\n", k);
        if (pacing)
            printf("step %d done\n", k);
        fflush(stdout);
    }

    double sum = 0;
    for (int i = 0; i < W * H; ++i)
        sum += macc[i];
    printf("sum %.1f\n", sum);
    CHECK(cudaFree(acc));
    CHECK(cudaFree(vol.ptr));
    CHECK(cudaFree(b));
    CHECK_CU(cuMemFree(dp));
    CHECK(cudaStreamDestroy(st));
    CHECK_CU(cuStreamDestroy(cs));
    printf("PASS " NAME "\n");
    return 0;
}
