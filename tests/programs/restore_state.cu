// restore_state: state set through API calls must survive a checkpoint.
//  - a kernel that needs 64 KiB of dynamic shared memory, which CUDA allows
//    only after cudaFuncSetAttribute(MaxDynamicSharedMemorySize) raised the
//    48 KiB default (a launch without it fails with cudaErrorInvalidValue);
//  - context limits (stack size, malloc heap size) set with cudaDeviceSetLimit;
//  - a stream created with the greatest priority and cudaStreamNonBlocking,
//    an event created with cudaEventDisableTiming;
//  - a __device__ launch counter.
// Every iteration launches the kernel and reads all of it back, so a restore
// between iterations that lost any of it changes the output.
//
// Pacing (only when GPUPROXY_TEST_PACE=1): before each iteration one line is
// read from stdin (at EOF the program stops waiting and runs freely); after
// iteration k the device is synchronized and "step <k> done" is printed.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#define NAME "restore_state"
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

static const int kSharedBytes = 64 * 1024;          // above the 48 KiB default
static const int kSharedInts = kSharedBytes / 4;
static const int kBlocks = 4;
static const int kIters = 4;
static const size_t kStack = 4096;
static const size_t kHeap = 16 << 20;

__device__ int launches;

// every block fills all of its dynamic shared memory, then thread 0 folds it
__global__ void fill_shared(int *out, int seed)
{
    extern __shared__ int s[];
    for (int i = threadIdx.x; i < kSharedInts; i += blockDim.x)
        s[i] = (i * 7 + seed + blockIdx.x) % 1000;
    __syncthreads();
    if (threadIdx.x == 0) {
        long long t = 0;
        for (int i = 0; i < kSharedInts; ++i) t += s[i];
        out[blockIdx.x] = (int)(t % 1000003);
        if (blockIdx.x == 0) launches++;
    }
}

int main(void)
{
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    int waiting = pace_env && strcmp(pace_env, "1") == 0;
    const int pacing = waiting;

    int *d_out;
    CHECK(cudaMalloc(&d_out, kBlocks * sizeof(int)));

    // without the attribute the launch is refused
    fill_shared<<<kBlocks, 256, kSharedBytes>>>(d_out, 0);
    cudaError_t launch = cudaGetLastError();
    cudaError_t sync = cudaDeviceSynchronize();
    cudaError_t late = cudaGetLastError();
    cudaError_t refused = launch != cudaSuccess ? launch : sync != cudaSuccess ? sync : late;
    printf("launch with %d bytes of dynamic shared memory before the attribute: %s\n", kSharedBytes,
           cudaGetErrorName(refused));

    CHECK(cudaFuncSetAttribute(fill_shared, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes));
    CHECK(cudaDeviceSetLimit(cudaLimitStackSize, kStack));
    CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, kHeap));
    int least = 0, greatest = 0;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
    cudaEvent_t ev;
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    int zero = 0;
    CHECK(cudaMemcpyToSymbol(launches, &zero, sizeof zero));

    for (int k = 1; k <= kIters; ++k) {
        if (waiting) {
            char line[256];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        fill_shared<<<kBlocks, 256, kSharedBytes, stream>>>(d_out, k * 13);
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(ev, stream));
        CHECK(cudaEventSynchronize(ev));
        int out[kBlocks];
        CHECK(cudaMemcpy(out, d_out, sizeof out, cudaMemcpyDeviceToHost));
        int n = -1;
        CHECK(cudaMemcpyFromSymbol(&n, launches, sizeof n));

        cudaFuncAttributes fa;
        CHECK(cudaFuncGetAttributes(&fa, fill_shared));
        size_t stack = 0, heap = 0;
        CHECK(cudaDeviceGetLimit(&stack, cudaLimitStackSize));
        CHECK(cudaDeviceGetLimit(&heap, cudaLimitMallocHeapSize));
        int prio = 0;
        unsigned int sflags = 0;
        CHECK(cudaStreamGetPriority(stream, &prio));
        CHECK(cudaStreamGetFlags(stream, &sflags));
        float ms = 0;
        cudaError_t timing = cudaEventElapsedTime(&ms, ev, ev);   // refused: the event keeps no time
        cudaGetLastError();

        printf("iter %d sums %d %d %d %d launches %d\n", k, out[0], out[1], out[2], out[3], n);
        printf("  max dynamic shared %d, stack %s, heap %s, stream priority %s flags %u, event timing %s\n",
               fa.maxDynamicSharedSizeBytes, stack >= kStack ? "kept" : "lost", heap >= kHeap ? "kept" : "lost",
               prio == greatest ? "greatest" : "other", sflags, cudaGetErrorName(timing));
        if (pacing) {
            CHECK(cudaDeviceSynchronize());
            printf("step %d done\n", k);
        }
        fflush(stdout);
    }

    CHECK(cudaEventDestroy(ev));
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(d_out));
    printf("PASS " NAME "\n");
    return 0;
}
