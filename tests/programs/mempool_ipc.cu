// mempool_ipc: exportable memory pools between two processes (issue 10),
// the way NVIDIA's streamOrderedAllocationIPC sample uses them. The program
// forks before any CUDA call. The parent creates two pools with
// handleTypes = cudaMemHandleTypePosixFileDescriptor, allocates from each
// (cudaMallocFromPoolAsync), fills the allocations, exports both pools
// (cudaMemPoolExportToShareableHandle: file descriptors) and both pointers
// (cudaMemPoolExportPointer), and sends the descriptors over a Unix socket
// with SCM_RIGHTS and the export data as bytes. The child imports the pools
// from the descriptors it received (other numbers than the parent's), tries
// every pointer with every pool (only the matching pairs may import, as the
// sample relies on), checks the parent's data, changes it with a kernel,
// frees its imports (cudaFreeAsync) and tells the parent, which checks the
// child's writes in its own allocations. Under gpuproxy the two processes
// are two sessions in two worker processes of the same proxyd.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cuda_runtime.h>

#define NAME "mempool_ipc"
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

static const int N = 1 << 16;       // ints per allocation
static const int NP = 2;            // pools
static const char *who = "parent";

// x[i] = x[i] * mul + add
__global__ void pool_scale_add(int *x, int n, int mul, int add)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = x[i] * mul + add;
}

static int value(int pool, int i) { return (pool + 1) * 100000 + i; }

// sends n descriptors and len bytes in one message (SCM_RIGHTS)
static void send_fds(int sock, const int *fds, int n, const void *data, size_t len)
{
    struct msghdr m;
    memset(&m, 0, sizeof m);
    struct iovec io = {(void *)data, len};
    m.msg_iov = &io;
    m.msg_iovlen = 1;
    std::vector<char> ctl(CMSG_SPACE(sizeof(int) * n));
    m.msg_control = ctl.data();
    m.msg_controllen = ctl.size();
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * n);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
    EXPECT(sendmsg(sock, &m, 0) == (ssize_t)len, "sendmsg");
}

static void recv_fds(int sock, int *fds, int n, void *data, size_t len)
{
    struct msghdr m;
    memset(&m, 0, sizeof m);
    struct iovec io = {data, len};
    m.msg_iov = &io;
    m.msg_iovlen = 1;
    std::vector<char> ctl(CMSG_SPACE(sizeof(int) * n));
    m.msg_control = ctl.data();
    m.msg_controllen = ctl.size();
    EXPECT(recvmsg(sock, &m, MSG_WAITALL) == (ssize_t)len, "recvmsg");
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    EXPECT(c && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int) * n), "no descriptors received");
    memcpy(fds, CMSG_DATA(c), sizeof(int) * n);
}

static int child(int sock)
{
    who = "child";
    int fds[NP];
    cudaMemPoolPtrExportData data[NP];
    recv_fds(sock, fds, NP, data, sizeof data);
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaMemPool_t pools[NP];
    int *ptrs[NP] = {nullptr, nullptr};
    for (int p = 0; p < NP; ++p) {
        struct stat sb;
        EXPECT(fstat(fds[p], &sb) == 0, "received descriptor %d is not open", fds[p]);
        CHECK(cudaMemPoolImportFromShareableHandle(&pools[p], (void *)(intptr_t)fds[p],
                                                   cudaMemHandleTypePosixFileDescriptor, 0));
        EXPECT(close(fds[p]) == 0, "close");      // the pool stays imported
        cudaMemLocation loc = {cudaMemLocationTypeDevice, 0};
        cudaMemAccessFlags fl;
        CHECK(cudaMemPoolGetAccess(&fl, pools[p], &loc));
        EXPECT(fl == cudaMemAccessFlagsProtReadWrite, "imported pool access %d", (int)fl);
        // every pointer with this pool: only the pointer of this pool imports
        int imported = 0;
        for (int q = 0; q < NP; ++q) {
            void *ptr = nullptr;
            cudaError_t e = cudaMemPoolImportPointer(&ptr, pools[p], &data[q]);
            if (q == p) {
                CHECK(e);
                ptrs[p] = (int *)ptr;
                imported++;
            } else {
                EXPECT(e != cudaSuccess, "pointer of pool %d imported through pool %d", q, p);
                cudaGetLastError();
            }
        }
        EXPECT(imported == 1, "pool %d: %d pointers imported", p, imported);
    }
    std::vector<int> v(N);
    for (int p = 0; p < NP; ++p) {
        CHECK(cudaMemcpyAsync(v.data(), ptrs[p], N * sizeof(int), cudaMemcpyDeviceToHost, st));
        CHECK(cudaStreamSynchronize(st));
        for (int i = 0; i < N; ++i)
            EXPECT(v[i] == value(p, i), "pool %d element %d is %d, want %d", p, i, v[i], value(p, i));
        pool_scale_add<<<(N + 255) / 256, 256, 0, st>>>(ptrs[p], N, 2, p + 1);
        CHECK(cudaGetLastError());
    }
    CHECK(cudaStreamSynchronize(st));
    // the importer frees its imports before the exporter frees the memory
    for (int p = 0; p < NP; ++p)
        CHECK(cudaFreeAsync(ptrs[p], st));
    CHECK(cudaStreamSynchronize(st));
    for (int p = 0; p < NP; ++p)
        CHECK(cudaMemPoolDestroy(pools[p]));
    CHECK(cudaStreamDestroy(st));
    char ok = 'k';
    EXPECT(write(sock, &ok, 1) == 1, "socket write");
    return 0;
}

