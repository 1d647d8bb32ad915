/* The shim's one process-wide recursive lock (gp_base.h says what it
 * protects), and what a forked child must reset.
 *
 * CUDA state does not survive fork(); the child starts a session of its
 * own if it uses CUDA. So the child re-creates the lock (another thread of
 * the parent may have held it) and then runs the reset functions the layers
 * above registered with gp_on_fork_child (transport.c: its connection;
 * slab.c: its slabs), in the order registered. The atfork handler is
 * installed at the first gp_lock, as it was when transport.c held the lock.
 *
 * The gate (gp_lock_gate): parking (park.c) must get the lock while the
 * app's threads keep making calls. A mutex is not fair: with four threads
 * calling back to back, a trylock every few milliseconds found it free so
 * rarely that an app ran to its end before it parked (seen in CI). So the
 * park thread closes the gate first: a thread that does not hold the lock
 * waits before taking it, the call in progress finishes, and the park
 * thread is the next owner. A thread already holding the lock (a nested
 * call) passes, or it would wait for itself.
 *
 * Locking: fork_hooks is written by constructors only (one thread, before
 * any entry point runs) and read in the child after fork (one thread);
 * gate_closed is atomic; depth is per thread. */
#include "gp_base.h"

#include <pthread.h>
#include <time.h>


static pthread_mutex_t gp_mu;
static int gate_closed;                 /* atomic: gp_lock_gate; opened under gate_mu */
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;   /* broadcast when the gate opens */
static __thread int depth;              /* this thread's holds of gp_mu (it is recursive) */
static pthread_once_t gp_once = PTHREAD_ONCE_INIT;
static void (*fork_hooks[GP_FORK_HOOKS])(void);
static int nfork_hooks;

void gp_on_fork_child(void (*fn)(void))
{
    if (nfork_hooks < GP_FORK_HOOKS)
        fork_hooks[nfork_hooks++] = fn;
    else
        gp_log("internal: more than %d fork hooks; one is ignored", GP_FORK_HOOKS);
}

static void make_mutex(void)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&gp_mu, &a);
}

static void child_after_fork(void)
{
    make_mutex();
    depth = 0;
    __atomic_store_n(&gate_closed, 0, __ATOMIC_RELEASE);
    pthread_mutex_init(&gate_mu, NULL);
    pthread_cond_init(&gate_cv, NULL);
    for (int i = 0; i < nfork_hooks; i++)
        fork_hooks[i]();
}

static void init_once(void)
{
    make_mutex();
    pthread_atfork(NULL, NULL, child_after_fork);
}

/* CLOCK_MONOTONIC ns when the first thread found the gate closed since it
 * was last closed, 0 if none has (atomic): the moment the app was first
 * held, which the park thread's own clock read after closing the gate may
 * come later than when it is preempted in between (park.c). */
static long long gate_first_wait;

long long gp_lock_gate_first_wait(void)
{
    return __atomic_load_n(&gate_first_wait, __ATOMIC_ACQUIRE);
}

void gp_lock_gate(int closed)
{
    if (closed)
        __atomic_store_n(&gate_first_wait, 0, __ATOMIC_RELEASE);
    /* opened under gate_mu, so a waiter between its check and its wait
     * cannot miss the broadcast */
    pthread_mutex_lock(&gate_mu);
    __atomic_store_n(&gate_closed, closed, __ATOMIC_RELEASE);
    if (!closed)
        pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

void gp_lock(void)
{
    pthread_once(&gp_once, init_once);
    /* a thread already holding the lock goes on (it must, to release it);
     * the others sleep until the park is over, not polling: a park lasts as
     * long as the GPU capture and CRIU's dump, which need the CPU */
    if (depth == 0 && __atomic_load_n(&gate_closed, __ATOMIC_ACQUIRE)) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        long long none = 0, now = (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
        __atomic_compare_exchange_n(&gate_first_wait, &none, now, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
        pthread_mutex_lock(&gate_mu);
        while (__atomic_load_n(&gate_closed, __ATOMIC_ACQUIRE))
            pthread_cond_wait(&gate_cv, &gate_mu);
        pthread_mutex_unlock(&gate_mu);
    }
    pthread_mutex_lock(&gp_mu);
    depth++;
}

void gp_unlock(void)
{
    depth--;
    pthread_mutex_unlock(&gp_mu);
}

int gp_trylock(void)
{
    pthread_once(&gp_once, init_once);
    int rc = pthread_mutex_trylock(&gp_mu);
    if (rc == 0)
        depth++;
    return rc;
}
