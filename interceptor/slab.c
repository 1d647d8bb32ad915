/* Small device allocations placed by the shim (issue 13, target 4;
 * docs/architecture.md, "Small allocations placed by the shim").
 *
 * Every cuMemAlloc used to be a synchronous round trip to the worker. Now
 * a request of at most GPUPROXY_SLAB_MAX bytes (default 256 KiB) is cut
 * from a slab: an ordinary allocation of GPUPROXY_SLAB_SIZE bytes (default
 * 2 MiB, the driver's mapping granularity) that the shim took from the
 * worker with one cuMemAlloc_v2. To the worker a slab is one allocation like
 * any other: it lives in the session's arena at a fixed address, a dump
 * stores it whole (its used and unused bytes alike) and a restore maps it
 * back at the same address. What is cut from it is known to the shim only:
 * that state lives in the application's memory, which CRIU saves with the
 * process for whole-process checkpoints and which stays valid for GPU-only
 * restores into the same live process (the addresses do not move). A
 * restore into a fresh process is no case: the process is the same.
 *
 * Rules (the CUDA behaviour each keeps):
 * - Alignment: blocks start on 256-byte boundaries (CUDA C Programming
 *   Guide, "Device Memory Accesses": addresses returned by the allocation
 *   routines are aligned to at least 256 bytes).
 * - Out of memory stays synchronous: when no slab has room the shim asks
 *   for a new slab inside the cuMemAlloc that needs it; when that fails the
 *   request goes to the worker as a plain allocation, and its answer
 *   (CUDA_ERROR_OUT_OF_MEMORY, cudaErrorMemoryAllocation at the runtime)
 *   is what the caller gets.
 * - cuMemFree/cudaFree synchronise (cuda_runtime_api.h, cudaFree: "performs
 *   an implicit device synchronization"): a freed block may still be read
 *   or written by queued work, so before a block goes back to the free
 *   list the shim makes the calling thread's context synchronise
 *   (cuCtxSynchronize, one round trip), unless no op at all was sent to the
 *   worker since the last successful cuCtxSynchronize (the shim's own or
 *   the application's: cudaDeviceSynchronize; gp_ops_synced): then no work
 *   can be pending and the free is local. A malloc/free pair with no
 *   GPU work in between costs no round trip; one after GPU work costs one,
 *   where it cost two before (and natively costs a device sync too).
 * - cuMemFree of an address inside a slab that is not the start of a live
 *   block (a double free, an interior pointer) is CUDA_ERROR_INVALID_VALUE,
 *   as the driver answers for an address that is not an allocation.
 * - cuMemGetAddressRange of an address in a block answers the block (base,
 *   requested size), as the worker does for its allocations; an address in
 *   a slab's unused part is CUDA_ERROR_NOT_FOUND.
 * - cuMemFreeAsync of a block frees it as cuMemFree does (the context
 *   synchronisation covers the stream's work).
 * - cuMemGetInfo counts whole slabs as used (the driver too maps small
 *   allocations in 2 MiB pages).
 * - IPC: cuIpcGetMemHandle of a block goes to the worker, whose handle
 *   names the slab's memory from the block's address on (proxyd/families/ipc.py
 *   records the offset in the chunk), so the opener's pointer is the block.
 * - A slab whose blocks are all freed goes back to the worker (cuMemFree)
 *   unless it is the device's only empty slab, which is kept for the next
 *   requests. A primary context reset frees every allocation of its device
 *   in the worker: the device's slabs are forgotten (gp_slab_device_gone).
 * - GPUPROXY_SLAB=0 turns all of this off (every request goes to the
 *   worker, as before).
 *
 * Locking: the slab table and every slab's state are guarded by gp_lock
 * (the shim's one recursive lock, gp_base.h), which also orders the
 * sub-allocations against the ops other threads send. A forked child
 * forgets the table (slab_forget_all, run by lock.c's fork-child hooks,
 * registered by this file's constructor): it starts a session of its own,
 * in which the parent's slabs do not exist. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gp_gen.h"
#include "gp_memory.h"
#include "gp_owner.h"

#define UNIT 256u                       /* block granularity and alignment */
#define GRANULE (2u << 20)              /* slab sizes are multiples of the VMM granularity */

