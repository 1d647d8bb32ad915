/* Transport of the shim: session set-up, batching of async ops, sync round
 * trips, resends across daemon restarts. The wire format is in
 * docs/protocol.md; the daemon side is proxyd/worker/server.py.
 *
 * Reliability model: every message carries a sequence number. Until proxyd
 * answers a message, the shim keeps it and sends it again after each second
 * of silence; proxyd executes each sequence number at most once and answers
 * duplicates from its record (the last sync reply is part of a checkpoint
 * image, so this holds across dump, daemon restart and restore). proxyd
 * answers a duplicate of a message it is still working on with KEEPALIVE.
 *
 * Two sockets: `sup` talks to proxyd's supervisor at the public endpoint
 * (HELLO, which says where this session's worker is; WHERE, asked after a
 * silence to learn whether the worker is busy, moved after a restore, dead or
 * released; PARKED), and `sock` talks to the session's worker, which executes
 * the calls. A worker that is alive but busy (a long synchronisation) is
 * waited for; one that died fails the call within about a second with the
 * reason; a supervisor that stops answering fails it after GPUPROXY_TIMEOUT_MS
 * (default 5 s), except during a planned wait (the session was dumped and
 * waits for a restore), which lasts up to GPUPROXY_RESTORE_WAIT_S.
 *
 * Locking: everything here runs under gp_lock (a recursive mutex, lock.c).
 *
 * Layers (interceptor/LAYERS): this file uses the wire (channel.c, curve.c),
 * the context stack and the profile below it, and calls nothing above it:
 * what it must tell the layers above (HELLO contents, a session opened, an
 * op begun) goes through gp_transport_hooks (gp_transport.h). */
#define _GNU_SOURCE
#include "gp_context.h"
#include "gp_gen.h"
#include "gp_profile.h"
#include "gp_transport.h"
#include "gp_wire.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#define GP_DEFAULT_ENDPOINT "ipc:///tmp/gpuproxy.sock"
#define GP_INLINE_MAX (16 * 1024)      /* larger payloads travel as their own frame */
#define GP_BATCH_MAX_OPS 4096
#define GP_BATCH_MAX_BYTES (1u << 20)
#define GP_WINDOW_MSGS 2                /* async messages in flight before the shim waits */
#define GP_WINDOW_BYTES (64u << 20)
#define GP_HDR_RESERVE 16               /* room for the message header before the ops */

struct gp_transport_hooks gp_transport_hooks;

/* A message waiting for its answer. Frame 0 is msgpack; frames 1.. are bulk data. */
typedef struct gp_frame {
    const void *p;
    size_t n;
    int owned;          /* free(p) once answered */
} gp_frame;

typedef struct gp_msg {
    uint64_t seq;
    int sync;
    gp_buf head;        /* frame 0: GP_HDR_RESERVE bytes of room, then the ops */
    size_t head_off;    /* where frame 0 starts inside head.p */
    int nframes;        /* data frames */
    gp_frame frames[GP_MAX_FRAMES];
    size_t bytes;
} gp_msg;

static struct {
    int state;                  /* 0 new, 1 connected, 2 failed to connect */
    pid_t pid;
    char endpoint[512];         /* the supervisor's (public) endpoint */
    char wendpoint[512];        /* the session's worker */
    char token[40];
    void *zctx;
    void *sock;                 /* to the worker (during the first HELLO: the supervisor) */
    void *sup;                  /* to the supervisor */
    void *sup_mon;              /* tcp: handshake failures of `sup` until the first answer (curve.c) */
    int in_session;             /* HELLO done: silences are probed with WHERE */
    int planned;                /* the supervisor said: dumped, waiting for a restore */
    uint64_t planned_since;
    long restore_wait_s;
    uint64_t seq;
    uint64_t answered;          /* highest sequence number whose answer was taken */
    /* the batch being built */
    gp_msg cur;
    uint32_t cur_ops;
    uint64_t ops_issued;    /* every op ever begun (gp_ops_issued) */
    uint32_t last_fid;      /* the newest op's function */
    uint64_t ctx_synced_at; /* ops_issued when a cuCtxSynchronize, the newest op then, succeeded (gp_ops_synced) */
    int cur_has_ops;
    /* async messages sent and not yet answered */
    gp_msg inflight[GP_WINDOW_MSGS + 1];
    int ninflight;
    size_t inflight_bytes;
    /* first async error not yet reported to the application */
    CUresult async_err;
    int debug;
    long spin_us;
    long timeout_ms;            /* silence after which a connected session gives up */
    long connect_ms;            /* silence after which the first contact gives up */
    int batching;
    int warned_unreachable;
    uint64_t epoch;             /* counts worker endpoints taken: restores, migrations */
} G;

/* ---------------------------------------------------------------- utils */

static uint64_t now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000u + (uint64_t)t.tv_nsec / 1000u;
}

static long env_long(const char *name, long def)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return def;
    char *end;
    long v = strtol(s, &end, 10);
    return *end ? def : v;
}

const char *gp_endpoint(void) { return G.endpoint; }

/* ------------------------------------------------------------------ fork */

static void child_after_fork(void)
{
    /* CUDA state does not survive fork(); the child starts a session of its
     * own if it uses CUDA. The parent's socket belongs to the parent's zmq
     * threads, which do not exist here: leak it rather than touch it. (The
     * lock is a fresh mutex already: lock.c runs this after making it.) */
    G.state = 0;
    G.zctx = NULL;
    G.sock = NULL;
    G.sup = NULL;
    G.sup_mon = NULL;
    G.in_session = 0;
    G.planned = 0;
    G.ninflight = 0;
    G.inflight_bytes = 0;
    gp_buf_init(&G.cur.head);
    G.cur_ops = 0;
    G.cur_has_ops = 0;
    G.cur.nframes = 0;
    G.cur.bytes = 0;
    gp_chan_forget();
}

__attribute__((constructor)) static void register_fork_child(void)
{
    gp_on_fork_child(child_after_fork);
}

uint64_t gp_ops_issued(void) { return G.ops_issued; }
uint64_t gp_ops_synced(void) { return G.ctx_synced_at; }

/* ------------------------------------------------------------ messages */

static void msg_reset(gp_msg *m)
{
    for (int i = 0; i < m->nframes; i++)
        if (m->frames[i].owned)
            free((void *)m->frames[i].p);
    m->nframes = 0;
    m->bytes = 0;
    gp_buf_reset(&m->head);
    gp_buf_reserve(&m->head, GP_HDR_RESERVE);
    m->head.len = GP_HDR_RESERVE;
}

static void msg_free(gp_msg *m)
{
    msg_reset(m);
    gp_buf_free(&m->head);
}

static void noop_free(void *data, void *hint) { (void)data; (void)hint; }

/* Sends message m. Large frames go zero-copy: their memory stays valid until
 * the message is answered (owned copies, or the caller's buffer of a sync op). */
static int zmq_send_msg(gp_msg *m, int nowait);

/* Sends m through the fast channel when it can go that way (one frame that
 * fits, the slot free), else through ZeroMQ. Resends always use ZeroMQ. */
