// many_globals: the shim knows every module variable the app got the address
// of, however many. XLA keeps its constants in module variables, so a JAX
// process gets thousands; the shim once noted only the first 1024, and a
// pointer query or a unified-memory copy then took a later variable for host
// memory. A driver-API program: it loads globals_table_kernels.cu's module
// (argv[1], a cubin; 128 variables g<p><d> = <p><d>) kModules times, looks up
// every variable's address and checks that each is device memory to
// cuPointerGetAttributes, then reads and writes the last ones through
// cuMemcpy2D with CU_MEMORYTYPE_UNIFIED, whose side the shim decides from
// the address (cuda.h: "unified" means the driver infers it).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda.h>

#define NAME "many_globals"
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

static const int kModules = 12;
static const int kVars = 128;      // NG of the kernels

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

// the j-th variable's name and initial value: g00..g07, g10..g17, ..., g170..g177
static int var_value(int j) { int q = j / 8; return (q < 8 ? q : q + 2) * 10 + j % 8; }
static void var_name(int j, char *out, size_t n) { snprintf(out, n, "g%d%d", var_value(j) / 10, j % 8); }

static CUresult copy2d_unified(CUdeviceptr dst, int dst_unified, const void *host_src, CUdeviceptr src,
                               void *host_dst, size_t bytes)
{
    CUDA_MEMCPY2D c;
    memset(&c, 0, sizeof c);
    if (dst_unified) {
        c.srcMemoryType = CU_MEMORYTYPE_HOST;
        c.srcHost = host_src;
        c.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
        c.dstDevice = dst;
    } else {
        c.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
        c.srcDevice = src;
        c.dstMemoryType = CU_MEMORYTYPE_HOST;
        c.dstHost = host_dst;
    }
    c.srcPitch = c.dstPitch = c.WidthInBytes = bytes;
    c.Height = 1;
    return cuMemcpy2D(&c);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        printf("FAIL " NAME ": usage: many_globals <globals_table_kernels.cubin>\n");
        return 1;
    }
    size_t size = 0;
    void *image = read_file(argv[1], &size);
    if (!image || size == 0) {
        printf("FAIL " NAME ": cannot read cubin %s\n", argv[1]);
        return 1;
    }
    CHECK(cuInit(0));
    CUdevice dev;
    CHECK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));

    static CUdeviceptr addr[kModules][kVars];
    CUmodule mods[kModules];
    for (int m = 0; m < kModules; m++) {
        CHECK(cuModuleLoadData(&mods[m], image));
        for (int j = 0; j < kVars; j++) {
            char name[16];
            var_name(j, name, sizeof name);
            size_t s = 0;
            CHECK(cuModuleGetGlobal(&addr[m][j], &s, mods[m], name));
            if (s != sizeof(int)) {
                printf("FAIL " NAME ": %s of module %d has size %zu\n", name, m, s);
                return 1;
            }
        }
    }
    printf("%d variables looked up in %d modules\n", kModules * kVars, kModules);

    int device_mem = 0;
    for (int m = 0; m < kModules; m++)
        for (int j = 0; j < kVars; j++) {
            unsigned int type = 0;
            CUdeviceptr p = 0;
            CUpointer_attribute attrs[] = { CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_POINTER };
            void *data[] = { &type, &p };
            CHECK(cuPointerGetAttributes(2, attrs, data, addr[m][j]));
            device_mem += type == CU_MEMORYTYPE_DEVICE && p == addr[m][j];
        }
    printf("%d of %d are device memory at their own address\n", device_mem, kModules * kVars);

    // the last module's last 8 variables: read through unified copies, write, read again
    const int last = kModules - 1;
    long long before = 0, after = 0;
    for (int j = kVars - 8; j < kVars; j++) {
        int v = 0;
        CHECK(copy2d_unified(0, 0, NULL, addr[last][j], &v, sizeof v));
        before += v == var_value(j);
        int w = 1000 + j;
        CHECK(copy2d_unified(addr[last][j], 1, &w, 0, NULL, sizeof w));
        CHECK(cuMemcpyDtoH(&v, addr[last][j], sizeof v));
        after += v == 1000 + j;
    }
    printf("unified 2D copies: %lld of 8 read their initial value, %lld of 8 written\n", before, after);
    if (device_mem != kModules * kVars || before != 8 || after != 8) {
        printf("FAIL " NAME "\n");
        return 1;
    }
    printf("PASS " NAME "\n");
    return 0;
}
