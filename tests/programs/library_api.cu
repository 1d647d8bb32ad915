// library_api: the driver's library API (cuLibrary*, cuKernel*), which
// NVIDIA's static runtime uses to load fat binaries and launch. A library is
// context-independent: its kernels run in every context that launches them,
// each context with its own copy of the module (its own __device__
// variables). A CUkernel may be passed where a CUfunction goes (cuda.h).
// Plain C++ with -lcuda; argv[1]: the cubin of driver_api_kernels.cu.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda.h>

#define NAME "library_api"
#define CHECK(call)                                                             \
    do {                                                                        \
        CUresult res_ = (call);                                                 \
        if (res_ != CUDA_SUCCESS) {                                             \
            const char *ename_ = NULL;                                          \
            cuGetErrorName(res_, &ename_);                                      \
            printf("FAIL " NAME ": %s -> %d %s at %s:%d\n", #call, (int)res_,   \
                   ename_ ? ename_ : "?", __FILE__, __LINE__);                  \
            fflush(stdout);                                                     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

static void *read_file(const char *path)
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
    return buf;
}

static const int N = 256;

// fill_seq(data, n, base, step) then scale_add(data, n, add) in the current
// context; returns data[0] + data[N-1] after checking every element.
static long run(CUkernel fill, CUfunction scale, CUdeviceptr d, int base, int add, int scale_now)
{
    int n = N, step = 2;
    void *fargs[] = { &d, &n, &base, &step };
    CHECK(cuLaunchKernel((CUfunction)fill, 2, 1, 1, 128, 1, 1, 0, NULL, fargs, NULL));
    void *sargs[] = { &d, &n, &add };
    CHECK(cuLaunchKernel(scale, 2, 1, 1, 128, 1, 1, 0, NULL, sargs, NULL));
    int h[N];
    CHECK(cuMemcpyDtoH(h, d, sizeof h));
    for (int i = 0; i < N; i++)
        if (h[i] != (base + 2 * i) * scale_now + add) {
            printf("FAIL " NAME ": element %d is %d, expected %d\n", i, h[i], (base + 2 * i) * scale_now + add);
            exit(1);
        }
    return (long)h[0] + h[N - 1];
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        printf("FAIL " NAME ": usage: library_api <driver_api_kernels.cubin>\n");
        return 1;
    }
    void *image = read_file(argv[1]);
    if (!image) {
        printf("FAIL " NAME ": cannot read %s\n", argv[1]);
        return 1;
    }
    CHECK(cuInit(0));
    CUdevice dev;
    CHECK(cuDeviceGet(&dev, 0));
    CUcontext a;
    CHECK(cuDevicePrimaryCtxRetain(&a, dev));
    CHECK(cuCtxSetCurrent(a));

    CUlibrary lib;
    CHECK(cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0));
    free(image);   // the driver keeps its own copy unless told the binary is preserved
    CUkernel fill, scale_k, again;
    CHECK(cuLibraryGetKernel(&fill, lib, "fill_seq"));
    CHECK(cuLibraryGetKernel(&scale_k, lib, "scale_add"));
    CHECK(cuLibraryGetKernel(&again, lib, "fill_seq"));
    printf("same kernel for the same name: %s\n", again == fill ? "yes" : "no");
    CUkernel none;
    CUresult r = cuLibraryGetKernel(&none, lib, "no_such_kernel");
    printf("unknown kernel name: %s\n", r == CUDA_ERROR_NOT_FOUND ? "CUDA_ERROR_NOT_FOUND" : "other error");

    CUfunction scale_a;
    CHECK(cuKernelGetFunction(&scale_a, scale_k));
    int threads = 0;
    CHECK(cuKernelGetAttribute(&threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, scale_k, dev));
    printf("max threads per block > 0: %s\n", threads > 0 ? "yes" : "no");
    const char *kname = NULL;
    CHECK(cuKernelGetName(&kname, scale_k));
    printf("kernel name: %s\n", kname ? kname : "(null)");

    CUdeviceptr da;
    CHECK(cuMemAlloc(&da, N * sizeof(int)));
    printf("context A, dev_scale 3: %ld\n", run(fill, scale_a, da, 10, 1, 3));
    CUdeviceptr gscale;
    size_t gsize = 0;
    CHECK(cuLibraryGetGlobal(&gscale, &gsize, lib, "dev_scale"));
    int five = 5;
    CHECK(cuMemcpyHtoD(gscale, &five, sizeof five));
    printf("context A, dev_scale 5 (size %zu): %ld\n", gsize, run(fill, scale_a, da, 10, 1, 5));

    // a second context: the library is loaded there on first use, with its
    // own dev_scale (3 again)
    CUcontext b;
    CHECK(cuCtxCreate(&b, NULL, 0, dev));
    CUfunction scale_b;
    CHECK(cuKernelGetFunction(&scale_b, scale_k));
    CUdeviceptr db;
    CHECK(cuMemAlloc(&db, N * sizeof(int)));
    printf("context B, dev_scale 3: %ld\n", run(fill, scale_b, db, 20, 2, 3));
    CHECK(cuMemFree(db));
    CHECK(cuCtxDestroy(b));

    // back in A: its module and dev_scale are unchanged
    CHECK(cuCtxSetCurrent(a));
    printf("context A again, dev_scale 5: %ld\n", run(fill, scale_a, da, 10, 1, 5));
    CHECK(cuMemFree(da));
    CHECK(cuLibraryUnload(lib));

    // an export table nobody defines: refused (the shim names it on stderr)
    CUuuid id;
    memset(&id, 0x5a, sizeof id);
    const void *table = NULL;
    r = cuGetExportTable(&table, &id);
    printf("unknown export table refused: %s\n", r != CUDA_SUCCESS && table == NULL ? "yes" : "no");
    CHECK(cuDevicePrimaryCtxRelease(dev));
    printf("PASS " NAME "\n");
    return 0;
}