static int msg_send(gp_msg *m)
{
    if (m->nframes == 0) {
        int bell;
        if (gp_chan_send(m->seq, m->head.p + m->head_off, m->head.len - m->head_off, &bell) == 0) {
            if (bell) {
                /* proxyd sleeps: wake it with a doorbell [3, seq] */
                uint8_t d[16];
                gp_buf b = { d, 0, sizeof d };
                mp_array(&b, 2);
                mp_uint(&b, GP_MSG_DOORBELL);
                mp_uint(&b, m->seq);
                zmq_send(G.sock, d, b.len, 0);
            }
            return 0;
        }
    }
    return zmq_send_msg(m, 0);
}

/* nowait: fail (EAGAIN) rather than block when the socket has no pipe to
 * its peer. A DEALER whose tcp handshake was refused (curve.c: a key proxyd
 * does not admit) has none until ZeroMQ reconnects, and a plain send would
 * wait for it forever; resends and first contacts use nowait and are tried
 * again later. Once the first frame is queued, the rest of the message is. */
static int zmq_send_msg(gp_msg *m, int nowait)
{
    zmq_msg_t zm;
    int more = m->nframes ? ZMQ_SNDMORE : 0;
    size_t n0 = m->head.len - m->head_off;
    if (zmq_send(G.sock, m->head.p + m->head_off, n0, more | (nowait ? ZMQ_DONTWAIT : 0)) < 0)
        return -1;
    for (int i = 0; i < m->nframes; i++) {
        int flags = (i + 1 < m->nframes) ? ZMQ_SNDMORE : 0;
        const gp_frame *f = &m->frames[i];
        if (f->n >= GP_INLINE_MAX) {
            zmq_msg_init_data(&zm, (void *)f->p, f->n, noop_free, NULL);
            if (zmq_msg_send(&zm, G.sock, flags) < 0) {
                zmq_msg_close(&zm);
                return -1;
            }
        } else if (zmq_send(G.sock, f->p, f->n, flags) < 0) {
            return -1;
        }
    }
    return 0;
}

/* Writes the header [type, seq, ops-array] right before the ops in m->head. */
static void msg_seal(gp_msg *m, int type, uint32_t nops)
{
    uint8_t tmp[GP_HDR_RESERVE];
    gp_buf h = { tmp, 0, sizeof tmp };
    m->seq = ++G.seq;
    /* a fixed buffer: reserve never grows it because the header fits in 16 bytes */
    mp_array(&h, 3);
    mp_uint(&h, (uint64_t)type);
    mp_uint(&h, m->seq);
    mp_array(&h, nops);
    m->head_off = GP_HDR_RESERVE - h.len;
    memcpy(m->head.p + m->head_off, tmp, h.len);
    m->bytes += m->head.len - m->head_off;
}

/* --------------------------------------------------------------- replies */

static void reply_init(gp_reply *r)
{
    r->code = 0;
    r->have_outs = 0;
    r->nouts = 0;
    r->nframes = 0;
    gp_rd_init(&r->rd, NULL, 0);
}

void gp_reply_done(gp_reply *r)
{
    for (int i = 0; i < r->nframes; i++)
        zmq_msg_close(&r->frames[i]);
    r->nframes = 0;
}

/* How long a wait for an answer spins (yielding the CPU every 16 looks)
 * before it sleeps on ZeroMQ. CUDA's default scheduling (CU_CTX_SCHED_AUTO,
 * cuda.h: cuCtxCreate) spins while a synchronising call waits for the GPU
 * when the machine has more logical processors than active contexts, and
 * only yields otherwise; a client that slept after 250 us paid a ZeroMQ
 * wake-up (50-100 us on the H100) on every synchronisation longer than that:
 * one client's loop of 8 MiB page-locked copies ran at 0.79 of native, 0.95
 * with a 5 ms spin, 64 MiB ones at 0.87 and 0.97 (2026-11-24). So with more
 * than two processors (the client and its worker each keep one) the spin
 * lasts 20 ms; on smaller machines it stays short, so that a spinning client
 * never holds the CPU its worker needs. GPUPROXY_SPIN_US overrides both. */
static long default_spin_us(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 2 ? 20000 : 250;
}

/* Receives one whole message (all frames) into r; waits at most timeout_ms
 * (0: do not wait). Spins first for spin_us, since a reply usually arrives
 * within tens of microseconds and waking a sleeping thread costs as much. */
static int recv_message(gp_reply *r, long timeout_ms)
{
    reply_init(r);
    zmq_msg_t *m = &r->frames[0];
    int got = gp_chan_recv(m);
    if (got == 0) {
        r->nframes = 1;
        return 0;
    }
    zmq_msg_init(m);
    got = zmq_msg_recv(m, G.sock, ZMQ_DONTWAIT);
    if (got < 0 && timeout_ms > 0) {
        uint64_t spin_end = now_us() + (uint64_t)G.spin_us;
        unsigned k = 0;
        while (got < 0 && now_us() < spin_end) {
            zmq_msg_close(m);
            if (gp_chan_recv(m) == 0) {
                r->nframes = 1;
                return 0;
            }
            zmq_msg_init(m);
            /* the socket costs a system call: look at it less often than at
             * the channel; at the same rate give the CPU away if another
             * thread wants it (sched_yield(2) returns at once otherwise), so
             * that on a machine with few cores this spin does not keep the
             * worker that is to answer, or other sessions, off the CPU */
            if ((++k & 15) == 0 || !gp_chan_active()) {
                if ((k & 15) == 0)
                    sched_yield();
                got = zmq_msg_recv(m, G.sock, ZMQ_DONTWAIT);
            }
        }
        if (got < 0) {
            if (gp_chan_idle(1)) {
                zmq_msg_close(m);
                if (gp_chan_recv(m) == 0) {
                    r->nframes = 1;
                    return 0;
                }
                zmq_msg_init(m);
            }
            zmq_pollitem_t it = { G.sock, 0, ZMQ_POLLIN, 0 };
            int pr = zmq_poll(&it, 1, timeout_ms);
            gp_chan_idle(0);
            if (pr > 0)
                got = zmq_msg_recv(m, G.sock, ZMQ_DONTWAIT);
            if (got < 0) {
                zmq_msg_close(m);
                if (gp_chan_recv(m) == 0) {
                    r->nframes = 1;
                    return 0;
                }
                zmq_msg_init(m);
            }
        }
    }
    if (got < 0) {
        zmq_msg_close(m);
        return -1;
    }
    r->nframes = 1;
    while (zmq_msg_more(&r->frames[r->nframes - 1])) {
        if (r->nframes == GP_MAX_FRAMES) {
            gp_log("reply with too many frames");
            gp_reply_done(r);
            return -1;
        }
        zmq_msg_t *f = &r->frames[r->nframes];
        zmq_msg_init(f);
        zmq_msg_recv(f, G.sock, 0);
        r->nframes++;
    }
    return 0;
}

