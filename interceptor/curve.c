/* Keyed tcp for the shim: every socket to a tcp:// endpoint is a ZeroMQ
 * CURVE client (ZeroMQ RFC 26; libzmq's zmq_curve(7): a client sets
 * ZMQ_CURVE_SERVERKEY, ZMQ_CURVE_PUBLICKEY and ZMQ_CURVE_SECRETKEY before
 * it connects, each as 40-character Z85 text). proxyd's side, the key files
 * and the ZAP handler that admits keys are in proxyd/core/curve.py; this file
 * finds the keys by the same rules:
 *
 *   server key  $GPUPROXY_CURVE_SERVERKEY, else KEYDIR/curve-server.pub
 *   client pair $GPUPROXY_CURVE_PUBLICKEY + $GPUPROXY_CURVE_SECRETKEY, else
 *               the file $GPUPROXY_CURVE_KEY_FILE, else KEYDIR/curve-client.key
 *               ("public Z85" and "secret Z85" lines; it must be a regular
 *               file of this user that nobody else can read)
 *   KEYDIR      $GPUPROXY_KEY_DIR, else $XDG_CONFIG_HOME/gpuproxy/keys, else
 *               $HOME/.config/gpuproxy/keys
 *
 * Missing or bad keys fail the connection with one line naming the endpoint
 * and what is missing; ipc:// sockets are left alone.
 *
 * A socket monitor (zmq_socket_monitor) on the supervisor socket lets the
 * first contact say "proxyd refused this client's key" rather than only
 * "no answer": ZeroMQ itself retries a refused handshake in silence.
 *
 * Locking: called under gp_lock (transport.c). The keys are read once per
 * process (and again in a forked child, which starts a session of its own). */
#define _GNU_SOURCE
#include "gp_wire.h"

#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define Z85_LEN 40

static struct {
    pid_t pid;            /* the process that loaded them (0: not yet) */
    int ok;
    char server[Z85_LEN + 1], pub[Z85_LEN + 1], sec[Z85_LEN + 1];
    char why[600];        /* why there are no usable keys */
} K;

static int z85_ok(const char *s, size_t n)
{
    static const char alphabet[] =
        "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
    if (n != Z85_LEN)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!s[i] || !strchr(alphabet, s[i]))
            return 0;
    return 1;
}

static void key_dir(char *out, size_t n)
{
    const char *d = getenv("GPUPROXY_KEY_DIR");
    if (d && *d) {
        snprintf(out, n, "%s", d);
        return;
    }
    const char *x = getenv("XDG_CONFIG_HOME");
    if (x && *x) {
        snprintf(out, n, "%s/gpuproxy/keys", x);
        return;
    }
    const char *h = getenv("HOME");
    if (!h || !*h) {
        struct passwd *pw = getpwuid(geteuid());
        h = pw ? pw->pw_dir : "/";
    }
    snprintf(out, n, "%s/.config/gpuproxy/keys", h);
}

/* Reads up to n-1 bytes of path; private: it must be a regular file of this
 * user with no access for others. -1 with K.why set otherwise. */
static int read_file(const char *path, char *buf, size_t n, int private)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        snprintf(K.why, sizeof K.why, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
        (private && (st.st_uid != geteuid() || (st.st_mode & 077)))) {
        snprintf(K.why, sizeof K.why, "key file %s must be a regular file of this user with mode 0600", path);
        close(fd);
        return -1;
    }
    ssize_t got = read(fd, buf, n - 1);
    close(fd);
    if (got < 0) {
        snprintf(K.why, sizeof K.why, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    buf[got] = 0;
    return 0;
}

/* Copies the first token after `name ` at the start of a line (name NULL:
 * the first token of the first line that is not a comment). */
static int find_key(const char *text, const char *name, char out[Z85_LEN + 1])
{
    size_t nl = name ? strlen(name) : 0;
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        while (*l == ' ' || *l == '\t')
            l++;
        if (*l == '#' || *l == '\n' || !*l)
            continue;
        const char *v = l;
        if (name) {
            if (strncmp(l, name, nl) != 0 || (l[nl] != ' ' && l[nl] != '\t'))
                continue;
            v = l + nl;
            while (*v == ' ' || *v == '\t')
                v++;
        }
        size_t k = strcspn(v, " \t\r\n");
        if (!z85_ok(v, k))
            return -1;
        memcpy(out, v, Z85_LEN);
        out[Z85_LEN] = 0;
        return 0;
    }
    return -1;
}

