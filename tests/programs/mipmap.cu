// mipmap: mipmapped CUDA arrays (issue 10, group 5), runtime and driver API.
//
// Runtime part: a 2D float mipmapped array of 4 levels (64x32 down to 8x4)
// from cudaMallocMipmappedArray; each level's array (cudaGetMipmappedArrayLevel,
// the same handle on every call) is filled by cudaMemcpy2DToArray; a texture
// object over the mipmapped resource (normalised coordinates, point
// sampling, point mipmap filtering) is read by a kernel with tex2DLod at
// every texel of every level (integer levels), and the results are compared
// with what was written. Each iteration rewrites one level from the host, so
// the levels carry state from iteration to iteration and through the
// checkpoints of tests/test_corpus_checkpoint.py (the level contents and the
// texture object's value must come back); the levels are also copied back
// to the host (cudaMemcpy2DFromArray) and compared.
//
// Driver part: cuMipmappedArrayCreate of 3 levels, cuMipmappedArrayGetLevel,
// a cuMemcpy3D into level 2 and back, cuArray3DGetDescriptor of a level,
// cuMipmappedArrayDestroy.
//
// All values are small integers, exact in float everywhere.
//
// Pacing (GPUPROXY_TEST_PACE=1): one stdin line before each iteration,
// "step <k> done" after it.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda.h>
#include <cuda_runtime.h>

#define NAME "mipmap"
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

static const int W = 64, H = 32, L = 4;

// out[i] = texel (x, y) of level `level`, read through the mipmapped
// texture at the texel's centre in normalised coordinates
__global__ void read_level(cudaTextureObject_t tex, float *out, int w, int h, int level)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= w * h)
        return;
    int x = i % w, y = i / w;
    out[i] = tex2DLod<float>(tex, (x + 0.5f) / w, (y + 0.5f) / h, (float)level);
}

static float value(int level, int x, int y, int gen) { return (float)(level * 1000 + y * 37 + x + gen * 5); }

