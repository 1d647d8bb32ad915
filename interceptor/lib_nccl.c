/* Hand-written part of the libnccl.so.2 stand-in (spec: shim: override in
 * specs/nccl/nccl.yaml; docs/multigpu.md). NCCL runs in the worker
 * (proxyd/nccl.py); here:
 *
 * - communicators are handles the stand-in chooses (lib_ids.c), so that a
 *   create names its object before the worker has made it;
 * - calls that wait for the other ranks (ncclCommInitRank(Config),
 *   ncclCommSplit, ncclCommFinalize) answer ncclInProgress from the worker
 *   at once (it works on a helper thread); for a blocking communicator (the
 *   default, nccl.h ncclConfig_t.blocking) the stand-in then polls
 *   ncclCommGetAsyncError until the result is in, as the application would
 *   have waited inside NCCL; for a nonblocking one it returns ncclInProgress
 *   and the application polls, as NCCL documents ("Fault Tolerance",
 *   nonblocking communicators);
 * - ncclGetErrorString and ncclGetLastError are answered here;
 * - ncclCommGetAsyncError of a blocking, ready communicator is answered
 *   here for GPUPROXY_NCCL_ERROR_POLL_MS (default 100) after the worker
 *   last said ncclSuccess (below, "Async error polls").
 *
 * Locking: the blocking table is guarded by gp_lock. The poll does not hold
 * gp_lock between polls, so the application's other threads keep making
 * CUDA calls while a communicator is being created, as natively. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gp_lib_nccl.h"

enum { K_NCCL_COMM = 54 };                                   /* proxyd/core/protocol.py */
enum { NCCL_IN_PROGRESS = 7, NCCL_INVALID_ARGUMENT = 4, NCCL_INVALID_USAGE = 5, NCCL_SPLIT_NOCOLOR = -1 };
enum { CONFIG_SIZE_OFF = 0, CONFIG_BLOCKING_OFF = 16 };     /* nccl.h ncclConfig_t: size_t size; ...; int blocking */

#define MAX_NONBLOCKING 256
static ncclComm_t nonblocking[MAX_NONBLOCKING];
static int nnonblocking;
static __thread char last_error[160];
/* ncclGroupStart/End nesting of this thread (NCCL's groups are per thread),
 * and the communicators created inside the open group: they complete at
 * the outermost ncclGroupEnd (nccl.h: inside a group, ncclCommInitRank
 * returns at once; the single-process form initialises one communicator
 * per device that way) */
#define MAX_GROUP_INITS 64
static __thread int group_depth;
static __thread ncclComm_t group_inits[MAX_GROUP_INITS];
static __thread int ngroup_inits;

static void forget_polled(ncclComm_t comm);      /* "Async error polls", below */

static int is_nonblocking(ncclComm_t c)
{
    int on = 0;
    gp_lock();
    for (int i = 0; i < nnonblocking; i++)
        if (nonblocking[i] == c)
            on = 1;
    gp_unlock();
    return on;
}

static void note_blocking(ncclComm_t c, int blocking)
{
    gp_lock();
    for (int i = 0; i < nnonblocking; i++)
        if (nonblocking[i] == c) {
            nonblocking[i] = nonblocking[--nnonblocking];
            break;
        }
    if (!blocking && nnonblocking < MAX_NONBLOCKING)
        nonblocking[nnonblocking++] = c;
    gp_unlock();
}

static void note_failure(const char *fn, ncclResult_t r)
{
    if (r != 0 && r != NCCL_IN_PROGRESS)
        snprintf(last_error, sizeof last_error, "%s failed: %s (details in the gpuproxy worker's log)", fn,
                 gpo_ncclGetErrorString(r));
}

/* The application's config: its blocking flag (default 1) and the bytes it
 * holds (never more than it says in `size`, nor than this header's). */
static int config_blocking(const ncclConfig_t *cfg, size_t *n)
{
    *n = 0;
    if (!cfg)
        return 1;
    size_t size;
    memcpy(&size, (const char *)cfg + CONFIG_SIZE_OFF, sizeof size);
    *n = size < sizeof *cfg ? size : sizeof *cfg;
    int blocking = 1;
    if (*n >= CONFIG_BLOCKING_OFF + sizeof(int))
        memcpy(&blocking, (const char *)cfg + CONFIG_BLOCKING_OFF, sizeof blocking);
    return blocking != 0;
}