/* Parses frame 0 of a reply: [seq, code, outs, async_code, async_fid] or
 * [seq, code, message] for protocol errors. */
/* msg/msglen: proxyd's explanation of a failure (printed by the caller, once
 * per fresh reply, never for a duplicate). */
static const uint8_t *reply_printed;   /* device printf output carried by the last parsed reply */
static size_t reply_printed_len;

static int reply_parse(gp_reply *r, uint64_t *seq, int *code, CUresult *async_code, uint32_t *async_fid,
                       const uint8_t **msg, size_t *msglen)
{
    *msg = NULL;
    *msglen = 0;
    reply_printed = NULL;
    reply_printed_len = 0;
    gp_rd_init(&r->rd, zmq_msg_data(&r->frames[0]), zmq_msg_size(&r->frames[0]));
    uint32_t n = mp_get_array(&r->rd);
    *seq = mp_get_uint(&r->rd);
    *code = (int)mp_get_int(&r->rd);
    *async_code = CUDA_SUCCESS;
    *async_fid = 0;
    if (r->rd.err || n < 2)
        return -1;
    if (*code < 0) {
        if (*code != GP_REPLY_KEEPALIVE && n >= 3)
            *msg = mp_get_bytes(&r->rd, msglen);
        return 0;
    }
    if (n >= 5) {
        /* outs come before the async fields; remember where they are */
        gp_rd outs = r->rd;
        mp_skip(&r->rd);
        *async_code = (CUresult)mp_get_int(&r->rd);
        *async_fid = (uint32_t)mp_get_uint(&r->rd);
        if (n >= 6)
            *msg = mp_get_bytes(&r->rd, msglen);
        if (n >= 7)   /* what the session's kernels printed (printf), for our stdout */
            reply_printed = mp_get_bytes(&r->rd, &reply_printed_len);
        r->rd = outs;
        mp_obj o;
        gp_rd peek = r->rd;
        if (mp_next(&peek, &o) == 0 && o.type == MP_ARRAY) {
            r->nouts = mp_get_array(&r->rd);
            r->have_outs = 1;
        } else {
            mp_skip(&r->rd);
        }
    }
    return r->rd.err ? -1 : 0;
}

static uint64_t async_failures;     /* gp_lib_failure_gen */

uint64_t gp_lib_failure_gen(void) { return __atomic_load_n(&async_failures, __ATOMIC_RELAXED); }

static void note_async_error(CUresult e, uint32_t fid)
{
    if (e != CUDA_SUCCESS)    /* a library setting it carried may not have been made */
        __atomic_add_fetch(&async_failures, 1, __ATOMIC_RELAXED);
    if (e != CUDA_SUCCESS && G.async_err == CUDA_SUCCESS) {
        G.async_err = e;
        if (G.debug)
            gp_log("async op (function id %u) failed with %d", fid, (int)e);
    }
}

/* Answers normally come in order, but proxyd may answer an async message
 * later than a following sync one (docs/protocol.md), so look the seq up. */
static void inflight_remove(int i)
{
    G.inflight_bytes -= G.inflight[i].bytes;
    msg_free(&G.inflight[i]);
    memmove(&G.inflight[i], &G.inflight[i + 1], (size_t)(G.ninflight - 1 - i) * sizeof(gp_msg));
    G.ninflight--;
    memset(&G.inflight[G.ninflight], 0, sizeof(gp_msg));
}

static void resend_all(gp_msg *sync_msg)
{
    for (int i = 0; i < G.ninflight; i++)
        zmq_send_msg(&G.inflight[i], 1);
    if (sync_msg)
        zmq_send_msg(sync_msg, 1);
}

static int where_probe(void);
static int send_async_batch(void);

/* A park requested while this thread waits for an answer the worker holds
 * at a job's cut happens here (park.c); 1 when it did. */
static int park_in_call(void)
{
    return gp_transport_hooks.park_in_call && gp_transport_hooks.park_in_call() == 0;
}

/* Waits for answers. Returns 0 when the sync message (if given) has been
 * answered (its reply left in *out) or, without one, when at most
 * `max_inflight` async messages remain unanswered. silence_ms: how long a
 * total silence may last before giving up. */
static int pump(gp_msg *sync_msg, gp_reply *out, int max_inflight, long silence_ms, int wait)
{
    uint64_t last_heard = now_us();
    uint64_t last_send = last_heard;
    for (;;) {
        if (!sync_msg && G.ninflight <= max_inflight)
            return 0;
        long slice = gp_chan_active() ? 20 : 200;   /* a missed channel wake-up costs at most this */
        gp_reply r;
        if (recv_message(&r, wait ? slice : 0) < 0) {
            if (!wait)
                return 1;
            if (park_in_call()) {
                last_heard = last_send = now_us();
                resend_all(sync_msg);    /* the held messages, to the worker as it is now */
                continue;
            }
            uint64_t t = now_us();
            if (t - last_send >= 1000000u) {
                last_send = t;
                if (G.in_session) {
                    /* Nothing for a second: ask the supervisor whether the
                     * worker is busy (then keep waiting), moved (a restore:
                     * go there), dead, or the session waits for a restore. */
                    int w = where_probe();
                    if (w < 0)
                        return -3;
                    t = now_us();
                    if (w > 0)
                        last_heard = t;
                }
                /* Send everything unanswered again: a restarted or restored
                 * worker executes what it has not, and answers the rest from
                 * its record. */
                resend_all(sync_msg);
            }
            if ((long)((t - last_heard) / 1000u) >= silence_ms)
                return -1;
            continue;
        }
        last_heard = now_us();
        uint64_t seq;
        int code;
        CUresult acode;
        uint32_t afid;
        const uint8_t *why;
        size_t whylen;
        if (reply_parse(&r, &seq, &code, &acode, &afid, &why, &whylen) < 0) {
            gp_log("malformed reply from proxyd ignored");
            gp_reply_done(&r);
            continue;
        }
        if (code == GP_REPLY_KEEPALIVE) {
            gp_reply_done(&r);
            if (park_in_call()) {
                last_heard = last_send = now_us();
                resend_all(sync_msg);
            }
            continue;
        }
        if (code >= 0 && seq <= G.answered && !(sync_msg && seq == sync_msg->seq)) {
            /* a second copy of an answer already taken (proxyd answers by
             * ZeroMQ as well when we slept, and answers resends): it must
             * not report its async error or explanation again */
            gp_reply_done(&r);
            continue;
        }
        if (why && whylen)
            gp_log("proxyd: %.*s", (int)whylen, (const char *)why);
        if (reply_printed && reply_printed_len)
            /* into the app's own stdout buffer, where the device's printf
             * output of a native process goes too (and in the same order) */
            fwrite(reply_printed, 1, reply_printed_len, stdout);
        if (code == GP_REPLY_UNKNOWN_SESSION || code == GP_REPLY_PROTOCOL_ERROR) {
            /* the daemon cannot run anything of this session: fail the wait */
            gp_reply_done(&r);
            return -2;
        }
        if (seq > G.answered)
            G.answered = seq;
        note_async_error(acode, afid);
        /* proxyd executes messages in order: an answer to seq also
         * settles every earlier message (the fast channel keeps only the
         * newest answer, so earlier ones may never be seen) */
        for (int i = G.ninflight - 1; i >= 0; i--)
            if (G.inflight[i].seq <= seq)
                inflight_remove(i);
        if (sync_msg && seq == sync_msg->seq) {
            *out = r;
            out->code = code;
            return 0;
        }
        gp_reply_done(&r);   /* an answer to a resend we no longer wait for */
    }
}

