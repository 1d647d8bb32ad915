/* Host functions in stream order: cuLaunchHostFunc, cuStreamAddCallback and
 * their runtime twins (cudaLaunchHostFunc, cudaStreamAddCallback).
 *
 * The function is the application's code and must run in the application's
 * process, at the point of the stream where it was enqueued; work enqueued
 * after it must wait until it has returned (CUDA Driver API, "Execution
 * Control", cuLaunchHostFunc: "The host function ... is executed ... after
 * all previously enqueued work ... and blocks work added after it").
 *
 * How (docs/compatibility.md, "Host functions"):
 *  - the shim keeps every enqueued function in a table under a fresh id and
 *    sends proxyd an op [stream, id, gate]; the gate is one page of shared
 *    memory (a hostmem.c segment, so parking and CRIU treat it like pinned
 *    host memory);
 *  - proxyd's worker enqueues, in that stream, a host function of its own
 *    (on the GPU: the driver's cuLaunchHostFunc; emulated: at once, in
 *    order) which writes the id into the gate, bumps `req` and waits until
 *    the shim bumps `done` -- so the stream is blocked on the worker's side
 *    exactly as long as the application's function runs;
 *  - a thread of the shim ("gpuproxy-hostfn", started on first use) waits
 *    on `req` (futex, shared), runs the function, then bumps `done`.
 *
 * The gate holds one request at a time: the worker serialises its host
 * functions (the CUDA driver, too, runs a context's host functions one by
 * one on one thread).
 *
 * A dump synchronises every context before it captures anything, so the
 * app's function has run before the image is taken: no host function is ever
 * pending in an image (spec: restore none-needed). A client that dies with a
 * function pending releases the worker's wait (it watches the client's
 * proof-of-life lock).
 *
 * Host functions must not call CUDA (cuda.h says so); this thread never
 * takes gp_lock, so it runs even while the application's own threads wait
 * inside a synchronising call.
 *
 * Locking: `tab_mu` guards the table (the enqueuing thread under gp_lock,
 * the host-function thread without it); the gate's words are accessed with
 * atomics only. The gate pointer and thread are set up under gp_lock. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "gp_gen.h"
#include <cuda_runtime_api.h>
#include "gp_shim.h"

/* Layout of the gate page; proxyd/hostfn.py reads and writes the same
 * offsets (little-endian, the only byte order both sides run on). */
typedef struct gp_gate {
    uint32_t req;       /* bumped by the worker when it wants function `id` run */
    uint32_t done;      /* set to `req` by the shim once that function returned */
    uint64_t id;        /* the table id of the function to run */
} gp_gate;

#define GATE_SIZE 4096

enum { HF_DRIVER_FN = 1, HF_DRIVER_CB = 2, HF_RUNTIME_CB = 3 };

typedef struct hf_entry {
    uint64_t id;
    int kind;
    void *fn;
    void *user;
    void *stream;       /* the stream value the application passed (callbacks get it back) */
    int node;           /* a graph node's function: stays in the table, may be shared */
    struct hf_entry *next;
} hf_entry;

static pthread_mutex_t tab_mu = PTHREAD_MUTEX_INITIALIZER;
static hf_entry *tab;
static uint64_t next_id = 1;
static gp_gate *gate;               /* set once, under gp_lock */
static pid_t thread_pid;            /* the process that owns the thread (fork starts a new one) */

static long futex(uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
    /* shared (not FUTEX_PRIVATE_FLAG): the other side is proxyd's worker */
    return syscall(SYS_futex, addr, op, val, ts, NULL, 0);
}

static hf_entry *take(uint64_t id)
{
    pthread_mutex_lock(&tab_mu);
    hf_entry **pp = &tab, *e = NULL;
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->id == id) {
            e = *pp;
            *pp = e->next;
            break;
        }
    pthread_mutex_unlock(&tab_mu);
    return e;
}