static int load_keys(void)
{
    char dir[400], path[512], text[4096];
    key_dir(dir, sizeof dir);
    K.ok = 0;
    K.why[0] = 0;
    const char *e = getenv("GPUPROXY_CURVE_SERVERKEY");
    if (e && *e) {
        if (!z85_ok(e, strlen(e))) {
            snprintf(K.why, sizeof K.why, "GPUPROXY_CURVE_SERVERKEY is not a 40-character Z85 key");
            return -1;
        }
        snprintf(K.server, sizeof K.server, "%s", e);
    } else {
        snprintf(path, sizeof path, "%s/curve-server.pub", dir);
        if (read_file(path, text, sizeof text, 0) < 0) {
            snprintf(K.why, sizeof K.why, "no server key: set GPUPROXY_CURVE_SERVERKEY or put proxyd's public key "
                     "(proxyd --server-key) in %s", path);
            return -1;
        }
        if (find_key(text, NULL, K.server) < 0) {
            snprintf(K.why, sizeof K.why, "%s holds no Z85 key", path);
            return -1;
        }
    }
    const char *p = getenv("GPUPROXY_CURVE_PUBLICKEY"), *s = getenv("GPUPROXY_CURVE_SECRETKEY");
    if ((p && *p) || (s && *s)) {
        if (!p || !s || !z85_ok(p, strlen(p)) || !z85_ok(s, strlen(s))) {
            snprintf(K.why, sizeof K.why, "GPUPROXY_CURVE_PUBLICKEY and GPUPROXY_CURVE_SECRETKEY must both be "
                     "40-character Z85 keys");
            return -1;
        }
        snprintf(K.pub, sizeof K.pub, "%s", p);
        snprintf(K.sec, sizeof K.sec, "%s", s);
    } else {
        const char *f = getenv("GPUPROXY_CURVE_KEY_FILE");
        if (f && *f)
            snprintf(path, sizeof path, "%s", f);
        else
            snprintf(path, sizeof path, "%s/curve-client.key", dir);
        if (read_file(path, text, sizeof text, 1) < 0) {
            size_t k = strlen(K.why);
            snprintf(K.why + k, sizeof K.why - k, " (no client key: proxy-cli keygen makes one)");
            return -1;
        }
        if (find_key(text, "public", K.pub) < 0 || find_key(text, "secret", K.sec) < 0) {
            snprintf(K.why, sizeof K.why, "%s needs a 'public Z85' and a 'secret Z85' line", path);
            return -1;
        }
    }
    K.ok = 1;
    return 0;
}

int gp_curve_setup(void *so, const char *endpoint)
{
    if (strncmp(endpoint, "tcp://", 6) != 0)
        return 0;
    if (K.pid != getpid()) {
        K.pid = getpid();
        load_keys();
    }
    if (!K.ok) {
        gp_log("cannot use %s: it is a keyed (CURVE) tcp endpoint and %s", endpoint, K.why);
        return -1;
    }
    if (zmq_setsockopt(so, ZMQ_CURVE_SERVERKEY, K.server, Z85_LEN) < 0 ||
        zmq_setsockopt(so, ZMQ_CURVE_PUBLICKEY, K.pub, Z85_LEN) < 0 ||
        zmq_setsockopt(so, ZMQ_CURVE_SECRETKEY, K.sec, Z85_LEN) < 0) {
        gp_log("cannot use %s: this libzmq refuses CURVE keys (%s)", endpoint, zmq_strerror(zmq_errno()));
        return -1;
    }
    return 0;
}

/* A PAIR socket receiving so's handshake failures (NULL for ipc, or when
 * monitoring is not possible: the caller then only misses the reason). */
void *gp_curve_monitor(void *zctx, void *so, const char *endpoint)
{
    static unsigned n;
    if (strncmp(endpoint, "tcp://", 6) != 0)
        return NULL;
    char addr[96];
    snprintf(addr, sizeof addr, "inproc://gpuproxy-monitor-%d-%u", (int)getpid(), ++n);
    if (zmq_socket_monitor(so, addr, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                     ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) < 0)
        return NULL;
    void *mon = zmq_socket(zctx, ZMQ_PAIR);
    if (!mon)
        return NULL;
    int linger = 0;
    zmq_setsockopt(mon, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_connect(mon, addr) < 0) {
        zmq_close(mon);
        zmq_socket_monitor(so, NULL, 0);
        return NULL;
    }
    return mon;
}

/* Why so's CURVE handshake failed, from the events the monitor holds
 * (waiting up to wait_ms for the first); NULL if none failed. Each event is
 * two frames (zmq_socket_monitor(3)): 2 bytes event, 4 bytes value (for an
 * AUTH failure, the ZAP status code), then the endpoint. */
const char *gp_curve_failure(void *mon, long wait_ms)
{
    static char why[200];
    const char *res = NULL;
    if (!mon)
        return NULL;
    zmq_pollitem_t it = { mon, 0, ZMQ_POLLIN, 0 };
    while (zmq_poll(&it, 1, wait_ms) > 0) {
        wait_ms = 0;
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            break;
        }
        unsigned ev = 0, val = 0;
        if (zmq_msg_size(&m) >= 6) {
            const unsigned char *d = zmq_msg_data(&m);
            uint16_t e16;
            uint32_t v32;
            memcpy(&e16, d, 2);
            memcpy(&v32, d + 2, 4);
            ev = e16;
            val = v32;
        }
        while (zmq_msg_more(&m)) {      /* the endpoint frame */
            zmq_msg_close(&m);
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, mon, 0) < 0)
                break;
        }
        zmq_msg_close(&m);
        if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
            snprintf(why, sizeof why, "proxyd refused this client's CURVE key (ZAP status %u): its public key "
                     "is not in proxyd's authorized_keys", val);
            res = why;
        } else if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL || ev == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) {
            snprintf(why, sizeof why, "the CURVE handshake failed (wrong server key "
                     "GPUPROXY_CURVE_SERVERKEY/curve-server.pub, or not a keyed proxyd)");
            res = why;
        }
    }
    return res;
}

void gp_curve_monitor_close(void *so, void *mon)
{
    if (!mon)
        return;
    if (so)
        zmq_socket_monitor(so, NULL, 0);
    zmq_close(mon);
}
