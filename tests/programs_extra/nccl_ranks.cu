// nccl_ranks: N processes (ranks) of one NCCL job (issue 22): the launcher
// forks N ranks before any CUDA call; rank 0 makes the unique id and hands
// it to the others through pipes. Each rank (device rank % GPUs) creates the
// communicator and checks, against values it computes itself: ncclAllReduce
// (int32 sum, float32 max), ncclAllGather, ncclBroadcast, ncclReduceScatter,
// a ring of ncclSend/ncclRecv in a group, and ncclCommSplit by parity
// (reversed keys) with an all-reduce on the new communicator, and an
// all-reduce captured into a CUDA graph launched twice. The launcher
// prints one line per rank in rank order, then "PASS nccl_ranks N".
//
// argv[1]: ranks (default 2).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <sys/wait.h>
#include <unistd.h>
#include <cuda_runtime.h>
#include "nccl_decls.h"

#define FAIL(...) do { fprintf(stderr, "rank %d: ", rank); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); \
    _exit(1); } while (0)
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) FAIL("%s -> %s", #x, cudaGetErrorName(e_)); } while (0)
#define NK(x) do { ncclResult_t r_ = (x); if (r_ != ncclSuccess) FAIL("%s -> %d (%s)", #x, (int)r_, \
    ncclGetErrorString(r_)); } while (0)

static int rank;

