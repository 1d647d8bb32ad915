/* Internal interface of the gpuproxy shim (libcuda.so.1 + libcudart.so.13).
 *
 * The shim is a client of proxyd. Every remoted driver call becomes one "op"
 * in the wire protocol (docs/protocol.md): [fid, ctx, arg...]. Async ops
 * (spec `sync: false`) are appended to a process-wide batch and sent without
 * waiting; a sync op is sent together with whatever async ops precede it and
 * the caller waits for its reply.
 *
 * Locking: one process-wide recursive mutex (gp_lock/gp_unlock) protects the
 * batch, the socket and all shim tables. Every exported entry point that talks
 * to the daemon holds it for the whole call, so the order in which threads
 * issue calls is the order in which proxyd executes them. */
#ifndef GP_SHIM_H
#define GP_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "gp_msgpack.h"
#include "gp_zmq.h"

#define GP_EXPORT __attribute__((visibility("default")))

/* Object kinds of client-visible handles; must match proxyd/protocol.py. A
 * handle value is (kind << 32) | id, so it is never NULL and never one of the
 * special stream values CU_STREAM_LEGACY (0x1) / CU_STREAM_PER_THREAD (0x2). */
enum gp_kind {
    GP_K_CONTEXT = 1,
    GP_K_MODULE = 2,
    GP_K_FUNCTION = 3,
    GP_K_STREAM = 4,
    GP_K_EVENT = 5,
    /* kinds the shim hands out itself (never sent to proxyd): CUlibrary and
     * CUkernel of the library API (library.c) */
    GP_K_LIBRARY = 16,
    GP_K_KERNEL = 17,
};

/* The function a CUfunction argument stands for: f itself, or, for a CUkernel
 * (which cuda.h lets callers pass as a CUfunction), that kernel's function in
 * the calling thread's current context, loaded there on first use; NULL when
 * it cannot be had. library.c. */
CUfunction gp_function_of(CUfunction f);
/* A context was destroyed or reset: forget the library modules and kernel
 * functions loaded in it (they went with it in proxyd). library.c. */
void gp_library_context_gone(CUcontext ctx);
/* At the top of an entry point taking a CUfunction f (before the lock): a
 * CUkernel becomes its function in the current context. */
#define GP_RESOLVE_FUNCTION(f)                                                  \
    do {                                                                        \
        if (((uint64_t)(uintptr_t)(f) >> 32) == GP_K_KERNEL && !((f) = gp_function_of(f))) \
            return CUDA_ERROR_INVALID_HANDLE;                                   \
    } while (0)

/* Message types, client -> daemon. */
enum { GP_MSG_HELLO = 0, GP_MSG_CALL = 1, GP_MSG_BYE = 2, GP_MSG_DOORBELL = 3, GP_MSG_WHERE = 4, GP_MSG_QUIESCE = 5 };

/* Reply codes below zero are protocol-level, not CUresult. */
#define GP_REPLY_KEEPALIVE (-1)
#define GP_REPLY_PROTOCOL_ERROR (-2)
#define GP_REPLY_UNKNOWN_SESSION (-3)
#define GP_REPLY_WHERE_QUIESCED (-4)   /* supervisor: the worker's device work is done (park.c) */

/* msgpack ext types used on the wire. */
#define GP_EXT_FRAME 1  /* payload: u32 big-endian index of a later frame of the message */
#define GP_EXT_SHM 2    /* payload: u32 segment, u64 offset, u64 length (big-endian) */
#define GP_EXT_CONTENT 3 /* payload: 32-byte SHA-256 of a module image, u64 length (big-endian) */

#define GP_MAX_FRAMES 64

typedef struct gp_reply {
    int code;           /* CUresult of the sync op, or of the first failed async op */
    int have_outs;      /* outs array present */
    uint32_t nouts;
    gp_rd rd;           /* positioned at the first out value */
    int nframes;        /* frames[0] is the msgpack frame */
    zmq_msg_t frames[GP_MAX_FRAMES];
} gp_reply;

/* ---- locking and session ---- */
void gp_lock(void);
/* transport.c: changes whenever the session moves to another worker (a
 * restore, a migration): state derived from the GPU is stale then */
uint64_t gp_session_epoch(void);
/* query_cache.c: sees every op, to drop answers the op may change */
void gp_qc_note_op(uint32_t fid);
/* profile.c (GPUPROXY_PROFILE): per-function call counts and sync waits */
void gp_prof_op(uint32_t fid);
uint64_t gp_prof_wait_begin(void);
void gp_prof_wait_end(uint64_t t0);
void gp_unlock(void);
int gp_trylock(void);               /* 0 when taken (park.c) */
void gp_resend_unanswered(void);
/* Connects (HELLO) if needed. Returns CUDA_SUCCESS or CUDA_ERROR_DEVICE_UNAVAILABLE
 * (after printing one stderr line naming the endpoint). Caller holds the lock. */
