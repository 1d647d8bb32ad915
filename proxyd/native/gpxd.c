/* proxyd's native helper (libgpxd.so, built at install time, loaded with
 * cffi in ABI mode by gpuproxy.proxyd.backends.native).
 *
 * Kernel launches are the one op whose cost the daemon adds to every step of
 * a GPU program, so runs of consecutive launch ops in a message are executed
 * here, straight from the received msgpack bytes: the argument buffer is
 * passed to cuLaunchKernel through CU_LAUNCH_PARAM_BUFFER_POINTER without a
 * copy, and handles are translated through tables that proxyd keeps in sync
 * (gpx_set). Anything unusual (an op this code does not know, a parameter
 * buffer sent as a separate frame) is left to the Python path.
 *
 * The op layout is docs/protocol.md's: [fid, ctx, f, gx, gy, gz, bx, by, bz,
 * shmem, stream, params, extra].
 *
 * The serving loop (gpx_serve, below) goes further for a worker whose
 * session uses the fast channel: it spins on the request slot itself and
 * answers in C the messages made only of ops it knows (launches, then at
 * most one synchronous stream/event/context query or synchronisation or a
 * small inline device-to-host copy); everything else goes back to Python
 * untouched (docs/architecture.md, "C serving loop").
 *
 * Locking: called from proxyd's main loop only, which owns these tables,
 * except the captured-stdout buffer (gpx_out_*), which the worker's drain
 * thread also fills: out_mu guards it. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gp_msgpack.h"

#define MAX_SLOTS 64
#define NKINDS 6

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);
typedef CUresult (*setctx_fn)(CUcontext);

static launch_fn p_launch;
static setctx_fn p_setctx;
static CUcontext cur_ctx;

typedef struct {
    uintptr_t *v;
    uint32_t n;
} table;

static table tables[MAX_SLOTS][NKINDS];
/* Objects the shim named itself (spec `ids: shim`: cuEventCreate) have ids
 * with bit 31 set (interceptor/lib_ids.c, proxyd/core/protocol.py
 * SHIM_ID_BIT), counted from 1 apart from proxyd's: a table of their own,
 * indexed by the id without that bit. */
#define SHIM_ID_BIT 0x80000000u
static table shim_tables[MAX_SLOTS][NKINDS];
static void serve_resolve(void *h);
static void ranges_clear(int slot);
static uint32_t launch_fids[8];
static int nlaunch_fids;

