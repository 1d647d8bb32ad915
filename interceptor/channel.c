/* Same-host fast channel: a shared-memory mailbox for the session's messages.
 *
 * ZeroMQ carries every session: HELLO, control, resends and the whole of a
 * session whose daemon is on another host. When proxyd runs on the same host
 * (it opened our shared memory at HELLO), each message whose bytes fit is
 * also offered through this mailbox, which both sides poll while they are
 * busy: a round trip then costs no thread wake-up, where a ZeroMQ round trip
 * costs four (two I/O threads on each side; docs/protocol.md, "Fast channel").
 * ZeroMQ stays the doorbell: a side that stopped polling is woken by a ZeroMQ
 * message, and the reliability rules (sequence numbers, resends, duplicates)
 * are the same for both paths.
 *
 * Layout of the channel segment (little-endian, one writer per field):
 *   0      u64 magic "GPXCHAN1"
 *   64     u64 req_seq      client: sequence number of the request in the slot
 *   72     u32 req_len      client
 *   128    u64 req_taken    daemon: last request copied out of the slot
 *   192    u64 rep_seq      daemon: sequence number of the reply in the slot
 *                           (0 while proxyd rewrites it: seqlock-style)
 *   200    u32 rep_len      daemon
 *   256    u32 daemon_idle  daemon: 1 while it sleeps (send a doorbell)
 *   320    u32 client_idle  client: 1 while it sleeps (daemon also replies by ZeroMQ)
 *   4096   request bytes [GP_CHAN_MAX]
 *   4096 + GP_CHAN_MAX   reply bytes [GP_CHAN_MAX]
 * Fields are published with release stores after the bytes they describe and
 * read with acquire loads; the idle flags use full fences (store, fence, load
 * on both sides) so that a sleeping side is never left unwoken.
 *
 * Locking: under gp_lock. */
#define _GNU_SOURCE
#include "gp_wire.h"

#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define GP_CHAN_MAX (1u << 20)
#define GP_CHAN_SIZE (4096 + 2 * GP_CHAN_MAX)

#define F64(off) ((volatile uint64_t *)(chan + (off)))
#define F32(off) ((volatile uint32_t *)(chan + (off)))

static uint8_t *chan;
static char chan_name[96];
static uint64_t last_rep;      /* last reply sequence number consumed from the slot */
static uint64_t last_req;      /* last request put into the slot */
static int chan_ok;

const char *gp_chan_create(const char *token, size_t *size)
{
    if (chan)
        goto done;
    snprintf(chan_name, sizeof chan_name, "/gpuproxy-%s-chan", gp_shm_id_of(token));   /* no token in public names */
    int fd = shm_open(chan_name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return NULL;
    if (ftruncate(fd, GP_CHAN_SIZE) < 0) {
        close(fd);
        shm_unlink(chan_name);
        return NULL;
    }
    void *p = mmap(NULL, GP_CHAN_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(chan_name);
        return NULL;
    }
    chan = p;
    memcpy(chan, "GPXCHAN1", 8);
done:
    *size = GP_CHAN_SIZE;
    return chan_name;
}

static void chan_unlink(void)
{
    if (chan_name[0])
        shm_unlink(chan_name);
}

/* proxyd said at HELLO whether it maps the channel. The name stays until exit
 * when it does (a daemon restored after a restart maps it again). */
void gp_chan_enable(int ok)
{
    if (!chan)
        return;
    chan_ok = ok;
    if (!ok) {
        chan_unlink();
        chan_name[0] = 0;
    } else {
        static int registered;
        if (!registered)
            atexit(chan_unlink);
        registered = 1;
    }
}

int gp_chan_active(void) { return chan && chan_ok; }

/* Offers frame 0 of message seq through the slot. Returns 0 when the message
 * went this way, -1 when the caller must send it by ZeroMQ (no channel, too
 * large, or the previous request not yet taken). */
int gp_chan_send(uint64_t seq, const void *p, size_t n, int *need_doorbell)
{
    *need_doorbell = 0;
    if (!gp_chan_active() || n > GP_CHAN_MAX)
        return -1;
    if (__atomic_load_n(F64(128), __ATOMIC_ACQUIRE) < last_req) {
        /* proxyd has not taken the previous request yet; it takes it as
         * soon as it looks, so wait a moment before using ZeroMQ instead */
        struct timespec t0, t;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        do {
            if (__atomic_load_n(F64(128), __ATOMIC_ACQUIRE) >= last_req)
                break;
            sched_yield();   /* proxyd's worker may be waiting for this CPU */
            clock_gettime(CLOCK_MONOTONIC, &t);
        } while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 50000L);
        if (__atomic_load_n(F64(128), __ATOMIC_ACQUIRE) < last_req)
            return -1;
    }
    memcpy(chan + 4096, p, n);
    *F32(72) = (uint32_t)n;
    __atomic_store_n(F64(64), seq, __ATOMIC_RELEASE);
    last_req = seq;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    *need_doorbell = *F32(256) != 0;
    return 0;
}

/* A reply newer than the last one consumed, copied out into msg (initialised
 * by this call); 0 if there is one, -1 if not. */
int gp_chan_recv(zmq_msg_t *msg)
{
    if (!gp_chan_active())
        return -1;
    uint64_t s = __atomic_load_n(F64(192), __ATOMIC_ACQUIRE);
    if (s == 0 || s <= last_rep)      /* 0: proxyd is writing the slot */
        return -1;
    uint32_t n = *F32(200);
    if (n > GP_CHAN_MAX)
        return -1;
    zmq_msg_init_size(msg, n);
    memcpy(zmq_msg_data(msg), chan + 4096 + GP_CHAN_MAX, n);
    /* the daemon may have overwritten the slot while we copied: take the
     * copy only if the sequence number did not move (the fence keeps the
     * copy's loads before the second look) */
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(F64(192), __ATOMIC_ACQUIRE) != s) {
        zmq_msg_close(msg);
        return -1;
    }
    last_rep = s;
    return 0;
}

/* Marks the client as going to sleep on ZeroMQ (1) or polling again (0).
 * Returns 1 when a reply arrived in the meantime (then nothing is marked). */
int gp_chan_idle(int idle)
{
    if (!gp_chan_active())
        return 0;
    *F32(320) = (uint32_t)idle;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (idle && __atomic_load_n(F64(192), __ATOMIC_ACQUIRE) > last_rep) {
        *F32(320) = 0;
        return 1;
    }
    return 0;
}

/* Parking (park.c): the channel becomes private memory (bytes and sequence
 * numbers kept); going on shares it again under its name. */
void gp_chan_unshare(void)
{
    if (chan && chan_name[0])
        gp_shm_to_private(chan, GP_CHAN_SIZE, chan_name);
}

int gp_chan_reshare(void)
{
    if (chan && chan_name[0] && gp_shm_from_private(chan, GP_CHAN_SIZE, chan_name) < 0)
        return 1;
    return 0;
}

/* Moving to another worker: no channel traffic until its HELLO answer says
 * it maps the channel (gp_chan_enable). */
void gp_chan_pause(void) { chan_ok = 0; }

/* After a fork the child has no channel of its own. */
void gp_chan_forget(void)
{
    chan = NULL;
    chan_name[0] = 0;
    chan_ok = 0;
    last_rep = last_req = 0;
}
