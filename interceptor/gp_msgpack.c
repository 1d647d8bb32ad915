/* Minimal msgpack codec; see gp_msgpack.h. Format reference: the msgpack
 * specification (github.com/msgpack/msgpack/blob/master/spec.md), big-endian
 * multi-byte fields. */
#include "gp_msgpack.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gp_buf_init(gp_buf *b) { b->p = NULL; b->len = 0; b->cap = 0; }

void gp_buf_free(gp_buf *b) { free(b->p); gp_buf_init(b); }

void gp_buf_reset(gp_buf *b) { b->len = 0; }

void gp_buf_reserve(gp_buf *b, size_t extra)
{
    if (b->len + extra <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra)
        cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p) {
        /* Out of host memory while building a message: nothing sensible can
         * be sent, and CUDA has no error for "the shim ran out of memory". */
        fprintf(stderr, "gpuproxy: out of host memory (%zu bytes)\n", cap);
        abort();
    }
    b->p = p;
    b->cap = cap;
}

void gp_buf_put_raw(gp_buf *b, const void *p, size_t n)
{
    gp_buf_reserve(b, n);
    if (n)
        memcpy(b->p + b->len, p, n);
    b->len += n;
}

static void put8(gp_buf *b, uint8_t v) { gp_buf_reserve(b, 1); b->p[b->len++] = v; }

static void putbe(gp_buf *b, uint64_t v, int bytes)
{
    gp_buf_reserve(b, (size_t)bytes);
    for (int i = bytes - 1; i >= 0; i--)
        b->p[b->len++] = (uint8_t)(v >> (8 * i));
}

void mp_nil(gp_buf *b) { put8(b, 0xc0); }
void mp_bool(gp_buf *b, int v) { put8(b, v ? 0xc3 : 0xc2); }

void mp_uint(gp_buf *b, uint64_t v)
{
    if (v < 128) put8(b, (uint8_t)v);
    else if (v <= 0xff) { put8(b, 0xcc); putbe(b, v, 1); }
    else if (v <= 0xffff) { put8(b, 0xcd); putbe(b, v, 2); }
    else if (v <= 0xffffffffu) { put8(b, 0xce); putbe(b, v, 4); }
    else { put8(b, 0xcf); putbe(b, v, 8); }
}

void mp_int(gp_buf *b, int64_t v)
{
    if (v >= 0) { mp_uint(b, (uint64_t)v); return; }
    if (v >= -32) put8(b, (uint8_t)(int8_t)v);
    else if (v >= INT8_MIN) { put8(b, 0xd0); putbe(b, (uint64_t)v, 1); }
    else if (v >= INT16_MIN) { put8(b, 0xd1); putbe(b, (uint64_t)v, 2); }
    else if (v >= INT32_MIN) { put8(b, 0xd2); putbe(b, (uint64_t)v, 4); }
    else { put8(b, 0xd3); putbe(b, (uint64_t)v, 8); }
}

void mp_f64(gp_buf *b, double v)
{
    uint64_t u;
    memcpy(&u, &v, 8);
    put8(b, 0xcb);
    putbe(b, u, 8);
}

void mp_strn(gp_buf *b, const char *s, size_t n)
{
    if (n < 32) put8(b, (uint8_t)(0xa0 | n));
    else if (n <= 0xff) { put8(b, 0xd9); putbe(b, n, 1); }
    else if (n <= 0xffff) { put8(b, 0xda); putbe(b, n, 2); }
    else { put8(b, 0xdb); putbe(b, n, 4); }
    gp_buf_put_raw(b, s, n);
}

void mp_str(gp_buf *b, const char *s)
{
    if (!s) { mp_nil(b); return; }
    mp_strn(b, s, strlen(s));
}

void mp_bin_header(gp_buf *b, size_t n)
{
    if (n <= 0xff) { put8(b, 0xc4); putbe(b, n, 1); }
    else if (n <= 0xffff) { put8(b, 0xc5); putbe(b, n, 2); }
    else { put8(b, 0xc6); putbe(b, n, 4); }
}

void mp_bin(gp_buf *b, const void *p, size_t n)
{
    mp_bin_header(b, n);
    gp_buf_put_raw(b, p, n);
}