int main(int argc, char **argv)
{
    int iters = (argc > 1) ? atoi(argv[1]) : 5;
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    const int pacing = pace_env && strcmp(pace_env, "1") == 0;
    int waiting = pacing;

    cudaChannelFormatDesc fd = cudaCreateChannelDesc<float>();
    cudaMipmappedArray_t mip;
    CHECK(cudaMallocMipmappedArray(&mip, &fd, make_cudaExtent(W, H, 0), L));
    int gen[L] = {0, 0, 0, 0};
    cudaArray_t lv[L];
    for (int l = 0; l < L; ++l) {
        CHECK(cudaGetMipmappedArrayLevel(&lv[l], mip, l));
        cudaArray_t again;
        CHECK(cudaGetMipmappedArrayLevel(&again, mip, l));
        EXPECT(again == lv[l], "level %d: another handle on the second call", l);
        cudaExtent e;
        CHECK(cudaArrayGetInfo(nullptr, &e, nullptr, lv[l]));
        EXPECT(e.width == (size_t)(W >> l) && e.height == (size_t)(H >> l), "level %d is %zux%zu", l, e.width,
               e.height);
    }
    cudaArray_t bad;
    EXPECT(cudaGetMipmappedArrayLevel(&bad, mip, L) != cudaSuccess, "level %d of %d accepted", L, L);
    cudaGetLastError();

    auto fill = [&](int l) {
        int w = W >> l, h = H >> l;
        std::vector<float> v(w * h);
        for (int y = 0; y < h; ++y)
            for (int x = 0; x < w; ++x)
                v[y * w + x] = value(l, x, y, gen[l]);
        CHECK(cudaMemcpy2DToArray(lv[l], 0, 0, v.data(), w * sizeof(float), w * sizeof(float), h,
                                  cudaMemcpyHostToDevice));
    };
    for (int l = 0; l < L; ++l)
        fill(l);

    cudaResourceDesc rd;
    memset(&rd, 0, sizeof rd);
    rd.resType = cudaResourceTypeMipmappedArray;
    rd.res.mipmap.mipmap = mip;
    cudaTextureDesc td;
    memset(&td, 0, sizeof td);
    td.addressMode[0] = td.addressMode[1] = cudaAddressModeClamp;
    td.filterMode = cudaFilterModePoint;
    td.mipmapFilterMode = cudaFilterModePoint;
    td.readMode = cudaReadModeElementType;
    td.normalizedCoords = 1;
    td.maxMipmapLevelClamp = (float)(L - 1);
    cudaTextureObject_t tex;
    CHECK(cudaCreateTextureObject(&tex, &rd, &td, nullptr));
    cudaResourceDesc back;
    CHECK(cudaGetTextureObjectResourceDesc(&back, tex));
    EXPECT(back.resType == cudaResourceTypeMipmappedArray && back.res.mipmap.mipmap == mip, "resource desc");

    // ---- driver: a second mipmapped array, level 2 written and read back
    {
        CUDA_ARRAY3D_DESCRIPTOR ad;
        memset(&ad, 0, sizeof ad);
        ad.Width = 20;
        ad.Height = 12;
        ad.Format = CU_AD_FORMAT_UNSIGNED_INT16;
        ad.NumChannels = 2;
        CUmipmappedArray m2;
        CHECK_CU(cuMipmappedArrayCreate(&m2, &ad, 3));
        CUarray l2;
        CHECK_CU(cuMipmappedArrayGetLevel(&l2, m2, 2));
        CUDA_ARRAY3D_DESCRIPTOR got;
        CHECK_CU(cuArray3DGetDescriptor(&got, l2));
        EXPECT(got.Width == 5 && got.Height == 3 && got.Format == CU_AD_FORMAT_UNSIGNED_INT16 && got.NumChannels == 2,
               "driver level 2 is %zux%zu format %d x%u", got.Width, got.Height, (int)got.Format, got.NumChannels);
        std::vector<unsigned short> in(5 * 3 * 2), out(5 * 3 * 2, 0);
        for (size_t i = 0; i < in.size(); ++i)
            in[i] = (unsigned short)(i * 977 + 3);
        CUDA_MEMCPY3D c;
        memset(&c, 0, sizeof c);
        c.srcMemoryType = CU_MEMORYTYPE_HOST;
        c.srcHost = in.data();
        c.srcPitch = 5 * 4;
        c.srcHeight = 3;
        c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
        c.dstArray = l2;
        c.WidthInBytes = 5 * 4;
        c.Height = 3;
        c.Depth = 1;
        CHECK_CU(cuMemcpy3D(&c));
        memset(&c, 0, sizeof c);
        c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
        c.srcArray = l2;
        c.dstMemoryType = CU_MEMORYTYPE_HOST;
        c.dstHost = out.data();
        c.dstPitch = 5 * 4;
        c.dstHeight = 3;
        c.WidthInBytes = 5 * 4;
        c.Height = 3;
        c.Depth = 1;
        CHECK_CU(cuMemcpy3D(&c));
        EXPECT(out == in, "driver level 2 contents differ after the round trip");
        CHECK_CU(cuMipmappedArrayDestroy(m2));
    }

    float *out;
    CHECK(cudaMalloc(&out, W * H * sizeof(float)));
    std::vector<float> got(W * H);
    printf("mipmaps ready\n");

    for (int k = 1; k <= iters; ++k) {
        if (waiting) {
            char line[256];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        // level k % L gets new contents
        gen[k % L] = k;
        fill(k % L);
        for (int l = 0; l < L; ++l) {
            int w = W >> l, h = H >> l;
            read_level<<<(w * h + 127) / 128, 128>>>(tex, out, w, h, l);
            CHECK(cudaGetLastError());
            CHECK(cudaMemcpy(got.data(), out, w * h * sizeof(float), cudaMemcpyDeviceToHost));
            for (int i = 0; i < w * h; ++i)
                EXPECT(got[i] == value(l, i % w, i / w, gen[l]), "iteration %d: level %d texel (%d, %d) is %g, want %g",
                       k, l, i % w, i / w, got[i], value(l, i % w, i / w, gen[l]));
            std::vector<float> copy(w * h);
            CHECK(cudaMemcpy2DFromArray(copy.data(), w * sizeof(float), lv[l], 0, 0, w * sizeof(float), h,
                                        cudaMemcpyDeviceToHost));
            for (int i = 0; i < w * h; ++i)
                EXPECT(copy[i] == value(l, i % w, i / w, gen[l]), "iteration %d: level %d copied back differs", k, l);
        }
        printf("iter %d ok\n", k);
        if (pacing)
            printf("step %d done\n", k);
        fflush(stdout);
    }

    double sum = 0;
    for (int l = 0; l < L; ++l)
        for (int y = 0; y < (H >> l); ++y)
            for (int x = 0; x < (W >> l); ++x)
                sum += value(l, x, y, gen[l]);
    printf("sum %.1f\n", sum);
    CHECK(cudaDestroyTextureObject(tex));
    CHECK(cudaFree(out));
    CHECK(cudaFreeMipmappedArray(mip));
    printf("PASS " NAME "\n");
    return 0;
}
