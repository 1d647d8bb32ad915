/* Shared segments turned into private memory and back, at the same address
 * with the same bytes (park.c parks the shim around a whole-process
 * checkpoint: CRIU cannot dump a shared mapping whose other side lives on
 * in proxyd; docs/checkpoint.md). Used by the files that own a segment:
 * hostmem.c (staging, pinned host memory) and channel.c (the fast
 * channel); it sits in the bottom layer so that both can.
 *
 * No locking: the caller (the park thread, holding gp_lock) owns the range. */
#define _GNU_SOURCE
#include "gp_base.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The parts of a segment that hold data, for copying only those: a park
 * stalls the app for as long as its segments take to copy, and a staging
 * segment of 64 MiB is mostly never written.
 *
 * shm -> private: tmpfs reports the extents ever written (SEEK_DATA /
 * SEEK_HOLE, lseek(2)); a hole reads as zeros, and fresh anonymous memory
 * is zeros too, so holes are not copied. Swapped-out pages are data.
 *
 * private -> shm: /proc/self/pagemap says which pages of the anonymous
 * mapping are present or swapped (bits 63 and 62; readable by the process
 * itself); the others were never written (or were CRIU-restored as zero)
 * and read as zeros: the new segment leaves them as holes. Where the file
 * cannot be read, everything is copied, as before. */
typedef int (*gp_extent_fn)(void *ctx, size_t off, size_t len);

static int shm_extents(const char *name, size_t size, gp_extent_fn fn, void *ctx)
{
    int fd = (name && name[0]) ? shm_open(name, O_RDONLY | O_CLOEXEC, 0) : -1;
    if (fd < 0)
        return fn(ctx, 0, size);
    off_t pos = 0;
    int rc = 0;
    while ((size_t)pos < size) {
        off_t d = lseek(fd, pos, SEEK_DATA);
        if (d < 0) {
            if (errno != ENXIO) {            /* no SEEK_DATA here: all of it */
                rc = fn(ctx, (size_t)pos, size - (size_t)pos);
            }
            break;                           /* ENXIO: only holes after pos */
        }
        off_t h = lseek(fd, d, SEEK_HOLE);
        if (h < 0 || (size_t)h > size)
            h = (off_t)size;
        if ((size_t)d >= size)
            break;
        if ((rc = fn(ctx, (size_t)d, (size_t)(h - d))) != 0)
            break;
        pos = h;
    }
    close(fd);
    return rc;
}

static int anon_extents(void *base, size_t size, gp_extent_fn fn, void *ctx)
{
    long pg = sysconf(_SC_PAGESIZE);
    int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || pg <= 0 || ((uintptr_t)base % (uintptr_t)pg) != 0) {
        if (fd >= 0)
            close(fd);
        return fn(ctx, 0, size);
    }
    size_t npages = (size + (size_t)pg - 1) / (size_t)pg;
    uint64_t ent[512];
    size_t run_start = 0, run_len = 0;
    int rc = 0;
    for (size_t i = 0; i < npages && rc == 0; i += 512) {
        size_t k = npages - i < 512 ? npages - i : 512;
        off_t at = (off_t)(((uintptr_t)base / (uintptr_t)pg + i) * sizeof(uint64_t));
        ssize_t got = pread(fd, ent, k * sizeof(uint64_t), at);
        if (got != (ssize_t)(k * sizeof(uint64_t))) {
            close(fd);
            /* unreadable: whatever was not reported yet is copied whole */
            if (run_len)
                rc = fn(ctx, run_start, run_len);
            return rc ? rc : fn(ctx, i * (size_t)pg, size - i * (size_t)pg);
        }
        for (size_t j = 0; j < k; j++) {
            int used = (ent[j] >> 63) & 1 || (ent[j] >> 62) & 1;
            size_t off = (i + j) * (size_t)pg;
            if (used) {
                if (!run_len)
                    run_start = off;
                run_len = off + (size_t)pg - run_start;
            } else if (run_len) {
                if ((rc = fn(ctx, run_start, run_len)) != 0)
                    break;
                run_len = 0;
            }
        }
    }
    close(fd);
    if (rc == 0 && run_len)
        rc = fn(ctx, run_start, run_start + run_len > size ? size - run_start : run_len);
    return rc;
}

struct copy_ctx { char *dst; const char *src; int fd; };

static int copy_mem(void *c, size_t off, size_t len)
{
    struct copy_ctx *x = c;
    memcpy(x->dst + off, x->src + off, len);
    return 0;
}

static int copy_to_file(void *c, size_t off, size_t len)
{
    struct copy_ctx *x = c;
    size_t done = 0;
    while (done < len) {
        ssize_t w = pwrite(x->fd, x->src + off + done, len - done, (off_t)(off + done));
        if (w <= 0)
            return -1;
        done += (size_t)w;
    }
    return 0;
}

/* Replaces a shared mapping by private memory holding the same bytes at the
 * same address, and unlinks the segment's name (nothing of the daemon's
 * stays mapped: what CRIU dumps is ordinary anonymous memory). The bytes
 * go into fresh anonymous memory elsewhere, which then moves over the
 * shared mapping (mremap: one copy, of the written extents only). */
int gp_shm_to_private(void *base, size_t size, const char *name)
{
    void *fresh = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (fresh == MAP_FAILED)
        return -1;
    struct copy_ctx x = { fresh, base, -1 };
    shm_extents(name, size, copy_mem, &x);
    void *p = mremap(fresh, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, base);
    if (p == MAP_FAILED) {
        munmap(fresh, size);
        return -1;
    }
    if (name && name[0])
        shm_unlink(name);
    return 0;
}

/* The reverse: a segment of that name again, holding the private bytes
 * (the pages ever written; the rest stay holes, read as zeros), mapped
 * shared at the same address. */
int gp_shm_from_private(void *base, size_t size, const char *name)
{
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) {
        shm_unlink(name);      /* left by the original process of a --leave-running dump */
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    }
    if (fd < 0)
        return -1;
    if (ftruncate(fd, (off_t)size) < 0) {
        close(fd);
        shm_unlink(name);
        return -1;
    }
    struct copy_ctx x = { NULL, base, fd };
    if (anon_extents(base, size, copy_to_file, &x) != 0) {
        close(fd);
        shm_unlink(name);
        return -1;
    }
    void *p = mmap(base, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(name);
        return -1;
    }
    return 0;
}