/* Waits for a communicator the worker is making or finalising. */
static ncclResult_t wait_ready(ncclComm_t comm)
{
    long ns = 20000;
    for (;;) {
        ncclResult_t st = NCCL_IN_PROGRESS;
        ncclResult_t r = gpg_ncclCommGetAsyncError(comm, &st);
        if (r != 0)
            return r;
        if (st != NCCL_IN_PROGRESS)
            return st;
        struct timespec ts = {0, ns};
        nanosleep(&ts, NULL);
        if (ns < 5000000)
            ns *= 2;
    }
}

/* Sends a create (fid) whose first out parameter is the new handle h. */
static ncclResult_t begin_create(uint32_t fid, int nargs, uint64_t *h, gp_buf **b)
{
    gp_lock();
    if (gp_session() != CUDA_SUCCESS) {
        gp_unlock();
        return (ncclResult_t)GP_NCCL_UNAVAILABLE;
    }
    *h = gp_lib_new_handle(K_NCCL_COMM);
    *b = gp_op_begin(fid, nargs);
    return 0;
}

/* Ends it: the worker's answer, then (wait) the wait for the new
 * communicator, noted blocking or not. Drops the handle when the create
 * failed. */
static ncclResult_t end_create_on(const char *fn, uint64_t h, int wait, int blocking, ncclComm_t *out)
{
    gp_reply r;
    ncclResult_t ret;
    if (gp_lib_op_sync(&r) < 0)
        ret = (ncclResult_t)GP_NCCL_UNAVAILABLE;
    else
        ret = (ncclResult_t)r.code;
    gp_reply_done(&r);
    gp_unlock();
    ncclComm_t c = (ncclComm_t)(uintptr_t)h;
    if (ret == NCCL_IN_PROGRESS && group_depth > 0 && ngroup_inits < MAX_GROUP_INITS) {
        group_inits[ngroup_inits++] = c;        /* waited for at ncclGroupEnd */
        ret = 0;
    }
    if (ret == NCCL_IN_PROGRESS && wait)
        ret = wait_ready(c);
    if (ret == 0 || ret == NCCL_IN_PROGRESS) {
        note_blocking(c, blocking);
        *out = c;
    } else {
        if (ret != (ncclResult_t)GP_NCCL_UNAVAILABLE)
            gpg_ncclCommAbort(c);         /* the worker forgets it */
        gp_lib_free_handle(c);
        note_failure(fn, ret);
    }
    return ret;
}

static ncclResult_t end_create(const char *fn, uint64_t h, int blocking, ncclComm_t *out)
{
    return end_create_on(fn, h, blocking, blocking, out);
}

static ncclResult_t init_rank(uint32_t fid, ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                              ncclConfig_t *config, int with_config)
{
    if (!comm)
        return NCCL_INVALID_ARGUMENT;
    size_t n;
    int blocking = config_blocking(config, &n);
    uint64_t h;
    gp_buf *b;
    ncclResult_t r = begin_create(fid, with_config ? 5 : 4, &h, &b);
    if (r != 0)
        return r;
    mp_uint(b, h);
    GP_PUT_SCALAR(b, nranks);
    mp_bin(b, &commId, sizeof commId);
    GP_PUT_SCALAR(b, rank);
    if (with_config) {
        if (config)
            gp_put_data(b, config, n, 0);
        else
            mp_nil(b);
    }
    return end_create(with_config ? "ncclCommInitRankConfig" : "ncclCommInitRank", h, blocking, comm);
}

ncclResult_t gpo_ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return init_rank(GP_FID_ncclCommInitRank, comm, nranks, commId, rank, NULL, 0);
}

ncclResult_t gpo_ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                        ncclConfig_t *config)
{
    return init_rank(GP_FID_ncclCommInitRankConfig, comm, nranks, commId, rank, config, 1);
}

