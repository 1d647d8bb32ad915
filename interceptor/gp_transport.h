/* The shim's transport (interceptor/LAYERS: transport): the session with
 * proxyd and the ops of the wire protocol (docs/protocol.md). transport.c.
 *
 * Every remoted driver call becomes one "op" [fid, ctx, arg...]. Async ops
 * (spec `sync: false`) are appended to a process-wide batch and sent without
 * waiting; a sync op is sent together with whatever async ops precede it and
 * the caller waits for its reply.
 *
 * Locking: everything here runs under gp_lock (gp_base.h). */
#ifndef GP_TRANSPORT_H
#define GP_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "gp_base.h"
#include "gp_zmq.h"

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

/* ---- what transport.c asks of the layers above it ----
 * transport.c calls no file above it; where it must tell or ask one at a
 * fixed point of a session's life, it calls a hook of this table. Each
 * member is set once, by a constructor of the file named (libcuda.so.1 runs
 * all its constructors on one thread before any entry point can be called),
 * and read afterwards without synchronisation; a member left NULL is
 * skipped. The hooks are called with gp_lock held. */
struct gp_transport_hooks {
    /* hostmem.c: appends the map describing this client to a HELLO (attach:
     * the HELLO re-attaches an existing session) */
    void (*hello_info)(gp_buf *b, int attach);
    /* hostmem.c: reads the worker's HELLO answer (its first out) */
    void (*hello_reply)(gp_rd *rd);
    /* hostmem.c: no daemon answered the HELLO: shared segment names go */
    void (*unreachable)(void);
    /* park.c: a session was opened (installs the park signal and thread) */
    void (*session_open)(void);
    /* query_cache.c: an op was begun (drops cached answers it may change) */
    void (*op_begun)(uint32_t fid);
    /* park.c: called by a thread waiting for an answer while a park is
     * requested; parks that thread there when the supervisor said the
     * session is held at a job's cut (docs/multigpu.md). 0: it parked and
     * is connected again (the caller sends its unanswered messages again);
     * -1: not parked */
    int (*park_in_call)(void);
};
extern struct gp_transport_hooks gp_transport_hooks;

/* ---- session ---- */
/* Connects (HELLO) if needed. Returns CUDA_SUCCESS or CUDA_ERROR_DEVICE_UNAVAILABLE
 * (after printing one stderr line naming the endpoint). Caller holds the lock. */
CUresult gp_session(void);
const char *gp_endpoint(void);
const char *gp_session_token(void);
const char *gp_shm_id(void);        /* gp_shm_id_of(the current token) */
int gp_session_pid(void);
/* changes whenever the session moves to another worker (a restore, a
 * migration): state derived from the GPU is stale then */
uint64_t gp_session_epoch(void);
void gp_resend_unanswered(void);
/* park.c: around a whole-process checkpoint */
int gp_transport_quiesce(void);
/* The same for a session held at a job's cut: what is batched is sent, but
 * no answer waited for (the held messages have not run; they are sent again
 * after going on). */
int gp_transport_quiesce_held(void);
int gp_transport_park(void);
int gp_transport_unpark(const char *endpoint);
/* Gives the session up after a park that never ended (park.c: restored,
 * never resumed): one line naming the endpoint; every later CUDA call of
 * this process fails at once. */
void gp_transport_abandon(long waited_s);
void gp_transport_daemon_gone(void);   /* park.c: the supervisor holding the park died */

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

/* How many ops were begun so far (any op may queue GPU work; slab.c
 * synchronises before reusing freed memory only when this moved). Caller
 * holds the lock. */
uint64_t gp_ops_issued(void);
/* gp_ops_issued() as it was when a cuCtxSynchronize (the newest op then)
 * last succeeded; equal to gp_ops_issued(): no op since. Caller holds the lock. */
uint64_t gp_ops_synced(void);

/* ---- ops of the library stand-ins (gp_lib.h, docs/libraries.md) ---- */
/* Ends a sync library op: sends the batch and waits. Returns 0 with r->code
 * the library's own status of this call, or -1 when proxyd cannot be
 * reached (after one stderr line). An earlier asynchronous op's failure is
 * not reported here: it stays pending for the next synchronising CUDA call
 * (cudaStreamSynchronize, cudaDeviceSynchronize, ...), as a kernel's would.
 * The caller must call gp_reply_done(r). */
int gp_lib_op_sync(gp_reply *r);
/* Ends an async library op (gemm): 0, or -1 when proxyd cannot be reached. */
int gp_lib_op_async(void);
/* Counts the asynchronous ops that failed: a library setting such an op
 * carried may not have been made (lib_cublas.c sends its settings again). */
uint64_t gp_lib_failure_gen(void);

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

#endif