int gpx_init(const char *libcuda)
{
    void *h = dlopen(libcuda, RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        h = dlopen(libcuda, RTLD_NOW);
    if (!h)
        return -1;
    p_launch = (launch_fn)dlsym(h, "cuLaunchKernel");
    p_setctx = (setctx_fn)dlsym(h, "cuCtxSetCurrent");
    serve_resolve(h);
    return (p_launch && p_setctx) ? 0 : -1;
}

void gpx_add_launch_fid(uint32_t fid)
{
    for (int i = 0; i < nlaunch_fids; i++)
        if (launch_fids[i] == fid)
            return;          /* a second Native() in one process (tests) */
    if (nlaunch_fids < 8)
        launch_fids[nlaunch_fids++] = fid;
}

/* The context proxyd made current by other means (Python): keeps the cache right. */
void gpx_note_current(uintptr_t ctx) { cur_ctx = (CUcontext)ctx; }

int gpx_set(int slot, int kind, uint32_t id, uintptr_t value)
{
    if (slot < 0 || slot >= MAX_SLOTS || kind <= 0 || kind >= NKINDS)
        return -1;
    table *t = id & SHIM_ID_BIT ? &shim_tables[slot][kind] : &tables[slot][kind];
    id &= ~SHIM_ID_BIT;
    if (id >= t->n) {
        uint32_t n = t->n ? t->n : 64;
        while (n <= id)
            n *= 2;
        uintptr_t *v = realloc(t->v, n * sizeof *v);
        if (!v)
            return -1;
        memset(v + t->n, 0, (n - t->n) * sizeof *v);
        t->v = v;
        t->n = n;
    }
    t->v[id] = value;
    return 0;
}

void gpx_clear_slot(int slot)
{
    if (slot < 0 || slot >= MAX_SLOTS)
        return;
    for (int k = 0; k < NKINDS; k++) {
        free(tables[slot][k].v);
        tables[slot][k].v = NULL;
        tables[slot][k].n = 0;
        free(shim_tables[slot][k].v);
        shim_tables[slot][k].v = NULL;
        shim_tables[slot][k].n = 0;
    }
    ranges_clear(slot);
}

static uintptr_t lookup(int slot, uint64_t handle, int kind)
{
    if ((int)(handle >> 32) != kind)
        return 0;
    uint32_t id = (uint32_t)handle;
    table *t = id & SHIM_ID_BIT ? &shim_tables[slot][kind] : &tables[slot][kind];
    id &= ~SHIM_ID_BIT;
    return id < t->n ? t->v[id] : 0;
}

/* Byte offset of the first op of message frame 0 ([type, seq, ops]) and the
 * op count, or -1. */
long gpx_ops_start(const uint8_t *buf, size_t len, uint32_t *nops)
{
    gp_rd r;
    gp_rd_init(&r, buf, len);
    if (mp_get_array(&r) < 3)
        return -1;
    mp_skip(&r);
    mp_skip(&r);
    *nops = mp_get_array(&r);
    return r.err ? -1 : (long)(r.p - buf);
}

/* Offset just after the object at off. */
long gpx_skip(const uint8_t *buf, size_t len, size_t off)
{
    gp_rd r;
    gp_rd_init(&r, buf + off, len - off);
    if (mp_skip(&r) < 0)
        return -1;
    return (long)(r.p - buf);
}

static int is_launch(uint32_t fid)
{
    for (int i = 0; i < nlaunch_fids; i++)
        if (launch_fids[i] == fid)
            return 1;
    return 0;
}

/* Runs consecutive launch ops from byte offset *off, at most max_ops of
 * them. Returns how many ops it consumed; *off moves past them. Stops before
 * an op it leaves to Python. A failed launch is consumed and reported in
 * *err (CUresult) with its index in *err_index; the run stops there. */
int gpx_run_launches(int slot, const uint8_t *buf, size_t len, size_t *off, int max_ops, int *err,
                     int *err_index)
{
    *err = 0;
    *err_index = -1;
    if (slot < 0 || slot >= MAX_SLOTS || !p_launch)
        return 0;
    int done = 0;
    while (done < max_ops) {
        gp_rd r;
        gp_rd_init(&r, buf + *off, len - *off);
        if (mp_get_array(&r) != 13)
            break;
        uint32_t fid = (uint32_t)mp_get_uint(&r);
        if (r.err || !is_launch(fid))
            break;
        uint64_t ctxh = mp_get_uint(&r);
        uint64_t fh = mp_get_uint(&r);
        unsigned d[7];
        for (int i = 0; i < 7; i++)
            d[i] = (unsigned)mp_get_uint(&r);
        uint64_t sh = mp_get_uint(&r);
        mp_obj params;
        if (mp_next(&r, &params) < 0 || (params.type != MP_BIN && params.type != MP_NIL))
            break;                                     /* frame reference: Python */
        mp_obj extra;
        if (mp_next(&r, &extra) < 0 || extra.type != MP_NIL || r.err)
            break;
        CUcontext ctx = ctxh ? (CUcontext)lookup(slot, ctxh, 1) : NULL;
        CUfunction f = (CUfunction)lookup(slot, fh, 3);
        CUstream s = sh < 3 ? (CUstream)(uintptr_t)sh : (CUstream)lookup(slot, sh, 4);
        if ((ctxh && !ctx) || !f || (sh >= 3 && !s))
            break;                                     /* unknown handle: Python reports it */
        if (ctx && ctx != cur_ctx) {
            CUresult rc = p_setctx(ctx);
            if (rc != CUDA_SUCCESS) {
                *err = rc;
                *err_index = done;
                *off = (size_t)(r.p - buf);
                return done + 1;
            }
            cur_ctx = ctx;
        }
        size_t psize = params.len;
        void *extra_arr[5] = { CU_LAUNCH_PARAM_BUFFER_POINTER, (void *)params.data, CU_LAUNCH_PARAM_BUFFER_SIZE,
                               &psize, CU_LAUNCH_PARAM_END };
        CUresult rc = p_launch(f, d[0], d[1], d[2], d[3], d[4], d[5], d[6], s, NULL,
                               params.type == MP_BIN && psize ? extra_arr : NULL);
        *off = (size_t)(r.p - buf);
        done++;
        if (rc != CUDA_SUCCESS) {
            *err = rc;
            *err_index = done - 1;
            return done;
        }
    }
    return done;
}

uintptr_t gpx_current(void) { return (uintptr_t)cur_ctx; }

/* ------------------------------------------------------------------------
 * Serving loop: the hot messages of a fast-channel session, answered in C.
 *
 * The worker's Python loop (proxyd/worker/native_serve.py) calls gpx_serve while
 * the session qualifies (not frozen, capturing, holding an unreported async
 * error, or mid-checkpoint; no addresses moved by a restore; nothing queued
 * out of order). gpx_serve spins on the channel's request slot, with the
 * GIL released (cffi ABI calls release it), and for each request:
 *  - copies it out and publishes req_taken, as Channel.poll does;
 *  - checks every op first: a message holding anything else (another
 *    function, an unknown handle, a value of an unusual type, an out-of-order
 *    sequence number) is handed back to Python whole, untouched (HANDOFF);
 *  - runs the ops and writes the answer Server.execute would write, byte for
 *    byte (tests/test_native_serve.py compares them), into the reply slot;
 *  - a driver failure stops the message after the failed op, which Python
 *    finishes (FAILED): messages and async-error bookkeeping stay Python's.
 * It returns when the spin runs out without a request (the Python loop then
 * looks at ZeroMQ, its outbox and control work, and may sleep), after
 * max_ns in all (so a client calling back to back never starves control
 * messages: a dump parks a session through ZeroMQ), or with a message that
 * needs Python.
 *
 * Ops served (their Python counterparts, proxyd/families/memory.py, launches.py, streams.py, dispatch.py):
 * cuLaunchKernel (launch_fast), cuStreamQuery, cuEventQuery and
 * cuDeviceGetAttribute (generic path: no bookkeeping), cuStreamSynchronize / cuEventSynchronize /
 * cuCtxSynchronize (stream_sync, event_sync, ctx_sync: none either) and
 * cuMemcpyDtoH_v2 to an inline answer and cuMemcpyHtoD_v2 from inline bytes
 * (memcpy_dtoh, memcpy_htod) of up to 64 KiB, the same two and their Async_v2
 * forms to and from the client's page-locked memory of any size (a ShmRef
 * into a segment Python copied with before: gpx_seg_add; the Async ones stay
 * in flight, as h_memcpy_* leave them), and cuMemsetD8/16/32 (_v2 and
 * Async: memset), only inside a range Python has checked before
 * (check_range: gpx_range_add; every message Python runs clears them, as it
 * may free memory); cuEventRecord (event_record: the events recorded are
 * listed for Python, which marks them as its handler does).
 * ------------------------------------------------------------------------ */

enum { GPX_IDLE = 0, GPX_HANDOFF = 1, GPX_FAILED = 2, GPX_REPLY_ZMQ = 3, GPX_REPLY_PY = 4, GPX_DONE = 5 };
enum { C_NONE = 0, C_LAUNCH, C_STREAM_QUERY, C_EVENT_QUERY, C_STREAM_SYNC, C_EVENT_SYNC, C_CTX_SYNC, C_DTOH, C_HTOD,
       C_MEMSET8, C_MEMSET16, C_MEMSET32, C_EVENT_RECORD, C_DEV_ATTR, C_HTOD_ASYNC, C_DTOH_ASYNC, C_MAX };
/* asynchronous ops: any number, anywhere in a message; the others (synchronous) only last */
#define IS_ASYNC(c) ((c) == C_LAUNCH || ((c) >= C_MEMSET8 && (c) <= C_EVENT_RECORD) || (c) == C_HTOD_ASYNC || \
                     (c) == C_DTOH_ASYNC)
