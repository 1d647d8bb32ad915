/* What the shim knows about each kernel function handle: its name and its
 * parameter layout (offset and size of each parameter in the packed argument
 * buffer). proxyd parses the layout from the module image once and returns it
 * with the handle (cuModuleGetFunction); the shim needs it to pack the
 * `void **kernelParams` of cuLaunchKernel / cudaLaunchKernel into one buffer.
 *
 * Locking: under gp_lock. */
#include "gp_funcs.h"

#include <stdlib.h>
#include <string.h>

#define GP_FN_BUCKETS 4096

static gp_fninfo *buckets[GP_FN_BUCKETS];

static unsigned hash(uint64_t h) { return (unsigned)((h * 0x9E3779B97F4A7C15ull) >> 52) & (GP_FN_BUCKETS - 1); }

gp_fninfo *gp_fn_lookup(CUfunction f)
{
    uint64_t h = (uint64_t)(uintptr_t)f;
    for (gp_fninfo *p = buckets[hash(h)]; p; p = p->next)
        if (p->handle == h)
            return p;
    return NULL;
}

gp_fninfo *gp_fn_add(CUfunction f, const char *name, size_t namelen)
{
    gp_fninfo *p = gp_fn_lookup(f);
    if (!p) {
        p = calloc(1, sizeof *p);
        if (!p)
            return NULL;
        p->handle = (uint64_t)(uintptr_t)f;
        unsigned b = hash(p->handle);
        p->next = buckets[b];
        buckets[b] = p;
    }
    free(p->name);
    p->name = malloc(namelen + 1);
    if (p->name) {
        memcpy(p->name, name, namelen);
        p->name[namelen] = 0;
    }
    return p;
}

/* Reads the layout [[offset, size], ...] from a reply into p. */
int gp_fn_read_layout(gp_fninfo *p, gp_rd *rd)
{
    uint32_t n = mp_get_array(rd);
    free(p->off);
    free(p->size);
    p->off = calloc(n ? n : 1, sizeof *p->off);
    p->size = calloc(n ? n : 1, sizeof *p->size);
    if (!p->off || !p->size)
        return -1;
    p->nparams = n;
    p->param_bytes = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t m = mp_get_array(rd);
        p->off[i] = (uint32_t)mp_get_uint(rd);
        p->size[i] = (uint32_t)mp_get_uint(rd);
        for (uint32_t j = 2; j < m; j++)
            mp_skip(rd);
        if (p->off[i] + p->size[i] > p->param_bytes)
            p->param_bytes = p->off[i] + p->size[i];
    }
    p->have_layout = 1;
    return rd->err ? -1 : 0;
}

/* Packs kernelParams (one pointer per parameter) into buf (param_bytes long). */
void gp_fn_pack(const gp_fninfo *p, void **params, uint8_t *buf)
{
    memset(buf, 0, p->param_bytes);
    for (uint32_t i = 0; i < p->nparams; i++)
        if (params && params[i])
            memcpy(buf + p->off[i], params[i], p->size[i]);
}
