// launch_variants: cooperative launches with a grid-wide barrier, launches
// with a thread block cluster attribute, cuLaunchKernelEx on a kernel of a
// cubin loaded with cuModuleLoad(path), occupancy queries (the potential
// block size with a shared-memory callback, computed through the driver and
// through the runtime's own template, must agree) and cudaFuncGetAttributes
// (issue 10, group 6). Runtime and driver variants alternate over argv[2]
// iterations (default 4).
//
// argv[1]: path of launch_variants_kernels.cubin. Pacing as in iterative.cu.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda_runtime.h>

namespace cg = cooperative_groups;

#define NAME "launch_variants"
#define CHECK(call)                                                             \
    do {                                                                        \
        cudaError_t err_ = (call);                                              \
        if (err_ != cudaSuccess) {                                              \
            printf("FAIL " NAME ": %s -> %s (%s) at %s:%d\n", #call,            \
                   cudaGetErrorName(err_), cudaGetErrorString(err_),            \
                   __FILE__, __LINE__);                                         \
            fflush(stdout);                                                     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)
#define CU(call)                                                                \
    do {                                                                        \
        CUresult r_ = (call);                                                   \
        if (r_ != CUDA_SUCCESS) {                                               \
            printf("FAIL " NAME ": %s -> CUresult %d at %s:%d\n", #call,        \
                   (int)r_, __FILE__, __LINE__);                                \
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

// per-block partial sums of in[0..n) times k, a grid-wide barrier, then block
// 0 adds the partials into *out (needs a cooperative launch)
__global__ void coop_sum(const int *in, long long *partial, long long *out, int n, int k)
{
    extern __shared__ long long acc[];
    long long s = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        s += (long long)in[i] * k;
    acc[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        long long t = 0;
        for (int j = 0; j < blockDim.x; ++j) t += acc[j];
        partial[blockIdx.x] = t;
    }
    cg::this_grid().sync();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        long long t = 0;
        for (int b = 0; b < gridDim.x; ++b) t += partial[b];
        *out += t;
    }
}

// each block writes its cluster's size * 100 + its rank in the cluster
__global__ void cluster_info(int *out)
{
    cg::cluster_group c = cg::this_cluster();
    if (threadIdx.x == 0)
        out[blockIdx.x] = (int)c.num_blocks() * 100 + (int)c.block_rank();
}

static size_t smem_for(int block) { return (size_t)block * sizeof(long long); }

typedef CUresult (*PFN_launchEx)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*PFN_launchCoop)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   CUstream, void **);
typedef CUresult (*PFN_potential)(int *, int *, CUfunction, CUoccupancyB2DSize, size_t, int);
typedef CUresult (*PFN_moduleLoad)(CUmodule *, const char *);
typedef CUresult (*PFN_moduleGetFunction)(CUfunction *, CUmodule, const char *);