#define MAX_RECORDED 64

/* channel layout: interceptor/channel.c */
#define CH_REQ_SEQ 64
#define CH_REQ_LEN 72
#define CH_REQ_TAKEN 128
#define CH_REP_SEQ 192
#define CH_REP_LEN 200
#define CH_CLIENT_IDLE 320
#define CH_REQ_DATA 4096
#define CH_MAX (1u << 20)
#define CH_REP_DATA (4096 + CH_MAX)
#define CF64(ch, off) ((volatile uint64_t *)((ch) + (off)))
#define CF32(ch, off) ((volatile uint32_t *)((ch) + (off)))

#define DTOH_MAX 65536            /* the shim sends larger copies through staging */
#define INLINE_MAX (128 * 1024)   /* protocol.Packer.INLINE_MAX: larger bytes go as frames */
#define MAX_OPS 256
#define NRANGES 32
#define NSEGS 16
#define EXT_SHM 2                 /* protocol.EXT_SHM: u32 segment, u64 offset, u64 length, big-endian */

typedef struct gpx_serve_state {
    uint8_t *chan;          /* in: the channel mapping */
    int slot;               /* in */
    int capture;            /* in: the worker's stdout is captured (gpx_out_*) */
    uint64_t spin_ns;       /* in: return after this long without a request */
    uint64_t max_ns;        /* in: return after this long in all */
    uint64_t taken;         /* in/out: Channel.taken */
    uint64_t last_seq;      /* in/out: Session.last_seq */
    int may_print;          /* in/out: Session.may_print */
    uint64_t calls;         /* out: ops run (Session.calls) */
    uint64_t served;        /* out: messages answered here */
    int reply_state;        /* out: 0 none answered, 1 last answer in gpx_last_reply, 2 left unanswered */
    const uint8_t *msg;     /* out (HANDOFF, FAILED, REPLY_PY): the message */
    size_t msg_len;
    int done_ops;           /* FAILED: ops run; the last of them failed */
    int fail_code;          /* FAILED: its CUresult */
    int fail_setctx;        /* FAILED: 1 when cuCtxSetCurrent failed (the op did not run) */
    uint32_t nrecorded;     /* out: events recorded (their handles in recorded[]) */
    uint64_t recorded[MAX_RECORDED];
    int code;               /* REPLY_PY: the answer's code */
    const uint8_t *outs;    /* REPLY_PY: its outs, msgpack */
    size_t outs_len;
    const uint8_t *printed; /* REPLY_PY: what the kernels printed */
    size_t printed_len;
} gpx_serve_state;

typedef CUresult (*h1_fn)(void *);
typedef CUresult (*v0_fn)(void);
typedef CUresult (*dtoh_fn)(void *, CUdeviceptr, size_t);
typedef CUresult (*htod_fn)(CUdeviceptr, const void *, size_t);
typedef CUresult (*dtoh_async_fn)(void *, CUdeviceptr, size_t, CUstream);
typedef CUresult (*htod_async_fn)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*memset_fn)(CUdeviceptr, unsigned, size_t, CUstream);   /* D8/D16/D32 Async: value promoted */
typedef CUresult (*record_fn)(CUevent, CUstream);
typedef CUresult (*attr_fn)(int *, CUdevice_attribute, CUdevice);

