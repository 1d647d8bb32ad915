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
 * Locking: fork_hooks is written by constructors only (one thread, before
 * any entry point runs) and read in the child after fork (one thread). */
#include "gp_base.h"

#include <pthread.h>

static pthread_mutex_t gp_mu;
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
    for (int i = 0; i < nfork_hooks; i++)
        fork_hooks[i]();
}

static void init_once(void)
{
    make_mutex();
    pthread_atfork(NULL, NULL, child_after_fork);
}

void gp_lock(void)
{
    pthread_once(&gp_once, init_once);
    pthread_mutex_lock(&gp_mu);
}

void gp_unlock(void) { pthread_mutex_unlock(&gp_mu); }

int gp_trylock(void)
{
    pthread_once(&gp_once, init_once);
    return pthread_mutex_trylock(&gp_mu);
}