void mp_ext(gp_buf *b, int8_t type, const void *p, size_t n)
{
    switch (n) {
    case 1: put8(b, 0xd4); break;
    case 2: put8(b, 0xd5); break;
    case 4: put8(b, 0xd6); break;
    case 8: put8(b, 0xd7); break;
    case 16: put8(b, 0xd8); break;
    default:
        if (n <= 0xff) { put8(b, 0xc7); putbe(b, n, 1); }
        else if (n <= 0xffff) { put8(b, 0xc8); putbe(b, n, 2); }
        else { put8(b, 0xc9); putbe(b, n, 4); }
    }
    put8(b, (uint8_t)type);
    gp_buf_put_raw(b, p, n);
}

void mp_array(gp_buf *b, uint32_t n)
{
    if (n < 16) put8(b, (uint8_t)(0x90 | n));
    else if (n <= 0xffff) { put8(b, 0xdc); putbe(b, n, 2); }
    else { put8(b, 0xdd); putbe(b, n, 4); }
}

void mp_map(gp_buf *b, uint32_t n)
{
    if (n < 16) put8(b, (uint8_t)(0x80 | n));
    else if (n <= 0xffff) { put8(b, 0xde); putbe(b, n, 2); }
    else { put8(b, 0xdf); putbe(b, n, 4); }
}

/* ---- reader ---- */

void gp_rd_init(gp_rd *r, const void *p, size_t n)
{
    r->p = p;
    r->end = (const uint8_t *)p + n;
    r->err = 0;
}

static int need(gp_rd *r, size_t n)
{
    if (r->err || (size_t)(r->end - r->p) < n) {
        r->err = 1;
        return -1;
    }
    return 0;
}

static uint64_t getbe(gp_rd *r, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v = (v << 8) | r->p[i];
    r->p += bytes;
    return v;
}

static int payload(gp_rd *r, mp_obj *o, enum mp_type t, int lenbytes)
{
    if (need(r, (size_t)lenbytes)) return -1;
    size_t n = (size_t)getbe(r, lenbytes);
    if (need(r, n)) return -1;
    o->type = t;
    o->data = r->p;
    o->len = n;
    r->p += n;
    return 0;
}

static int ext_payload(gp_rd *r, mp_obj *o, size_t n)
{
    if (need(r, 1 + n)) return -1;
    o->type = MP_EXT;
    o->ext_type = (int8_t)r->p[0];
    o->data = r->p + 1;
    o->len = n;
    r->p += 1 + n;
    return 0;
}

