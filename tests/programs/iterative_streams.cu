// iterative_streams: a long-running loop over two streams. Stream 1 uploads a
// small parameter table from page-locked memory (double-buffered, guarded by
// events) and evolves X; stream 2 waits for X through an event and folds X
// into Y; stream 1 waits for stream 2 before touching X again. Every 10
// iterations both arrays are downloaded asynchronously into page-locked
// buffers and "iter <k> checksum <value>" is printed. At the end the host
// recomputes everything and compares.
//
// argv[1]: number of iterations (default 40). Pacing as in iterative.cu: with
// GPUPROXY_TEST_PACE=1 one stdin line is read before each iteration (EOF: run
// freely) and "step <k> done" is printed after iteration k.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

#define NAME "iterative_streams"
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

static const int kN = 1 << 16;
static const int kP = 256;

// x[i] = x[i] * 5 + p[i % 256] + k   (unsigned wrap-around)
__global__ void evolve_x(unsigned *x, const unsigned *p, int n, unsigned k)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        x[i] = x[i] * 5u + p[i & 255] + k;
}

// y[i] = (y[i] ^ (x[i] >> 3)) + (x[i] & 255)
__global__ void fold_y(unsigned *y, const unsigned *x, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        unsigned xi = x[i];
        y[i] = (y[i] ^ (xi >> 3)) + (xi & 255u);
    }
}

static unsigned param(int k, int j) { return (unsigned)((k * 37 + j * 11) % 101); }

static unsigned long long checksum(const unsigned *x, const unsigned *y)
{
    unsigned long long sx = 0, sy = 0;
    for (int i = 0; i < kN; ++i) {
        sx += x[i];
        sy += y[i];
    }
    return sx * 31ull + sy;
}

int main(int argc, char **argv)
{
    int iters = (argc > 1) ? atoi(argv[1]) : 40;
    if (iters <= 0) {
        printf("FAIL " NAME ": bad iteration count\n");
        return 1;
    }
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    const int pacing = pace_env && strcmp(pace_env, "1") == 0;
    int waiting = pacing;

    printf("n %d iterations %d\n", kN, iters);
    fflush(stdout);

    const size_t bytes = kN * sizeof(unsigned);
    unsigned *hx, *hy, *hp[2];
    CHECK(cudaMallocHost(&hx, bytes));
    CHECK(cudaMallocHost(&hy, bytes));
    CHECK(cudaMallocHost(&hp[0], kP * sizeof(unsigned)));
    CHECK(cudaMallocHost(&hp[1], kP * sizeof(unsigned)));
    unsigned *dx, *dy, *dp;
    CHECK(cudaMalloc(&dx, bytes));
    CHECK(cudaMalloc(&dy, bytes));
    CHECK(cudaMalloc(&dp, kP * sizeof(unsigned)));

    cudaStream_t s1, s2;
    CHECK(cudaStreamCreate(&s1));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t ex, ey, ep[2];
    CHECK(cudaEventCreateWithFlags(&ex, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&ey, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&ep[0], cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&ep[1], cudaEventDisableTiming));

    for (int i = 0; i < kN; ++i) hx[i] = (unsigned)i;
    CHECK(cudaMemcpyAsync(dx, hx, bytes, cudaMemcpyHostToDevice, s1));
    CHECK(cudaEventRecord(ep[0], s1));
    CHECK(cudaEventRecord(ep[1], s1));
    CHECK(cudaMemsetAsync(dy, 0, bytes, s2));
    CHECK(cudaEventRecord(ey, s2));
    CHECK(cudaStreamSynchronize(s1));       // hx is reused for downloads

    std::vector<unsigned long long> printed;
    for (int k = 1; k <= iters; ++k) {
        if (waiting) {
            char line[256];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        int b = k & 1;
        CHECK(cudaEventSynchronize(ep[b]));    // the upload that last used hp[b] is complete
        for (int j = 0; j < kP; ++j) hp[b][j] = param(k, j);
        CHECK(cudaMemcpyAsync(dp, hp[b], kP * sizeof(unsigned), cudaMemcpyHostToDevice, s1));
        CHECK(cudaEventRecord(ep[b], s1));
        CHECK(cudaStreamWaitEvent(s1, ey, 0)); // stream 2 is done reading X
        evolve_x<<<64, 256, 0, s1>>>(dx, dp, kN, (unsigned)k);
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(ex, s1));
        CHECK(cudaStreamWaitEvent(s2, ex, 0));
        fold_y<<<48, 256, 0, s2>>>(dy, dx, kN);
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(ey, s2));
        if (k % 10 == 0) {
            CHECK(cudaMemcpyAsync(hx, dx, bytes, cudaMemcpyDeviceToHost, s1));
            CHECK(cudaMemcpyAsync(hy, dy, bytes, cudaMemcpyDeviceToHost, s2));
            CHECK(cudaStreamSynchronize(s1));
            CHECK(cudaStreamSynchronize(s2));
            unsigned long long c = checksum(hx, hy);
            printed.push_back(c);
            printf("iter %d checksum %llu\n", k, c);
            fflush(stdout);
        }
        if (pacing) {
            CHECK(cudaStreamSynchronize(s1));
            CHECK(cudaStreamSynchronize(s2));
            printf("step %d done\n", k);
            fflush(stdout);
        }
    }
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(hx, dx, bytes, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hy, dy, bytes, cudaMemcpyDeviceToHost));

    // host reference
    std::vector<unsigned> x(kN), y(kN, 0u);
    for (int i = 0; i < kN; ++i) x[i] = (unsigned)i;
    size_t n_printed = 0;
    for (int k = 1; k <= iters; ++k) {
        for (int i = 0; i < kN; ++i) {
            x[i] = x[i] * 5u + param(k, i & 255) + (unsigned)k;
            y[i] = (y[i] ^ (x[i] >> 3)) + (x[i] & 255u);
        }
        if (k % 10 == 0) {
            if (n_printed >= printed.size() || printed[n_printed] != checksum(x.data(), y.data())) {
                printf("FAIL " NAME ": checksum of iteration %d differs from the host's\n", k);
                return 1;
            }
            ++n_printed;
        }
    }
    for (int i = 0; i < kN; ++i) {
        if (hx[i] != x[i] || hy[i] != y[i]) {
            printf("FAIL " NAME ": final state differs at %d\n", i);
            return 1;
        }
    }
    printf("final checksum %llu\n", checksum(hx, hy));

    CHECK(cudaEventDestroy(ex));
    CHECK(cudaEventDestroy(ey));
    CHECK(cudaEventDestroy(ep[0]));
    CHECK(cudaEventDestroy(ep[1]));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s2));
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
    CHECK(cudaFree(dp));
    CHECK(cudaFreeHost(hx));
    CHECK(cudaFreeHost(hy));
    CHECK(cudaFreeHost(hp[0]));
    CHECK(cudaFreeHost(hp[1]));
    printf("PASS " NAME "\n");
    fflush(stdout);
    return 0;
}