static h1_fn p_stream_query, p_event_query, p_stream_sync, p_event_sync;
static v0_fn p_ctx_sync;
static dtoh_fn p_dtoh;
static htod_fn p_htod;
static dtoh_async_fn p_dtoh_async;
static htod_async_fn p_htod_async;
static memset_fn p_memset[3];
static record_fn p_record;
static attr_fn p_attr;
static uint8_t *fid_class;        /* function id -> C_* */
static uint32_t nfid_class;

static void serve_resolve(void *h)
{
    p_stream_query = (h1_fn)dlsym(h, "cuStreamQuery");
    p_event_query = (h1_fn)dlsym(h, "cuEventQuery");
    p_stream_sync = (h1_fn)dlsym(h, "cuStreamSynchronize");
    p_event_sync = (h1_fn)dlsym(h, "cuEventSynchronize");
    p_ctx_sync = (v0_fn)dlsym(h, "cuCtxSynchronize");
    p_dtoh = (dtoh_fn)dlsym(h, "cuMemcpyDtoH_v2");
    p_htod = (htod_fn)dlsym(h, "cuMemcpyHtoD_v2");
    p_dtoh_async = (dtoh_async_fn)dlsym(h, "cuMemcpyDtoHAsync_v2");
    p_htod_async = (htod_async_fn)dlsym(h, "cuMemcpyHtoDAsync_v2");
    p_memset[0] = (memset_fn)dlsym(h, "cuMemsetD8Async");
    p_memset[1] = (memset_fn)dlsym(h, "cuMemsetD16Async");
    p_memset[2] = (memset_fn)dlsym(h, "cuMemsetD32Async");
    p_record = (record_fn)dlsym(h, "cuEventRecord");
    p_attr = (attr_fn)dlsym(h, "cuDeviceGetAttribute");
}

/* 1 when every driver function of the serving loop was found. */
int gpx_serve_ready(void)
{
    return p_launch && p_setctx && p_stream_query && p_event_query && p_stream_sync && p_event_sync && p_ctx_sync &&
           p_dtoh && p_htod && p_dtoh_async && p_htod_async && p_memset[0] && p_memset[1] && p_memset[2] && p_record && p_attr;
}

/* native.py declares the state again for cffi: it checks the two agree. */
size_t gpx_serve_state_size(void) { return sizeof(gpx_serve_state); }

int gpx_add_fid_class(uint32_t fid, int cls)
{
    if (cls <= C_NONE || cls >= C_MAX || fid > 1000000)
        return -1;
    if (fid >= nfid_class) {
        uint32_t n = nfid_class ? nfid_class : 1024;
        while (n <= fid)
            n *= 2;
        uint8_t *v = realloc(fid_class, n);
        if (!v)
            return -1;
        memset(v + nfid_class, 0, n - nfid_class);
        fid_class = v;
        nfid_class = n;
    }
    fid_class[fid] = (uint8_t)cls;
    return 0;
}

/* --- device ranges Python has checked (check_range), per slot ---------- */
typedef struct { uint64_t lo, hi; } range;
static range ranges[MAX_SLOTS][NRANGES];
static int nranges[MAX_SLOTS], next_range[MAX_SLOTS];

/* --- the client's page-locked host segments Python has copied with ------
 * (ShmRef of a segment other than the staging one: native_serve.learn),
 * mapped in this worker at base; cleared with the ranges, since only a
 * message or control command Python runs can unmap one (cuMemFreeHost). */
typedef struct { uint32_t seg; uint64_t base, len; } pseg;
static pseg psegs[MAX_SLOTS][NSEGS];
static int npsegs[MAX_SLOTS];

static void ranges_clear(int slot)
{
    if (slot >= 0 && slot < MAX_SLOTS)
        nranges[slot] = next_range[slot] = npsegs[slot] = 0;
}

void gpx_seg_add(int slot, uint32_t seg, uint64_t base, uint64_t len)
{
    if (slot < 0 || slot >= MAX_SLOTS || !base || !len)
        return;
    for (int i = 0; i < npsegs[slot]; i++)
        if (psegs[slot][i].seg == seg) {
            psegs[slot][i].base = base;
            psegs[slot][i].len = len;
            return;
        }
    if (npsegs[slot] < NSEGS)
        psegs[slot][npsegs[slot]++] = (pseg){ seg, base, len };
}

static uint64_t be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* The worker's address of `need` bytes a ShmRef names in a known
 * page-locked segment, or NULL (then Python takes the message, and checks
 * and reports what is wrong with it: dispatch.data). */
static uint8_t *host_ref(int slot, const mp_obj *o, uint64_t need)
{
    if (o->type != MP_EXT || o->ext_type != EXT_SHM || o->len != 20)
        return NULL;
    uint32_t seg = (uint32_t)be(o->data, 4);
    uint64_t off = be(o->data + 4, 8), len = be(o->data + 12, 8);
    for (int i = 0; i < npsegs[slot]; i++) {
        pseg *g = &psegs[slot][i];
        if (g->seg != seg)
            continue;
        if (off > g->len || len > g->len - off || need > len)
            return NULL;
        return (uint8_t *)(uintptr_t)(g->base + off);
    }
    return NULL;
}

void gpx_range_clear(int slot) { ranges_clear(slot); }