typedef struct slab {
    CUdeviceptr base;
    size_t size;
    CUdevice dev;
    uint32_t units;         /* size / UNIT */
    uint32_t free_units;
    uint32_t live;          /* live blocks */
    uint32_t hint;          /* every unit below it is taken */
    uint64_t *used;         /* bitmap: 1 = unit taken */
    uint32_t *req;          /* requested bytes of the block starting at unit i; 0: no block starts there */
} slab;

static struct {
    int configured;
    int on;
    size_t max;             /* largest request served from slabs */
    size_t slab_size;
    slab *v;                /* sorted by base */
    int n, cap;
} S;

static size_t env_bytes(const char *name, size_t dflt)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return dflt;
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    if (*end == 'k' || *end == 'K')
        v <<= 10, end++;
    else if (*end == 'm' || *end == 'M')
        v <<= 20, end++;
    if (*end || v == 0) {
        fprintf(stderr, "gpuproxy: %s=%s is not a byte count; using %zu\n", name, s, dflt);
        return dflt;
    }
    return (size_t)v;
}

static void configure(void)
{
    if (S.configured)
        return;
    S.configured = 1;
    const char *on = getenv("GPUPROXY_SLAB");
    S.on = !(on && strcmp(on, "0") == 0);
    S.max = env_bytes("GPUPROXY_SLAB_MAX", 256u << 10);
    /* blocks record their size in 32 bits, and a "small" allocation above
     * 64 MiB would make every slab huge: the threshold stops there */
    if (S.max > (64u << 20))
        S.max = 64u << 20;
    S.slab_size = env_bytes("GPUPROXY_SLAB_SIZE", GRANULE);
    /* a slab holds at least two of the largest blocks, so that one large
     * block does not take a slab of its own */
    if (S.slab_size < 2 * S.max)
        S.slab_size = 2 * S.max;
    S.slab_size = (S.slab_size + GRANULE - 1) / GRANULE * GRANULE;
    if (S.slab_size > (1024u << 20))
        S.slab_size = 1024u << 20;
}

static uint32_t units_of(size_t bytes) { return (uint32_t)((bytes + UNIT - 1) / UNIT); }

static int bit(const slab *s, uint32_t i) { return (int)(s->used[i >> 6] >> (i & 63) & 1); }

static void set_bits(slab *s, uint32_t i, uint32_t n, int v)
{
    for (uint32_t k = i; k < i + n; k++) {
        if (v)
            s->used[k >> 6] |= 1ull << (k & 63);
        else
            s->used[k >> 6] &= ~(1ull << (k & 63));
    }
}

/* First fit: the lowest run of n free units, or -1. */
static int64_t find_run(const slab *s, uint32_t n)
{
    uint32_t run = 0, start = 0;
    for (uint32_t i = s->hint; i < s->units;) {
        uint64_t w = s->used[i >> 6];
        if ((i & 63) == 0 && w == ~0ull) {
            run = 0;
            i += 64;
            continue;
        }
        if ((i & 63) == 0 && w == 0) {
            if (run == 0)
                start = i;
            run += 64;
            if (run >= n)
                return start;
            i += 64;
            continue;
        }
        if (w >> (i & 63) & 1) {
            run = 0;
        } else {
            if (run == 0)
                start = i;
            if (++run >= n)
                return start;
        }
        i++;
    }
    return -1;
}

/* The slab holding p, or -1. */
static int slab_index(CUdeviceptr p)
{
    int lo = 0, hi = S.n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (p < S.v[mid].base)
            hi = mid - 1;
        else if (p >= S.v[mid].base + S.v[mid].size)
            lo = mid + 1;
        else
            return mid;
    }
    return -1;
}

static void drop_slab_state(slab *s)
{
    free(s->used);
    free(s->req);
}