static void *entry(const char *symbol)
{
    void *fn = NULL;
    cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
    CHECK(cudaGetDriverEntryPointByVersion(symbol, &fn, CUDART_VERSION, cudaEnableDefault, &st));
    EXPECT(st == cudaDriverEntryPointSuccess && fn, "driver entry point %s not found", symbol);
    return fn;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        printf("FAIL " NAME ": usage: launch_variants CUBIN [iterations]\n");
        return 1;
    }
    int iters = argc > 2 ? atoi(argv[2]) : 4;
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    const int pacing = pace_env && strcmp(pace_env, "1") == 0;
    int waiting = pacing;

    CHECK(cudaFree(0));
    PFN_launchEx launchEx = (PFN_launchEx)entry("cuLaunchKernelEx");
    PFN_launchCoop launchCoop = (PFN_launchCoop)entry("cuLaunchCooperativeKernel");
    PFN_potential potential = (PFN_potential)entry("cuOccupancyMaxPotentialBlockSize");
    PFN_moduleLoad moduleLoad = (PFN_moduleLoad)entry("cuModuleLoad");
    PFN_moduleGetFunction getFunction = (PFN_moduleGetFunction)entry("cuModuleGetFunction");
    typedef CUresult (*PFN_activeClusters)(int *, CUfunction, const CUlaunchConfig *);
    PFN_activeClusters activeClusters = (PFN_activeClusters)entry("cuOccupancyMaxActiveClusters");

    // ---- attributes and occupancy
    cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, coop_sum));
    EXPECT(fa.maxThreadsPerBlock >= 128 && fa.numRegs >= 0, "coop_sum attributes: %d threads", fa.maxThreadsPerBlock);
    int sms = 0, coopOk = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CHECK(cudaDeviceGetAttribute(&coopOk, cudaDevAttrCooperativeLaunch, 0));
    EXPECT(coopOk, "device does not support cooperative launches");
    const int T = 128;
    int perSm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, coop_sum, T, smem_for(T)));
    EXPECT(perSm >= 1, "occupancy %d", perSm);
    int blocks = perSm * sms < 64 ? perSm * sms : 64;

    CUfunction fcoop;
    CHECK(cudaGetFuncBySymbol((cudaFunction_t *)&fcoop, (const void *)coop_sum));
    int dMinGrid = 0, dBlock = 0, rMinGrid = 0, rBlock = 0;
    CU(potential(&dMinGrid, &dBlock, fcoop, smem_for, 0, 0));
    CHECK(cudaOccupancyMaxPotentialBlockSizeVariableSMem(&rMinGrid, &rBlock, coop_sum, smem_for));
    EXPECT(dBlock > 0 && dMinGrid > 0, "potential block size %d grid %d", dBlock, dMinGrid);
    EXPECT(dBlock == rBlock && dMinGrid == rMinGrid, "driver says block %d grid %d, runtime %d %d", dBlock,
           dMinGrid, rBlock, rMinGrid);
    int atBest = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&atBest, coop_sum, dBlock, smem_for(dBlock)));
    EXPECT(atBest * sms == dMinGrid, "min grid %d is not %d blocks x %d SMs", dMinGrid, atBest, sms);
    printf("occupancy: driver and runtime agree on the potential block size\n");

    // ---- a kernel of a cubin loaded from a file
    CUmodule mod;
    CU(moduleLoad(&mod, argv[1]));
    CUfunction fill;
    CU(getFunction(&fill, mod, "fill_pattern"));

    const int N = 100000, C = 16;
    std::vector<int> hin(N);
    for (int i = 0; i < N; ++i) hin[i] = (i * 37) % 1001 - 500;
    int *in, *clus, *seq;
    long long *partial, *out;
    CHECK(cudaMalloc(&in, N * sizeof(int)));
    CHECK(cudaMalloc(&seq, N * sizeof(int)));
    CHECK(cudaMalloc(&clus, C * sizeof(int)));
    CHECK(cudaMalloc(&partial, 64 * sizeof(long long)));
    CHECK(cudaMalloc(&out, sizeof(long long)));
    CHECK(cudaMemcpy(in, hin.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(out, 0, sizeof(long long)));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    long long base = 0;
    for (int i = 0; i < N; ++i) base += hin[i];
    long long want = 0;
    for (int k = 1; k <= iters; ++k) {
        if (waiting) {
            char line[256];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        int n = N;
        if (k % 2) {       // runtime variants
            void *args[] = { &in, &partial, &out, &n, &k };
            CHECK(cudaLaunchCooperativeKernel((const void *)coop_sum, dim3(blocks), dim3(T), args, smem_for(T), s));
            cudaLaunchConfig_t cfg;
            memset(&cfg, 0, sizeof cfg);
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeClusterDimension;
            at[0].val.clusterDim.x = 2; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
            cfg.gridDim = dim3(C);
            cfg.blockDim = dim3(32);
            cfg.stream = s;
            cfg.attrs = at;
            cfg.numAttrs = 1;
            CHECK(cudaLaunchKernelEx(&cfg, cluster_info, clus));
        } else {           // driver variants
            void *args[] = { &in, &partial, &out, &n, &k };
            CU(launchCoop(fcoop, blocks, 1, 1, T, 1, 1, (unsigned)smem_for(T), (CUstream)s, args));
            CUfunction fclus;
            CHECK(cudaGetFuncBySymbol((cudaFunction_t *)&fclus, (const void *)cluster_info));
            CUlaunchAttribute at[1];
            memset(at, 0, sizeof at);
            at[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            at[0].value.clusterDim.x = 4; at[0].value.clusterDim.y = 1; at[0].value.clusterDim.z = 1;
            CUlaunchConfig cfg;
            memset(&cfg, 0, sizeof cfg);
            cfg.gridDimX = C; cfg.gridDimY = 1; cfg.gridDimZ = 1;
            cfg.blockDimX = 32; cfg.blockDimY = 1; cfg.blockDimZ = 1;
            cfg.hStream = (CUstream)s;
            cfg.attrs = at;
            cfg.numAttrs = 1;
            void *cargs[] = { &clus };
            CU(launchEx(&cfg, fclus, cargs, NULL));
            // what cuDNN asks before it picks a cluster kernel
            int nclusters = 0;
            CU(activeClusters(&nclusters, fclus, &cfg));
            EXPECT(nclusters >= 1, "iteration %d: %d co-resident clusters of 4", k, nclusters);
        }
        // fill_pattern (cuModuleLoad'ed) through cuLaunchKernelEx with a priority attribute
        int sbase = k * 1000, step = k;
        void *fargs[] = { &seq, &n, &sbase, &step };
        CUlaunchAttribute pa;
        memset(&pa, 0, sizeof pa);
        pa.id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
        pa.value.priority = 0;
        CUlaunchConfig fc;
        memset(&fc, 0, sizeof fc);
        fc.gridDimX = 64; fc.gridDimY = 1; fc.gridDimZ = 1;
        fc.blockDimX = 256; fc.blockDimY = 1; fc.blockDimZ = 1;
        fc.hStream = (CUstream)s;
        fc.attrs = &pa;
        fc.numAttrs = 1;
        CU(launchEx(&fc, fill, fargs, NULL));
        CHECK(cudaStreamSynchronize(s));

        want += base * k;
        long long got = 0;
        CHECK(cudaMemcpy(&got, out, sizeof got, cudaMemcpyDeviceToHost));
        EXPECT(got == want, "iteration %d: cooperative sum %lld, want %lld", k, got, want);
        int hc[C];
        CHECK(cudaMemcpy(hc, clus, sizeof hc, cudaMemcpyDeviceToHost));
        int cs = k % 2 ? 2 : 4;
        for (int b = 0; b < C; ++b)
            EXPECT(hc[b] == cs * 100 + b % cs, "iteration %d: block %d cluster info %d", k, b, hc[b]);
        std::vector<int> hs(N);
        CHECK(cudaMemcpy(hs.data(), seq, N * sizeof(int), cudaMemcpyDeviceToHost));
        for (int i = 0; i < N; ++i)
            EXPECT(hs[i] == sbase + i * step, "iteration %d: fill_pattern[%d] = %d", k, i, hs[i]);
        printf("iter %d sum %lld clusters of %d\n", k, got, cs);
        if (pacing) {
            CHECK(cudaDeviceSynchronize());
            printf("step %d done\n", k);
        }
        fflush(stdout);
    }
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(in));
    CHECK(cudaFree(seq));
    CHECK(cudaFree(clus));
    CHECK(cudaFree(partial));
    CHECK(cudaFree(out));
    printf("PASS " NAME "\n");
    return 0;
}
