/* The two pieces transport.c is built on (interceptor/LAYERS: wire): the
 * same-host fast channel (channel.c) and CURVE keys for tcp endpoints
 * (curve.c). Neither knows about sessions: what they need of one (the
 * session's token) is passed in. hostmem.c creates the channel at HELLO and
 * park.c shares it again after a checkpoint, so those include this header
 * too.
 *
 * Locking: every function here runs under gp_lock. */
#ifndef GP_WIRE_H
#define GP_WIRE_H

#include "gp_base.h"
#include "gp_zmq.h"

/* ---- channel.c ---- */
/* Creates (once) the channel segment of the session with this token;
 * returns its name and sets *size, or NULL. */
const char *gp_chan_create(const char *token, size_t *size);
/* The worker's HELLO answer: it maps the channel (1) or not (0). */
void gp_chan_enable(int ok);
int gp_chan_active(void);
int gp_chan_send(uint64_t seq, const void *p, size_t n, int *need_doorbell);
int gp_chan_recv(zmq_msg_t *msg);
int gp_chan_idle(int idle);
void gp_chan_pause(void);
void gp_chan_forget(void);
/* park.c: private memory while parked, shared again after */
void gp_chan_unshare(void);
int gp_chan_reshare(void);

/* ---- curve.c: keyed tcp (CURVE client keys, handshake monitor) ---- */
int gp_curve_setup(void *so, const char *endpoint);
void *gp_curve_monitor(void *zctx, void *so, const char *endpoint);
const char *gp_curve_failure(void *mon, long wait_ms);
void gp_curve_monitor_close(void *so, void *mon);

#endif