static hf_entry *find(uint64_t id)
{
    pthread_mutex_lock(&tab_mu);
    hf_entry *e = tab;
    while (e && e->id != id)
        e = e->next;
    pthread_mutex_unlock(&tab_mu);
    return e;
}

static void run_entry(hf_entry *e)
{
    switch (e->kind) {
    case HF_DRIVER_FN:
        ((CUhostFn)e->fn)(e->user);
        break;
    case HF_DRIVER_CB:
        ((CUstreamCallback)e->fn)((CUstream)e->stream, CUDA_SUCCESS, e->user);
        break;
    case HF_RUNTIME_CB:
        ((cudaStreamCallback_t)e->fn)((cudaStream_t)e->stream, cudaSuccess, e->user);
        break;
    }
}

static void *hostfn_thread(void *arg)
{
    (void)arg;
    uint32_t seen = __atomic_load_n(&gate->done, __ATOMIC_ACQUIRE);
    for (;;) {
        uint32_t req = __atomic_load_n(&gate->req, __ATOMIC_ACQUIRE);
        if (req == seen) {
            /* A timeout, not an endless wait: parking for a checkpoint maps
             * the page anew (park.c), and a wait on the old mapping would
             * never be woken. */
            struct timespec ts = { 0, 100 * 1000000L };
            futex(&gate->req, FUTEX_WAIT, seen, &ts);
            continue;
        }
        uint64_t id = __atomic_load_n(&gate->id, __ATOMIC_ACQUIRE);
        /* bit 63: a node of an executable graph, which runs again at every
         * launch (proxyd/families/graphs.py): the entry stays in the table */
        int keep = (int)(id >> 63);
        id &= ~(1ULL << 63);
        hf_entry *e = keep ? find(id) : take(id);
        if (e) {
            run_entry(e);
            if (!keep)
                free(e);
        } else {
            gp_log("host function %llu requested by proxyd is unknown; the stream goes on",
                   (unsigned long long)id);
        }
        seen = req;
        __atomic_store_n(&gate->done, req, __ATOMIC_RELEASE);
        futex(&gate->done, FUTEX_WAKE, INT_MAX, NULL);
    }
    return NULL;
}

/* Sets up the gate and the thread (caller holds gp_lock and has a session). */
static CUresult ensure_gate(void)
{
    if (!gp_shm_ok()) {
        /* proxyd on another host (tcp): no memory to share a gate in */
        gp_warn_unsupported("cuLaunchHostFunc (host functions need proxyd on the same host)");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (!gate) {
        gate = gp_host_alloc(GATE_SIZE);
        if (!gate)
            return CUDA_ERROR_OUT_OF_MEMORY;
        memset(gate, 0, GATE_SIZE);
    }
    if (thread_pid != getpid()) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        /* host functions are the app's code: give them a normal stack */
        pthread_attr_setstacksize(&a, 8 << 20);
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);     /* the app's signals go to its own threads */
        int rc = pthread_create(&t, &a, hostfn_thread, NULL);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&a);
        if (rc != 0)
            return CUDA_ERROR_OUT_OF_MEMORY;
        pthread_setname_np(t, "gpuproxy-hostfn");
        thread_pid = getpid();
    }
    return CUDA_SUCCESS;
}

/* Enqueues one host function: op [stream, id, gate] (+ flags for
 * cuStreamAddCallback), sent at once so that the stream reaches it without
 * waiting for the application's next synchronous call. */
