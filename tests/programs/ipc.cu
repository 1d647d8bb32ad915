// ipc: CUDA IPC between two processes of one host (issue 10, group 8). The
// program forks before any CUDA call; the parent allocates device memory,
// fills it, exports it with cudaIpcGetMemHandle and sends the handle through
// a pipe with an interprocess event's handle (cudaIpcGetEventHandle); the
// child opens both, checks what the parent wrote, adds to every element with
// a kernel, records the shared event and tells the parent, which waits on
// the event (not on the child) and checks the child's writes in its own
// allocation. Under gpuproxy the two processes are two sessions in two
// worker processes of the same proxyd.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <sys/wait.h>
#include <unistd.h>
#include <cuda_runtime.h>

#define NAME "ipc"
#define CHECK(call)                                                             \
    do {                                                                        \
        cudaError_t err_ = (call);                                              \
        if (err_ != cudaSuccess) {                                              \
            printf("FAIL " NAME " (%s): %s -> %s (%s) at %s:%d\n", who, #call,  \
                   cudaGetErrorName(err_), cudaGetErrorString(err_),            \
                   __FILE__, __LINE__);                                         \
            fflush(stdout);                                                     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)
#define EXPECT(cond, ...)                                                       \
    do {                                                                        \
        if (!(cond)) {                                                          \
            printf("FAIL " NAME " (%s): ", who);                                \
            printf(__VA_ARGS__);                                                \
            printf("\n");                                                       \
            fflush(stdout);                                                     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

static const int N = 1 << 18;
static const char *who = "parent";

// x[i] = x[i] + add
__global__ void add_const(int *x, int n, int add)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += add;
}

static void read_all(int fd, void *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)p + got, n - got);
        EXPECT(r > 0, "pipe closed");
        got += (size_t)r;
    }
}

static int child(int from_parent, int to_parent)
{
    who = "child";
    cudaIpcMemHandle_t h;
    read_all(from_parent, &h, sizeof h);
    cudaIpcEventHandle_t eh;
    read_all(from_parent, &eh, sizeof eh);
    int *p = NULL;
    CHECK(cudaIpcOpenMemHandle((void **)&p, h, cudaIpcMemLazyEnablePeerAccess));
    cudaEvent_t done;
    CHECK(cudaIpcOpenEventHandle(&done, eh));
    std::vector<int> v(N);
    CHECK(cudaMemcpy(v.data(), p, N * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; ++i)
        EXPECT(v[i] == 3 * i + 1, "element %d is %d before the child's kernel, want %d", i, v[i], 3 * i + 1);
    add_const<<<(N + 255) / 256, 256>>>(p, N, 1000);
    CHECK(cudaGetLastError());
    // the parent learns that the kernel is done from the shared event, not
    // from this process: it waits on the event once told it was recorded
    CHECK(cudaEventRecord(done, 0));
    char ok = 'k';
    EXPECT(write(to_parent, &ok, 1) == 1, "pipe write");
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaEventDestroy(done));
    CHECK(cudaIpcCloseMemHandle(p));
    return 0;
}

int main(void)
{
    int p2c[2], c2p[2];
    if (pipe(p2c) != 0 || pipe(c2p) != 0) {
        printf("FAIL " NAME ": pipe\n");
        return 1;
    }
    fflush(stdout);
    pid_t pid = fork();     // before any CUDA call, as CUDA requires
    if (pid < 0) {
        printf("FAIL " NAME ": fork\n");
        return 1;
    }
    if (pid == 0) {
        close(p2c[1]);
        close(c2p[0]);
        _exit(child(p2c[0], c2p[1]));
    }
    close(p2c[0]);
    close(c2p[1]);

    int *d = NULL;
    CHECK(cudaMalloc((void **)&d, N * sizeof(int)));
    std::vector<int> v(N);
    for (int i = 0; i < N; ++i)
        v[i] = 3 * i + 1;
    CHECK(cudaMemcpy(d, v.data(), N * sizeof(int), cudaMemcpyHostToDevice));
    cudaIpcMemHandle_t h;
    CHECK(cudaIpcGetMemHandle(&h, d));
    cudaEvent_t done;
    CHECK(cudaEventCreateWithFlags(&done, cudaEventInterprocess | cudaEventDisableTiming));
    cudaIpcEventHandle_t eh;
    CHECK(cudaIpcGetEventHandle(&eh, done));
    EXPECT(write(p2c[1], &h, sizeof h) == (ssize_t)sizeof h, "pipe write");
    EXPECT(write(p2c[1], &eh, sizeof eh) == (ssize_t)sizeof eh, "pipe write");
    char ok = 0;
    EXPECT(read(c2p[0], &ok, 1) == 1 && ok == 'k', "the child did not record its event");
    CHECK(cudaEventSynchronize(done));      // the child's kernel has completed
    CHECK(cudaMemcpy(v.data(), d, N * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; ++i)
        EXPECT(v[i] == 3 * i + 1 + 1000, "element %d is %d once the shared event completed, want %d", i, v[i],
               3 * i + 1 + 1000);
    printf("shared event signalled the child's kernel\n");
    int status = 0;
    EXPECT(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed");
    printf("child opened the handle and wrote through it\n");

    CHECK(cudaMemcpy(v.data(), d, N * sizeof(int), cudaMemcpyDeviceToHost));
    long long sum = 0;
    for (int i = 0; i < N; ++i) {
        EXPECT(v[i] == 3 * i + 1 + 1000, "element %d is %d after the child's kernel, want %d", i, v[i],
               3 * i + 1 + 1000);
        sum += v[i];
    }
    // the parent's own kernel on the same memory still works
    add_const<<<(N + 255) / 256, 256>>>(d, N, 1);
    CHECK(cudaMemcpy(v.data(), d, N * sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT(v[N - 1] == 3 * (N - 1) + 1 + 1001, "parent kernel");
    printf("sum %lld\n", sum);
    CHECK(cudaEventDestroy(done));
    CHECK(cudaFree(d));
    printf("PASS " NAME "\n");
    return 0;
}
