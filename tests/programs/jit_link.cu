// jit_link: the driver's JIT linker (cuLinkCreate/AddData/AddFile/Complete/
// Destroy), as pycuda's DynamicModule and numba-cuda use it: two PTX units,
// one calling a device function the other defines, linked into one image
// that is loaded as a module; log buffers filled; a bad input refused with
// an error log. Plain C++ on the driver API (-lcuda).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <cuda.h>

#define NAME "jit_link"
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
#define EXPECT(cond)                                                            \
    do {                                                                        \
        if (!(cond)) {                                                          \
            printf("FAIL " NAME ": %s at %s:%d\n", #cond, __FILE__, __LINE__);  \
            fflush(stdout);                                                     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

// a kernel that calls an external device function ...
static const char ptx_kernel[] =
    ".version 7.8\n"
    ".target sm_75\n"
    ".address_size 64\n"
    ".extern .func (.param .b32 r) twice_plus(.param .b32 x);\n"
    ".visible .entry jit_apply(.param .u64 p, .param .u32 n)\n"
    "{\n"
    "    .reg .b32 %r<7>;\n"
    "    .reg .b64 %rd<4>;\n"
    "    .reg .pred %q;\n"
    "    ld.param.u64 %rd1, [p];\n"
    "    ld.param.u32 %r1, [n];\n"
    "    mov.u32 %r2, %ctaid.x;\n"
    "    mov.u32 %r3, %ntid.x;\n"
    "    mov.u32 %r4, %tid.x;\n"
    "    mad.lo.s32 %r2, %r2, %r3, %r4;\n"
    "    setp.ge.u32 %q, %r2, %r1;\n"
    "    @%q bra DONE;\n"
    "    cvta.to.global.u64 %rd1, %rd1;\n"
    "    mul.wide.u32 %rd2, %r2, 4;\n"
    "    add.s64 %rd3, %rd1, %rd2;\n"
    "    ld.global.u32 %r5, [%rd3];\n"
    "    {\n"
    "    .param .b32 arg0;\n"
    "    st.param.b32 [arg0], %r5;\n"
    "    .param .b32 ret0;\n"
    "    call.uni (ret0), twice_plus, (arg0);\n"
    "    ld.param.b32 %r6, [ret0];\n"
    "    }\n"
    "    st.global.u32 [%rd3], %r6;\n"
    "DONE:\n"
    "    ret;\n"
    "}\n";
// ... and the unit that defines it: twice_plus(x) = 2x + 7
static const char ptx_func[] =
    ".version 7.8\n"
    ".target sm_75\n"
    ".address_size 64\n"
    ".visible .func (.param .b32 r) twice_plus(.param .b32 x)\n"
    "{\n"
    "    .reg .b32 %r<3>;\n"
    "    ld.param.b32 %r1, [x];\n"
    "    shl.b32 %r2, %r1, 1;\n"
    "    add.s32 %r2, %r2, 7;\n"
    "    st.param.b32 [r], %r2;\n"
    "    ret;\n"
    "}\n";

int main()
{
    CHECK(cuInit(0));
    CUdevice dev;
    CHECK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));

    // the second unit goes in through a file, as cuLinkAddFile reads one
    char path[] = "/tmp/jit_link_XXXXXX";
    int fd = mkstemp(path);
    EXPECT(fd >= 0);
    EXPECT(write(fd, ptx_func, strlen(ptx_func)) == (ssize_t)strlen(ptx_func));
    close(fd);

    static char info[4096], err[4096];
    memset(info, 'x', sizeof info);
    memset(err, 'x', sizeof err);
    CUjit_option opts[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                           CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                           CU_JIT_LOG_VERBOSE};
    void *vals[] = {info, (void *)(uintptr_t)sizeof info, err, (void *)(uintptr_t)sizeof err, (void *)1};
    CUlinkState link;
    CHECK(cuLinkCreate(5, opts, vals, &link));
    CHECK(cuLinkAddData(link, CU_JIT_INPUT_PTX, (void *)ptx_kernel, sizeof ptx_kernel, "kernel.ptx", 0, NULL, NULL));
    CHECK(cuLinkAddFile(link, CU_JIT_INPUT_PTX, path, 0, NULL, NULL));
    void *image = NULL;
    size_t image_size = 0;
    CHECK(cuLinkComplete(link, &image, &image_size));
    unlink(path);
    EXPECT(image != NULL && image_size > 0);
    // the logs are NUL-terminated C strings within their buffers, and the
    // size options now say how much was filled
    EXPECT(memchr(info, 0, sizeof info) != NULL && memchr(err, 0, sizeof err) != NULL);
    EXPECT((uintptr_t)vals[1] <= sizeof info && (uintptr_t)vals[3] <= sizeof err);
    printf("linked an image: %s\n", image_size > 64 ? "yes" : "no");

    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, image));   // before cuLinkDestroy, which frees the image
    CHECK(cuLinkDestroy(link));
    CUfunction fn;
    CHECK(cuModuleGetFunction(&fn, mod, "jit_apply"));

    const unsigned n = 1000;
    static int host[n];
    for (unsigned i = 0; i < n; i++)
        host[i] = (int)i - 300;
    CUdeviceptr d;
    CHECK(cuMemAlloc(&d, sizeof host));
    CHECK(cuMemcpyHtoD(d, host, sizeof host));
    unsigned nn = n;
    void *args[] = {&d, &nn};
    CHECK(cuLaunchKernel(fn, (n + 127) / 128, 1, 1, 128, 1, 1, 0, NULL, args, NULL));
    CHECK(cuMemcpyDtoH(host, d, sizeof host));
    int bad = 0;
    for (unsigned i = 0; i < n; i++)
        bad += host[i] != 2 * ((int)i - 300) + 7;
    printf("linked kernel results wrong: %d of %u\n", bad, n);

    // a bad input: refused, with the reason in the error log
    static char err2[1024];
    err2[0] = '\0';
    CUjit_option eopts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *evals[] = {err2, (void *)(uintptr_t)sizeof err2};
    CUlinkState bad_link;
    CHECK(cuLinkCreate(2, eopts, evals, &bad_link));
    static const char garbage[] = "this is not PTX at all";
    CUresult r = cuLinkAddData(bad_link, CU_JIT_INPUT_PTX, (void *)garbage, sizeof garbage, "garbage.ptx",
                               0, NULL, NULL);
    if (r == CUDA_SUCCESS) {
        void *img2;
        size_t sz2;
        r = cuLinkComplete(bad_link, &img2, &sz2);
    }
    printf("bad input refused: %s, error log: %s\n", r != CUDA_SUCCESS ? "yes" : "no",
           strlen(err2) > 0 ? "filled" : "empty");
    CHECK(cuLinkDestroy(bad_link));

    CHECK(cuMemFree(d));
    CHECK(cuModuleUnload(mod));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    printf("PASS " NAME "\n");
    return 0;
}
