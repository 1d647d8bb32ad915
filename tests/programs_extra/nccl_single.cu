// nccl_single: one rank, for the parts of the stand-in the multi-rank test
// does not reach: a nonblocking communicator (ncclCommInitRankConfig with
// blocking = 0: ncclInProgress, then the application polls
// ncclCommGetAsyncError), a collective on it, ncclCommSplit with
// NCCL_SPLIT_NOCOLOR (a NULL communicator), errors of bad arguments, and --
// with argv[1] "wait" -- a pause while the communicator is alive ("ready",
// then one stdin line) so that a test can try to checkpoint the session.
#include <cstdio>
#include <cstring>
#include <cstddef>
#include <cuda_runtime.h>
#include "nccl_decls.h"

// nccl.h (nvidia-nccl-cu13 2.32.3): the whole structure. NCCL reads every
// field its `version` names, so a shorter structure with version 23203 had
// NCCL read past its end (a segfault natively, H200, 2026-11-27).
struct ncclConfig_v23100 {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
    int splitShare;
    int trafficClass;
    const char *commName;
    int collnetEnable;
    int CTAPolicy;
    int shrinkShare;
    int nvlsCTAs;
    int nChannelsPerNetPeer;
    int nvlinkCentricSched;
    int graphUsageMode;
    int numRmaCtx;
    int maxP2pPeers;
    int graphStreamOrdering;
    int launchOrderImplicit;
    int numRmaSig;
    int rmaEagerInit;
    int hostCftMode;
    int nvlsHostMode;
};

#define NK(x) do { ncclResult_t r_ = (x); if (r_ != ncclSuccess) { printf("FAIL %s -> %d\n", #x, (int)r_); \
    return 1; } } while (0)

int main(int argc, char **argv)
{
    cudaSetDevice(0);
    ncclUniqueId id;
    NK(ncclGetUniqueId(&id));
    ncclConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.size = sizeof cfg;
    cfg.magic = 0xcafebeef;
    cfg.version = 23203;
    // NCCL_CONFIG_INITIALIZER: every attribute undefined (INT_MIN, NULL), then ours
    int *attrs[] = {&cfg.cgaClusterSize, &cfg.minCTAs, &cfg.maxCTAs, &cfg.splitShare, &cfg.trafficClass,
                    &cfg.collnetEnable, &cfg.CTAPolicy, &cfg.shrinkShare, &cfg.nvlsCTAs, &cfg.nChannelsPerNetPeer,
                    &cfg.nvlinkCentricSched, &cfg.graphUsageMode, &cfg.numRmaCtx, &cfg.maxP2pPeers,
                    &cfg.graphStreamOrdering, &cfg.launchOrderImplicit, &cfg.numRmaSig, &cfg.rmaEagerInit,
                    &cfg.hostCftMode, &cfg.nvlsHostMode};
    for (int *a : attrs) *a = (int)0x80000000;
    cfg.netName = cfg.commName = NULL;
    cfg.blocking = 0;
    ncclComm_t comm;
    ncclResult_t r = ncclCommInitRankConfig(&comm, 1, id, 0, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) { printf("FAIL init %d\n", (int)r); return 1; }
    int polls = 0;
    ncclResult_t st = ncclInProgress;
    while (st == ncclInProgress) {
        NK(ncclCommGetAsyncError(comm, &st));
        polls++;
    }
    printf("nonblocking init: %d\n", (int)st);
    int *d;
    cudaMalloc(&d, 16 * sizeof(int));
    int h[16];
    for (int i = 0; i < 16; i++) h[i] = i * i;
    cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
    r = ncclAllReduce(d, d, 16, ncclInt32, ncclSum, comm, 0);    // may be in progress (nonblocking)
    for (st = r; st == ncclInProgress;)
        NK(ncclCommGetAsyncError(comm, &st));
    if (st != ncclSuccess) { printf("FAIL all-reduce %d\n", (int)st); return 1; }
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    int ok = 1;
    for (int i = 0; i < 16; i++) ok &= h[i] == i * i;
    printf("one-rank all-reduce: %s\n", ok ? "ok" : "WRONG");
    ncclComm_t none = (ncclComm_t)1;
    ncclConfig_t blocking = cfg;
    blocking.blocking = 1;
    // NCCL_SPLIT_NOCOLOR. The parent is nonblocking, so the split is a job
    // of a nonblocking group whatever the new communicator's config says
    // (NCCL src/group.cc): ncclCommSplit answers ncclSuccess and the parent
    // is ncclInProgress until the split is done; the application polls it
    // before using the parent again (ncclCommDestroy of a parent still in
    // progress is ncclInvalidArgument: src/init.cc ncclCommEnsureReady).
    r = ncclCommSplit(comm, -1, 0, &none, &blocking);
    printf("no-color split on a nonblocking parent: %d\n", (int)r);
    for (st = ncclInProgress; st == ncclInProgress;)
        NK(ncclCommGetAsyncError(comm, &st));
    printf("parent after the split: %d\n", (int)st);
    printf("no-color split gives %s\n", none ? "a communicator" : "NULL");
    ncclComm_t bad;
    printf("rank 3 of 2: %d\n", (int)ncclCommInitRank(&bad, 2, id, 3));
    // a blocking communicator polled as PyTorch's watchdog polls it (at
    // every collective): no error, every time
    ncclUniqueId id2;
    NK(ncclGetUniqueId(&id2));
    ncclComm_t bc;
    NK(ncclCommInitRank(&bc, 1, id2, 0));
    int fine = 0;
    for (int i = 0; i < 2000; i++) {
        ncclResult_t e = ncclInProgress;       // overwritten by the call
        NK(ncclCommGetAsyncError(bc, &e));
        fine += e == ncclSuccess;
    }
    printf("blocking communicator polled 2000 times: %d without error\n", fine);
    NK(ncclCommDestroy(bc));
    if (argc > 1 && strcmp(argv[1], "wait") == 0) {
        printf("ready\n");
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof line, stdin)) { /* EOF: go on */ }
    }
    NK(ncclCommDestroy(comm));
    printf("PASS nccl_single\n");
    return 0;
}