static CUresult enqueue(uint32_t fid, int nargs, CUstream wire_stream, int kind, void *fn, void *user,
                        void *app_stream)
{
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    gp_lock();
    CUresult rc = gp_session();
    if (rc == CUDA_SUCCESS)
        rc = ensure_gate();
    if (rc != CUDA_SUCCESS) {
        gp_unlock();
        return rc;
    }
    hf_entry *e = calloc(1, sizeof *e);
    if (!e) {
        gp_unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    e->kind = kind;
    e->fn = fn;
    e->user = user;
    e->stream = app_stream;
    pthread_mutex_lock(&tab_mu);
    e->id = next_id++;
    e->next = tab;
    tab = e;
    pthread_mutex_unlock(&tab_mu);
    uint32_t seg;
    uint64_t off, avail;
    if (gp_host_lookup(gate, &seg, &off, &avail) != 0) {
        free(take(e->id));
        gp_unlock();
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    gp_buf *b = gp_op_begin(fid, (uint32_t)nargs);
    gp_put_handle(b, wire_stream);
    mp_uint(b, e->id);
    gp_put_shm(b, seg, off, sizeof(gp_gate));
    if (nargs == 4)
        mp_uint(b, 0);          /* flags: reserved, must be 0 (checked below) */
    rc = gp_op_async();
    if (rc == CUDA_SUCCESS && gp_send_now() == 0)
        rc = CUDA_ERROR_DEVICE_UNAVAILABLE;
    gp_unlock();
    return rc;
}

CUresult gpo_cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
    return enqueue(GP_FID_cuLaunchHostFunc, 3, hStream, HF_DRIVER_FN, (void *)fn, userData, hStream);
}

CUresult gpo_cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void *userData)
{
    /* per-thread default stream variant: NULL is the thread's own stream */
    return enqueue(GP_FID_cuLaunchHostFunc_ptsz, 3, hStream ? hStream : CU_STREAM_PER_THREAD, HF_DRIVER_FN,
                   (void *)fn, userData, hStream);
}

/* cuStreamAddCallback: "flags: Reserved for future use, must be 0" (cuda.h). */
CUresult gpo_cuStreamAddCallback(CUstream hStream, CUstreamCallback callback, void *userData, unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return enqueue(GP_FID_cuStreamAddCallback, 4, hStream, HF_DRIVER_CB, (void *)callback, userData, hStream);
}

CUresult gpo_cuStreamAddCallback_ptsz(CUstream hStream, CUstreamCallback callback, void *userData,
                                      unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return enqueue(GP_FID_cuStreamAddCallback_ptsz, 4, hStream ? hStream : CU_STREAM_PER_THREAD, HF_DRIVER_CB,
                   (void *)callback, userData, hStream);
}

/* cudaStreamAddCallback (rt_hostfn.c): the runtime callback gets the
 * application's cudaStream_t back. */
CUresult gp_hostfn_add_rt_callback(CUstream wire, int per_thread, void *callback, void *userData, void *app_stream)
{
    return enqueue(per_thread ? GP_FID_cuStreamAddCallback_ptsz : GP_FID_cuStreamAddCallback, 4, wire, HF_RUNTIME_CB,
                   callback, userData, app_stream);
}

/* A host node of a graph (graph_build.c): the function goes into the table
 * and stays there (the worker asks for it with bit 63 set at every launch
 * of an executable graph); seg, off and len say where the gate is. Graphs can
 * be cloned and instantiated any number of times, so no destroy owns an
 * entry: nodes with the same function and argument share one, which keeps
 * the table bounded for programs that build their graphs again and again.
 * Caller holds gp_lock and has a session. */
CUresult gp_hostfn_node(void *fn, void *user, uint64_t *id, uint32_t *seg, uint64_t *off, uint64_t *len)
{
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = ensure_gate();
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t avail;
    if (gp_host_lookup(gate, seg, off, &avail) != 0)
        return CUDA_ERROR_NOT_SUPPORTED;
    *len = sizeof(gp_gate);
    pthread_mutex_lock(&tab_mu);
    for (hf_entry *e = tab; e; e = e->next)
        if (e->node && e->fn == fn && e->user == user) {
            *id = e->id;
            pthread_mutex_unlock(&tab_mu);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&tab_mu);
    hf_entry *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->kind = HF_DRIVER_FN;
    e->fn = fn;
    e->user = user;
    e->node = 1;
    pthread_mutex_lock(&tab_mu);
    e->id = next_id++;
    e->next = tab;
    tab = e;
    pthread_mutex_unlock(&tab_mu);
    *id = e->id;
    return CUDA_SUCCESS;
}
