/* The cuBLASLt descriptors of the app, kept in the shim (lib_cublaslt.c
 * makes proxyd's copies from them only when a call needs one), and the
 * heuristic cache built on them (docs/libraries.md, "Asynchronous creates and the heuristic
 * cache").
 *
 * PyTorch asks cublasLtMatmulAlgoGetHeuristic before every cuBLASLt matmul,
 * with descriptors it has just created (at::cuda::blas, gemm_and_bias and
 * friends). The answer is a function of the descriptors' contents, the
 * preference and the device (cublasLt.h: the heuristic reads no matrix
 * data), so the shim keeps each descriptor's creation arguments and
 * attributes and answers a repeated question from a cache instead of a
 * round trip. Pointer-valued attributes (bias, aux, scale pointers) enter
 * the key by their alignment (pointer_attr below).
 *
 * The cache is per session epoch (gp_session_epoch: a restore or migration
 * may put the session on another GPU, whose algorithms differ) and bounded
 * (LT_CACHE_MAX entries, then it starts again empty).
 *
 * Locking: gp_lock around every access (recursive; the stand-in's bodies
 * hold it or take it). Lives in libcuda.so.1 with the other gp_ state. */
#include <stdlib.h>
#include <string.h>

#include "gp_lib.h"

#define LT_BUCKETS 256
#define LT_CACHE_MAX 4096

typedef struct lt_attr {
    int id;
    size_t n;
    unsigned char *v;
} lt_attr;

typedef struct lt_desc {
    uint64_t h;
    int kind;
    unsigned char args[32];
    size_t nargs;
    lt_attr *attrs;          /* sorted by id */
    size_t nattrs;
    struct lt_desc *next;
} lt_desc;

static lt_desc *descs[LT_BUCKETS];

static size_t bucket(uint64_t h) { return (size_t)((h ^ (h >> 32)) * 0x9E3779B97F4A7C15ull >> 56) % LT_BUCKETS; }

static lt_desc *find_desc(uint64_t h)
{
    for (lt_desc *d = descs[bucket(h)]; d; d = d->next)
        if (d->h == h)
            return d;
    return NULL;
}

static void free_desc(lt_desc *d)
{
    for (size_t i = 0; i < d->nattrs; i++)
        free(d->attrs[i].v);
    free(d->attrs);
    free(d);
}

void gp_lt_state_forget(const void *hp)
{
    uint64_t h = (uint64_t)(uintptr_t)hp;
    gp_lock();
    for (lt_desc **p = &descs[bucket(h)]; *p; p = &(*p)->next)
        if ((*p)->h == h) {
            lt_desc *d = *p;
            *p = d->next;
            free_desc(d);
            break;
        }
    gp_unlock();
}

int gp_lt_state_create(const void *hp, int kind, const void *args, size_t nargs)
{
    uint64_t h = (uint64_t)(uintptr_t)hp;
    if (nargs > sizeof ((lt_desc *)0)->args)
        return -1;
    gp_lt_state_forget(hp);
    lt_desc *d = calloc(1, sizeof *d);
    if (!d)
        return -1;
    d->h = h;
    d->kind = kind;
    memcpy(d->args, args, nargs);
    d->nargs = nargs;
    gp_lock();
    d->next = descs[bucket(h)];
    descs[bucket(h)] = d;
    gp_unlock();
    return 0;
}

int gp_lt_state_attr(const void *hp, int id, const void *buf, size_t n)
{
    gp_lock();
    lt_desc *d = find_desc((uint64_t)(uintptr_t)hp);
    if (!d) {
        gp_unlock();
        return -1;
    }
    unsigned char *v = malloc(n ? n : 1);
    size_t i = 0;
    while (i < d->nattrs && d->attrs[i].id < id)
        i++;
    if (!v) {
        gp_unlock();
        return -2;
    }
    if (n)
        memcpy(v, buf, n);
    if (i < d->nattrs && d->attrs[i].id == id) {
        free(d->attrs[i].v);
    } else {
        lt_attr *na = realloc(d->attrs, (d->nattrs + 1) * sizeof *na);
        if (!na) {
            free(v);
            gp_unlock();
            return -2;
        }
        d->attrs = na;
        memmove(&d->attrs[i + 1], &d->attrs[i], (d->nattrs - i) * sizeof *na);
        d->nattrs++;
    }
    d->attrs[i] = (lt_attr){ id, n, v };
    gp_unlock();
    return 0;
}