/* The session is lost for good: say so once, then every later call of
 * this process fails at once (G.state 4) instead of waiting the timeout out
 * again, which doubled the time to fail and the message. */
static CUresult lost_daemon(int why)
{
    if (G.state == 4)
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    if (why == -2)
        gp_log("proxyd at %s does not know this process's session (daemon restarted without a restore?)", G.endpoint);
    else if (why == -3)
        ;   /* where_probe said why */
    else
        gp_log("proxyd at %s stopped answering for %ld ms; this process's CUDA calls fail from now on",
               G.endpoint, G.timeout_ms);
    G.state = 4;
    return CUDA_ERROR_DEVICE_UNAVAILABLE;
}

/* --------------------------------------------------------------- session */

static void make_token(void)
{
    unsigned char rnd[8] = {0};
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, rnd, sizeof rnd) != (ssize_t)sizeof rnd)
            memset(rnd, 0, sizeof rnd);
        close(fd);
    }
    uint64_t t = now_us();
    for (int i = 0; i < 8; i++)
        rnd[i] ^= (unsigned char)(t >> (8 * i));
    snprintf(G.token, sizeof G.token, "%02x%02x%02x%02x%02x%02x%02x%02x-%d",
             rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7], (int)getpid());
}

/* A DEALER connected to endpoint (a CURVE client on tcp, curve.c); mon, when
 * not NULL, gets a monitor of its handshakes, set up before it connects. */