CUresult gp_session(void);
const char *gp_endpoint(void);

/* Entry and exit of a hand-written driver entry point that talks to proxyd:
 * GP_ENTER takes gp_lock and makes sure of a session (returning its error,
 * lock released, when there is none); GP_LEAVE(rc) releases the lock and
 * returns rc. */
#define GP_ENTER()                                   \
    gp_lock();                                       \
    do {                                             \
        CUresult s_ = gp_session();                  \
        if (s_ != CUDA_SUCCESS) {                    \
            gp_unlock();                             \
            return s_;                               \
        }                                            \
    } while (0)
#define GP_LEAVE(rc) do { CUresult r_ = (rc); gp_unlock(); return r_; } while (0)

/* ---- building ops (caller holds the lock and has a session) ---- */
/* Starts op [fid, ctx, <nargs args>] in the pending batch, returns the buffer
 * to append exactly nargs msgpack objects to. ctx is the calling thread's
 * current context handle (0 when none). */
gp_buf *gp_op_begin(uint32_t fid, uint32_t nargs);
/* Appends host bytes as one argument: inline bin for small data, otherwise a
 * separate zmq frame referenced by GP_EXT_FRAME. With copy == 0 the bytes must
 * stay valid until the op's message is answered (sync ops only). */
void gp_put_data(gp_buf *b, const void *p, size_t n, int copy);
/* Ends an async op. Returns the sticky async error if one is pending and
 * not yet reported, else CUDA_SUCCESS. */
CUresult gp_op_async(void);
/* Ends a sync op: sends the batch, waits for the reply and fills r. Returns
 * r->code. The caller must call gp_reply_done(r) afterwards. */
CUresult gp_op_sync(gp_reply *r);
/* Flushes pending async ops and waits until proxyd acknowledged all of them. */
CUresult gp_flush(void);
void gp_reply_done(gp_reply *r);
/* Sends the pending batch at once; returns its sequence number (0: failure). */
uint64_t gp_send_now(void);
/* Waits until every message up to seq is answered. */
CUresult gp_wait_acked(uint64_t seq);
CUresult gp_take_async_error(void);
/* Writes a reference to shared host memory (GP_EXT_SHM) as one argument. */
void gp_put_shm(gp_buf *b, uint32_t seg, uint64_t off, uint64_t len);

/* ---- reading outs of a reply ---- */
/* Copies one out value (msgpack bin of exactly n bytes, or an integer) into p. */
void gp_out_value(gp_reply *r, void *p, size_t n);
/* Reads one out handle (uint) into *p. */
void gp_out_handle(gp_reply *r, void **p);
/* Returns the bytes of one out (bin or frame reference); *n gets the size. */
const uint8_t *gp_out_bytes(gp_reply *r, size_t *n);
/* Copies one out buffer into p (at most cap bytes). */
void gp_out_buffer(gp_reply *r, void *p, size_t cap);
int64_t gp_out_int(gp_reply *r);
void gp_out_skip(gp_reply *r);

/* Scalars: integers (including enums) as msgpack ints, floating point as float64. */
#define GP_PUT_SCALAR(b, x) _Generic((x), \
        float: gp_put_f64, double: gp_put_f64, \
        unsigned long long: gp_put_u64, unsigned long: gp_put_u64, unsigned int: gp_put_u64, \
        unsigned short: gp_put_u64, unsigned char: gp_put_u64, \
        default: gp_put_i64)((b), (x))
static inline void gp_put_f64(gp_buf *b, double v) { mp_f64(b, v); }
static inline void gp_put_u64(gp_buf *b, unsigned long long v) { mp_uint(b, v); }
static inline void gp_put_i64(gp_buf *b, long long v) { mp_int(b, v); }
static inline void gp_put_handle(gp_buf *b, const void *h) { mp_uint(b, (uint64_t)(uintptr_t)h); }

/* ---- per-thread context stack (driver API semantics, kept in the client) ---- */
CUcontext gp_ctx_current(void);
void gp_ctx_set_current(CUcontext ctx);
int gp_ctx_push(CUcontext ctx);
CUcontext gp_ctx_pop(void);
/* Remembers which device a context belongs to (for cuCtxGetDevice). */
void gp_ctx_note_device(CUcontext ctx, CUdevice dev);
int gp_ctx_device(CUcontext ctx, CUdevice *dev);
void gp_ctx_forget(CUcontext ctx);
/* Primary contexts: noted at cuDevicePrimaryCtxRetain; proxyd keeps a
 * device's primary handle across resets, so the handle stays known. */
