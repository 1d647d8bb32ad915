// textures: CUDA arrays, texture objects and surface objects (issue 10,
// group 5), runtime and driver API.
//
// Runtime part: a 2D float array `src` filled by cudaMemcpy2DToArray from a
// pitched host buffer; a texture object on it (point sampling, clamp
// addressing, unnormalised coordinates); a surface object on a second array
// `dst`. Each iteration a kernel reads src through the texture (with
// neighbours that fall off the edges: clamping) and writes dst through the
// surface (surf2Dwrite); dst is copied back (cudaMemcpy2DFromArray) and
// compared with the same computation on the CPU, then copied into src
// (cudaMemcpy2DArrayToArray) so that the next iteration starts from it: the
// arrays' contents carry state from one iteration to the next, and through
// the checkpoints of tests/test_corpus_checkpoint.py.
//
// Driver part: a 3D array (cuArray3DCreate) filled by cuMemcpy3D, a texture
// object on it (cuTexObjectCreate), read by a kernel every iteration with
// tex3D.
//
// The texture and surface objects are created once, before the loop, and
// their values are kept in host memory and passed to every launch: after a
// restore they must still name the same objects.
//
// All values are small integers times powers of two, so the float results
// are exact on the GPU, on the CPU and on the emulated GPU.
//
// Pacing (GPUPROXY_TEST_PACE=1): one stdin line before each iteration,
// "step <k> done" after it.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>

// cudaMemcpyToArray/FromArray are deprecated but exported, and programs use them
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#define NAME "textures"
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

static const int W = 64, H = 48;            // the 2D arrays
static const int X3 = 8, Y3 = 4, Z3 = 3;    // the 3D array

// dst(x, y) = src(x, y) + src(x + 1, y) / 2 + src(x, y - 1) / 4 + k, where a
// neighbour outside the array reads the nearest edge texel (clamp)
__global__ void step(cudaTextureObject_t tex, cudaSurfaceObject_t surf, int w, int h, float k)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= w || y >= h)
        return;
    float c = tex2D<float>(tex, x + 0.5f, y + 0.5f);
    float r = tex2D<float>(tex, x + 1.5f, y + 0.5f);
    float u = tex2D<float>(tex, x + 0.5f, y - 0.5f);
    surf2Dwrite(c + 0.5f * r + 0.25f * u + k, surf, x * (int)sizeof(float), y);
}

// out[i] = 2 * texel (x, y, z) of the 3D array, i = (z * ny + y) * nx + x
__global__ void read3d(CUtexObject tex, float *out, int nx, int ny, int nz)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nx * ny * nz)
        return;
    int x = i % nx, y = (i / nx) % ny, z = i / (nx * ny);
    out[i] = 2.0f * tex3D<float>(tex, x + 0.5f, y + 0.5f, z + 0.5f);
}

static float at(const std::vector<float> &a, int x, int y)
{
    x = x < 0 ? 0 : (x >= W ? W - 1 : x);
    y = y < 0 ? 0 : (y >= H ? H - 1 : y);
    return a[y * W + x];
}

