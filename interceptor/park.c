/* Parking the shim around a whole-process checkpoint (CRIU), and going on
 * after it (docs/checkpoint.md).
 *
 * CRIU dumps a process tree with its memory, files and sockets, but it cannot
 * dump a socket connected to a process outside the tree (proxyd) nor a shared
 * mapping whose other side lives on elsewhere. So before CRIU runs, the shim
 * "parks":
 *  1. proxyd's supervisor sends the park signal (GPUPROXY_PARK_SIGNAL,
 *     default SIGRTMIN+6); its handler only wakes the park thread;
 *  2. the park thread takes gp_lock as soon as no CUDA call holds it (a call
 *     in progress finishes first: its effects must be complete before the
 *     bytes are taken); every thread that makes a CUDA call from then on
 *     waits for gp_lock, inside the shim;
 *  3. it sends what is batched, waits for every answer, and asks the
 *     supervisor to have the worker wait for the device to be idle (no DMA
 *     into shared memory may land after its bytes are copied); then it closes the ZeroMQ sockets and terminates the ZeroMQ context (its
 *     I/O thread ends), and turns every shared segment (staging, pinned host
 *     memory, the fast channel) into private memory at the same address with
 *     the same bytes, unlinking its name; then it creates
 *     /dev/shm/gpuproxy-parked-<public id>, which tells the supervisor;
 *  4. the parked thread waits for /dev/shm/gpuproxy-resume-<public id>, which
 *     proxyd writes (with its endpoint) when the app may go on: after a
 *     --leave-running dump, or after CRIU restored the process; a restored
 *     copy (its start time differs) that gets no resume within
 *     GPUPROXY_RESTORE_WAIT_S (default 600 s) gives its session up: one
 *     line naming the endpoint, and its CUDA calls fail from then on; the
 *     original process does the same within a second or so when the
 *     supervisor that parked it dies (its lease, below: nobody would
 *     resume it);
 *  5. going on re-creates the shared segments under their names with their
 *     bytes, mapped at the same addresses, opens a ZeroMQ context and sockets,
 *     asks the supervisor where the session's worker is, re-attaches there
 *     (HELLO with attach, sequence number 0) and resends whatever was not
 *     answered: the worker executes what it has not executed and answers the
 *     rest from its record (also kept in the GPU image), so no call is lost
 *     or run twice.
 *
 * Locking: parking and going on run on the park thread with gp_lock held,
 * so no other thread touches the transport meanwhile. park_requested is read
 * without the lock (an atomic flag). The signal handler only writes to a
 * pipe (async-signal-safe). */
#define _GNU_SOURCE
#include "gp_memory.h"
#include "gp_wire.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


static int park_pipe[2] = { -1, -1 };
static volatile int park_requested;
static pid_t park_pid;

int gp_park_requested(void) { return __atomic_load_n(&park_requested, __ATOMIC_ACQUIRE); }

/* ------------------------------------------------------------ park, go on */

static void flag_path(char *out, size_t n, const char *what)
{
    snprintf(out, n, "/dev/shm/gpuproxy-%s-%s", what, gp_shm_id());
}

static void sleep_ms(long ms)
{
    struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };
    while (nanosleep(&t, &t) < 0 && errno == EINTR)
        ;
}