void gp_ctx_note_primary(CUcontext ctx, CUdevice dev);
CUcontext gp_ctx_primary_of(CUdevice dev);   /* NULL: never retained */
/* Adds delta to ctx's cuCtxAttach/cuCtxDetach usage count; returns the new count, -1 if unknown. */
int gp_ctx_add_use(CUcontext ctx, int delta);

/* transport.c: how many ops were begun so far (any op may queue GPU work;
 * slab.c synchronises before reusing freed memory only when this moved).
 * Caller holds the lock. */
uint64_t gp_ops_issued(void);
/* gp_ops_issued() as it was when a cuCtxSynchronize (the newest op then)
 * last succeeded; equal to gp_ops_issued(): no op since. Caller holds the lock. */
uint64_t gp_ops_synced(void);

/* ---- small allocations placed by the shim (slab.c) ---- */
/* Frees p when it is a block of a slab (*handled = 1, the result returned);
 * *handled = 0: p is not in a slab, the worker decides. */
CUresult gp_slab_free(CUdeviceptr p, int *handled);
/* 1 when p lies in a slab: *rc is CUDA_SUCCESS with the block's base and
 * requested size, or CUDA_ERROR_NOT_FOUND (p is in no live block). */
int gp_slab_range(CUdeviceptr p, CUdeviceptr *base, size_t *size, CUresult *rc);
/* The device's allocations are gone in the worker (primary context reset). */
void gp_slab_device_gone(CUdevice dev);
/* A forked child: the parent's slabs are not in the child's session. */
void gp_slab_forget_all(void);

/* ---- device address ranges known to the client ---- */
/* The session's arena (all allocations) and module globals count as device
 * memory; everything else is host memory. Used to resolve cudaMemcpyDefault
 * and cuMemcpy (unified addressing). */
int gp_is_device_ptr(const void *p);
void gp_note_device_range(uint64_t base, uint64_t size);

/* ---- host memory shared with proxyd (cudaMallocHost / cuMemHostAlloc) ---- */
void *gp_host_alloc(size_t size);
int gp_host_free(void *p);
int gp_host_lookup(const void *p, uint32_t *seg, uint64_t *off, uint64_t *avail);
int gp_host_segment(const void *p, uint32_t *id, const char **name, size_t *size);
int gp_shm_ok(void);
/* GPU-visible host memory (docs/host-memory.md): shared segments at the same
 * address in the application and its worker. */
enum { GP_HM_HOST = 1, GP_HM_MANAGED = 2, GP_HM_REGISTERED = 3 };
void *gp_hostmap_alloc(size_t size, int kind, unsigned flags);
int gp_hostmap_adopt(void *p, size_t size, unsigned flags);
int gp_hostmap_info(const void *p, int *kind, unsigned *flags, void **user, size_t *user_size,
                    uint32_t *id, void **base, size_t *size);
int gp_hostmap_registered(const void *p);
int gp_hostmap_free(void *base);
size_t gp_staging_size(void);
void *gp_staging_base(void);
uint32_t gp_staging_id(void);

/* ---- diagnostics ---- */
void gp_warn_unsupported(const char *fn);
void gp_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* curve.c: keyed tcp (CURVE client keys, handshake monitor) */
int gp_curve_setup(void *so, const char *endpoint);
void *gp_curve_monitor(void *zctx, void *so, const char *endpoint);
const char *gp_curve_failure(void *mon, long wait_ms);
void gp_curve_monitor_close(void *so, void *mon);
int gp_debug_enabled(void);

/* sha256.c: the SHA-256 digest of n bytes. */
void gp_sha256(const void *data, size_t n, uint8_t out[32]);
/* driver.c: loads a module image, named by its SHA-256 digest first (sent
 * whole only when the worker has no copy); digest may be NULL (computed
 * here). fid is the cu* function the application called. */
CUresult gp_module_load_image(uint32_t fid, uint32_t nargs, CUmodule *module, const void *data, size_t n,
                              const uint8_t *digest);
/* driver.c: the GPUPROXY_DEBUG line for a symbol with no entry point. */
void gp_proc_note_missing(const char *api, const char *symbol, int version, const void *found);
/* Generated (build/gen): symbol lookup for cuGetProcAddress. */
void *gp_proc_lookup(const char *symbol, int cuda_version, int per_thread, int *found_other_version);
/* Generated: error names of CUresult. */
const char *gp_cu_error_name(CUresult e);

#endif
