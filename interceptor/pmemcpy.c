/* Parallel memcpy for copies through the staging segment.
 *
 * A copy from or to pageable memory costs the shim one memory copy (user
 * buffer <-> staging), which one thread does at about 10 GB/s; the DMA on
 * proxyd's side runs at PCIe speed. Splitting large copies over a few helper
 * threads keeps the memory copy from being the bottleneck. The helpers are
 * started on first use, block every signal (they must never run the
 * application's handlers) and are forgotten in a forked child.
 *
 * Locking: called under gp_lock, so one parallel copy runs at a time. */
#define _GNU_SOURCE
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gp_base.h"

#define GP_MAX_HELPERS 7
#define GP_PAR_MIN (2u << 20)

static struct part {
    void *dst;
    const void *src;
    size_t n;
    sem_t go;
} parts[GP_MAX_HELPERS];
static sem_t done;
static int nhelpers = -1;      /* -1: not started */

static void *helper(void *arg)
{
    struct part *p = arg;
    for (;;) {
        while (sem_wait(&p->go) != 0)
            ;
        memcpy(p->dst, p->src, p->n);
        sem_post(&done);
    }
    return NULL;
}

static void forget_helpers(void) { nhelpers = -1; }

static void start_helpers(void)
{
    /* helpers only pay off where cores are free for them (proxyd needs some too) */
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    long want = ncpu >= 8 ? 3 : 0;
    const char *e = getenv("GPUPROXY_COPY_THREADS");
    if (e && *e)
        want = atol(e) - 1;
    if (want > GP_MAX_HELPERS)
        want = GP_MAX_HELPERS;
    nhelpers = 0;
    if (want <= 0)
        return;
    sem_init(&done, 0, 0);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = 0; i < want; i++) {
        pthread_t t;
        sem_init(&parts[i].go, 0, 0);
        if (pthread_create(&t, NULL, helper, &parts[i]) != 0)
            break;
        pthread_detach(t);
        nhelpers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    static int atfork_set;
    if (!atfork_set) {
        pthread_atfork(NULL, NULL, forget_helpers);
        atfork_set = 1;
    }
}

void gp_pmemcpy(void *dst, const void *src, size_t n)
{
    if (n < GP_PAR_MIN) {
        memcpy(dst, src, n);
        return;
    }
    if (nhelpers < 0)
        start_helpers();
    int k = nhelpers;
    if (k == 0) {
        memcpy(dst, src, n);
        return;
    }
    size_t share = (n / (size_t)(k + 1) + 4095) & ~(size_t)4095;
    size_t off = 0;
    int used = 0;
    for (int i = 0; i < k && off + share < n; i++) {
        parts[i].dst = (char *)dst + off;
        parts[i].src = (const char *)src + off;
        parts[i].n = share;
        off += share;
        sem_post(&parts[i].go);
        used++;
    }
    memcpy((char *)dst + off, (const char *)src + off, n - off);
    for (int i = 0; i < used; i++)
        while (sem_wait(&done) != 0)
            ;
}
