/* The part of the libzmq 4.x C API the shim uses, declared here because the
 * pyzmq wheel bundles libzmq but no zmq.h. Values follow zmq.h of libzmq 4.3
 * (they are part of its stable ABI); tests/test_shim_build.py checks them
 * against pyzmq's constants. */
#ifndef GP_ZMQ_H
#define GP_ZMQ_H

#include <stddef.h>

#define ZMQ_PAIR 0
#define ZMQ_DEALER 5
#define ZMQ_ROUTER 6

#define ZMQ_DONTWAIT 1
#define ZMQ_SNDMORE 2

#define ZMQ_ROUTING_ID 5
#define ZMQ_RCVMORE 13
#define ZMQ_LINGER 17
#define ZMQ_RECONNECT_IVL 18
#define ZMQ_RECONNECT_IVL_MAX 21
#define ZMQ_SNDHWM 23
#define ZMQ_RCVHWM 24
#define ZMQ_IMMEDIATE 39
#define ZMQ_BLOCKY 70
#define ZMQ_CURVE_PUBLICKEY 48
#define ZMQ_CURVE_SECRETKEY 49
#define ZMQ_CURVE_SERVERKEY 50

/* socket monitor events (zmq_socket_monitor) */
#define ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL 0x0800
#define ZMQ_EVENT_HANDSHAKE_SUCCEEDED 0x1000
#define ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL 0x2000
#define ZMQ_EVENT_HANDSHAKE_FAILED_AUTH 0x4000

#define ZMQ_IO_THREADS 1
#define ZMQ_POLLIN 1

typedef struct zmq_msg_t {
    unsigned char _[64];
} __attribute__((aligned(sizeof(void *)))) zmq_msg_t;

typedef struct zmq_pollitem_t {
    void *socket;
    int fd;
    short events;
    short revents;
} zmq_pollitem_t;

typedef void(zmq_free_fn)(void *data, void *hint);

void *zmq_ctx_new(void);
int zmq_ctx_set(void *context, int option, int optval);
int zmq_ctx_term(void *context);
void *zmq_socket(void *context, int type);
int zmq_close(void *s);
int zmq_setsockopt(void *s, int option, const void *optval, size_t optvallen);
int zmq_getsockopt(void *s, int option, void *optval, size_t *optvallen);
int zmq_connect(void *s, const char *addr);
int zmq_socket_monitor(void *s, const char *addr, int events);
int zmq_send(void *s, const void *buf, size_t len, int flags);
int zmq_msg_init(zmq_msg_t *msg);
int zmq_msg_init_size(zmq_msg_t *msg, size_t size);
int zmq_msg_init_data(zmq_msg_t *msg, void *data, size_t size, zmq_free_fn *ffn, void *hint);
int zmq_msg_send(zmq_msg_t *msg, void *s, int flags);
int zmq_msg_recv(zmq_msg_t *msg, void *s, int flags);
int zmq_msg_close(zmq_msg_t *msg);
void *zmq_msg_data(zmq_msg_t *msg);
size_t zmq_msg_size(const zmq_msg_t *msg);
int zmq_msg_more(const zmq_msg_t *msg);
int zmq_poll(zmq_pollitem_t *items, int nitems, long timeout);
int zmq_errno(void);
const char *zmq_strerror(int errnum);

#endif
