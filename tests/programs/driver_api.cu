// driver_api: a pure driver-API program (linked with -lcuda, no runtime calls;
// compiled as plain C++ so that nvcc does not even register a fat binary).
// argv[1]: path of the cubin built from driver_api_kernels.cu.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda.h>

#define NAME "driver_api"
#define CHECK(call)                                                             \
    do {                                                                        \
        CUresult res_ = (call);                                                 \
        if (res_ != CUDA_SUCCESS) {                                             \
            const char *ename_ = NULL, *estr_ = NULL;                           \
            cuGetErrorName(res_, &ename_);                                      \
            cuGetErrorString(res_, &estr_);                                     \
            printf("FAIL " NAME ": %s -> %d %s (%s) at %s:%d\n", #call,         \
                   (int)res_, ename_ ? ename_ : "?", estr_ ? estr_ : "?",       \
                   __FILE__, __LINE__);                                         \
            fflush(stdout);                                                     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

static void *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(len > 0 ? (size_t)len : 1);
    if (buf && len > 0 && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *size = (size_t)len;
    return buf;
}

// argument buffer for mix(int *data, int n, char c, long long big): the
// natural C layout is the kernel's parameter layout (0, 8, 12, 16; 24 bytes)
struct MixArgs {
    CUdeviceptr data;
    int n;
    char c;
    long long big;
};

int main(int argc, char **argv)
{
    if (argc < 2) {
        printf("FAIL " NAME ": usage: driver_api <driver_api_kernels.cubin>\n");
        return 1;
    }
    size_t imageSize = 0;
    void *image = read_file(argv[1], &imageSize);
    if (!image || imageSize == 0) {
        printf("FAIL " NAME ": cannot read cubin %s\n", argv[1]);
        return 1;
    }

    CHECK(cuInit(0));
    int count = 0;
    CHECK(cuDeviceGetCount(&count));
    printf("device count>=1: %s\n", count >= 1 ? "yes" : "no");
    CUdevice dev;
    CHECK(cuDeviceGet(&dev, 0));
    char name[256];
    memset(name, 0, sizeof name);
    CHECK(cuDeviceGetName(name, sizeof name, dev));
    printf("device name nonempty: %s\n", name[0] ? "yes" : "no");

    CUcontext ctx;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));

    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, image));
    CUfunction fScale, fMix, fFill;
    CHECK(cuModuleGetFunction(&fScale, mod, "scale_add"));
    CHECK(cuModuleGetFunction(&fMix, mod, "mix"));
    CHECK(cuModuleGetFunction(&fFill, mod, "fill_seq"));

    // __device__ variable: read its initial value, then change it
    CUdeviceptr dScale;
    size_t scaleSize = 0;
    CHECK(cuModuleGetGlobal(&dScale, &scaleSize, mod, "dev_scale"));
    int hScale = 0;
    CHECK(cuMemcpyDtoH(&hScale, dScale, sizeof hScale));
    printf("dev_scale size %d initial %d\n", (int)scaleSize, hScale);
    if (scaleSize != sizeof(int) || hScale != 3) {
        printf("FAIL " NAME ": unexpected dev_scale\n");
        return 1;
    }
    hScale = 5;
    CHECK(cuMemcpyHtoD(dScale, &hScale, sizeof hScale));

    const int n = 10000;
    const size_t bytes = n * sizeof(int);
    int *h = (int *)malloc(bytes);
    int *back = (int *)malloc(bytes);
    for (int i = 0; i < n; ++i) h[i] = i % 77;

    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, bytes));
    CHECK(cuMemcpyHtoD(d, h, bytes));

    // launch 1: kernelParams
    int nArg = n, addArg = 7;
    void *params[] = {&d, &nArg, &addArg};
    const unsigned threads = 128;
    const unsigned blocks = (n + threads - 1) / threads;
    CHECK(cuLaunchKernel(fScale, blocks, 1, 1, threads, 1, 1, 0, NULL, params, NULL));

    // launch 2: one argument buffer through `extra`
    MixArgs margs;
    memset(&margs, 0, sizeof margs);
    margs.data = d;
    margs.n = n;
    margs.c = -3;
    margs.big = 123456789012345LL;      // % 1000 == 345
    size_t margsSize = sizeof margs;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &margs,
                     CU_LAUNCH_PARAM_BUFFER_SIZE, &margsSize,
                     CU_LAUNCH_PARAM_END};
    CHECK(cuLaunchKernel(fMix, blocks, 1, 1, threads, 1, 1, 0, NULL, NULL, extra));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemcpyDtoH(back, d, bytes));
    long long sum = 0;
    for (int i = 0; i < n; ++i) {
        int expect = h[i] * 5 + 7 - 3 + 345;
        if (back[i] != expect) {
            printf("FAIL " NAME ": launch result %d: got %d want %d\n", i, back[i], expect);
            return 1;
        }
        sum += back[i];
    }
    printf("sizeof(MixArgs)=%d launches checksum %lld\n", (int)sizeof(MixArgs), sum);

    // memset
    CUdeviceptr d2;
    CHECK(cuMemAlloc(&d2, bytes));
    CHECK(cuMemsetD32(d2, 0x12345678u, n));
    CHECK(cuMemcpyDtoH(back, d2, bytes));
    for (int i = 0; i < n; ++i) {
        if (back[i] != 0x12345678) {
            printf("FAIL " NAME ": memset element %d: got %x\n", i, back[i]);
            return 1;
        }
    }
    printf("cuMemsetD32 ok\n");

    // stream: async upload, kernel, async download into page-locked memory
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    int *pinned = NULL;
    CHECK(cuMemAllocHost((void **)&pinned, bytes));
    for (int i = 0; i < n; ++i) pinned[i] = -i;
    CHECK(cuMemcpyHtoDAsync(d2, pinned, bytes / 2, stream));     // first half := -i
    int base = 1000, step = 3, half = n / 2;
    CUdeviceptr d2Upper = d2 + (CUdeviceptr)(half * sizeof(int));
    void *fillParams[] = {&d2Upper, &half, &base, &step};      // second half := 1000 + 3*j
    CHECK(cuLaunchKernel(fFill, 8, 1, 1, 64, 1, 1, 0, stream, fillParams, NULL));
    CHECK(cuStreamSynchronize(stream));
    for (int i = 0; i < n; ++i) pinned[i] = 0;                   // the upload is complete
    CHECK(cuMemcpyDtoHAsync(pinned, d2, bytes, stream));
    CHECK(cuStreamSynchronize(stream));
    long long sum2 = 0;
    for (int i = 0; i < n; ++i) {
        int expect = (i < half) ? -i : 1000 + 3 * (i - half);
        if (pinned[i] != expect) {
            printf("FAIL " NAME ": stream result %d: got %d want %d\n", i, pinned[i], expect);
            return 1;
        }
        sum2 += pinned[i];
    }
    printf("stream checksum %lld\n", sum2);

    CHECK(cuStreamDestroy(stream));
    CHECK(cuMemFreeHost(pinned));
    CHECK(cuModuleUnload(mod));
    CHECK(cuMemFree(d));
    CHECK(cuMemFree(d2));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    free(h);
    free(back);
    free(image);
    printf("PASS " NAME "\n");
    return 0;
}