/* Read access for lib_cublaslt.c, which builds proxyd's copies from it. */
int gp_lt_state_get(const void *hp, int *kind, const void **args, size_t *nargs, size_t *nattrs)
{
    gp_lock();
    lt_desc *d = find_desc((uint64_t)(uintptr_t)hp);
    if (d) {
        *kind = d->kind;
        *args = d->args;
        *nargs = d->nargs;
        *nattrs = d->nattrs;
    }
    gp_unlock();
    return d != NULL;
}

int gp_lt_state_attr_at(const void *hp, size_t i, int *id, const void **v, size_t *n)
{
    gp_lock();
    lt_desc *d = find_desc((uint64_t)(uintptr_t)hp);
    int ok = d && i < d->nattrs;
    if (ok) {
        *id = d->attrs[i].id;
        *v = d->attrs[i].v;
        *n = d->attrs[i].n;
    }
    gp_unlock();
    return ok;
}

/* ------------------------------------------------------------- the cache */

typedef struct lt_entry {
    uint64_t hash;
    unsigned char *key;
    size_t nkey;
    int count;
    unsigned char *results;
    size_t nresults;
    struct lt_entry *next;
} lt_entry;

static lt_entry *cache[LT_BUCKETS];
static size_t ncache;

/* cublasLt.h, cublasLtMatmulDescAttributes_t: the attributes that hold
 * device pointers (bias, epilogue aux, scale and amax pointers). The
 * heuristic reads no data through them; it may "depend on its value to
 * determine expected pointer alignment" (the header, on BIAS_POINTER), so
 * the key holds their alignment instead of their value: PyTorch's aux and
 * bias buffers move between steps, their alignment does not. Exported for
 * lib_cublaslt.c, which updates them on proxyd's copies instead of making
 * new ones. */
enum { K_MATMUL_DESC = 34 };

int gp_lt_pointer_attr(int id)
{
    switch (id) {
    case 8:  /* BIAS_POINTER */
    case 11: /* EPILOGUE_AUX_POINTER */
    case 17: case 18: case 19: case 20:     /* A/B/C/D_SCALE_POINTER */
    case 21: /* AMAX_D_POINTER */
    case 23: case 24:                       /* EPILOGUE_AUX_SCALE/AMAX_POINTER */
    case 36: /* D_OUT_SCALE_POINTER */
        return 1;
    default:
        return 0;
    }
}

/* the largest power of two (up to 256 bytes) dividing p; 0 for NULL */
static uint64_t alignment(uint64_t p)
{
    if (!p)
        return 0;
    uint64_t a = p & (~p + 1);
    return a > 256 ? 256 : a;
}

typedef struct {
    unsigned char *p;
    size_t n, cap;
    int ok;
} kbuf;

static void kput(kbuf *k, const void *p, size_t n)
{
    if (!k->ok)
        return;
    if (k->n + n > k->cap) {
        size_t c = k->cap ? 2 * k->cap : 1024;
        while (c < k->n + n)
            c *= 2;
        unsigned char *q = realloc(k->p, c);
        if (!q) {
            k->ok = 0;
            return;
        }
        k->p = q;
        k->cap = c;
    }
    memcpy(k->p + k->n, p, n);
    k->n += n;
}

/* A descriptor's contents into a key. Device-pointer attributes enter by
 * their alignment (KEY_ALIGN: the heuristic cache) or by their id alone
 * (KEY_NO_POINTERS: the identity of proxyd's copy, lib_cublaslt.c, which
 * sets their values on the copy itself). */
enum { KEY_ALIGN, KEY_NO_POINTERS };

