// globals_table: __device__ variables must come back at their addresses
// (issue 23, target 5). A pure driver-API program: it loads the module of
// globals_table_kernels.cu (argv[1], a cubin) kModules times, and between
// the loads looks up and launches kernels of the module just loaded, as a
// framework loading its modules lazily does; each module's `publish` stores
// the addresses of its 128 variables into one table in device memory. Every
// iteration bumps all variables and sums them by reading through the table:
// a variable that moved on a restore makes the stored pointer stale, and
// the sum (or the launch) goes wrong. It also compares each module's
// cuModuleGetGlobal(g00) with the address it looked up at the start.
//
// Pacing (only when GPUPROXY_TEST_PACE=1): before each iteration one line is
// read from stdin (at EOF the program runs freely); after iteration k the
// context is synchronized and "step <k> done" is printed.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda.h>

#define NAME "globals_table"
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

static const int kModules = 4;
static const int kVars = 128;      // NG of the kernels
static const int kIters = 3;

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

int main(int argc, char **argv)
{
    if (argc < 2) {
        printf("FAIL " NAME ": usage: globals_table <globals_table_kernels.cubin>\n");
        return 1;
    }
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    int waiting = pace_env && strcmp(pace_env, "1") == 0;
    const int pacing = waiting;
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

    const int n = kModules * kVars;
    CUdeviceptr table, out;
    CHECK(cuMemAlloc(&table, n * sizeof(unsigned long long)));
    CHECK(cuMemAlloc(&out, sizeof(long long)));

    CUmodule mods[kModules];
    CUfunction bump[kModules], gather = NULL;
    CUdeviceptr first[kModules];
    long long expect = 0;
    for (int m = 0; m < kModules; m++) {
        // load, then at once look up and launch its kernels (before the next load)
        CHECK(cuModuleLoadData(&mods[m], image));
        CUfunction publish;
        CHECK(cuModuleGetFunction(&publish, mods[m], "gt_publish"));
        int base = m * kVars;
        void *pargs[] = { &table, &base };
        CHECK(cuLaunchKernel(publish, 1, 1, 1, kVars, 1, 1, 0, 0, pargs, NULL));
        CHECK(cuModuleGetFunction(&bump[m], mods[m], "gt_bump"));
        if (m == 0)
            CHECK(cuModuleGetFunction(&gather, mods[m], "gt_gather"));
        size_t gsize = 0;
        CHECK(cuModuleGetGlobal(&first[m], &gsize, mods[m], "g00"));
        for (int j = 0; j < kVars; j++) {       // the initial values: g<p><d> = <p><d> in decimal,
            int q = j / 8;                      // p = 0..7, then 10..17
            expect += (q < 8 ? q : q + 2) * 10 + j % 8;
        }
    }
    CHECK(cuCtxSynchronize());
    printf("%d modules of %d variables loaded, their addresses in a device table\n", kModules, kVars);

    for (int k = 1; k <= kIters; k++) {
        if (waiting) {
            char line[64];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        for (int m = 0; m < kModules; m++) {
            void *bargs[] = { &k };
            CHECK(cuLaunchKernel(bump[m], 1, 1, 1, kVars, 1, 1, 0, 0, bargs, NULL));
        }
        int nn = n;
        void *gargs[] = { &table, &nn, &out };
        CHECK(cuLaunchKernel(gather, 1, 1, 1, 32, 1, 1, 0, 0, gargs, NULL));
        long long sum = 0;
        CHECK(cuMemcpyDtoH(&sum, out, sizeof sum));
        expect += (long long)k * n;
        int same = 0;
        for (int m = 0; m < kModules; m++) {
            CUdeviceptr a;
            size_t s;
            CHECK(cuModuleGetGlobal(&a, &s, mods[m], "g00"));
            same += a == first[m];
        }
        printf("iter %d sum through the table %lld (%s), %d of %d modules' g00 at its first address\n", k, sum,
               sum == expect ? "right" : "WRONG", same, kModules);
        if (pacing) {
            CHECK(cuCtxSynchronize());
            printf("step %d done\n", k);
        }
        fflush(stdout);
    }
    printf("PASS " NAME "\n");
    return 0;
}
