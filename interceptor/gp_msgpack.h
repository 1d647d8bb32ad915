/* Minimal msgpack encoder/decoder used by the shim for its wire messages.
 *
 * Only the subset the protocol needs (docs/protocol.md): nil, bool, integers,
 * float64, str, bin, ext (frame references), arrays and maps. Encoding always
 * picks the shortest form, as the msgpack spec requires of conforming writers,
 * so Python's msgpack reads everything we write.
 *
 * Locking: a gp_buf / gp_rd is owned by one thread at a time; callers lock. */
#ifndef GP_MSGPACK_H
#define GP_MSGPACK_H

#include <stddef.h>
#include <stdint.h>

typedef struct gp_buf {
    uint8_t *p;
    size_t len;
    size_t cap;
} gp_buf;

void gp_buf_init(gp_buf *b);
void gp_buf_free(gp_buf *b);
void gp_buf_reset(gp_buf *b);
void gp_buf_reserve(gp_buf *b, size_t extra);
void gp_buf_put_raw(gp_buf *b, const void *p, size_t n);

void mp_nil(gp_buf *b);
void mp_bool(gp_buf *b, int v);
void mp_int(gp_buf *b, int64_t v);
void mp_uint(gp_buf *b, uint64_t v);
void mp_f64(gp_buf *b, double v);
void mp_str(gp_buf *b, const char *s);            /* NULL -> nil */
void mp_strn(gp_buf *b, const char *s, size_t n);
void mp_bin(gp_buf *b, const void *p, size_t n);  /* NULL with n == 0 -> empty bin */
void mp_bin_header(gp_buf *b, size_t n);           /* caller appends n raw bytes */
void mp_ext(gp_buf *b, int8_t type, const void *p, size_t n);
void mp_array(gp_buf *b, uint32_t n);
void mp_map(gp_buf *b, uint32_t n);

enum mp_type {
    MP_NIL, MP_BOOL, MP_INT, MP_UINT, MP_F64, MP_STR, MP_BIN, MP_EXT, MP_ARRAY, MP_MAP, MP_BAD
};

typedef struct mp_obj {
    enum mp_type type;
    union {
        int64_t i;
        uint64_t u;
        double f;
        int b;
        uint32_t n;           /* array / map element count */
    } v;
    const uint8_t *data;      /* str / bin / ext payload */
    size_t len;
    int8_t ext_type;
} mp_obj;

typedef struct gp_rd {
    const uint8_t *p;
    const uint8_t *end;
    int err;                  /* sticky: set on malformed or truncated input */
} gp_rd;

void gp_rd_init(gp_rd *r, const void *p, size_t n);
/* Reads the next object header (containers: only the count). Returns 0 or -1. */
int mp_next(gp_rd *r, mp_obj *o);
/* Skips one whole object including container contents. */
int mp_skip(gp_rd *r);
/* Typed helpers; on type mismatch they set r->err and return 0/NULL. */
int64_t mp_get_int(gp_rd *r);
uint64_t mp_get_uint(gp_rd *r);
double mp_get_f64(gp_rd *r);
uint32_t mp_get_array(gp_rd *r);
uint32_t mp_get_map(gp_rd *r);
/* str/bin: returns a pointer into the buffer, length in *n; nil gives NULL. */
const uint8_t *mp_get_bytes(gp_rd *r, size_t *n);

#endif