/* Takes a new slab from the worker (one synchronous cuMemAlloc_v2). */
static CUresult new_slab(CUdevice dev, slab **out)
{
    if (S.n == S.cap) {
        int cap = S.cap ? 2 * S.cap : 16;
        slab *v = realloc(S.v, (size_t)cap * sizeof *v);
        if (!v)
            return CUDA_ERROR_OUT_OF_MEMORY;
        S.v = v;
        S.cap = cap;
    }
    slab s = {0};
    s.size = S.slab_size;
    s.units = (uint32_t)(S.slab_size / UNIT);
    s.free_units = s.units;
    s.dev = dev;
    s.used = calloc((s.units + 63) / 64, sizeof *s.used);
    s.req = calloc(s.units, sizeof *s.req);
    if (!s.used || !s.req) {
        drop_slab_state(&s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult rc = gpg_cuMemAlloc_v2(&s.base, s.size);
    if (rc != CUDA_SUCCESS) {
        drop_slab_state(&s);
        return rc;
    }
    int i = 0;
    while (i < S.n && S.v[i].base < s.base)
        i++;
    memmove(&S.v[i + 1], &S.v[i], (size_t)(S.n - i) * sizeof *S.v);
    S.v[i] = s;
    S.n++;
    *out = &S.v[i];
    return CUDA_SUCCESS;
}

static CUdeviceptr take(slab *s, size_t bytes)
{
    uint32_t n = units_of(bytes);
    if (s->free_units < n)
        return 0;
    int64_t at = find_run(s, n);
    if (at < 0)
        return 0;
    uint32_t u = (uint32_t)at;
    set_bits(s, u, n, 1);
    s->req[u] = (uint32_t)bytes;
    s->free_units -= n;
    s->live++;
    if (u == s->hint)
        s->hint = u + n;
    return s->base + (CUdeviceptr)u * UNIT;
}

/* cuMemAlloc_v2: a block of a slab of the current context's device for a
 * small request, else the worker's allocation (handler mem_alloc). */
/* The worker's allocation, noted with its device (peer.c, pointer attributes). */
static CUresult worker_alloc(CUdeviceptr *dptr, size_t bytesize)
{
    CUresult rc = gpg_cuMemAlloc_v2(dptr, bytesize);
    CUdevice dev;
    CUcontext ctx = gp_ctx_current();
    if (rc == CUDA_SUCCESS && dptr && ctx && gp_ctx_device(ctx, &dev) == 0)
        gp_owner_note(*dptr, bytesize, dev);
    return rc;
}

CUresult gpo_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    gp_lock();
    configure();
    CUdevice dev;
    CUcontext ctx = gp_ctx_current();
    if (!S.on || !dptr || bytesize == 0 || bytesize > S.max || !ctx || gp_ctx_device(ctx, &dev)) {
        gp_unlock();
        return worker_alloc(dptr, bytesize);   /* the worker answers (and checks) everything else */
    }
    CUresult rc = gp_session();      /* no session: the caller gets the same error as for any call */
    if (rc != CUDA_SUCCESS)
        GP_LEAVE(rc);
    for (int i = 0; i < S.n; i++) {
        if (S.v[i].dev != dev)
            continue;
        CUdeviceptr p = take(&S.v[i], bytesize);
        if (p) {
            *dptr = p;
            GP_LEAVE(CUDA_SUCCESS);
        }
    }
    slab *s;
    if (new_slab(dev, &s) == CUDA_SUCCESS) {
        *dptr = take(s, bytesize);
        GP_LEAVE(CUDA_SUCCESS);
    }
    /* No room for a slab: the request itself may still fit (the worker's
     * small-allocation chunks); its answer, out of memory included, is the
     * caller's, synchronously. */
    gp_unlock();
    return worker_alloc(dptr, bytesize);
}

/* Waits for queued work before a block is reused (see the rules above).
 * Caller holds gp_lock. */
static CUresult fence(void)
{
    if (gp_ops_synced() == gp_ops_issued() && gp_ops_issued() != 0)
        return CUDA_SUCCESS;
    return cuCtxSynchronize();
}

static void remove_slab(int i)
{
    drop_slab_state(&S.v[i]);
    memmove(&S.v[i], &S.v[i + 1], (size_t)(S.n - i - 1) * sizeof *S.v);
    S.n--;
}

/* Frees p when it lies in a slab: *handled = 1 and the result; else
 * *handled = 0 and the caller asks the worker. Caller holds gp_lock. */
static CUresult free_block(CUdeviceptr p, int *handled)
{
    *handled = 0;
    if (!S.configured || S.n == 0)
        return CUDA_SUCCESS;
    int i = slab_index(p);
    if (i < 0)
        return CUDA_SUCCESS;
    *handled = 1;
    slab *s = &S.v[i];
    CUdeviceptr off = p - s->base;
    uint32_t u = (uint32_t)(off / UNIT);
    if (off % UNIT || s->req[u] == 0)
        return CUDA_ERROR_INVALID_VALUE;    /* not the start of a live allocation */
    CUresult rc = fence();
    if (rc != CUDA_SUCCESS)
        return rc;                           /* the block stays taken: work may still use it */
    uint32_t n = units_of(s->req[u]);
    set_bits(s, u, n, 0);
    s->req[u] = 0;
    s->free_units += n;
    s->live--;
    if (u < s->hint)
        s->hint = u;
    if (s->live == 0) {
        /* keep one empty slab per device for the next requests */
        int other_empty = 0;
        for (int k = 0; k < S.n; k++)
            if (k != i && S.v[k].dev == s->dev && S.v[k].live == 0)
                other_empty = 1;
        if (other_empty) {
            CUdeviceptr base = s->base;
            remove_slab(i);
            gpg_cuMemFree_v2(base);     /* the block's free succeeded; the slab's return is housekeeping */
        }
    }
    return CUDA_SUCCESS;
}

CUresult gp_slab_free(CUdeviceptr p, int *handled)
{
    gp_lock();
    CUresult rc = free_block(p, handled);
    gp_unlock();
    return rc;
}

int gp_slab_range(CUdeviceptr p, CUdeviceptr *base, size_t *size, CUresult *rc)
{
    gp_lock();
    int i = S.configured ? slab_index(p) : -1;
    if (i < 0) {
        gp_unlock();
        return 0;
    }
    const slab *s = &S.v[i];
    uint32_t u = (uint32_t)((p - s->base) / UNIT);
    *rc = CUDA_ERROR_NOT_FOUND;
    if (bit(s, u)) {
        /* blocks are contiguous runs of taken units: the nearest block
         * start at or below u owns it */
        uint32_t k = u;
        while (s->req[k] == 0 && k > 0)
            k--;
        if (s->req[k] && u < k + units_of(s->req[k])) {
            *base = s->base + (CUdeviceptr)k * UNIT;
            *size = s->req[k];
            *rc = CUDA_SUCCESS;
        }
    }
    gp_unlock();
    return 1;
}

/* The device of the slab holding p (peer.c's gp_owner_of): 0 when p is in a slab.
 * Takes gp_lock (recursive). */
int gp_slab_device(CUdeviceptr p, CUdevice *dev)
{
    gp_lock();
    int i = S.configured ? slab_index(p) : -1;
    if (i >= 0)
        *dev = S.v[i].dev;
    gp_unlock();
    return i >= 0 ? 0 : -1;
}

void gp_slab_device_gone(CUdevice dev)
{
    gp_lock();
    for (int i = S.n - 1; i >= 0; i--)
        if (S.v[i].dev == dev)
            remove_slab(i);
    gp_unlock();
}

static void slab_forget_all(void)
{
    for (int i = 0; i < S.n; i++)
        drop_slab_state(&S.v[i]);
    free(S.v);
    S.v = NULL;
    S.n = S.cap = 0;
}

__attribute__((constructor)) static void register_fork_child(void)
{
    gp_on_fork_child(slab_forget_all);
}

/* cuMemGetAddressRange_v2: a block answers itself (see the rules above);
 * other addresses are the worker's (handler mem_get_address_range). */
CUresult gpo_cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    CUdeviceptr base;
    size_t size;
    CUresult rc;
    if (gp_slab_range(dptr, &base, &size, &rc)) {
        if (rc == CUDA_SUCCESS) {
            if (pbase)
                *pbase = base;
            if (psize)
                *psize = size;
        }
        return rc;
    }
    return gpg_cuMemGetAddressRange_v2(pbase, psize, dptr);
}

static CUresult free_async(CUdeviceptr dptr, CUstream hStream, int per_thread)
{
    int handled;
    CUresult rc = gp_slab_free(dptr, &handled);
    if (handled)
        return rc;
    gp_owner_forget(dptr);
    return per_thread ? gpg_cuMemFreeAsync_ptsz(dptr, hStream) : gpg_cuMemFreeAsync(dptr, hStream);
}

CUresult gpo_cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) { return free_async(dptr, hStream, 0); }

CUresult gpo_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) { return free_async(dptr, hStream, 1); }