void gpx_range_add(int slot, uint64_t lo, uint64_t hi)
{
    if (slot < 0 || slot >= MAX_SLOTS || hi <= lo)
        return;
    for (int i = 0; i < nranges[slot]; i++)
        if (ranges[slot][i].lo == lo && ranges[slot][i].hi == hi)
            return;
    int i = nranges[slot] < NRANGES ? nranges[slot]++ : next_range[slot]++ % NRANGES;
    ranges[slot][i].lo = lo;
    ranges[slot][i].hi = hi;
}

static int range_ok(int slot, uint64_t addr, uint64_t n)
{
    for (int i = 0; i < nranges[slot]; i++)
        if (addr >= ranges[slot][i].lo && addr + n <= ranges[slot][i].hi && addr + n > addr)
            return 1;
    return 0;
}

/* --- captured stdout (server.StdoutCapture's buffer, native form) ------ */
static pthread_mutex_t out_mu = PTHREAD_MUTEX_INITIALIZER;
static gp_buf out_buf, out_taken;
static int out_fd = -1;

/* Reads what the pipe holds into the buffer (caller holds out_mu). */
static void out_read_locked(void)
{
    if (out_fd < 0)
        return;
    for (;;) {
        gp_buf_reserve(&out_buf, 65536);
        ssize_t k = read(out_fd, out_buf.p + out_buf.len, 65536);
        if (k <= 0)
            return;
        out_buf.len += (size_t)k;
    }
}

/* The read end of the worker's stdout pipe (non-blocking), and bytes the
 * Python capture had read before it handed over. */
void gpx_out_init(int fd, const uint8_t *pending, size_t n)
{
    pthread_mutex_lock(&out_mu);
    out_fd = fd;
    if (n)
        gp_buf_put_raw(&out_buf, pending, n);
    pthread_mutex_unlock(&out_mu);
}

/* The drain thread: empties the pipe so that a large output never blocks
 * the writer. */
void gpx_out_drain(void)
{
    pthread_mutex_lock(&out_mu);
    out_read_locked();
    pthread_mutex_unlock(&out_mu);
}

/* Everything printed so far (flushing C stdio first, as StdoutCapture.take
 * does); the bytes stay valid until the next call. Main loop only. */
size_t gpx_out_take(const uint8_t **p)
{
    fflush(NULL);
    pthread_mutex_lock(&out_mu);
    out_read_locked();
    gp_buf t = out_taken;
    out_taken = out_buf;
    out_buf = t;
    gp_buf_reset(&out_buf);
    pthread_mutex_unlock(&out_mu);
    *p = out_taken.p;
    return out_taken.len;
}

/* --- the loop ---------------------------------------------------------- */
typedef struct {
    int cls;
    uint32_t fid;
    CUcontext ctx;
    void *obj;                  /* function (launch), stream or event */
    CUstream stream;            /* launch */
    unsigned d[7];              /* launch: grid, block, shared memory */
    const uint8_t *params;      /* launch: packed arguments (NULL: nil); htod: the bytes */
    size_t plen;
    uint64_t src, n;            /* dtoh: source; htod, memset: destination; byte / element count */
    uint64_t value;             /* memset */
    uint64_t handle;            /* event record: the event's handle */
    uint8_t *host;              /* copies: page-locked client memory (host_ref), or NULL */
} op_desc;

static uint8_t *msgbuf;
static size_t msgcap;
static op_desc descs[MAX_OPS];
static gp_buf rep, outs_buf;
static uint64_t rep_seq;

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* A non-negative integer (Python: type(v) is int, v >= 0). */
static int get_u(gp_rd *r, uint64_t *v)
{
    mp_obj o;
    if (mp_next(r, &o) < 0)
        return -1;
    if (o.type == MP_UINT) {
        *v = o.v.u;
        return 0;
    }
    if (o.type == MP_INT && o.v.i >= 0) {
        *v = (uint64_t)o.v.i;
        return 0;
    }
    return -1;
}

static int get_stream(int slot, gp_rd *r, int nil_ok, CUstream *s)
{
    mp_obj o;
    gp_rd save = *r;
    if (nil_ok && mp_next(r, &o) == 0 && o.type == MP_NIL) {
        *s = NULL;
        return 0;
    }
    *r = save;
    uint64_t h;
    if (get_u(r, &h) < 0)
        return -1;
    if (h < 3) {            /* NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD: their own values */
        *s = (CUstream)(uintptr_t)h;
        return 0;
    }
    *s = (CUstream)lookup(slot, h, 4);
    return *s ? 0 : -1;
}

