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
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Replaces a shared mapping by private memory holding the same bytes at the
 * same address, and unlinks the segment's name (nothing of the daemon's
 * stays mapped: what CRIU dumps is ordinary anonymous memory). */
int gp_shm_to_private(void *base, size_t size, const char *name)
{
    void *tmp = malloc(size);
    if (!tmp)
        return -1;
    memcpy(tmp, base, size);
    void *p = mmap(base, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p == MAP_FAILED) {
        free(tmp);
        return -1;
    }
    memcpy(base, tmp, size);
    free(tmp);
    if (name && name[0])
        shm_unlink(name);
    return 0;
}

/* The reverse: a segment of that name again, holding the private bytes,
 * mapped shared at the same address. */
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
    size_t off = 0;
    while (off < size) {
        ssize_t w = pwrite(fd, (char *)base + off, size - off, (off_t)off);
        if (w <= 0) {
            close(fd);
            shm_unlink(name);
            return -1;
        }
        off += (size_t)w;
    }
    void *p = mmap(base, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(name);
        return -1;
    }
    return 0;
}