static void kput_desc(kbuf *k, const void *hp, int pointers)
{
    lt_desc *d = hp ? find_desc((uint64_t)(uintptr_t)hp) : NULL;
    if (hp && !d) {             /* a descriptor the shim does not know: no key */
        k->ok = 0;
        return;
    }
    uint64_t hdr[3] = { d ? (uint64_t)d->kind : 0, d ? d->nargs : 0, d ? d->nattrs : 0 };
    kput(k, hdr, sizeof hdr);
    if (!d)
        return;
    kput(k, d->args, d->nargs);
    for (size_t i = 0; i < d->nattrs; i++) {
        uint64_t a[2] = { (uint64_t)d->attrs[i].id, d->attrs[i].n };
        kput(k, a, sizeof a);
        if (d->kind == K_MATMUL_DESC && gp_lt_pointer_attr(d->attrs[i].id) && d->attrs[i].n == sizeof(uint64_t)) {
            if (pointers == KEY_NO_POINTERS)
                continue;
            uint64_t p, al;
            memcpy(&p, d->attrs[i].v, sizeof p);
            al = alignment(p);
            kput(k, &al, sizeof al);
        } else {
            kput(k, d->attrs[i].v, d->attrs[i].n);
        }
    }
}

static uint64_t fnv(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

int gp_lt_copy_key(const void *h, unsigned char **key, size_t *n, uint64_t *hash)
{
    kbuf k = { .ok = 1 };
    gp_lock();
    if (h)
        kput_desc(&k, h, KEY_NO_POINTERS);
    gp_unlock();
    if (!h || !k.ok) {
        free(k.p);
        return -1;
    }
    *key = k.p;
    *n = k.n;
    *hash = fnv(k.p, k.n);
    return 0;
}

static void cache_clear(void)
{
    for (size_t b = 0; b < LT_BUCKETS; b++) {
        for (lt_entry *e = cache[b], *nx; e; e = nx) {
            nx = e->next;
            free(e->key);
            free(e->results);
            free(e);
        }
        cache[b] = NULL;
    }
    ncache = 0;
}

/* The key of one heuristic question; 0 (and k->ok = 0) when it cannot be
 * keyed. descs: operationDesc, A, B, C, D, preference. */
static int make_key(kbuf *k, const void *ctx, const void *handle, const void *const descs6[6], int requested)
{
    uint64_t head[4] = { gp_session_epoch(), (uint64_t)(uintptr_t)ctx, (uint64_t)(uintptr_t)handle,
                         (uint64_t)(int64_t)requested };
    k->ok = 1;
    kput(k, head, sizeof head);
    for (int i = 0; i < 6; i++)
        kput_desc(k, descs6[i], KEY_ALIGN);
    return k->ok;
}

int gp_lt_heuristic_find(const void *ctx, const void *handle, const void *const descs6[6], int requested,
                         void *results, size_t result_size, int *count)
{
    kbuf k = { 0 };
    int hit = 0;
    gp_lock();
    if (make_key(&k, ctx, handle, descs6, requested)) {
        uint64_t h = fnv(k.p, k.n);
        for (lt_entry *e = cache[h % LT_BUCKETS]; e; e = e->next)
            if (e->hash == h && e->nkey == k.n && !memcmp(e->key, k.p, k.n)
                && e->nresults <= (size_t)requested * result_size) {
                if (results)
                    memcpy(results, e->results, e->nresults);
                *count = e->count;
                hit = 1;
                break;
            }
    }
    gp_unlock();
    free(k.p);
    return hit;
}

void gp_lt_heuristic_store(const void *ctx, const void *handle, const void *const descs6[6], int requested,
                           const void *results, size_t result_size, int count)
{
    if (count < 0 || count > requested || !results)
        return;
    kbuf k = { 0 };
    gp_lock();
    if (make_key(&k, ctx, handle, descs6, requested)) {
        if (ncache >= LT_CACHE_MAX)
            cache_clear();
        lt_entry *e = calloc(1, sizeof *e);
        size_t nr = (size_t)count * result_size;
        unsigned char *r = malloc(nr ? nr : 1);
        if (e && r) {
            memcpy(r, results, nr);
            e->hash = fnv(k.p, k.n);
            e->key = k.p;
            e->nkey = k.n;
            e->count = count;
            e->results = r;
            e->nresults = nr;
            e->next = cache[e->hash % LT_BUCKETS];
            cache[e->hash % LT_BUCKETS] = e;
            ncache++;
            k.p = NULL;         /* the entry owns it now */
        } else {
            free(e);
            free(r);
        }
    }
    gp_unlock();
    free(k.p);
}