static long long mono_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* How far this process's CLOCK_MONOTONIC is ahead of the host's (negative:
 * behind). CRIU restores a process into a time namespace whose monotonic
 * clock goes on where the dumped one stopped (measured here with CRIU 4.2.1:
 * 3 s after the dump, the restored process's clock was 3.08 s behind the
 * host's; time_namespaces(7), /proc/PID/timens_offsets). The times this file
 * writes for proxyd and proxy-cli (held_ns, ran_ns) are the host's, so they
 * are converted with the offset in force when each was read; before any
 * restore it is 0. Read from /proc/self/timens_offsets ("monotonic SECS
 * NSECS"), 0 where the kernel has no time namespaces. */
static long long mono_offset_ns(void)
{
    int fd = open("/proc/self/timens_offsets", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    char buf[256];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    const char *m = strstr(buf, "monotonic");
    long long secs = 0, nsecs = 0;
    if (!m || sscanf(m + 9, "%lld %lld", &secs, &nsecs) != 2)
        return 0;
    return secs * 1000000000LL + nsecs;
}

/* The last ran file this process wrote, removed when it exits: the
 * supervisor removes it when the session ends, but a supervisor that died
 * meanwhile cannot, and the next one's sweep (park_sweep.py) cannot tell a
 * client that was pid 1 of its own pid namespace (a container) from the
 * host's init. Written by the thread that parks, under gp_lock. */
static char ran_written[160];
static int ran_atexit;

static void ran_unlink(void)
{
    if (ran_written[0])
        unlink(ran_written);
}

/* The app's own figure of a checkpoint's stall: held_ns, when gp_lock was
 * taken for parking (from then on every CUDA call of every thread waits in
 * the shim), and ran_ns, when it was given back after going on. Written to
 * /dev/shm/gpuproxy-ran-<public id> as "held_ns ran_ns" (the host's
 * CLOCK_MONOTONIC, which proxyd and proxy-cli read as time.monotonic():
 * mono_offset_ns); the supervisor's
 * resume command reports it (docs/checkpoint.md, "What the app lived"). */
static void write_ran(long long held, long long ran)
{
    char path[160], tmp[176], line[64];
    flag_path(path, sizeof path, "ran");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    int n = snprintf(line, sizeof line, "%lld %lld\n", held, ran);
    int ok = write(fd, line, (size_t)n) == n;
    close(fd);
    if (!ok || rename(tmp, path) < 0) {
        unlink(tmp);
        return;
    }
    snprintf(ran_written, sizeof ran_written, "%s", path);
    if (!ran_atexit) {
        ran_atexit = 1;
        atexit(ran_unlink);
    }
}

/* This process's start time (field 22 of /proc/self/stat, clock ticks
 * since boot; proc(5)): a CRIU restore forks the process anew, so it
 * differs in the restored copy although the pid is the same. 0 when
 * unknown. */
static long long start_ticks(void)
{
    char buf[1024];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');      /* the command name may hold spaces */
    if (!p)
        return 0;
    /* after ")": state is field 3, start time field 22 */
    for (int field = 2; field < 22 && p; field++)
        p = strchr(p + 1, ' ');
    return p ? strtoll(p + 1, NULL, 10) : 0;
}

/* How long a restored process waits for its resume:
 * GPUPROXY_RESTORE_WAIT_S, default 600 s (a restore's GPU part is done
 * before CRIU forks the tree, so the resume normally follows in seconds). */
static long restore_wait_s(void)
{
    const char *e = getenv("GPUPROXY_RESTORE_WAIT_S");
    long v = (e && *e) ? atol(e) : 0;
    return v > 0 ? v : 600;
}

/* Parks, waits to be resumed, goes on. Called with gp_lock held (taken at
 * held_ns; held_off, mono_offset_ns() then, puts it in the host's clock for
 * the parked file). Returns 0 when the session is connected again, -1 when it did
 * not park, 1 when it parked but could not connect again or was restored
 * and never resumed, 2 when its proxyd died meanwhile (the session is then
 * given up; with 2 nobody waits for its "ran" figure). */
static int parking;      /* under gp_lock: a park in progress (no second one inside it) */

/* /dev/shm/gpuproxy-parkheld-<public id>: the supervisor says the session
 * is held at a job's cut (park_in_call, below); taken (unlinked) here. */
static int take_park_held(void)
{
    char flag[160];
    flag_path(flag, sizeof flag, "parkheld");
    if (access(flag, F_OK) != 0)
        return 0;
    unlink(flag);
    return 1;
}

/* The park lease (proxyd/supervisor/park_lease.py): the supervisor that
 * asked for this park made /dev/shm/gpuproxy-lease-<public id> before its
 * signal, with its pid (0 when this process cannot see it: another pid
 * namespace) and renews its modification time while the park lasts. Read
 * once here, before the parked file tells the supervisor (CRIU may dump
 * the process from then on, so the wait below opens no file that could be
 * caught open: it only stats and signals). No lease: an older proxyd, the
 * wait is as before. */
struct park_lease {
    int known;
    pid_t pid;
    char path[160];
};

static void lease_read(struct park_lease *l)
{
    memset(l, 0, sizeof *l);
    flag_path(l->path, sizeof l->path, "lease");
    int fd = open(l->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return;
    char buf[64];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    buf[n > 0 ? n : 0] = 0;
    l->pid = (pid_t)atol(buf);
    l->known = 1;
}

/* GPUPROXY_PARK_LEASE_S (default 10 s): a lease not renewed for that long
 * means its supervisor is gone, where its pid cannot be checked (or is a
 * zombie). The supervisor renews it every second. */
static long lease_s(void)
{
    const char *e = getenv("GPUPROXY_PARK_LEASE_S");
    long v = (e && *e) ? atol(e) : 0;
    return v > 0 ? v : 10;
}

/* 1 when the supervisor holding the park is gone: its pid no longer
 * exists, or its lease went stale. A lease removed is not a death (the
 * supervisor removes it as it resumes the app: the resume file is there). */
static int lease_lost(const struct park_lease *l, long stale_s)
{
    if (!l->known)
        return 0;
    struct stat st;
    if (stat(l->path, &st) != 0)
        return 0;
    if (l->pid > 0 && kill(l->pid, 0) < 0 && errno == ESRCH)
        return 1;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return now.tv_sec - st.st_mtim.tv_sec > stale_s;
}

static int gp_park_here(long long held_ns, long long held_off, int in_call)
{
    if (!gp_park_requested())
        return -1;
    /* held at a cut, the worker does not answer the held messages: do not
     * wait for them (also when the park thread got the lock between calls
     * with held async messages out); they are sent again after */
    if (!in_call)
        in_call = take_park_held();
    parking = 1;
    int q = in_call ? gp_transport_quiesce_held() : gp_transport_quiesce();
    if (q != 0) {
        parking = 0;
        /* not parked: the supervisor's park command times out and says so */
        __atomic_store_n(&park_requested, 0, __ATOMIC_RELEASE);
        return -1;
    }
    long long t_q = mono_ns();
    char parked[160], resume[160];
    flag_path(parked, sizeof parked, "parked");
    flag_path(resume, sizeof resume, "resume");
    gp_transport_park();
    long long t_t = mono_ns();
    gp_hostmem_unshare();
    gp_chan_unshare();
    long long t_u = mono_ns();
    struct park_lease lease;
    lease_read(&lease);
    long stale_s = lease_s();
    /* the file carries held_ns; written before it is named, so the
     * supervisor never reads it half written */
    char ptmp[176], hl[32];
    snprintf(ptmp, sizeof ptmp, "%s.tmp", parked);
    int fd = open(ptmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
        int n = snprintf(hl, sizeof hl, "%lld\n", held_ns - held_off);     /* the host's clock */
        if (write(fd, hl, (size_t)n) != n) {
            /* an empty file still says "parked" */
        }
        close(fd);
        if (rename(ptmp, parked) < 0)
            unlink(ptmp);
    }
    if (gp_debug_enabled())
        gp_log("parked for a checkpoint in %.1f ms (quiesce %.1f, sockets %.1f, memory made private %.1f); "
               "waiting for %s", (mono_ns() - held_ns) / 1e6, (t_q - held_ns) / 1e6, (t_t - t_q) / 1e6,
               (t_u - t_t) / 1e6, resume);
    /* CRIU dumps (and restores) the process while it sleeps here */
    char endpoint[512] = "";
    long long born = start_ticks(), restored_ns = 0;
    long wait_s = restore_wait_s();
    for (unsigned spin = 1;; spin++) {
        int rfd = open(resume, O_RDONLY | O_CLOEXEC);
        if (rfd >= 0) {
            ssize_t n = read(rfd, endpoint, sizeof endpoint - 1);
            close(rfd);
            endpoint[n > 0 ? n : 0] = 0;
            char *nl = strchr(endpoint, '\n');
            if (nl)
                *nl = 0;
            unlink(resume);
            break;
        }
        /* a restored copy of this process (CRIU forked it anew: its start
         * time differs) waits at most wait_s for its resume, which the
         * restore's last step writes; CRIU only logs a failure of that
         * step, so without this bound the app would wait forever */
        if (spin % 100 == 0 && born > 0) {
            /* a read of /proc/self/stat that failed (0) says nothing: taken
             * for a restore, it would also stop the lease check below */
            long long now_ticks = restored_ns ? 0 : start_ticks();
            if (now_ticks > 0 && now_ticks != born)
                restored_ns = mono_ns();
            if (restored_ns && mono_ns() - restored_ns > wait_s * 1000000000LL) {
                unlink(parked);
                __atomic_store_n(&park_requested, 0, __ATOMIC_RELEASE);
                gp_transport_abandon(wait_s);
                parking = 0;
                return 1;
            }
        }
        /* the original process whose supervisor died (mid-dump: nobody
         * will resume it) goes on, its session lost as with any dead
         * daemon: one line naming the endpoint, its CUDA calls fail. A
         * restored copy is the restore's business (above): every 200th
         * spin is also a 100th, so a copy (whose spin count CRIU restored
         * too) is known as one before its old lease is looked at. */
        if (spin % 200 == 0 && !restored_ns && lease_lost(&lease, stale_s)) {
            unlink(parked);
            unlink(lease.path);         /* ours (park_lease.py): nobody else will remove it */
            __atomic_store_n(&park_requested, 0, __ATOMIC_RELEASE);
            gp_transport_daemon_gone();
            parking = 0;
            return 2;
        }
        /* every millisecond slept here after the resume file appears is
         * stall the app lives through: poll often (an open() a ms is cheap) */
        sleep_ms(1);
    }
    unlink(parked);
    long long t_r = mono_ns();
    __atomic_store_n(&park_requested, 0, __ATOMIC_RELEASE);
    int bad = gp_hostmem_reshare() | gp_chan_reshare();
    long long t_s = mono_ns();
    if (bad)
        gp_log("could not share some host memory with proxyd again after the checkpoint; copies use the socket");
    int rc = gp_transport_unpark(endpoint[0] ? endpoint : NULL);
    parking = 0;
    if (gp_debug_enabled())
        gp_log("resumed after a checkpoint (%s) in %.1f ms (memory shared again %.1f, reconnect %.1f)",
               rc == 0 ? "connected" : "not connected", (mono_ns() - t_r) / 1e6, (t_s - t_r) / 1e6,
               (mono_ns() - t_s) / 1e6);
    return rc;
}

static void *park_thread(void *arg)
{
    (void)arg;
    for (;;) {
        char c;
        ssize_t n = read(park_pipe[0], &c, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return NULL;
        __atomic_store_n(&park_requested, 1, __ATOMIC_RELEASE);
        /* from here a thread starting a CUDA call waits (lock.c's gate): the
         * app is held from now, and the call in progress, if any, is the
         * last before the park */
        /* the clock read after the gate closes: a thread that starts a call
         * after that reading waits; read before, the app made calls inside
         * the window whenever this thread was preempted in between (CI,
         * 2026-11-28). A thread that found the gate closed earlier than the
         * reading (preempted the other way) gives the earlier moment
         * (lock.c), below. The offset does not change meanwhile. */
        gp_lock_gate(1);
        long long held = mono_ns();
        long long held_off = mono_offset_ns();
        for (;;) {
            if (!gp_park_requested())
                break;
            if (gp_trylock() == 0) {
                if (gp_park_requested()) {
                    long long first = gp_lock_gate_first_wait();
                    if (first && first < held)
                        held = first;
                    int rc = gp_park_here(held, held_off, 0);
                    gp_resend_unanswered();
                    /* the window ends when the app's threads may run again:
                     * read before the gate opens, since a woken thread can
                     * make calls before this thread reads the clock after
                     * (two 10-us calls inside the window on the H100,
                     * tests/test_stall_figures.py, 2026-11-28) */
                    long long ran = mono_ns();
                    gp_lock_gate(0);
                    gp_unlock();
                    if (rc != -1 && rc != 2)     /* in the host's clock: a restore came between them */
                        write_ran(held - held_off, ran - mono_offset_ns());
                    break;
                }
                gp_unlock();
                break;
            }
            struct timespec t = { 0, 100000 };      /* 0.1 ms: the call in progress ends */
            nanosleep(&t, NULL);
        }
        gp_lock_gate(0);
    }
}

static void on_park_signal(int sig)
{
    (void)sig;
    int e = errno;
    char c = 'p';
    if (park_pipe[1] >= 0 && write(park_pipe[1], &c, 1) < 0) {
        /* nothing to do in a signal handler */
    }
    errno = e;
}

/* A park inside a call (gp_transport_hooks.park_in_call): the thread that
 * waits for an answer the worker holds at a job's cut (it holds gp_lock, so
 * the park thread cannot get it) parks itself, when the supervisor said so
 * with /dev/shm/gpuproxy-parkheld-<public id> (an ordinary park keeps "the
 * call in progress finishes first"). Its held messages have not run: they
 * are sent again after (the caller), to the worker as it is then. */
static int park_in_call(void)
{
    if (!gp_park_requested() || parking || !take_park_held())
        return -1;
    long long held = mono_ns();
    long long held_off = mono_offset_ns();
    int rc = gp_park_here(held, held_off, 1);
    if (rc == -1)
        return -1;
    if (rc != 2)
        write_ran(held - held_off, mono_ns() - mono_offset_ns());
    return 0;
}

/* Called once a session is open (gp_transport_hooks.session_open, set by
 * the constructor below): installs the park signal and thread. */
static void park_init(void)
{
    if (park_pid == getpid())
        return;
    park_pid = getpid();
    const char *e = getenv("GPUPROXY_PARK_SIGNAL");
    int sig = (e && *e) ? atoi(e) : SIGRTMIN + 6;
    if (sig <= 0 || sig >= NSIG)
        return;
    if (pipe2(park_pipe, O_CLOEXEC) < 0)
        return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_park_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&a, 64 << 10);
    /* the thread must not take the app's signals */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_create(&t, &a, park_thread, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&a);
}

__attribute__((constructor)) static void register_session_hook(void)
{
    gp_transport_hooks.session_open = park_init;
    gp_transport_hooks.park_in_call = park_in_call;
}