ncclResult_t gpo_ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
    if (!newcomm)
        return NCCL_INVALID_ARGUMENT;
    size_t n;
    /* nccl.h: a split's communicator takes the parent's blocking mode unless config says */
    int parent_nb = is_nonblocking(comm);
    int blocking = config ? config_blocking(config, &n) : !parent_nb;
    if (!config)
        n = 0;
    uint64_t h;
    gp_buf *b;
    ncclResult_t r = begin_create(GP_FID_ncclCommSplit, 5, &h, &b);
    if (r != 0)
        return r;
    mp_uint(b, (uint64_t)(uintptr_t)comm);
    GP_PUT_SCALAR(b, color);
    GP_PUT_SCALAR(b, key);
    mp_uint(b, h);
    if (config)
        gp_put_data(b, config, n, 0);
    else
        mp_nil(b);
    /* NCCL runs the split as a job of the parent's group, which is blocking
     * or not as the PARENT is (src/group.cc ncclAsyncLaunch: the group's mode
     * is the mode of the communicator the job belongs to; the new one's
     * config only sets its own mode afterwards). With a nonblocking parent
     * ncclCommSplit answers ncclSuccess at once while the split goes on, the
     * parent's ncclCommGetAsyncError says ncclInProgress until it is done,
     * and a use of the parent meanwhile (ncclCommDestroy included) is
     * ncclInvalidArgument (src/init.cc ncclCommSplit, ncclCommEnsureReady).
     * The worker keeps the parent busy for the split, which answers the
     * same. One difference: NCCL writes *newcomm when the split is done,
     * the stand-in at once (its handle answers ncclInvalidArgument until then). */
    r = end_create_on("ncclCommSplit", h, !parent_nb, blocking, newcomm);
    if (r == NCCL_IN_PROGRESS && parent_nb)
        r = 0;
    if (r == 0 && color == NCCL_SPLIT_NOCOLOR) {
        /* nccl.h: ranks that pass NCCL_SPLIT_NOCOLOR get a NULL communicator;
         * an abort drops the worker's handle also while the split still runs */
        gpg_ncclCommAbort(*newcomm);
        gp_lib_free_handle(*newcomm);
        note_blocking(*newcomm, 1);
        *newcomm = NULL;
    }
    return r;
}

ncclResult_t gpo_ncclCommFinalize(ncclComm_t comm)
{
    forget_polled(comm);
    gp_lock();
    if (gp_session() != CUDA_SUCCESS) {
        gp_unlock();
        return (ncclResult_t)GP_NCCL_UNAVAILABLE;
    }
    gp_buf *b = gp_op_begin(GP_FID_ncclCommFinalize, 1);
    mp_uint(b, (uint64_t)(uintptr_t)comm);
    gp_reply r;
    ncclResult_t ret = gp_lib_op_sync(&r) < 0 ? (ncclResult_t)GP_NCCL_UNAVAILABLE : (ncclResult_t)r.code;
    gp_reply_done(&r);
    gp_unlock();
    if (ret == NCCL_IN_PROGRESS && !is_nonblocking(comm))
        ret = wait_ready(comm);
    note_failure("ncclCommFinalize", ret);
    return ret;
}

/* Async error polls. PyTorch's ProcessGroupNCCL wakes its watchdog thread
 * at every collective it enqueues, and the watchdog asks
 * ncclCommGetAsyncError of the communicator each time: on 4 H100s about 21
 * such calls per rank and DDP step, each a synchronous round trip that waits
 * behind the session's queued work (0.78 ms on average) while the shim's
 * one lock keeps the training thread from issuing its next calls (call
 * profile, docs/multigpu.md "Measured on 4 H100s"). For a blocking
 * communicator that the worker last found without error (ncclSuccess), the
 * answer can only change by an asynchronous failure in NCCL, which the
 * watchdog exists to notice within its timeouts (minutes): the stand-in
 * answers ncclSuccess itself for GPUPROXY_NCCL_ERROR_POLL_MS and asks the
 * worker again after that. Nonblocking communicators always ask (their
 * application polls for ncclInProgress), and so does a communicator being
 * made, split, finalized or destroyed (wait_ready uses the remote call
 * directly). Guarded by gp_lock. */
#define MAX_POLLED 256
static struct { ncclComm_t comm; long long ok_ns; } polled[MAX_POLLED];
static int npolled;
static long long poll_ns = -1;

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static long long error_poll_ns(void)
{
    if (poll_ns < 0) {
        const char *v = getenv("GPUPROXY_NCCL_ERROR_POLL_MS");
        long ms = v && *v ? strtol(v, NULL, 10) : 100;
        poll_ns = ms > 0 ? ms * 1000000LL : 0;
    }
    return poll_ns;
}

/* the slot of comm, or -1 (under gp_lock) */
static int polled_slot(ncclComm_t comm)
{
    for (int i = 0; i < npolled; i++)
        if (polled[i].comm == comm)
            return i;
    return -1;
}

static void forget_polled(ncclComm_t comm)
{
    gp_lock();
    int i = polled_slot(comm);
    if (i >= 0)
        polled[i] = polled[--npolled];
    gp_unlock();
}

