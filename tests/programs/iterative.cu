// iterative: a long-running integer heat-diffusion loop whose state lives on
// the device (two 512x512 int32 ping-pong grids, a __device__ step counter and
// a device-memory table of the two grids' pointers). Checkpoint/restore tests
// checkpoint it while it runs; its output must not change.
//
// argv[1]: number of iterations (default 60). Every 10 iterations it prints
// "iter <k> checksum <value>" from a device-to-host copy; at the end the host
// recomputes everything and compares.
//
// Pacing (only when GPUPROXY_TEST_PACE=1): before each iteration one line is
// read from stdin (at EOF the program stops waiting and runs freely); after
// iteration k the device is synchronized and "step <k> done" is printed.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

#define NAME "iterative"
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

static const int W = 512;
static const int H = 512;

__device__ int step_counter = 0;

// one diffusion step with periodic boundaries and a fixed pattern of sources
__global__ void diffuse(const int *src, int *dst, int w, int h, int step)
{
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= w || y >= h) return;
    int xl = (x == 0) ? w - 1 : x - 1;
    int xr = (x == w - 1) ? 0 : x + 1;
    int yu = (y == 0) ? h - 1 : y - 1;
    int yd = (y == h - 1) ? 0 : y + 1;
    int v = (4 * src[y * w + x] + src[y * w + xl] + src[y * w + xr] + src[yu * w + x] + src[yd * w + x]) >> 3;
    if ((x * 7 + y * 13 + step) % 17 == 0)
        v += 100;
    dst[y * w + x] = v;
}

__global__ void bump_step()
{
    step_counter += 1;
}

// adds a pattern to row (step_counter % h) of grid table[which]
__global__ void inject(int *const *table, int which, int w, int h)
{
    int s = step_counter;
    int *grid = table[which];
    int row = s % h;
    for (int x = blockIdx.x * blockDim.x + threadIdx.x; x < w; x += blockDim.x * gridDim.x)
        grid[row * w + x] += (s * 3 + x) & 63;
}

static long long checksum(const int *g)
{
    long long s = 0;
    for (int i = 0; i < W * H; ++i) s += (long long)g[i] * (i % 7 + 1);
    return s;
}

// the same computation on the host
static void host_step(const std::vector<int> &src, std::vector<int> &dst, int k)
{
    for (int y = 0; y < H; ++y) {
        for (int x = 0; x < W; ++x) {
            int xl = (x == 0) ? W - 1 : x - 1;
            int xr = (x == W - 1) ? 0 : x + 1;
            int yu = (y == 0) ? H - 1 : y - 1;
            int yd = (y == H - 1) ? 0 : y + 1;
            int v = (4 * src[y * W + x] + src[y * W + xl] + src[y * W + xr] + src[yu * W + x] + src[yd * W + x]) >> 3;
            if ((x * 7 + y * 13 + k) % 17 == 0) v += 100;
            dst[y * W + x] = v;
        }
    }
    int row = k % H;
    for (int x = 0; x < W; ++x) dst[row * W + x] += (k * 3 + x) & 63;
}

int main(int argc, char **argv)
{
    int iters = (argc > 1) ? atoi(argv[1]) : 60;
    if (iters <= 0) {
        printf("FAIL " NAME ": bad iteration count\n");
        return 1;
    }
    const char *pace_env = getenv("GPUPROXY_TEST_PACE");
    const int pacing = pace_env && strcmp(pace_env, "1") == 0;
    int waiting = pacing;

    printf("grid %dx%d iterations %d\n", W, H, iters);
    fflush(stdout);

    const size_t bytes = (size_t)W * H * sizeof(int);
    std::vector<int> init(W * H), host(W * H);
    for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x) init[y * W + x] = (x * 31 + y * 17) % 1000;

    int *grids[2];
    CHECK(cudaMalloc(&grids[0], bytes));
    CHECK(cudaMalloc(&grids[1], bytes));
    CHECK(cudaMemcpy(grids[0], init.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(grids[1], 0, bytes));
    int **d_table;
    CHECK(cudaMalloc(&d_table, 2 * sizeof(int *)));
    CHECK(cudaMemcpy(d_table, grids, 2 * sizeof(int *), cudaMemcpyHostToDevice));
    int zero = 0;
    CHECK(cudaMemcpyToSymbol(step_counter, &zero, sizeof zero));

    std::vector<long long> printed;
    const dim3 block(16, 16);
    const dim3 grid((W + 15) / 16, (H + 15) / 16);
    int cur = 0;
    for (int k = 1; k <= iters; ++k) {
        if (waiting) {
            char line[256];
            if (!fgets(line, sizeof line, stdin)) waiting = 0;
        }
        diffuse<<<grid, block>>>(grids[cur], grids[1 - cur], W, H, k);
        CHECK(cudaGetLastError());
        bump_step<<<1, 1>>>();
        CHECK(cudaGetLastError());
        inject<<<2, 256>>>(d_table, 1 - cur, W, H);
        CHECK(cudaGetLastError());
        cur = 1 - cur;
        if (k % 10 == 0) {
            CHECK(cudaMemcpy(host.data(), grids[cur], bytes, cudaMemcpyDeviceToHost));
            long long c = checksum(host.data());
            printed.push_back(c);
            printf("iter %d checksum %lld\n", k, c);
            fflush(stdout);
        }
        if (pacing) {
            CHECK(cudaDeviceSynchronize());
            printf("step %d done\n", k);
            fflush(stdout);
        }
    }

    CHECK(cudaMemcpy(host.data(), grids[cur], bytes, cudaMemcpyDeviceToHost));
    int steps = -1;
    CHECK(cudaMemcpyFromSymbol(&steps, step_counter, sizeof steps));

    // host reference
    std::vector<int> a = init, b(W * H);
    size_t n_printed = 0;
    for (int k = 1; k <= iters; ++k) {
        host_step(a, b, k);
        a.swap(b);
        if (k % 10 == 0) {
            if (n_printed >= printed.size() || printed[n_printed] != checksum(a.data())) {
                printf("FAIL " NAME ": checksum of iteration %d differs from the host's\n", k);
                return 1;
            }
            ++n_printed;
        }
    }
    if (steps != iters) {
        printf("FAIL " NAME ": step counter %d, expected %d\n", steps, iters);
        return 1;
    }
    for (int i = 0; i < W * H; ++i) {
        if (host[i] != a[i]) {
            printf("FAIL " NAME ": final grid differs at %d: got %d want %d\n", i, host[i], a[i]);
            return 1;
        }
    }
    printf("final step_counter %d\n", steps);
    printf("final checksum %lld\n", checksum(host.data()));

    CHECK(cudaFree(grids[0]));
    CHECK(cudaFree(grids[1]));
    CHECK(cudaFree(d_table));
    printf("PASS " NAME "\n");
    fflush(stdout);
    return 0;
}