static void *new_dealer(const char *endpoint, void **mon)
{
    void *so = zmq_socket(G.zctx, ZMQ_DEALER);
    if (!so)
        return NULL;
    char rid[64];
    int n = snprintf(rid, sizeof rid, "c:%s", G.token);
    zmq_setsockopt(so, ZMQ_ROUTING_ID, rid, (size_t)n);
    int linger = 0, ivl = 50, ivlmax = 500, hwm = 0;
    zmq_setsockopt(so, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(so, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    zmq_setsockopt(so, ZMQ_RECONNECT_IVL_MAX, &ivlmax, sizeof ivlmax);
    zmq_setsockopt(so, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(so, ZMQ_RCVHWM, &hwm, sizeof hwm);
    if (gp_curve_setup(so, endpoint) < 0) {     /* it said why */
        zmq_close(so);
        return NULL;
    }
    if (mon)
        *mon = gp_curve_monitor(G.zctx, so, endpoint);
    if (zmq_connect(so, endpoint) < 0) {
        gp_log("cannot use endpoint %s: %s", endpoint, zmq_strerror(zmq_errno()));
        if (mon) {
            gp_curve_monitor_close(so, *mon);
            *mon = NULL;
        }
        zmq_close(so);
        return NULL;
    }
    return so;
}

static int open_socket(void)
{
    G.zctx = zmq_ctx_new();
    if (!G.zctx)
        return -1;
    zmq_ctx_set(G.zctx, ZMQ_IO_THREADS, 1);
    zmq_ctx_set(G.zctx, ZMQ_BLOCKY, 0);
    G.sup = new_dealer(G.endpoint, &G.sup_mon);
    G.sock = G.sup;
    return G.sup ? 0 : -1;
}

/* A worker endpoint as the client must dial it: a worker bound to all
 * interfaces (tcp://0.0.0.0:PORT) is reached at the host we reached the
 * supervisor at. */
uint64_t gp_session_epoch(void) { return G.epoch; }

static void set_worker_endpoint(const char *ep, size_t n)
{
    char tmp[512];
    G.epoch++;
    snprintf(tmp, sizeof tmp, "%.*s", (int)n, ep);
    const char *any[] = { "tcp://0.0.0.0:", "tcp://*:", "tcp://[::]:" };
    for (unsigned i = 0; i < sizeof any / sizeof any[0]; i++) {
        size_t k = strlen(any[i]);
        if (!strncmp(tmp, any[i], k) && !strncmp(G.endpoint, "tcp://", 6)) {
            const char *host = G.endpoint + 6;
            const char *colon = strrchr(host, ':');
            int hl = colon ? (int)(colon - host) : (int)strlen(host);
            snprintf(G.wendpoint, sizeof G.wendpoint, "tcp://%.*s:%s", hl, host, tmp + k);
            return;
        }
    }
    snprintf(G.wendpoint, sizeof G.wendpoint, "%s", tmp);
}

/* Reads the "endpoint" of a supervisor answer's first out (a map). */
static int answer_endpoint(gp_rd *rd, const uint8_t **state, size_t *slen, const uint8_t **why, size_t *wlen)
{
    int found = 0;
    if (state) { *state = NULL; *slen = 0; }
    if (why) { *why = NULL; *wlen = 0; }
    uint32_t n = mp_get_map(rd);
    for (uint32_t i = 0; i < n && !rd->err; i++) {
        size_t kl, vl;
        const uint8_t *k = mp_get_bytes(rd, &kl);
        if (k && kl == 8 && !memcmp(k, "endpoint", 8)) {
            const uint8_t *v = mp_get_bytes(rd, &vl);
            if (v && vl) {
                set_worker_endpoint((const char *)v, vl);
                found = 1;
            }
        } else if (k && kl == 5 && !memcmp(k, "state", 5) && state) {
            *state = mp_get_bytes(rd, slen);
        } else if (k && kl == 3 && !memcmp(k, "why", 3) && why) {
            *why = mp_get_bytes(rd, wlen);
        } else {
            mp_skip(rd);
        }
    }
    return found && !rd->err;
}

/* Opens the data socket to the worker named in G.wendpoint and says HELLO
 * there (attach: re-attach an existing session without taking a sequence
 * number). 0 on success. */
static int hello_worker(int attach, long limit_ms);

/* Goes to the session's new worker after a restore: a new socket, an
 * attaching HELLO; the caller then resends what is unanswered. */
static int reconnect_worker(void)
{
    void *old = G.sock;
    G.sock = new_dealer(G.wendpoint, NULL);
    if (!G.sock) {
        G.sock = old;
        return -1;
    }
    if (old && old != G.sup)
        zmq_close(old);
    gp_chan_pause();      /* until the new worker says it maps the channel */
    if (hello_worker(1, G.connect_ms > 2000 ? G.connect_ms : 2000) < 0)
        return -1;
    if (G.debug)
        gp_log("session %s re-attached at %s", G.token, G.wendpoint);
    return 0;
}

/* /dev/shm/gpuproxy-released-<token>: written by the supervisor when a
 * --dump without --leave-running releases this session's GPU state
 * (proxyd/supervisor/markers.py). A client that learns of its release only after that
 * daemon is gone (killed, replaced by a new one that does not know the
 * session yet) still knows it waits for a restore, and keeps waiting up to
 * GPUPROXY_RESTORE_WAIT_S instead of failing (planned_wait, below).
 * The marker goes when the session runs again (restored). It only delays a
 * failure, so its owner is not checked. Clients on another host (tcp) share
 * no /dev/shm with proxyd: they rely on the supervisor's answer alone. */
static int gp_released_marker(void)
{
    char path[160];
    snprintf(path, sizeof path, "/dev/shm/gpuproxy-released-%s", gp_shm_id());
    return access(path, F_OK) == 0;
}

static void gp_released_clear(void)
{
    char path[160];
    snprintf(path, sizeof path, "/dev/shm/gpuproxy-released-%s", gp_shm_id());
    unlink(path);
}

/* Whether this session waits for a restore: the supervisor said so
 * (released), or, when the daemon that said it is gone or was replaced
 * before we asked, the marker it left (gp_released_marker). */
static int planned_wait(void)
{
    if (!G.planned && gp_released_marker()) {
        G.planned = 1;
        G.planned_since = now_us();
        gp_log("session dumped: waiting for a restore (at most %ld s, GPUPROXY_RESTORE_WAIT_S)", G.restore_wait_s);
    }
    return G.planned && (long)((now_us() - G.planned_since) / 1000000u) < G.restore_wait_s;
}

static int where_probe(void)
{
    char pidns[128] = "";
    ssize_t k = readlink("/proc/self/ns/pid", pidns, sizeof pidns - 1);
    pidns[k > 0 ? k : 0] = 0;
    gp_buf b;
    gp_buf_init(&b);
    mp_array(&b, 3);
    mp_uint(&b, GP_MSG_WHERE);
    mp_uint(&b, 0);
    mp_map(&b, 2);
    mp_str(&b, "pid");
    mp_int(&b, getpid());
    mp_str(&b, "pidns");
    mp_str(&b, pidns);
    int sent = zmq_send(G.sup, b.p, b.len, ZMQ_DONTWAIT);
    gp_buf_free(&b);
    if (sent < 0)
        return planned_wait() ? 1 : 0;   /* no daemon at all for now: a restart may be under way */
    zmq_pollitem_t it = { G.sup, 0, ZMQ_POLLIN, 0 };
    if (zmq_poll(&it, 1, 1000) <= 0) {
        if (planned_wait())
            return 1;   /* a daemon restart is part of a planned wait */
        return 0;
    }
    /* take the newest answer (a late one to an earlier probe may be queued) */
    zmq_msg_t m, last;
    zmq_msg_init(&last);
    int have = 0;
    for (;;) {
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, G.sup, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            break;
        }
        zmq_msg_close(&last);
        last = m;
        have = 1;
    }
    if (!have) {
        zmq_msg_close(&last);
        return 0;
    }
    gp_rd rd;
    gp_rd_init(&rd, zmq_msg_data(&last), zmq_msg_size(&last));
    uint32_t n = mp_get_array(&rd);
    mp_get_uint(&rd);
    int code = (int)mp_get_int(&rd);
    int rc = 0;
    const uint8_t *st = NULL, *why = NULL;
    size_t sl = 0, wl = 0;
    char prev[512];
    snprintf(prev, sizeof prev, "%s", G.wendpoint);
    int has_ep = 0;
    if (!rd.err && n >= 3 && code == 0 && mp_get_array(&rd) >= 1)
        has_ep = answer_endpoint(&rd, &st, &sl, &why, &wl);
    if (rd.err || !st) {
        rc = 0;
    } else if (sl == 7 && !memcmp(st, "running", 7)) {
        gp_released_clear();     /* restored (or never released): no wait to mark */
        G.planned = 0;
        rc = 1;
        if (has_ep && strcmp(prev, G.wendpoint) != 0)
            rc = reconnect_worker() == 0 ? 2 : 1;
    } else if ((sl == 8 && !memcmp(st, "released", 8)) || (sl == 8 && !memcmp(st, "starting", 8))) {
        if (!G.planned) {
            G.planned = 1;
            G.planned_since = now_us();
            gp_log("session dumped: waiting for a restore (at most %ld s, GPUPROXY_RESTORE_WAIT_S)", G.restore_wait_s);
        }
        rc = (long)((now_us() - G.planned_since) / 1000000u) < G.restore_wait_s ? 1 : -1;
        if (rc < 0)
            gp_log("no restore came within %ld s; giving up", G.restore_wait_s);
    } else if (sl == 4 && !memcmp(st, "dead", 4)) {
        gp_log("proxyd at %s lost this session: %.*s", G.endpoint, (int)wl, why ? (const char *)why : "its worker ended");
        rc = -1;
    } else {   /* unknown */
        if (planned_wait()) {
            rc = 1;   /* a restarted daemon: the restore may still come */
        } else {
            gp_log("proxyd at %s does not know this process's session (daemon restarted without a restore?)",
                   G.endpoint);
            rc = -1;
        }
    }
    zmq_msg_close(&last);
    return rc;
}

/* HELLO's contents and answer, and a daemon that never answered, are
 * hostmem.c's business (gp_transport_hooks). */
static void hello_info(gp_buf *b, int attach)
{
    if (gp_transport_hooks.hello_info)
        gp_transport_hooks.hello_info(b, attach);
    else
        mp_map(b, 0);
}

static void hello_unreachable(void)
{
    if (gp_transport_hooks.unreachable)
        gp_transport_hooks.unreachable();
}

static void bye_at_exit(void)
{
    if (G.state != 1 || G.pid != getpid())
        return;
    gp_lock();
    /* Let queued async work reach the daemon, then end the session. */
    gp_flush();
    gp_msg m;
    memset(&m, 0, sizeof m);
    msg_reset(&m);
    msg_seal(&m, GP_MSG_BYE, 0);
    msg_send(&m);
    gp_reply r;
    if (pump(&m, &r, 0, 500, 1) == 0)
        gp_reply_done(&r);
    msg_free(&m);
    G.state = 3;
    gp_unlock();
}

static int hello_worker(int attach, long limit_ms)
{
    gp_msg m;
    memset(&m, 0, sizeof m);
    msg_reset(&m);
    hello_info(&m.head, attach);
    if (attach) {
        /* seq 0: an attach must not move the session's sequence numbers */
        uint64_t keep = G.seq;
        G.seq = (uint64_t)-1;   /* msg_seal adds one: 0 */
        msg_seal(&m, GP_MSG_HELLO, 1);
        G.seq = keep;
    } else {
        msg_seal(&m, GP_MSG_HELLO, 1);
    }
    int in = G.in_session;
    G.in_session = 0;        /* no WHERE probes from inside this wait */
    gp_reply r;
    int rc = -1;
    if (zmq_send_msg(&m, 1) == 0)
        rc = pump(&m, &r, 0, limit_ms, 1);
    msg_free(&m);
    G.in_session = in;
    if (rc != 0)
        return -1;
    if (r.code != 0) {
        gp_reply_done(&r);
        return -1;
    }
    if (r.have_outs && r.nouts >= 1 && gp_transport_hooks.hello_reply)
        gp_transport_hooks.hello_reply(&r.rd);
    gp_reply_done(&r);
    return 0;
}

CUresult gp_session(void)
{
    if (G.state == 1 && G.pid == getpid())
        return CUDA_SUCCESS;
    if (G.state == 3)
        return CUDA_ERROR_DEINITIALIZED;
    if (G.state == 4 && G.pid == getpid())
        return CUDA_ERROR_DEVICE_UNAVAILABLE;     /* lost_daemon said why, once */
    if (G.state == 0 || G.pid != getpid()) {
        const char *ep = getenv("GPUPROXY_ENDPOINT");
        snprintf(G.endpoint, sizeof G.endpoint, "%s", (ep && *ep) ? ep : GP_DEFAULT_ENDPOINT);
        G.debug = getenv("GPUPROXY_DEBUG") != NULL;
        gp_set_debug(G.debug);
        G.spin_us = env_long("GPUPROXY_SPIN_US", default_spin_us());
        G.timeout_ms = env_long("GPUPROXY_TIMEOUT_MS", 5000);
        G.restore_wait_s = env_long("GPUPROXY_RESTORE_WAIT_S", 3600);
        G.in_session = 0;
        G.planned = 0;
        G.connect_ms = env_long("GPUPROXY_CONNECT_TIMEOUT_MS", 1500);
        G.batching = env_long("GPUPROXY_BATCH", 1) != 0;
        G.pid = getpid();
        G.seq = 0;
        G.answered = 0;
        G.async_err = CUDA_SUCCESS;
        make_token();
        msg_reset(&G.cur);
        if (open_socket() < 0) {
            G.state = 2;
            return CUDA_ERROR_DEVICE_UNAVAILABLE;
        }
    }
    if (!G.sup)
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    /* HELLO to the supervisor: [0, seq, [info]]; it answers (after KEEPALIVEs
     * while a worker starts) with the endpoint of this session's worker. */
    G.sock = G.sup;
    gp_msg m;
    memset(&m, 0, sizeof m);
    msg_reset(&m);
    hello_info(&m.head, 0);
    msg_seal(&m, GP_MSG_HELLO, 1);
    long limit = G.state == 2 ? 200 : G.connect_ms;   /* after one failure, fail fast */
    if (zmq_send_msg(&m, 1) < 0) {     /* never through the channel: there is none yet */
        msg_free(&m);
        G.state = 2;
        if (!G.warned_unreachable)
            gp_log("cannot send to proxyd at %s: %s", G.endpoint, zmq_strerror(zmq_errno()));
        G.warned_unreachable = 1;
        hello_unreachable();   /* as below: no daemon maps our segments */
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    }
    gp_reply r;
    int rc = pump(&m, &r, 0, limit, 1);
    msg_free(&m);
    int have_ep = 0;
    if (rc == 0 && r.code == 0 && r.have_outs && r.nouts >= 1)
        have_ep = answer_endpoint(&r.rd, NULL, NULL, NULL, NULL);
    if (rc != 0 || r.code != 0 || !have_ep) {
        if (rc == 0)
            gp_reply_done(&r);
        const char *refused = gp_curve_failure(G.sup_mon, 0);
        if (rc == 0 && r.code != 0)
            ;   /* pump printed proxyd's reason */
        else if (refused)
            gp_log("cannot reach proxyd at %s: %s", G.endpoint, refused);
        else if (!G.warned_unreachable || G.state != 2)
            gp_log("cannot reach proxyd at %s (no answer within %ld ms); start it with `proxyd` or set GPUPROXY_ENDPOINT",
                   G.endpoint, limit);
        G.warned_unreachable = 1;
        G.state = 2;
        hello_unreachable();   /* hostmem.c: no daemon maps our segments: remove their names */
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    }
    gp_reply_done(&r);
    gp_curve_monitor_close(G.sup, G.sup_mon);    /* admitted: nothing more to learn from it */
    G.sup_mon = NULL;
    G.sock = new_dealer(G.wendpoint, NULL);
    if (!G.sock || hello_worker(0, G.connect_ms > 5000 ? G.connect_ms : 5000) < 0) {
        gp_log("cannot open a session with proxyd's worker at %s", G.wendpoint);
        G.state = 2;
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    }
    G.in_session = 1;
    G.state = 1;
    if (gp_transport_hooks.session_open)
        gp_transport_hooks.session_open();   /* park.c: the park signal and thread */
    static int atexit_done;
    if (!atexit_done) {
        atexit(bye_at_exit);
        atexit_done = 1;
    }
    if (G.debug)
        gp_log("session %s connected to %s", G.token, G.endpoint);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------- park / go on */

/* Closes the sockets and ends the ZeroMQ context (its I/O thread goes), so
 * that nothing of the connection to proxyd is left for CRIU to find. What is
 * unanswered stays in `inflight` and the current batch stays in `cur`. */
int gp_transport_park(void)
{
    gp_curve_monitor_close(G.sup, G.sup_mon);     /* before the context ends: it would wait for it */
    G.sup_mon = NULL;
    if (G.sock && G.sock != G.sup)
        zmq_close(G.sock);
    if (G.sup)
        zmq_close(G.sup);
    G.sock = G.sup = NULL;
    if (G.zctx)
        zmq_ctx_term(G.zctx);
    G.zctx = NULL;
    gp_chan_pause();
    return 0;
}

/* Connects again after parking: to `endpoint` (a restore may have happened
 * elsewhere) or the one we had; asks the supervisor where the session's
 * worker is and attaches there. */
int gp_transport_unpark(const char *endpoint)
{
    if (endpoint && *endpoint)
        snprintf(G.endpoint, sizeof G.endpoint, "%s", endpoint);
    G.wendpoint[0] = 0;
    if (open_socket() < 0)
        return -1;
    G.planned = 0;
    uint64_t end = now_us() + (uint64_t)(G.timeout_ms > 0 ? G.timeout_ms : 5000) * 1000u;
    while (now_us() < end) {
        int w = where_probe();     /* reconnects when it learns the endpoint */
        if (w < 0 || w == 2) {
            gp_curve_monitor_close(G.sup, G.sup_mon);
            G.sup_mon = NULL;
        }
        if (w < 0)
            return -1;
        if (w == 2)
            return 0;
        struct timespec t = { 0, 100 * 1000000L };   /* the worker may still be starting */
        nanosleep(&t, NULL);
    }
    gp_curve_monitor_close(G.sup, G.sup_mon);
    G.sup_mon = NULL;
    gp_log("proxyd at %s did not take this session back after the checkpoint", G.endpoint);
    return -1;
}

/* A restored process whose resume never came (the restore's last step,
 * CRIU's RESUME_DEVICES_LATE, failed: CRIU only logs that): the session is
 * lost as with a dead daemon (lost_daemon's state 4), said once here. */
void gp_transport_abandon(long waited_s)
{
    gp_log("restored from a checkpoint, but proxyd at %s did not resume this process within %ld s "
           "(GPUPROXY_RESTORE_WAIT_S); its CUDA calls fail from now on", G.endpoint, waited_s);
    G.state = 4;
}

/* A parked process whose supervisor died before resuming it (park.c's
 * lease): the session is lost as with a dead daemon, said once here. */
void gp_transport_daemon_gone(void)
{
    gp_log("proxyd at %s ended while this process was parked for a checkpoint; it goes on, "
           "but its CUDA calls fail from now on", G.endpoint);
    G.state = 4;
}

/* Before parking: sends the batch being built and waits until proxyd has
 * answered everything (an async failure stays pending for the app's next
 * sync call), then asks the supervisor to have the worker wait until the
 * device is idle, so that nothing proxyd does afterwards writes into memory
 * we share: the bytes we turn private are final. 0 on success. */
static int quiesce(int held);

int gp_transport_quiesce(void) { return quiesce(0); }
int gp_transport_quiesce_held(void) { return quiesce(1); }

static int quiesce(int held)
{
    if (G.state != 1 || !G.sock)
        return -1;
    /* the batch being built is sent either way (unanswered, it is in
     * G.inflight and sent again after going on: nothing is lost) */
    if (G.cur_has_ops && send_async_batch() < 0)
        return -1;
    if (!held && pump(NULL, NULL, 0, G.timeout_ms, 1) != 0)
        return -1;
    gp_buf b;
    gp_buf_init(&b);
    mp_array(&b, 3);
    mp_uint(&b, GP_MSG_QUIESCE);
    mp_uint(&b, 0);
    mp_map(&b, 0);
    int sent = zmq_send(G.sup, b.p, b.len, 0);
    gp_buf_free(&b);
    if (sent < 0)
        return -1;
    long wait_ms = env_long("GPUPROXY_PARK_QUIESCE_MS", 600000);
    zmq_pollitem_t it = { G.sup, 0, ZMQ_POLLIN, 0 };
    for (;;) {
        if (zmq_poll(&it, 1, wait_ms) <= 0) {
            gp_log("proxyd at %s did not confirm that the device is idle; not parking", G.endpoint);
            return -1;
        }
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, G.sup, 0) < 0) {
            zmq_msg_close(&m);
            return -1;
        }
        gp_rd rd;
        gp_rd_init(&rd, zmq_msg_data(&m), zmq_msg_size(&m));
        uint32_t n = mp_get_array(&rd);
        uint64_t seq = mp_get_uint(&rd);
        int code = (int)mp_get_int(&rd);
        zmq_msg_close(&m);
        if (rd.err || n < 2 || seq != 0)
            continue;
        if (code == GP_REPLY_WHERE_QUIESCED)
            return 0;
        if (code == GP_REPLY_KEEPALIVE)
            continue;
        if (code != 0) {
            gp_log("proxyd at %s could not idle the device before parking (%d)", G.endpoint, code);
            return -1;
        }
    }
}

/* Sends every unanswered message again (after going on from a park). */
void gp_resend_unanswered(void)
{
    if (G.sock)
        resend_all(NULL);
}

/* ---------------------------------------------------------------- ops */

gp_buf *gp_op_begin(uint32_t fid, uint32_t nargs)
{
    gp_buf *b = &G.cur.head;
    if (b->len < GP_HDR_RESERVE) {
        gp_buf_reserve(b, GP_HDR_RESERVE);
        b->len = GP_HDR_RESERVE;
    }
    mp_array(b, nargs + 2);
    mp_uint(b, fid);
    mp_uint(b, (uint64_t)(uintptr_t)gp_ctx_current());
    gp_prof_op(fid);
    if (gp_transport_hooks.op_begun)
        gp_transport_hooks.op_begun(fid);   /* query_cache.c */
    G.cur_ops++;
    G.cur_has_ops = 1;
    G.ops_issued++;
    G.last_fid = fid;
    return b;
}

void gp_put_data(gp_buf *b, const void *p, size_t n, int copy)
{
    if (!p && n == 0) {
        mp_nil(b);
        return;
    }
    /* the fast channel takes single-frame messages: inline up to 64 KiB there */
    size_t inline_max = gp_chan_active() ? (64u << 10) + 1 : GP_INLINE_MAX;
    if (n < inline_max || G.cur.nframes == GP_MAX_FRAMES) {
        if (n >= inline_max)
            gp_log("too many data frames in one message; sending %zu bytes inline", n);
        mp_bin(b, p, n);
        return;
    }
    gp_frame *f = &G.cur.frames[G.cur.nframes++];
    if (copy) {
        void *c = malloc(n);
        if (!c) {
            gp_log("out of host memory copying %zu bytes", n);
            abort();
        }
        memcpy(c, p, n);
        f->p = c;
        f->owned = 1;
    } else {
        f->p = p;
        f->owned = 0;
    }
    f->n = n;
    G.cur.bytes += n;
    uint8_t idx[4] = { 0, 0, (uint8_t)(G.cur.nframes >> 8), (uint8_t)G.cur.nframes };
    mp_ext(b, GP_EXT_FRAME, idx, 4);
}

static CUresult take_async_error(void)
{
    CUresult e = G.async_err;
    G.async_err = CUDA_SUCCESS;
    return e;
}

/* Sends the current batch as an async message (no reply awaited now). */
static int send_async_batch(void)
{
    if (!G.cur_has_ops)
        return 0;
    /* Keep the window bounded: wait for answers until there is room. */
    if (G.ninflight >= GP_WINDOW_MSGS || G.inflight_bytes > GP_WINDOW_BYTES) {
        int rc = pump(NULL, NULL, G.ninflight - 1, G.timeout_ms, 1);
        if (rc < 0) {
            lost_daemon(rc);
            return -1;
        }
    }
    gp_msg *m = &G.inflight[G.ninflight];
    *m = G.cur;
    msg_seal(m, GP_MSG_CALL, G.cur_ops);
    m->sync = 0;
    G.ninflight++;
    G.inflight_bytes += m->bytes;
    memset(&G.cur, 0, sizeof G.cur);
    msg_reset(&G.cur);
    G.cur_ops = 0;
    G.cur_has_ops = 0;
    return msg_send(m);
}

CUresult gp_op_async(void)
{
    /* Nagle-style: if nothing is in flight, send right away so the GPU starts
     * working; otherwise keep batching while the daemon is busy, until the
     * batch is large or an answer frees the window. */
    if (!G.batching || G.ninflight == 0) {
        if (send_async_batch() < 0)
            return CUDA_ERROR_DEVICE_UNAVAILABLE;
    } else if (G.cur_ops >= GP_BATCH_MAX_OPS || G.cur.bytes + G.cur.head.len >= GP_BATCH_MAX_BYTES) {
        if (send_async_batch() < 0)
            return CUDA_ERROR_DEVICE_UNAVAILABLE;
    } else {
        pump(NULL, NULL, 0, 0, 0);        /* collect answers that already arrived */
        if (G.ninflight == 0 && send_async_batch() < 0)
            return CUDA_ERROR_DEVICE_UNAVAILABLE;
    }
    return CUDA_SUCCESS;
}

/* Sends the current batch as a sync message and waits for its answer:
 * 0, or pump's failure (< 0) with *r reset. Shared by CUDA and library ops. */
static int sync_exchange(gp_reply *r)
{
    reply_init(r);
    gp_msg m = G.cur;
    memset(&G.cur, 0, sizeof G.cur);
    msg_reset(&G.cur);
    msg_seal(&m, GP_MSG_CALL, G.cur_ops);
    m.sync = 1;
    G.cur_ops = 0;
    G.cur_has_ops = 0;
    uint64_t t0 = gp_prof_wait_begin();
    int rc = -1;
    if (msg_send(&m) == 0)
        rc = pump(&m, r, 0, G.timeout_ms, 1);
    gp_prof_wait_end(t0);
    msg_free(&m);
    if (rc != 0)
        reply_init(r);
    return rc;
}

CUresult gp_op_sync(gp_reply *r)
{
    int rc = sync_exchange(r);
    if (rc != 0) {
        r->code = lost_daemon(rc);
        return (CUresult)r->code;
    }
    /* An earlier async op's failure surfaces here, as CUDA reports errors of
     * asynchronous work at the next synchronising call. */
    CUresult ae = take_async_error();
    if (r->code == CUDA_SUCCESS && ae != CUDA_SUCCESS)
        r->code = ae;
    /* a context synchronisation that was the newest op: nothing sent before
     * it can still run on that context (slab.c reuses freed blocks then) */
    if (r->code == CUDA_SUCCESS && G.last_fid == GP_FID_cuCtxSynchronize)
        G.ctx_synced_at = G.ops_issued;
    return (CUresult)r->code;
}

/* Library ops (gp_transport.h): the reply's code is the library's status of this
 * call; an earlier async op's failure stays in G.async_err for the next
 * synchronising CUDA call instead of turning into a library status. */
int gp_lib_op_sync(gp_reply *r)
{
    int rc = sync_exchange(r);
    if (rc != 0) {
        r->code = lost_daemon(rc);
        return -1;
    }
    return 0;
}

int gp_lib_op_async(void)
{
    return gp_op_async() == CUDA_SUCCESS ? 0 : -1;
}

CUresult gp_flush(void)
{
    if (G.state != 1)
        return CUDA_SUCCESS;
    if (G.cur_has_ops && send_async_batch() < 0)
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    int rc = pump(NULL, NULL, 0, G.timeout_ms, 1);
    if (rc < 0)
        return lost_daemon(rc);
    return take_async_error();
}

/* --------------------------------------------------------------- outs */

static const uint8_t *frame_ref(gp_reply *r, const mp_obj *o, size_t *n)
{
    if (o->len != 4) {
        r->rd.err = 1;
        return NULL;
    }
    uint32_t idx = ((uint32_t)o->data[0] << 24) | ((uint32_t)o->data[1] << 16) |
                   ((uint32_t)o->data[2] << 8) | o->data[3];
    if ((int)idx >= r->nframes || idx == 0) {
        r->rd.err = 1;
        return NULL;
    }
    *n = zmq_msg_size(&r->frames[idx]);
    return zmq_msg_data(&r->frames[idx]);
}

const uint8_t *gp_out_bytes(gp_reply *r, size_t *n)
{
    mp_obj o;
    *n = 0;
    if (mp_next(&r->rd, &o) < 0)
        return NULL;
    if (o.type == MP_BIN || o.type == MP_STR) {
        *n = o.len;
        return o.data;
    }
    if (o.type == MP_EXT && o.ext_type == GP_EXT_FRAME)
        return frame_ref(r, &o, n);
    if (o.type != MP_NIL)
        r->rd.err = 1;
    return NULL;
}

void gp_out_value(gp_reply *r, void *p, size_t n)
{
    gp_rd peek = r->rd;
    mp_obj o;
    if (mp_next(&peek, &o) < 0)
        return;
    if (o.type == MP_INT || o.type == MP_UINT || o.type == MP_BOOL) {
        int64_t v = mp_get_int(&r->rd);
        if (p) {
            /* little-endian: the low n bytes of the 64-bit value */
            memcpy(p, &v, n < 8 ? n : 8);
        }
        return;
    }
    if (o.type == MP_F64) {
        double d = mp_get_f64(&r->rd);
        if (p) {
            if (n == sizeof(float)) { float f = (float)d; memcpy(p, &f, n); }
            else memcpy(p, &d, n < 8 ? n : 8);
        }
        return;
    }
    size_t len;
    const uint8_t *d = gp_out_bytes(r, &len);
    if (p && d)
        memcpy(p, d, len < n ? len : n);
}

void gp_out_handle(gp_reply *r, void **p)
{
    uint64_t v = mp_get_uint(&r->rd);
    if (p)
        *p = (void *)(uintptr_t)v;
}

void gp_out_buffer(gp_reply *r, void *p, size_t cap)
{
    size_t len;
    const uint8_t *d = gp_out_bytes(r, &len);
    if (p && d)
        memcpy(p, d, len < cap ? len : cap);
}

int64_t gp_out_int(gp_reply *r) { return mp_get_int(&r->rd); }

void gp_out_skip(gp_reply *r) { mp_skip(&r->rd); }

const char *gp_session_token(void) { return G.token; }
const char *gp_shm_id(void) { return gp_shm_id_of(G.token); }
int gp_session_pid(void) { return (int)G.pid; }

/* Sends the pending batch now as an async message and returns its sequence
 * number (0 on failure). Used by chunked copies through the staging segment,
 * which must know when proxyd is done with a chunk. */
uint64_t gp_send_now(void)
{
    if (!G.cur_has_ops)
        return G.seq;
    if (send_async_batch() < 0)
        return 0;
    return G.seq;
}

/* Waits until proxyd has answered every message up to and including seq. */
CUresult gp_wait_acked(uint64_t seq)
{
    for (;;) {
        int pending = 0;
        for (int i = 0; i < G.ninflight; i++)
            if (G.inflight[i].seq <= seq)
                pending = 1;
        if (!pending)
            return CUDA_SUCCESS;
        int rc = pump(NULL, NULL, G.ninflight - 1, G.timeout_ms, 1);
        if (rc < 0)
            return lost_daemon(rc);
    }
}

/* The sticky error of async work, reported once (cudaGetLastError semantics
 * are layered on top in the runtime). */
CUresult gp_take_async_error(void) { return take_async_error(); }

void gp_put_shm(gp_buf *b, uint32_t seg, uint64_t off, uint64_t len)
{
    uint8_t p[20];
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(seg >> (24 - 8 * i));
    for (int i = 0; i < 8; i++) p[4 + i] = (uint8_t)(off >> (56 - 8 * i));
    for (int i = 0; i < 8; i++) p[12 + i] = (uint8_t)(len >> (56 - 8 * i));
    mp_ext(b, GP_EXT_SHM, p, sizeof p);
}
