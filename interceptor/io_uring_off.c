/* io_uring kept out of a proxied process, so that CRIU can checkpoint it.
 *
 * CRIU 4.x cannot dump an io_uring instance (proc_parse.c stops at the
 * ring's mapping). PyTorch's TCPStore server (libuv, linked into
 * libtorch_cpu) makes one in every event loop: libuv's uv__platform_loop_init
 * calls io_uring_setup for its epoll_ctl batching ring whatever
 * UV_USE_IO_URING says, and torchrun's agent runs two such loops from its
 * start (seen on the H100 machine with PyTorch 2.11 and here with 2.14, by
 * strace -k: 2026-11-28). So every torchrun job's tree was undumpable.
 *
 * libuv makes that call through libc's syscall(3) and goes on with plain
 * epoll when it fails (ENOSYS: "no io_uring in this kernel"), which it was
 * written to do. The shim's libcuda.so.1 (LD_PRELOADed into every process
 * of the job, the launcher too) therefore defines syscall(): io_uring_setup
 * answers ENOSYS, every other number goes on to libc's unchanged. A torchrun
 * DDP job (gloo, CPU) started with this interposer was dumped whole by CRIU
 * mid-run, restored, and printed the uninterrupted run's curve.
 * GPUPROXY_IO_URING=1 lets io_uring_setup through (such a process then
 * cannot be checkpointed whole: proxyd refuses it before parking, criu.py's
 * check_dumpable). Programs that issue the system call without libc's
 * syscall() (liburing's inline syscalls) are not affected, and are refused
 * the same way.
 *
 * Locking: none. The next syscall is looked up once; two threads racing on
 * the lookup store the same pointer. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/syscall.h>

#include "gp_base.h"

#ifndef SYS_io_uring_setup
#define SYS_io_uring_setup 425
#endif

typedef long (*syscall_fn)(long, ...);

static int io_uring_allowed(void)
{
    static int allowed = -1;         /* read once: the environment does not change under us */
    if (allowed < 0) {
        const char *v = getenv("GPUPROXY_IO_URING");
        allowed = v && v[0] == '1';
    }
    return allowed;
}

/* syscall(2)'s libc wrapper takes up to six arguments after the number and
 * passes them in registers whatever the call (x86-64 and aarch64 SysV), so
 * forwarding six is what libc's own wrapper reads. */
long syscall(long number, ...)
{
    static syscall_fn next;
    va_list ap;
    va_start(ap, number);
    long a1 = va_arg(ap, long), a2 = va_arg(ap, long), a3 = va_arg(ap, long);
    long a4 = va_arg(ap, long), a5 = va_arg(ap, long), a6 = va_arg(ap, long);
    va_end(ap);
    if (number == SYS_io_uring_setup && !io_uring_allowed()) {
        if (gp_debug_enabled())
            gp_log("io_uring_setup answered ENOSYS so that this process stays checkpointable "
                   "(GPUPROXY_IO_URING=1 allows it)");
        errno = ENOSYS;
        return -1;
    }
    if (!next)
        next = (syscall_fn)dlsym(RTLD_NEXT, "syscall");
    if (!next) {
        errno = ENOSYS;
        return -1;
    }
    return next(number, a1, a2, a3, a4, a5, a6);
}