int mp_next(gp_rd *r, mp_obj *o)
{
    o->type = MP_BAD;
    o->data = NULL;
    o->len = 0;
    if (need(r, 1)) return -1;
    uint8_t c = *r->p++;
    if (c <= 0x7f) { o->type = MP_UINT; o->v.u = c; return 0; }
    if (c >= 0xe0) { o->type = MP_INT; o->v.i = (int8_t)c; return 0; }
    if ((c & 0xf0) == 0x80) { o->type = MP_MAP; o->v.n = c & 0x0f; return 0; }
    if ((c & 0xf0) == 0x90) { o->type = MP_ARRAY; o->v.n = c & 0x0f; return 0; }
    if ((c & 0xe0) == 0xa0) {
        size_t n = c & 0x1f;
        if (need(r, n)) return -1;
        o->type = MP_STR; o->data = r->p; o->len = n; r->p += n;
        return 0;
    }
    switch (c) {
    case 0xc0: o->type = MP_NIL; return 0;
    case 0xc2: o->type = MP_BOOL; o->v.b = 0; return 0;
    case 0xc3: o->type = MP_BOOL; o->v.b = 1; return 0;
    case 0xc4: return payload(r, o, MP_BIN, 1);
    case 0xc5: return payload(r, o, MP_BIN, 2);
    case 0xc6: return payload(r, o, MP_BIN, 4);
    case 0xc7: if (need(r, 1)) return -1; return ext_payload(r, o, (size_t)getbe(r, 1));
    case 0xc8: if (need(r, 2)) return -1; return ext_payload(r, o, (size_t)getbe(r, 2));
    case 0xc9: if (need(r, 4)) return -1; return ext_payload(r, o, (size_t)getbe(r, 4));
    case 0xca: {
        if (need(r, 4)) return -1;
        uint32_t u = (uint32_t)getbe(r, 4);
        float f;
        memcpy(&f, &u, 4);
        o->type = MP_F64; o->v.f = f;
        return 0;
    }
    case 0xcb: {
        if (need(r, 8)) return -1;
        uint64_t u = getbe(r, 8);
        memcpy(&o->v.f, &u, 8);
        o->type = MP_F64;
        return 0;
    }
    case 0xcc: if (need(r, 1)) return -1; o->type = MP_UINT; o->v.u = getbe(r, 1); return 0;
    case 0xcd: if (need(r, 2)) return -1; o->type = MP_UINT; o->v.u = getbe(r, 2); return 0;
    case 0xce: if (need(r, 4)) return -1; o->type = MP_UINT; o->v.u = getbe(r, 4); return 0;
    case 0xcf: if (need(r, 8)) return -1; o->type = MP_UINT; o->v.u = getbe(r, 8); return 0;
    case 0xd0: if (need(r, 1)) return -1; o->type = MP_INT; o->v.i = (int8_t)getbe(r, 1); return 0;
    case 0xd1: if (need(r, 2)) return -1; o->type = MP_INT; o->v.i = (int16_t)getbe(r, 2); return 0;
    case 0xd2: if (need(r, 4)) return -1; o->type = MP_INT; o->v.i = (int32_t)getbe(r, 4); return 0;
    case 0xd3: if (need(r, 8)) return -1; o->type = MP_INT; o->v.i = (int64_t)getbe(r, 8); return 0;
    case 0xd4: return ext_payload(r, o, 1);
    case 0xd5: return ext_payload(r, o, 2);
    case 0xd6: return ext_payload(r, o, 4);
    case 0xd7: return ext_payload(r, o, 8);
    case 0xd8: return ext_payload(r, o, 16);
    case 0xd9: return payload(r, o, MP_STR, 1);
    case 0xda: return payload(r, o, MP_STR, 2);
    case 0xdb: return payload(r, o, MP_STR, 4);
    case 0xdc: if (need(r, 2)) return -1; o->type = MP_ARRAY; o->v.n = (uint32_t)getbe(r, 2); return 0;
    case 0xdd: if (need(r, 4)) return -1; o->type = MP_ARRAY; o->v.n = (uint32_t)getbe(r, 4); return 0;
    case 0xde: if (need(r, 2)) return -1; o->type = MP_MAP; o->v.n = (uint32_t)getbe(r, 2); return 0;
    case 0xdf: if (need(r, 4)) return -1; o->type = MP_MAP; o->v.n = (uint32_t)getbe(r, 4); return 0;
    default:
        r->err = 1;
        return -1;
    }
}

int mp_skip(gp_rd *r)
{
    mp_obj o;
    if (mp_next(r, &o)) return -1;
    if (o.type == MP_ARRAY) {
        for (uint32_t i = 0; i < o.v.n; i++)
            if (mp_skip(r)) return -1;
    } else if (o.type == MP_MAP) {
        for (uint32_t i = 0; i < 2 * o.v.n; i++)
            if (mp_skip(r)) return -1;
    }
    return 0;
}

int64_t mp_get_int(gp_rd *r)
{
    mp_obj o;
    if (mp_next(r, &o)) return 0;
    if (o.type == MP_INT) return o.v.i;
    if (o.type == MP_UINT) return (int64_t)o.v.u;
    if (o.type == MP_BOOL) return o.v.b;
    if (o.type == MP_NIL) return 0;
    r->err = 1;
    return 0;
}

uint64_t mp_get_uint(gp_rd *r) { return (uint64_t)mp_get_int(r); }

double mp_get_f64(gp_rd *r)
{
    mp_obj o;
    if (mp_next(r, &o)) return 0;
    if (o.type == MP_F64) return o.v.f;
    if (o.type == MP_INT) return (double)o.v.i;
    if (o.type == MP_UINT) return (double)o.v.u;
    r->err = 1;
    return 0;
}

uint32_t mp_get_array(gp_rd *r)
{
    mp_obj o;
    if (mp_next(r, &o)) return 0;
    if (o.type == MP_ARRAY) return o.v.n;
    if (o.type == MP_NIL) return 0;
    r->err = 1;
    return 0;
}

uint32_t mp_get_map(gp_rd *r)
{
    mp_obj o;
    if (mp_next(r, &o)) return 0;
    if (o.type == MP_MAP) return o.v.n;
    r->err = 1;
    return 0;
}

const uint8_t *mp_get_bytes(gp_rd *r, size_t *n)
{
    mp_obj o;
    *n = 0;
    if (mp_next(r, &o)) return NULL;
    if (o.type == MP_BIN || o.type == MP_STR) { *n = o.len; return o.data; }
    if (o.type == MP_NIL) return NULL;
    r->err = 1;
    return NULL;
}