template <typename T> static std::vector<T> get(const T *d, size_t n)
{
    std::vector<T> h(n);
    CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

template <typename T> static T *put(const std::vector<T> &h)
{
    T *d;
    CK(cudaMalloc(&d, h.size() * sizeof(T)));
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

static void run_rank(int n, int in_fd, const std::vector<int> &out_fds)
{
    int ndev = 0;
    CK(cudaGetDeviceCount(&ndev));
    CK(cudaSetDevice(rank % ndev));
    ncclUniqueId id;
    if (rank == 0) {
        NK(ncclGetUniqueId(&id));
        for (int fd : out_fds)
            if (write(fd, &id, sizeof id) != (ssize_t)sizeof id) FAIL("write id");
    } else if (read(in_fd, &id, sizeof id) != (ssize_t)sizeof id) {
        FAIL("read id");
    }
    ncclComm_t comm;
    NK(ncclCommInitRank(&comm, n, id, rank));
    int cnt = -1, me = -1, dev = -1;
    NK(ncclCommCount(comm, &cnt));
    NK(ncclCommUserRank(comm, &me));
    NK(ncclCommCuDevice(comm, &dev));
    if (cnt != n || me != rank || dev != rank % ndev) FAIL("count %d rank %d device %d", cnt, me, dev);
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    const int N = 1000;

    // all-reduce, int32 sum: x_r[i] = 1000 (r + 1) + i
    std::vector<int> xi(N);
    for (int i = 0; i < N; i++) xi[i] = 1000 * (rank + 1) + i;
    int *si = put(xi), *ri;
    CK(cudaMalloc(&ri, N * sizeof(int)));
    NK(ncclAllReduce(si, ri, N, ncclInt32, ncclSum, comm, s));
    // float32 max: y_r[i] = (i % 7 == r % 7) ? 100 + r : r - i
    std::vector<float> xf(N);
    for (int i = 0; i < N; i++) xf[i] = (i % 7 == rank % 7) ? 100.0f + rank : (float)(rank - i);
    float *sf = put(xf), *rf;
    CK(cudaMalloc(&rf, N * sizeof(float)));
    NK(ncclAllReduce(sf, rf, N, ncclFloat32, ncclMax, comm, s));
    CK(cudaStreamSynchronize(s));
    std::vector<int> gi = get(ri, N);
    std::vector<float> gf = get(rf, N);
    for (int i = 0; i < N; i++) {
        int want = 1000 * n * (n + 1) / 2 + n * i;
        if (gi[i] != want) FAIL("allreduce sum [%d] = %d, expected %d", i, gi[i], want);
        float wf = -1e30f;
        for (int r = 0; r < n; r++) {
            float v = (i % 7 == r % 7) ? 100.0f + r : (float)(r - i);
            if (v > wf) wf = v;
        }
        if (gf[i] != wf) FAIL("allreduce max [%d] = %g, expected %g", i, gf[i], wf);
    }

    // all-gather: 8 values r * 100 + i from each rank
    std::vector<int> part(8);
    for (int i = 0; i < 8; i++) part[i] = rank * 100 + i;
    int *sp = put(part), *gather;
    CK(cudaMalloc(&gather, 8 * n * sizeof(int)));
    NK(ncclAllGather(sp, gather, 8, ncclInt32, comm, s));
    CK(cudaStreamSynchronize(s));
    std::vector<int> g = get(gather, 8 * n);
    for (int r = 0; r < n; r++)
        for (int i = 0; i < 8; i++)
            if (g[r * 8 + i] != r * 100 + i) FAIL("allgather [%d][%d] = %d", r, i, g[r * 8 + i]);

    // broadcast from the last rank, in place on the others' buffers
    int root = n - 1;
    std::vector<int> b(N);
    for (int i = 0; i < N; i++) b[i] = rank == root ? 7 * i + root : -1;
    int *bd = put(b);
    NK(ncclBroadcast(bd, bd, N, ncclInt32, root, comm, s));
    CK(cudaStreamSynchronize(s));
    b = get(bd, N);
    for (int i = 0; i < N; i++)
        if (b[i] != 7 * i + root) FAIL("broadcast [%d] = %d", i, b[i]);

    // reduce-scatter: rank r contributes (r + 1) * (j + 1) for j < 16 n
    const int R = 16;
    std::vector<int> rs(R * n);
    for (int j = 0; j < R * n; j++) rs[j] = (rank + 1) * (j + 1);
    int *rsd = put(rs), *rso;
    CK(cudaMalloc(&rso, R * sizeof(int)));
    NK(ncclReduceScatter(rsd, rso, R, ncclInt32, ncclSum, comm, s));
    CK(cudaStreamSynchronize(s));
    std::vector<int> rg = get(rso, R);
    for (int k = 0; k < R; k++)
        if (rg[k] != n * (n + 1) / 2 * (rank * R + k + 1)) FAIL("reducescatter [%d] = %d", k, rg[k]);

    // a ring: receive from the left, send to the right, in one group
    std::vector<int> ring(64);
    for (int i = 0; i < 64; i++) ring[i] = rank * 10 + i;
    int *snd = put(ring), *rcv;
    CK(cudaMalloc(&rcv, 64 * sizeof(int)));
    int left = (rank + n - 1) % n, right = (rank + 1) % n;
    NK(ncclGroupStart());
    NK(ncclRecv(rcv, 64, ncclInt32, left, comm, s));
    NK(ncclSend(snd, 64, ncclInt32, right, comm, s));
    NK(ncclGroupEnd());
    CK(cudaStreamSynchronize(s));
    std::vector<int> rr = get(rcv, 64);
    for (int i = 0; i < 64; i++)
        if (rr[i] != left * 10 + i) FAIL("recv [%d] = %d from rank %d", i, rr[i], left);

    // split by parity, keys reversed: new ranks count down
    ncclComm_t sub;
    NK(ncclCommSplit(comm, rank % 2, -rank, &sub, NULL));
    int scnt = 0, srank = -1;
    NK(ncclCommCount(sub, &scnt));
    NK(ncclCommUserRank(sub, &srank));
    int same = 0, above = 0;
    for (int r = 0; r < n; r++)
        if (r % 2 == rank % 2) {
            same++;
            if (r > rank) above++;
        }
    if (scnt != same || srank != above) FAIL("split: %d ranks, rank %d (expected %d, %d)", scnt, srank, same, above);
    std::vector<int> one(4, rank);
    int *od = put(one), *os;
    CK(cudaMalloc(&os, 4 * sizeof(int)));
    NK(ncclAllReduce(od, os, 4, ncclInt32, ncclSum, sub, s));
    CK(cudaStreamSynchronize(s));
    int wsum = 0;
    for (int r = rank % 2; r < n; r += 2) wsum += r;
    if (get(os, 4)[3] != wsum) FAIL("split allreduce = %d, expected %d", get(os, 4)[3], wsum);
    // pre-multiplied sums (FSDP's averaging): a host scalar 0.5 on float32,
    // a device scalar 3 on int32
    ncclRedOp_t half_sum, triple_sum;
    float half = 0.5f;
    NK(ncclRedOpCreatePreMulSum(&half_sum, &half, ncclFloat32, ncclScalarHostImmediate, comm));
    std::vector<int> three(1, 3);
    int *three_d = put(three);
    NK(ncclRedOpCreatePreMulSum(&triple_sum, three_d, ncclInt32, ncclScalarDevice, comm));
    std::vector<float> pf(16, (float)(rank + 1));
    float *pfd = put(pf);
    std::vector<int> pi(16, rank + 1);
    int *pid = put(pi);
    NK(ncclAllReduce(pfd, pfd, 16, ncclFloat32, half_sum, comm, s));
    NK(ncclAllReduce(pid, pid, 16, ncclInt32, triple_sum, comm, s));
    CK(cudaStreamSynchronize(s));
    if (get(pfd, 16)[15] != 0.5f * n * (n + 1) / 2) FAIL("premul float = %g", get(pfd, 16)[15]);
    if (get(pid, 16)[15] != 3 * n * (n + 1) / 2) FAIL("premul int = %d", get(pid, 16)[15]);
    NK(ncclRedOpDestroy(half_sum, comm));
    NK(ncclRedOpDestroy(triple_sum, comm));

    // an all-reduce captured into a CUDA graph (PyTorch's CUDA graphs),
    // launched twice: in place, so the second launch reduces the first's sums
    std::vector<int> gx(32, rank + 1);
    int *gd = put(gx);
    cudaStream_t cs;
    CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
    NK(ncclAllReduce(gd, gd, 32, ncclInt32, ncclSum, comm, cs));
    CK(cudaStreamEndCapture(cs, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int l = 0; l < 2; l++)
        CK(cudaGraphLaunch(exec, cs));
    CK(cudaStreamSynchronize(cs));
    int once = n * (n + 1) / 2;
    if (get(gd, 32)[31] != n * once) FAIL("graph all-reduce = %d, expected %d", get(gd, 32)[31], n * once);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(cs));
    ncclResult_t ae = ncclInProgress;
    NK(ncclCommGetAsyncError(comm, &ae));
    if (ae != ncclSuccess) FAIL("async error %d", (int)ae);
    NK(ncclCommDestroy(sub));
    NK(ncclCommDestroy(comm));
    CK(cudaStreamDestroy(s));
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 2;
    if (n < 1 || n > 64) { printf("FAIL ranks %d\n", n); return 1; }
    std::vector<int> rd(n), wr(n);
    for (int r = 1; r < n; r++) {
        int p[2];
        if (pipe(p)) { perror("pipe"); return 1; }
        rd[r] = p[0];
        wr[r] = p[1];
    }
    fflush(stdout);
    std::vector<pid_t> kids(n);
    for (int r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); return 1; }
        if (pid == 0) {
            rank = r;
            std::vector<int> outs;
            if (r == 0)
                for (int q = 1; q < n; q++) outs.push_back(wr[q]);
            run_rank(n, r ? rd[r] : -1, outs);
            _exit(0);
        }
        kids[r] = pid;
    }
    int bad = 0;
    for (int r = 0; r < n; r++) {
        int st = 0;
        waitpid(kids[r], &st, 0);
        int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        printf("rank %d %s\n", r, ok ? "ok" : "FAILED");
        bad |= !ok;
    }
    if (!bad) printf("PASS nccl_ranks %d\n", n);
    return bad;
}
