// nccl_loop: a multi-rank NCCL job that runs long enough to be checkpointed
// in the middle (issue 22, part 4: the consistent cut). The launcher forks N
// ranks (each its own process, session and worker); rank 0 makes the unique
// id and hands it to the others through pipes. Each rank (device rank %
// GPUs) makes a communicator and a split by parity, then loops: read its
// vector back, mix in a rank- and step-dependent term on the host, write it
// back, all-reduce (sum) over everyone, and every third step all-reduce
// (max) over its parity group. The state lives in device memory between
// steps, so a restore that lost or altered it, or a cut between ranks at
// different steps, changes the result. Each rank sends its checksum to the
// launcher, which prints them in rank order and "DONE nccl_loop N".
// Rank 0 writes "step K" to stderr at each step (the test dumps mid-run),
// and with $NCCL_LOOP_GATE set every rank waits at two thirds for that file.
//
// With $NCCL_LOOP_GRAPH set, each of the two all-reduces is captured into a
// CUDA graph once and the steps launch those graphs instead (the cut must
// count the collectives of graph launches); the results are the same.
//
// argv: ranks (2), steps (40), microseconds rank 0 sleeps per step (20000).
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

static void run_rank(int n, int steps, int pace_us, int in_fd, const std::vector<int> &out_fds, int res_fd)
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
    ncclComm_t comm, sub;
    NK(ncclCommInitRank(&comm, n, id, rank));
    NK(ncclCommSplit(comm, rank % 2, rank, &sub, NULL));
    cudaStream_t s;
    CK(cudaStreamCreate(&s));
    const int N = 4096;
    std::vector<float> h(N);
    for (int i = 0; i < N; i++) h[i] = (float)(rank + 1) * 0.5f + (float)(i % 31);
    float *x;
    CK(cudaMalloc(&x, N * sizeof(float)));
    CK(cudaMemcpy(x, h.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    cudaGraphExec_t ar = NULL, ar_sub = NULL;
    if (getenv("NCCL_LOOP_GRAPH")) {
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        NK(ncclAllReduce(x, x, N, ncclFloat32, ncclSum, comm, s));
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&ar, g, 0));
        CK(cudaGraphDestroy(g));
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        NK(ncclAllReduce(x, x, N, ncclFloat32, ncclMax, sub, s));
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&ar_sub, g, 0));
        CK(cudaGraphDestroy(g));
    }
    for (int k = 0; k < steps; k++) {
        CK(cudaMemcpy(h.data(), x, N * sizeof(float), cudaMemcpyDeviceToHost));
        for (int i = 0; i < N; i++) h[i] = h[i] * 0.25f + 0.001f * (float)((rank + 1) * (k + 1)) + (float)(i % 7);
        CK(cudaMemcpy(x, h.data(), N * sizeof(float), cudaMemcpyHostToDevice));
        if (ar)
            CK(cudaGraphLaunch(ar, s));
        else
            NK(ncclAllReduce(x, x, N, ncclFloat32, ncclSum, comm, s));
        if (k % 3 == 2 && ar_sub)
            CK(cudaGraphLaunch(ar_sub, s));
        else if (k % 3 == 2)
            NK(ncclAllReduce(x, x, N, ncclFloat32, ncclMax, sub, s));
        CK(cudaStreamSynchronize(s));
        if (rank == 0) {
            fprintf(stderr, "step %d\n", k);
            fflush(stderr);
        }
        // only rank 0 is slow: the others wait inside their next
        // collective (their workers blocked there), which the cut must handle
        if (pace_us && rank == 0) usleep(pace_us);
        // $NCCL_LOOP_GATE: every rank waits at two thirds until that file
        // exists (a test's dump then surely comes before the end)
        const char *gate = getenv("NCCL_LOOP_GATE");
        if (gate && k == 2 * steps / 3)
            for (int w = 0; w < 12000 && access(gate, F_OK) != 0; w++) usleep(10000);
    }
    CK(cudaMemcpy(h.data(), x, N * sizeof(float), cudaMemcpyDeviceToHost));
    unsigned hash = 2166136261u;
    const unsigned char *b = (const unsigned char *)h.data();
    for (size_t i = 0; i < N * sizeof(float); i++) hash = (hash ^ b[i]) * 16777619u;
    double sum = 0;
    for (int i = 0; i < N; i++) sum += h[i];
    char line[128];
    int len = snprintf(line, sizeof line, "rank %d: %08x %.6f\n", rank, hash, sum);
    if (write(res_fd, line, len) != len) FAIL("write result");
    if (ar) {
        CK(cudaGraphExecDestroy(ar));
        CK(cudaGraphExecDestroy(ar_sub));
    }
    NK(ncclCommDestroy(sub));
    NK(ncclCommDestroy(comm));
    CK(cudaStreamDestroy(s));
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 2;
    int steps = argc > 2 ? atoi(argv[2]) : 40;
    int pace_us = argc > 3 ? atoi(argv[3]) : 20000;
    if (n < 1 || n > 64) { printf("FAIL ranks %d\n", n); return 1; }
    std::vector<int> rd(n), wr(n), res(n);
    for (int r = 0; r < n; r++) {
        int p[2], q[2];
        if (pipe(p) || pipe(q)) { perror("pipe"); return 1; }
        rd[r] = p[0];
        wr[r] = p[1];
        res[r] = q[0];
        rd.push_back(q[1]);     // the result pipe's write end, kept at index n + r
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
            run_rank(n, steps, pace_us, r ? rd[r] : -1, outs, rd[n + r]);
            _exit(0);
        }
        kids[r] = pid;
        close(rd[n + r]);
    }
    int bad = 0;
    for (int r = 0; r < n; r++) {
        char buf[128];
        ssize_t got = read(res[r], buf, sizeof buf - 1);
        int st = 0;
        waitpid(kids[r], &st, 0);
        if (got <= 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            printf("rank %d failed\n", r);
            bad = 1;
            continue;
        }
        buf[got] = 0;
        fputs(buf, stdout);
    }
    if (!bad) printf("DONE nccl_loop %d\n", n);
    return bad;
}
