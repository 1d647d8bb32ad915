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
 * The gate (gp_lock_exclusive): parking (park.c) must get the lock while the
 * app's threads keep making calls. A mutex is not fair: with four threads
 * calling back to back, a trylock every few milliseconds found it free so
 * rarely that an app ran to its end before it parked (seen in CI). So the
 * park thread closes a gate first: a thread that does not hold the lock
 * waits at the gate before taking it, the calls in progress finish, and the
 * park thread is the next owner. A thread already holding the lock (a
 * nested call) passes the gate, or it would wait for itself.
 *
 * Locking: fork_hooks is written by constructors only (one thread, before
 * any entry point runs) and read in the child after fork (one thread).
 * gate_closed is written under gate_mu when opened (so no waiter misses the
 * broadcast) and read atomically; held is per thread. */
#include "gp_base.h"

#include <pthread.h>

static pthread_mutex_t gp_mu;
static pthread_once_t gp_once = PTHREAD_ONCE_INIT;
static void (*fork_hooks[GP_FORK_HOOKS])(void);
static int nfork_hooks;
static __thread int held;           /* how deep this thread holds gp_mu */
static int gate_closed;
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;

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
    /* the child has one thread and no park thread: the gate is open */
    __atomic_store_n(&gate_closed, 0, __ATOMIC_RELEASE);
    pthread_mutex_init(&gate_mu, NULL);
    pthread_cond_init(&gate_cv, NULL);
    held = 0;
    for (int i = 0; i < nfork_hooks; i++)
        fork_hooks[i]();
}

static void init_once(void)
{
    make_mutex();
    pthread_atfork(NULL, NULL, child_after_fork);
}

static void wait_at_gate(void)
{
    if (held > 0 || !__atomic_load_n(&gate_closed, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&gate_mu);
    while (__atomic_load_n(&gate_closed, __ATOMIC_ACQUIRE))
        pthread_cond_wait(&gate_cv, &gate_mu);
    pthread_mutex_unlock(&gate_mu);
}

void gp_lock(void)
{
    pthread_once(&gp_once, init_once);
    wait_at_gate();
    pthread_mutex_lock(&gp_mu);
    held++;
}

void gp_unlock(void)
{
    if (held > 0)
        held--;
    pthread_mutex_unlock(&gp_mu);
}

int gp_trylock(void)
{
    pthread_once(&gp_once, init_once);
    int rc = pthread_mutex_trylock(&gp_mu);
    if (rc == 0)
        held++;
    return rc;
}

void gp_lock_exclusive(void)
{
    pthread_once(&gp_once, init_once);
    __atomic_store_n(&gate_closed, 1, __ATOMIC_RELEASE);
    pthread_mutex_lock(&gp_mu);
    held++;
}

void gp_unlock_exclusive(void)
{
    gp_unlock();
    pthread_mutex_lock(&gate_mu);
    __atomic_store_n(&gate_closed, 0, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}
