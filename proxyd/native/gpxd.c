/* proxyd's native helper (libgpxd.so, built at install time, loaded with
 * cffi in ABI mode by gpuproxy.proxyd.native).
 *
 * Kernel launches are the one op whose cost the daemon adds to every step of
 * a GPU program, so runs of consecutive launch ops in a message are executed
 * here, straight from the received msgpack bytes: the argument buffer is
 * passed to cuLaunchKernel through CU_LAUNCH_PARAM_BUFFER_POINTER without a
 * copy, and handles are translated through tables that proxyd keeps in sync
 * (gpx_set). Anything unusual (an op this code does not know, a parameter
 * buffer sent as a separate frame) is left to the Python path.
 *
 * The op layout is docs/protocol.md's: [fid, ctx, f, gx, gy, gz, bx, by, bz,
 * shmem, stream, params, extra].
 *
 * Locking: called from proxyd's main loop only, which owns these tables. */
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gp_msgpack.h"

#define MAX_SLOTS 64
#define NKINDS 6

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);
typedef CUresult (*setctx_fn)(CUcontext);

static launch_fn p_launch;
static setctx_fn p_setctx;
static CUcontext cur_ctx;

typedef struct {
    uintptr_t *v;
    uint32_t n;
} table;

static table tables[MAX_SLOTS][NKINDS];
static uint32_t launch_fids[8];
static int nlaunch_fids;

int gpx_init(const char *libcuda)
{
    void *h = dlopen(libcuda, RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        h = dlopen(libcuda, RTLD_NOW);
    if (!h)
        return -1;
    p_launch = (launch_fn)dlsym(h, "cuLaunchKernel");
    p_setctx = (setctx_fn)dlsym(h, "cuCtxSetCurrent");
    return (p_launch && p_setctx) ? 0 : -1;
}

void gpx_add_launch_fid(uint32_t fid)
{
    if (nlaunch_fids < 8)
        launch_fids[nlaunch_fids++] = fid;
}

/* The context proxyd made current by other means (Python): keeps the cache right. */
void gpx_note_current(uintptr_t ctx) { cur_ctx = (CUcontext)ctx; }

int gpx_set(int slot, int kind, uint32_t id, uintptr_t value)
{
    if (slot < 0 || slot >= MAX_SLOTS || kind <= 0 || kind >= NKINDS)
        return -1;
    table *t = &tables[slot][kind];
    if (id >= t->n) {
        uint32_t n = t->n ? t->n : 64;
        while (n <= id)
            n *= 2;
        uintptr_t *v = realloc(t->v, n * sizeof *v);
        if (!v)
            return -1;
        memset(v + t->n, 0, (n - t->n) * sizeof *v);
        t->v = v;
        t->n = n;
    }
    t->v[id] = value;
    return 0;
}

void gpx_clear_slot(int slot)
{
    if (slot < 0 || slot >= MAX_SLOTS)
        return;
    for (int k = 0; k < NKINDS; k++) {
        free(tables[slot][k].v);
        tables[slot][k].v = NULL;
        tables[slot][k].n = 0;
    }
}

static uintptr_t lookup(int slot, uint64_t handle, int kind)
{
    if ((int)(handle >> 32) != kind)
        return 0;
    uint32_t id = (uint32_t)handle;
    table *t = &tables[slot][kind];
    return id < t->n ? t->v[id] : 0;
}

/* Byte offset of the first op of message frame 0 ([type, seq, ops]) and the
 * op count, or -1. */
long gpx_ops_start(const uint8_t *buf, size_t len, uint32_t *nops)
{
    gp_rd r;
    gp_rd_init(&r, buf, len);
    if (mp_get_array(&r) < 3)
        return -1;
    mp_skip(&r);
    mp_skip(&r);
    *nops = mp_get_array(&r);
    return r.err ? -1 : (long)(r.p - buf);
}

/* Offset just after the object at off. */
long gpx_skip(const uint8_t *buf, size_t len, size_t off)
{
    gp_rd r;
    gp_rd_init(&r, buf + off, len - off);
    if (mp_skip(&r) < 0)
        return -1;
    return (long)(r.p - buf);
}

static int is_launch(uint32_t fid)
{
    for (int i = 0; i < nlaunch_fids; i++)
        if (launch_fids[i] == fid)
            return 1;
    return 0;
}

/* Runs consecutive launch ops from byte offset *off, at most max_ops of
 * them. Returns how many ops it consumed; *off moves past them. Stops before
 * an op it leaves to Python. A failed launch is consumed and reported in
 * *err (CUresult) with its index in *err_index; the run stops there. */
int gpx_run_launches(int slot, const uint8_t *buf, size_t len, size_t *off, int max_ops, int *err,
                     int *err_index)
{
    *err = 0;
    *err_index = -1;
    if (slot < 0 || slot >= MAX_SLOTS || !p_launch)
        return 0;
    int done = 0;
    while (done < max_ops) {
        gp_rd r;
        gp_rd_init(&r, buf + *off, len - *off);
        if (mp_get_array(&r) != 13)
            break;
        uint32_t fid = (uint32_t)mp_get_uint(&r);
        if (r.err || !is_launch(fid))
            break;
        uint64_t ctxh = mp_get_uint(&r);
        uint64_t fh = mp_get_uint(&r);
        unsigned d[7];
        for (int i = 0; i < 7; i++)
            d[i] = (unsigned)mp_get_uint(&r);
        uint64_t sh = mp_get_uint(&r);
        mp_obj params;
        if (mp_next(&r, &params) < 0 || (params.type != MP_BIN && params.type != MP_NIL))
            break;                                     /* frame reference: Python */
        mp_obj extra;
        if (mp_next(&r, &extra) < 0 || extra.type != MP_NIL || r.err)
            break;
        CUcontext ctx = ctxh ? (CUcontext)lookup(slot, ctxh, 1) : NULL;
        CUfunction f = (CUfunction)lookup(slot, fh, 3);
        CUstream s = sh < 3 ? (CUstream)(uintptr_t)sh : (CUstream)lookup(slot, sh, 4);
        if ((ctxh && !ctx) || !f || (sh >= 3 && !s))
            break;                                     /* unknown handle: Python reports it */
        if (ctx && ctx != cur_ctx) {
            CUresult rc = p_setctx(ctx);
            if (rc != CUDA_SUCCESS) {
                *err = rc;
                *err_index = done;
                *off = (size_t)(r.p - buf);
                return done + 1;
            }
            cur_ctx = ctx;
        }
        size_t psize = params.len;
        void *extra_arr[5] = { CU_LAUNCH_PARAM_BUFFER_POINTER, (void *)params.data, CU_LAUNCH_PARAM_BUFFER_SIZE,
                               &psize, CU_LAUNCH_PARAM_END };
        CUresult rc = p_launch(f, d[0], d[1], d[2], d[3], d[4], d[5], d[6], s, NULL,
                               params.type == MP_BIN && psize ? extra_arr : NULL);
        *off = (size_t)(r.p - buf);
        done++;
        if (rc != CUDA_SUCCESS) {
            *err = rc;
            *err_index = done - 1;
            return done;
        }
    }
    return done;
}

uintptr_t gpx_current(void) { return (uintptr_t)cur_ctx; }
