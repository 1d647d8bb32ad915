/* Call profile of the shim (GPUPROXY_PROFILE=FILE): how many times each
 * forwarded function was called, how many of those calls waited for an
 * answer, and how long they waited. Written at exit as
 * "fid calls sync_calls sync_wait_us" lines; `proxy-cli profile FILE`
 * names the functions from specs/ (and merges the FILE.<pid> files of other
 * processes that used the variable too). It answers "where does a proxied program
 * spend its round trips" (issues 12 and 13) without a profiler on the app.
 *
 * Off unless the variable is set: then each op costs one branch. Locking:
 * the counters are updated under gp_lock (every caller holds it: ops are
 * built and sent under it, transport.c); the exit writer takes it. Process
 * ownership: a forked child inherits the counters; whoever writes second
 * writes FILE.<pid>. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gp_profile.h"

#define GP_PROF_IDS 65536       /* every spec id is below this (the library families reach 47192, specs/nccl; tests/test_specs.py checks it): an id above it would be counted as id 0 */

typedef struct {
    uint64_t calls, sync_calls, wait_ns;
} prof_slot;

static prof_slot *slots;        /* NULL: profiling off */
static char prof_path[512];
static pid_t prof_pid;
static uint32_t last_fid;

static uint64_t mono_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void prof_write(void)
{
    if (!slots)
        return;
    gp_lock();
    size_t used = 0;
    for (uint32_t i = 0; i < GP_PROF_IDS; i++)
        used += slots[i].calls != 0;
    if (!used) {                /* a helper process that never called CUDA (sh, ldconfig): nothing to say */
        gp_unlock();
        return;
    }
    /* FILE for the first process that has something to say; another one
     * (a child of the app, or a second app given the same variable) writes
     * FILE.<pid> instead of overwriting it. `proxy-cli profile` merges them. */
    char path[600];
    snprintf(path, sizeof path, "%s", prof_path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) {
        snprintf(path, sizeof path, "%s.%d", prof_path, (int)getpid());
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    }
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (f) {
        fprintf(f, "# gpuproxy shim call profile of pid %d: fid calls sync_calls sync_wait_us\n", (int)getpid());
        for (uint32_t i = 0; i < GP_PROF_IDS; i++)
            if (slots[i].calls)
                fprintf(f, "%u %llu %llu %.1f\n", i, (unsigned long long)slots[i].calls,
                        (unsigned long long)slots[i].sync_calls, slots[i].wait_ns / 1000.0);
        fclose(f);
        fprintf(stderr, "gpuproxy: call profile of %zu functions written to %s\n", used, path);
    } else {
        if (fd >= 0)
            close(fd);
        fprintf(stderr, "gpuproxy: cannot write the call profile to %s\n", path);
    }
    gp_unlock();
}

__attribute__((constructor)) static void prof_init(void)
{
    const char *p = getenv("GPUPROXY_PROFILE");
    if (!p || !*p || strlen(p) >= sizeof prof_path)
        return;
    slots = calloc(GP_PROF_IDS, sizeof *slots);
    if (!slots)
        return;
    snprintf(prof_path, sizeof prof_path, "%s", p);
    prof_pid = getpid();
    atexit(prof_write);
}

void gp_prof_op(uint32_t fid)
{
    if (!slots)
        return;
    last_fid = fid < GP_PROF_IDS ? fid : 0;
    slots[last_fid].calls++;
}

/* A synchronous message's last op is the call that waits (transport.c). */
uint64_t gp_prof_wait_begin(void) { return slots ? mono_ns() : 0; }

void gp_prof_wait_end(uint64_t t0)
{
    if (!slots)
        return;
    slots[last_fid].sync_calls++;
    slots[last_fid].wait_ns += mono_ns() - t0;
}
