/*
 * The public id that names a session's shared memory in /dev/shm (issue 21;
 * proxyd/core/shm_names.py computes the same).
 *
 * The session token is a capability and /dev/shm can be listed by every
 * local user, so segment, channel and park/resume names carry
 *     hex(SHA-256("gpuproxy shm\0" + token))[0:16] '-' pid
 * instead of the token: the same shape (16 hex digits, '-', the pid) that
 * proxyd's sweep of dead clients parses, without the secret.
 *
 * Thread safety: the result is in a thread-local buffer, valid until the
 * thread's next call. Layer: base (a pure function of the token it is given;
 * transport.c's gp_shm_id() applies it to the current session's token, which
 * changes in a forked child).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "gp_base.h"

const char *gp_shm_id_of(const char *token)
{
    static __thread char id[48];
    char buf[64];
    static const char domain[] = "gpuproxy shm";      /* followed by its NUL */
    size_t n = strlen(token);
    if (n > sizeof buf - sizeof domain)
        n = sizeof buf - sizeof domain;
    memcpy(buf, domain, sizeof domain);
    memcpy(buf + sizeof domain, token, n);
    uint8_t h[32];
    gp_sha256(buf, sizeof domain + n, h);
    const char *dash = strrchr(token, '-');
    snprintf(id, sizeof id, "%02x%02x%02x%02x%02x%02x%02x%02x-%s", h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7],
             dash ? dash + 1 : "0");
    return id;
}