/* Checks one op and fills d; -1: not one this loop serves as it stands. */
static int check_op(int slot, gp_rd *r, op_desc *d)
{
    uint32_t len = mp_get_array(r);
    uint64_t fid, ctxh, v;
    if (r->err || get_u(r, &fid) < 0 || fid >= nfid_class || get_u(r, &ctxh) < 0)
        return -1;
    d->cls = fid_class[fid];
    d->fid = (uint32_t)fid;
    d->ctx = NULL;
    if (ctxh) {
        d->ctx = (CUcontext)lookup(slot, ctxh, 1);
        if (!d->ctx)
            return -1;      /* Python: invalid context, or a reset primary context */
    }
    switch (d->cls) {
    case C_LAUNCH: {
        if (len != 13 || get_u(r, &v) < 0 || !(d->obj = (void *)lookup(slot, v, 3)))
            return -1;
        for (int i = 0; i < 7; i++) {
            if (get_u(r, &v) < 0 || v > UINT32_MAX)
                return -1;
            d->d[i] = (unsigned)v;
        }
        if (get_stream(slot, r, 1, &d->stream) < 0)
            return -1;
        mp_obj p, e;
        if (mp_next(r, &p) < 0 || (p.type != MP_BIN && p.type != MP_NIL))
            return -1;
        d->params = p.type == MP_BIN ? p.data : NULL;
        d->plen = p.type == MP_BIN ? p.len : 0;
        if (mp_next(r, &e) < 0 || e.type != MP_NIL)
            return -1;
        return 0;
    }
    case C_STREAM_QUERY:
    case C_STREAM_SYNC:
        if (len != 3)
            return -1;
        return get_stream(slot, r, 0, (CUstream *)&d->obj);
    case C_EVENT_QUERY:
    case C_EVENT_SYNC:
        if (len != 3 || get_u(r, &v) < 0)
            return -1;
        d->obj = (void *)lookup(slot, v, 5);
        return d->obj ? 0 : -1;
    case C_CTX_SYNC:
        return len == 2 && d->ctx ? 0 : -1;      /* no context: Python's invalid-context answer */
    case C_DTOH:
    case C_DTOH_ASYNC: {
        /* [fid, ctx, nil (answer inline) | ShmRef (page-locked), src, n(, stream)] */
        mp_obj dst;
        int want = d->cls == C_DTOH ? 5 : 6;
        if (len != (uint32_t)want || mp_next(r, &dst) < 0 || get_u(r, &d->src) < 0 || get_u(r, &d->n) < 0)
            return -1;
        d->stream = NULL;
        if (d->cls == C_DTOH_ASYNC && get_stream(slot, r, 0, &d->stream) < 0)
            return -1;
        if (d->n == 0 || !range_ok(slot, d->src, d->n))
            return -1;
        d->host = NULL;
        if (dst.type == MP_NIL)
            return d->cls == C_DTOH && d->n <= DTOH_MAX ? 0 : -1;
        d->host = host_ref(slot, &dst, d->n);
        return d->host ? 0 : -1;
    }
    case C_HTOD:
    case C_HTOD_ASYNC: {
        /* [fid, ctx, dst, bytes (inline) | ShmRef (page-locked), n(, stream)] */
        mp_obj b;
        int want = d->cls == C_HTOD ? 5 : 6;
        if (len != (uint32_t)want || get_u(r, &d->src) < 0 || mp_next(r, &b) < 0 || get_u(r, &d->n) < 0)
            return -1;
        d->stream = NULL;
        if (d->cls == C_HTOD_ASYNC && get_stream(slot, r, 0, &d->stream) < 0)
            return -1;
        if (d->n == 0 || !range_ok(slot, d->src, d->n))
            return -1;
        d->host = NULL;
        if (b.type == MP_BIN) {     /* bytes in a staging segment or frame: Python */
            if (d->cls != C_HTOD || d->n > DTOH_MAX || b.len < d->n)
                return -1;
            d->params = b.data;
            return 0;
        }
        d->host = host_ref(slot, &b, d->n);
        d->params = d->host;
        return d->host ? 0 : -1;
    }
    case C_MEMSET8:
    case C_MEMSET16:
    case C_MEMSET32: {
        mp_obj val;
        if ((len != 5 && len != 6) || get_u(r, &d->src) < 0 || mp_next(r, &val) < 0 ||
            (val.type != MP_UINT && val.type != MP_INT) || get_u(r, &d->n) < 0)
            return -1;
        d->value = val.type == MP_UINT ? val.v.u : (uint64_t)val.v.i;      /* masked to the width: backend.memset */
        d->stream = NULL;
        if (len == 6 && get_stream(slot, r, 0, &d->stream) < 0)
            return -1;
        uint64_t elem = d->cls == C_MEMSET8 ? 1 : d->cls == C_MEMSET16 ? 2 : 4;
        if (d->n == 0 || d->n > (UINT64_MAX >> 3) || !range_ok(slot, d->src, elem * d->n))
            return -1;
        return 0;
    }
    case C_DEV_ATTR: {
        mp_obj out;      /* [fid, ctx, true (the out-value), attribute, device] */
        if (len != 5 || mp_next(r, &out) < 0 || out.type != MP_BOOL || !out.v.b || get_u(r, &d->value) < 0 ||
            get_u(r, &d->n) < 0 || d->value > INT32_MAX || d->n > INT32_MAX)
            return -1;   /* other values: the generic path's conversions (norm_scalar) */
        return 0;
    }
    case C_EVENT_RECORD:
        if (len != 4 || get_u(r, &d->handle) < 0 || !(d->obj = (void *)lookup(slot, d->handle, 5)))
            return -1;
        return get_stream(slot, r, 0, &d->stream);
    default:
        return -1;
    }
}

static int set_ctx(CUcontext c, CUresult *rc)
{
    if (c && c != cur_ctx) {
        *rc = p_setctx(c);
        if (*rc != CUDA_SUCCESS)
            return -1;
        cur_ctx = c;
    }
    return 0;
}

/* Publishes rep in the reply slot (Channel.reply's seqlock rules);
 * returns 1 when the client sleeps and needs the answer by ZeroMQ too. */