int main(int argc, char **argv)
{
    int iters = (argc > 1) ? atoi(argv[1]) : 5;
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    const int pacing = pace_env && strcmp(pace_env, "1") == 0;
    int waiting = pacing;

    // ---- runtime: arrays, texture and surface objects
    cudaChannelFormatDesc fd = cudaCreateChannelDesc(32, 0, 0, 0, cudaChannelFormatKindFloat);
    EXPECT(fd.x == 32 && fd.y == 0 && fd.f == cudaChannelFormatKindFloat, "channel desc");
    cudaChannelFormatDesc fd2 = cudaCreateChannelDesc<float>();
    EXPECT(fd2.x == 32 && fd2.f == cudaChannelFormatKindFloat, "channel desc template");
    cudaArray_t src, dst;
    CHECK(cudaMallocArray(&src, &fd, W, H));
    CHECK(cudaMallocArray(&dst, &fd, W, H, cudaArraySurfaceLoadStore));
    cudaChannelFormatDesc got;
    cudaExtent ext;
    unsigned int flags = 99;
    CHECK(cudaArrayGetInfo(&got, &ext, &flags, dst));
    EXPECT(got.x == 32 && got.f == cudaChannelFormatKindFloat && ext.width == (size_t)W &&
           ext.height == (size_t)H && ext.depth == 0 && (flags & cudaArraySurfaceLoadStore),
           "cudaArrayGetInfo: %d %zu x %zu x %zu flags %u", got.x, ext.width, ext.height, ext.depth, flags);

    // host image with a pitch wider than a row
    const int hp = W + 3;
    std::vector<float> host(hp * H, -1.0f), want(W * H), cur(W * H);
    for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x) {
            host[y * hp + x] = (float)((x * 3 + y * 7) % 17);
            want[y * W + x] = host[y * hp + x];
        }
    CHECK(cudaMemcpy2DToArray(src, 0, 0, host.data(), hp * sizeof(float), W * sizeof(float), H,
                              cudaMemcpyHostToDevice));

    cudaResourceDesc rd;
    memset(&rd, 0, sizeof rd);
    rd.resType = cudaResourceTypeArray;
    rd.res.array.array = src;
    cudaTextureDesc td;
    memset(&td, 0, sizeof td);
    td.addressMode[0] = td.addressMode[1] = cudaAddressModeClamp;
    td.filterMode = cudaFilterModePoint;
    td.readMode = cudaReadModeElementType;
    td.normalizedCoords = 0;
    cudaTextureObject_t tex;
    CHECK(cudaCreateTextureObject(&tex, &rd, &td, nullptr));
    cudaResourceDesc back;
    CHECK(cudaGetTextureObjectResourceDesc(&back, tex));
    EXPECT(back.resType == cudaResourceTypeArray && back.res.array.array == src, "texture resource desc");

    cudaTextureDesc tback;
    CHECK(cudaGetTextureObjectTextureDesc(&tback, tex));
    EXPECT(tback.addressMode[0] == cudaAddressModeClamp && tback.filterMode == cudaFilterModePoint &&
           !tback.normalizedCoords, "texture desc");

    // the deprecated copies (cudaMemcpyToArray/FromArray) into a 5x3 array:
    // 3 floats at element 2 of row 0 (the rest of the row), then 7 floats
    // from the start of row 1, which continue on row 2; the whole array
    // comes back in one copy of 15 floats
    {
        cudaArray_t lin;
        CHECK(cudaMallocArray(&lin, &fd, 5, 3));
        std::vector<float> zeros(15, 0.0f), ten(10), all(15, -1.0f);
        for (int i = 0; i < 10; ++i)
            ten[i] = (float)(i + 1);
        CHECK(cudaMemcpy2DToArray(lin, 0, 0, zeros.data(), 5 * sizeof(float), 5 * sizeof(float), 3,
                                  cudaMemcpyHostToDevice));
        CHECK(cudaMemcpyToArray(lin, 2 * sizeof(float), 0, ten.data(), 3 * sizeof(float), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpyToArray(lin, 0, 1, ten.data() + 3, 7 * sizeof(float), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpyFromArray(all.data(), lin, 0, 0, 15 * sizeof(float), cudaMemcpyDeviceToHost));
        for (int i = 0; i < 15; ++i)
            EXPECT(all[i] == (i >= 2 && i < 12 ? (float)(i - 1) : 0.0f), "row-wrapping copy: element %d is %g", i,
                   all[i]);
        // the same through an asynchronous 2D copy on a stream
        cudaStream_t st;
        CHECK(cudaStreamCreate(&st));
        std::vector<float> again(15, -1.0f);
        CHECK(cudaMemcpy2DFromArrayAsync(again.data(), 5 * sizeof(float), lin, 0, 0, 5 * sizeof(float), 3,
                                         cudaMemcpyDeviceToHost, st));
        CHECK(cudaStreamSynchronize(st));
        EXPECT(again == all, "asynchronous copy from the array differs");
        CHECK(cudaStreamDestroy(st));
        CHECK(cudaFreeArray(lin));
    }

    cudaResourceDesc sd;
    memset(&sd, 0, sizeof sd);
    sd.resType = cudaResourceTypeArray;
    sd.res.array.array = dst;
    cudaSurfaceObject_t surf;
    CHECK(cudaCreateSurfaceObject(&surf, &sd));

    // ---- driver: a 3D array and a texture object on it
    CUDA_ARRAY3D_DESCRIPTOR ad;
    memset(&ad, 0, sizeof ad);
    ad.Width = X3;
    ad.Height = Y3;
    ad.Depth = Z3;
    ad.Format = CU_AD_FORMAT_FLOAT;
    ad.NumChannels = 1;
    CUarray a3;
    CHECK_CU(cuArray3DCreate(&a3, &ad));
    CUDA_ARRAY3D_DESCRIPTOR ad2;
    CHECK_CU(cuArray3DGetDescriptor(&ad2, a3));
    EXPECT(ad2.Width == X3 && ad2.Height == Y3 && ad2.Depth == Z3 && ad2.Format == CU_AD_FORMAT_FLOAT &&
           ad2.NumChannels == 1, "cuArray3DGetDescriptor");
    std::vector<float> vol(X3 * Y3 * Z3), vol_back(X3 * Y3 * Z3, -1.0f);
    for (int i = 0; i < X3 * Y3 * Z3; ++i)
        vol[i] = (float)(i * 5 % 23);
    CUDA_MEMCPY3D c3;
    memset(&c3, 0, sizeof c3);
    c3.srcMemoryType = CU_MEMORYTYPE_HOST;
    c3.srcHost = vol.data();
    c3.srcPitch = X3 * sizeof(float);
    c3.srcHeight = Y3;
    c3.dstMemoryType = CU_MEMORYTYPE_ARRAY;
    c3.dstArray = a3;
    c3.WidthInBytes = X3 * sizeof(float);
    c3.Height = Y3;
    c3.Depth = Z3;
    CHECK_CU(cuMemcpy3D(&c3));
    CUDA_RESOURCE_DESC cr;
    memset(&cr, 0, sizeof cr);
    cr.resType = CU_RESOURCE_TYPE_ARRAY;
    cr.res.array.hArray = a3;
    CUDA_TEXTURE_DESC ct;
    memset(&ct, 0, sizeof ct);
    ct.addressMode[0] = ct.addressMode[1] = ct.addressMode[2] = CU_TR_ADDRESS_MODE_CLAMP;
    ct.filterMode = CU_TR_FILTER_MODE_POINT;
    CUtexObject t3;
    CHECK_CU(cuTexObjectCreate(&t3, &cr, &ct, nullptr));
    float *out3;
    CHECK(cudaMalloc(&out3, X3 * Y3 * Z3 * sizeof(float)));
    printf("arrays ready\n");

    const dim3 T(16, 8), B((W + T.x - 1) / T.x, (H + T.y - 1) / T.y);
    std::vector<float> res3(X3 * Y3 * Z3);
    for (int k = 1; k <= iters; ++k) {
        if (waiting) {
            char line[256];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        step<<<B, T>>>(tex, surf, W, H, (float)k);
        read3d<<<1, X3 * Y3 * Z3>>>(t3, out3, X3, Y3, Z3);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaMemcpy2DFromArray(cur.data(), W * sizeof(float), dst, 0, 0, W * sizeof(float), H,
                                    cudaMemcpyDeviceToHost));
        std::vector<float> next(W * H);
        for (int y = 0; y < H; ++y)
            for (int x = 0; x < W; ++x)
                next[y * W + x] = at(want, x, y) + 0.5f * at(want, x + 1, y) + 0.25f * at(want, x, y - 1) + k;
        for (int i = 0; i < W * H; ++i)
            EXPECT(cur[i] == next[i], "iteration %d: texel (%d, %d) is %g, want %g", k, i % W, i / W, cur[i],
                   next[i]);
        want = next;
        // the result becomes the next iteration's input
        CHECK(cudaMemcpy2DArrayToArray(src, 0, 0, dst, 0, 0, W * sizeof(float), H, cudaMemcpyDeviceToDevice));
        CHECK(cudaMemcpy(res3.data(), out3, res3.size() * sizeof(float), cudaMemcpyDeviceToHost));
        for (int i = 0; i < X3 * Y3 * Z3; ++i)
            EXPECT(res3[i] == 2.0f * vol[i], "iteration %d: 3D texel %d is %g, want %g", k, i, res3[i], 2.0f * vol[i]);
        printf("iter %d ok\n", k);
        if (pacing)
            printf("step %d done\n", k);
        fflush(stdout);
    }

    // the 3D array back to the host (array -> host through cuMemcpy3D)
    CUDA_MEMCPY3D b3;
    memset(&b3, 0, sizeof b3);
    b3.srcMemoryType = CU_MEMORYTYPE_ARRAY;
    b3.srcArray = a3;
    b3.dstMemoryType = CU_MEMORYTYPE_HOST;
    b3.dstHost = vol_back.data();
    b3.dstPitch = X3 * sizeof(float);
    b3.dstHeight = Y3;
    b3.WidthInBytes = X3 * sizeof(float);
    b3.Height = Y3;
    b3.Depth = Z3;
    CHECK_CU(cuMemcpy3D(&b3));
    EXPECT(vol_back == vol, "3D array contents differ after the copy back");
    // and with the runtime's cudaMemcpy3D (positions and width in elements on
    // the array side): slice 1 .. 2, rows 1 .. 3, elements 2 .. 7
    std::vector<float> part(6 * 3 * 2, -1.0f);
    cudaMemcpy3DParms p3;
    memset(&p3, 0, sizeof p3);
    p3.srcArray = (cudaArray_t)a3;
    p3.srcPos = make_cudaPos(2, 1, 1);
    p3.dstPtr = make_cudaPitchedPtr(part.data(), 6 * sizeof(float), 6, 3);
    p3.extent = make_cudaExtent(6, 3, 2);
    p3.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&p3));
    for (int z = 0; z < 2; ++z)
        for (int y = 0; y < 3; ++y)
            for (int x = 0; x < 6; ++x)
                EXPECT(part[(z * 3 + y) * 6 + x] == vol[((z + 1) * Y3 + y + 1) * X3 + x + 2],
                       "cudaMemcpy3D from the array: (%d, %d, %d)", x, y, z);

    double sum = 0;
    for (float v : want)
        sum += v;
    printf("sum %.4f\n", sum);
    CHECK_CU(cuTexObjectDestroy(t3));
    CHECK_CU(cuArrayDestroy(a3));
    CHECK(cudaDestroySurfaceObject(surf));
    CHECK(cudaDestroyTextureObject(tex));
    CHECK(cudaFreeArray(dst));
    CHECK(cudaFreeArray(src));
    CHECK(cudaFree(out3));
    printf("PASS " NAME "\n");
    return 0;
}