int main(void)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        printf("FAIL " NAME ": socketpair\n");
        return 1;
    }
    fflush(stdout);
    pid_t pid = fork();     // before any CUDA call, as CUDA requires
    if (pid < 0) {
        printf("FAIL " NAME ": fork\n");
        return 1;
    }
    if (pid == 0) {
        close(sv[0]);
        _exit(child(sv[1]));
    }
    close(sv[1]);

    int types = 0;
    CHECK(cudaDeviceGetAttribute(&types, cudaDevAttrMemoryPoolSupportedHandleTypes, 0));
    EXPECT(types & cudaMemHandleTypePosixFileDescriptor, "supported pool handle types %d", types);
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaMemPool_t pools[NP];
    int *ptrs[NP];
    int fds[NP];
    cudaMemPoolPtrExportData data[NP];
    std::vector<int> v(N);
    for (int p = 0; p < NP; ++p) {
        cudaMemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = cudaMemAllocationTypePinned;
        props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = 0;
        CHECK(cudaMemPoolCreate(&pools[p], &props));
        CHECK(cudaMallocFromPoolAsync((void **)&ptrs[p], N * sizeof(int), pools[p], st));
        for (int i = 0; i < N; ++i)
            v[i] = value(p, i);
        CHECK(cudaMemcpyAsync(ptrs[p], v.data(), N * sizeof(int), cudaMemcpyHostToDevice, st));
        CHECK(cudaStreamSynchronize(st));
        fds[p] = -1;
        CHECK(cudaMemPoolExportToShareableHandle(&fds[p], pools[p], cudaMemHandleTypePosixFileDescriptor, 0));
        EXPECT(fds[p] >= 0, "pool %d: descriptor %d", p, fds[p]);
        memset(&data[p], 0, sizeof data[p]);
        CHECK(cudaMemPoolExportPointer(&data[p], ptrs[p]));
    }
    // a pool created without handle types cannot be exported
    {
        cudaMemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        cudaMemPool_t plain;
        CHECK(cudaMemPoolCreate(&plain, &props));
        int fd = -1;
        EXPECT(cudaMemPoolExportToShareableHandle(&fd, plain, cudaMemHandleTypePosixFileDescriptor, 0) != cudaSuccess,
               "a pool without handle types was exported");
        cudaGetLastError();
        CHECK(cudaMemPoolDestroy(plain));
    }
    send_fds(sv[0], fds, NP, data, sizeof data);
    for (int p = 0; p < NP; ++p)
        EXPECT(close(fds[p]) == 0, "close");
    printf("pools and pointers exported\n");
    char ok = 0;
    EXPECT(read(sv[0], &ok, 1) == 1 && ok == 'k', "the child did not finish");
    int status = 0;
    EXPECT(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed");
    printf("child imported both pools and wrote through them\n");
    long long sum = 0;
    for (int p = 0; p < NP; ++p) {
        CHECK(cudaMemcpyAsync(v.data(), ptrs[p], N * sizeof(int), cudaMemcpyDeviceToHost, st));
        CHECK(cudaStreamSynchronize(st));
        for (int i = 0; i < N; ++i) {
            EXPECT(v[i] == 2 * value(p, i) + p + 1, "pool %d element %d is %d after the child, want %d", p, i, v[i],
                   2 * value(p, i) + p + 1);
            sum += v[i];
        }
        CHECK(cudaFreeAsync(ptrs[p], st));
    }
    CHECK(cudaStreamSynchronize(st));
    for (int p = 0; p < NP; ++p)
        CHECK(cudaMemPoolDestroy(pools[p]));
    CHECK(cudaStreamDestroy(st));
    printf("sum %lld\n", sum);
    printf("PASS " NAME "\n");
    return 0;
}