static int publish(uint8_t *ch, uint64_t seq)
{
    __atomic_store_n(CF64(ch, CH_REP_SEQ), 0, __ATOMIC_RELEASE);
    memcpy(ch + CH_REP_DATA, rep.p, rep.len);
    *CF32(ch, CH_REP_LEN) = (uint32_t)rep.len;
    __atomic_store_n(CF64(ch, CH_REP_SEQ), seq, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return *CF32(ch, CH_CLIENT_IDLE) != 0;
}

static int serve_one(gpx_serve_state *st, const uint8_t *buf, size_t len)
{
    gp_rd r;
    gp_rd_init(&r, buf, len);
    uint64_t type, seq;
    if (mp_get_array(&r) != 3 || r.err || get_u(&r, &type) < 0 || type != 1 || get_u(&r, &seq) < 0 ||
        seq >= (1ull << 63) || seq != st->last_seq + 1)
        return GPX_HANDOFF;
    uint32_t nops = mp_get_array(&r);
    if (r.err || nops == 0 || nops > MAX_OPS)
        return GPX_HANDOFF;
    for (uint32_t i = 0; i < nops; i++) {
        if (check_op(st->slot, &r, &descs[i]) < 0)
            return GPX_HANDOFF;
        if (!IS_ASYNC(descs[i].cls) && i != nops - 1)
            return GPX_HANDOFF;          /* a synchronous op answers only as the last one */
        if (descs[i].cls == C_EVENT_RECORD && st->nrecorded + i >= MAX_RECORDED)
            return GPX_HANDOFF;          /* no room to list it for Python */
    }
    if (r.err || r.p != r.end)
        return GPX_HANDOFF;              /* trailing bytes: Python calls the message malformed */

    /* run */
    int last = descs[nops - 1].cls;
    int sync = !IS_ASYNC(last);
    CUresult code = CUDA_SUCCESS;
    gp_buf_reset(&outs_buf);
    for (uint32_t i = 0; i < nops; i++) {
        op_desc *d = &descs[i];
        CUresult rc = CUDA_SUCCESS;
        st->calls++;
        if (set_ctx(d->ctx, &rc) < 0) {
            st->fail_setctx = 1;
            goto failed;
        }
        switch (d->cls) {
        case C_LAUNCH: {
            size_t psize = d->plen;
            void *ex[5] = { CU_LAUNCH_PARAM_BUFFER_POINTER, (void *)d->params, CU_LAUNCH_PARAM_BUFFER_SIZE, &psize,
                            CU_LAUNCH_PARAM_END };
            st->may_print = 1;
            rc = p_launch((CUfunction)d->obj, d->d[0], d->d[1], d->d[2], d->d[3], d->d[4], d->d[5], d->d[6],
                          d->stream, NULL, d->params && psize ? ex : NULL);
            if (rc != CUDA_SUCCESS)
                goto failed;
            break;
        }
        case C_MEMSET8:
        case C_MEMSET16:
        case C_MEMSET32: {
            static const uint64_t mask[3] = { 0xFF, 0xFFFF, 0xFFFFFFFF };
            int w = d->cls - C_MEMSET8;
            rc = p_memset[w]((CUdeviceptr)d->src, (unsigned)(d->value & mask[w]), d->n, d->stream);
            if (rc != CUDA_SUCCESS)
                goto failed;
            break;
        }
        case C_EVENT_RECORD:
            rc = p_record((CUevent)d->obj, d->stream);
            if (rc != CUDA_SUCCESS)
                goto failed;
            st->recorded[st->nrecorded++] = d->handle;
            break;
        case C_HTOD:
            rc = p_htod((CUdeviceptr)d->src, d->params, d->n);
            if (rc != CUDA_SUCCESS)
                goto failed;
            mp_array(&outs_buf, 0);
            break;
        case C_HTOD_ASYNC:      /* memory.h_memcpy_htod: page-locked source, left in flight */
            rc = p_htod_async((CUdeviceptr)d->src, d->host, d->n, d->stream);
            if (rc != CUDA_SUCCESS)
                goto failed;
            break;
        case C_DTOH_ASYNC:      /* memory.h_memcpy_dtoh */
            rc = p_dtoh_async(d->host, (CUdeviceptr)d->src, d->n, d->stream);
            if (rc != CUDA_SUCCESS)
                goto failed;
            break;
        case C_DEV_ATTR: {
            /* the generic path: the value, or the code alone */
            int v = 0;
            code = p_attr(&v, (CUdevice_attribute)d->value, (CUdevice)d->n);
            if (code == CUDA_SUCCESS) {
                mp_array(&outs_buf, 1);
                mp_int(&outs_buf, v);
            } else {
                mp_nil(&outs_buf);
            }
            break;
        }
        case C_STREAM_QUERY:
        case C_EVENT_QUERY:
            /* the generic path: a failure (CUDA_ERROR_NOT_READY above all)
             * is the answer's code, with no outs and no message */
            code = (d->cls == C_STREAM_QUERY ? p_stream_query : p_event_query)(d->obj);
            if (code == CUDA_SUCCESS)
                mp_array(&outs_buf, 0);
            else
                mp_nil(&outs_buf);
            break;
        case C_STREAM_SYNC:
        case C_EVENT_SYNC:
        case C_CTX_SYNC:
            rc = d->cls == C_CTX_SYNC ? p_ctx_sync() : (d->cls == C_STREAM_SYNC ? p_stream_sync : p_event_sync)(d->obj);
            if (rc != CUDA_SUCCESS)
                goto failed;            /* the handler's message names the call: Python */
            mp_array(&outs_buf, 0);
            break;
        case C_DTOH:
            if (d->host) {      /* into page-locked client memory: the answer says nothing (outs [None]) */
                rc = p_dtoh(d->host, (CUdeviceptr)d->src, d->n);
                if (rc != CUDA_SUCCESS)
                    goto failed;
                mp_array(&outs_buf, 1);
                mp_nil(&outs_buf);
                break;
            }
            mp_array(&outs_buf, 1);
            mp_bin_header(&outs_buf, d->n);
            gp_buf_reserve(&outs_buf, d->n);
            rc = p_dtoh(outs_buf.p + outs_buf.len, (CUdeviceptr)d->src, d->n);
            if (rc != CUDA_SUCCESS)
                goto failed;
            outs_buf.len += d->n;
            break;
        }
        continue;
    failed:
        st->done_ops = (int)i + 1;
        st->fail_code = rc;
        st->last_seq = seq;
        return GPX_FAILED;
    }
    st->last_seq = seq;

    /* answer (Server.execute) */
    if (!sync) {
        if (__atomic_load_n(CF64(st->chan, CH_REQ_SEQ), __ATOMIC_ACQUIRE) > st->taken) {
            st->reply_state = 2;         /* the next request's answer settles this one */
            st->served++;
            return GPX_DONE;
        }
        gp_buf_reset(&outs_buf);
        mp_nil(&outs_buf);
    }
    const uint8_t *printed = NULL;
    size_t plen = 0;
    if (sync && st->capture && st->may_print) {
        plen = gpx_out_take(&printed);
        if (last == C_CTX_SYNC)
            st->may_print = 0;   /* every kernel has ended and its printf buffer is flushed */
    }
    if (plen >= INLINE_MAX) {
        /* Python sends it as frames of its own (protocol.Packer) */
        st->code = code;
        st->outs = outs_buf.p;
        st->outs_len = outs_buf.len;
        st->printed = printed;
        st->printed_len = plen;
        st->served++;
        return GPX_REPLY_PY;
    }
    gp_buf_reset(&rep);
    mp_array(&rep, plen ? 7 : 6);
    mp_uint(&rep, seq);
    mp_uint(&rep, (uint64_t)code);
    gp_buf_put_raw(&rep, outs_buf.p, outs_buf.len);
    mp_uint(&rep, 0);
    mp_uint(&rep, 0);
    mp_strn(&rep, "", 0);
    if (plen)
        mp_bin(&rep, printed, plen);
    rep_seq = seq;
    st->reply_state = 1;
    st->served++;
    return publish(st->chan, seq) ? GPX_REPLY_ZMQ : GPX_DONE;
}

/* The last answer built here (Session.last_reply, for duplicates). */
size_t gpx_last_reply(const uint8_t **p, uint64_t *seq)
{
    *p = rep.p;
    *seq = rep_seq;
    return rep.len;
}

int gpx_serve(gpx_serve_state *st)
{
    uint8_t *ch = st->chan;
    if (!ch || st->slot < 0 || st->slot >= MAX_SLOTS || !gpx_serve_ready())
        return GPX_IDLE;
    st->calls = st->served = 0;
    st->reply_state = 0;
    st->nrecorded = 0;
    st->msg = NULL;
    st->msg_len = 0;
    st->done_ops = st->fail_code = st->fail_setctx = 0;
    uint64_t t0 = now_ns(), last = t0;
    for (unsigned k = 1;; k++) {
        uint64_t s = __atomic_load_n(CF64(ch, CH_REQ_SEQ), __ATOMIC_ACQUIRE);
        if (s > st->taken) {
            uint32_t n = *CF32(ch, CH_REQ_LEN);
            if (n <= CH_MAX) {
                if (n > msgcap) {
                    uint8_t *b = realloc(msgbuf, n);
                    if (!b)
                        return GPX_IDLE;     /* Python's poll takes it */
                    msgbuf = b;
                    msgcap = n;
                }
                memcpy(msgbuf, ch + CH_REQ_DATA, n);
                st->taken = s;
                __atomic_store_n(CF64(ch, CH_REQ_TAKEN), s, __ATOMIC_RELEASE);
                int rc = serve_one(st, msgbuf, n);
                if (rc != GPX_DONE) {
                    st->msg = msgbuf;
                    st->msg_len = n;
                    return rc;
                }
                last = now_ns();
                if (last - t0 > st->max_ns)
                    return GPX_IDLE;
                continue;
            }
        }
        uint64_t t = now_ns();
        if (t - last > st->spin_ns || t - t0 > st->max_ns)
            return GPX_IDLE;
        /* every 64 looks (about a microsecond) give the CPU away if another
         * process wants it, as the Python loop does (sched_yield(2) returns
         * at once otherwise): a client and its worker spinning together must
         * not keep other sessions off a machine with few cores */
        if ((k & 63) == 0)
            sched_yield();
        else
            __builtin_ia32_pause();
    }
}