ncclResult_t gpo_ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    if (!asyncError)
        return NCCL_INVALID_ARGUMENT;
    long long every = error_poll_ns();
    if (every && comm && !is_nonblocking(comm)) {
        gp_lock();
        int i = polled_slot(comm);
        int fresh = i >= 0 && now_ns() - polled[i].ok_ns < every;
        gp_unlock();
        if (fresh) {
            *asyncError = 0;        /* ncclSuccess */
            return 0;
        }
    }
    ncclResult_t r = gpg_ncclCommGetAsyncError(comm, asyncError);
    if (every && comm && r == 0 && *asyncError == 0 && !is_nonblocking(comm)) {
        gp_lock();
        int i = polled_slot(comm);
        if (i < 0 && npolled < MAX_POLLED)
            i = npolled++;
        if (i >= 0) {
            polled[i].comm = comm;
            polled[i].ok_ns = now_ns();
        }
        gp_unlock();
    } else if (comm) {
        forget_polled(comm);
    }
    return r;
}

static ncclResult_t end_comm(ncclComm_t comm, int abort)
{
    if (!comm)
        return abort ? 0 : NCCL_INVALID_ARGUMENT;     /* nccl.h: ncclCommAbort(NULL) is a no-op */
    forget_polled(comm);
    ncclResult_t r = abort ? gpg_ncclCommAbort(comm) : gpg_ncclCommDestroy(comm);
    if (r == 0) {
        note_blocking(comm, 1);
        gp_lib_free_handle(comm);
    }
    note_failure(abort ? "ncclCommAbort" : "ncclCommDestroy", r);
    return r;
}

ncclResult_t gpo_ncclCommDestroy(ncclComm_t comm) { return end_comm(comm, 0); }

ncclResult_t gpo_ncclCommAbort(ncclComm_t comm) { return end_comm(comm, 1); }

/* nccl.h, ncclResult_t: what each code means, in this project's words */
const char *gpo_ncclGetErrorString(ncclResult_t result)
{
    switch ((int)result) {
    case 0: return "no error";
    case 1: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case 2: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case 3: return "internal error - please report this issue to the NCCL developers";
    case 4: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case 5: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case 6: return "remote process exited or there was a network error";
    case 7: return "NCCL operation in progress";
    case 8: return "NCCL operation timed out";
    default: return "unknown result code";
    }
}

const char *gpo_ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return last_error;
}

ncclResult_t gpo_ncclGroupStart(void)
{
    ncclResult_t r = gpg_ncclGroupStart();
    if (r == 0)
        group_depth++;
    return r;
}

/* The outermost end waits for the communicators created in the group
 * (blocking ones; a nonblocking one the application polls itself). */
ncclResult_t gpo_ncclGroupEnd(void)
{
    if (group_depth == 0)
        return NCCL_INVALID_USAGE;
    ncclResult_t r = gpg_ncclGroupEnd();
    if (--group_depth > 0 || r != 0)
        return r;
    int n = ngroup_inits;
    ngroup_inits = 0;
    for (int i = 0; i < n; i++) {
        if (is_nonblocking(group_inits[i]))
            continue;
        ncclResult_t st = wait_ready(group_inits[i]);
        if (st != 0 && r == 0) {
            r = st;
            note_failure("ncclGroupEnd (communicator initialisation)", st);
        }
    }
    return r;
}

extern int cudaGetDevice(int *device);      /* cuda_runtime_api.h (the runtime stand-in) */
extern int cudaSetDevice(int device);

/* nccl.h, ncclCommInitAll: one communicator per device of this process,
 * "not compatible with a multi-process setup": a unique id, then a group
 * with one ncclCommInitRank per device (devlist NULL: devices 0..ndev-1). */
ncclResult_t gpo_ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist)
{
    if (!comm || ndev < 1)
        return NCCL_INVALID_ARGUMENT;
    int saved = 0;
    if (cudaGetDevice(&saved) != 0)
        return (ncclResult_t)1;                 /* ncclUnhandledCudaError */
    ncclUniqueId id;
    ncclResult_t r = gpg_ncclGetUniqueId(&id);
    if (r != 0)
        return r;
    r = gpo_ncclGroupStart();
    for (int i = 0; r == 0 && i < ndev; i++) {
        if (cudaSetDevice(devlist ? devlist[i] : i) != 0)
            r = NCCL_INVALID_ARGUMENT;
        else
            r = gpo_ncclCommInitRank(&comm[i], ndev, id, i);
    }
    ncclResult_t e = gpo_ncclGroupEnd();
    cudaSetDevice(saved);
    return r != 0 ? r : e;
}

/* nccl.h ncclDataType_t: int8, uint8, int32, uint32, int64, uint64, float16,
 * float32, float64, bfloat16, float8e4m3, float8e5m2 */
size_t gp_nccl_type_size(int datatype)
{
    static const unsigned char size[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return datatype >= 0 && datatype < (int)sizeof size ? size[datatype] : 0;
}
