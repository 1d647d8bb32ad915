/* Test driver for the shim's msgpack codec (interceptor/gp_msgpack.c), used
 * by tests/test_msgpack_c.py, which compares it with Python's msgpack.
 *
 *   msgpack_roundtrip encode      stdin: one command per line (below);
 *                                 stdout: the bytes the gp_msgpack writers produce
 *   msgpack_roundtrip transcode   stdin: msgpack objects; each is read with
 *                                 mp_next (recursively) and written again with
 *                                 the writers; stdout: the result. Along the way
 *                                 mp_skip and the typed getters must agree with
 *                                 mp_next. Exit 1 (message on stderr) on any
 *                                 reader error.
 *   msgpack_roundtrip truncate    stdin: one msgpack object of n bytes; every
 *                                 prefix of it (in a buffer of exactly that
 *                                 size) must make mp_skip fail with the sticky
 *                                 error set (objects over 4 KiB: a sample of
 *                                 the prefixes); the whole must be skipped
 *                                 exactly.
 *                                 stdout: "ok <n>".
 *   msgpack_roundtrip get KIND    stdin: one msgpack object; applies one typed
 *                                 getter (int uint f64 array map bytes) and
 *                                 prints "<value> err=<0|1> rest=<bytes left>".
 *
 * Encode commands (payloads in hex, "-" for none):
 *   nil | true | false
 *   u DEC       mp_uint            i DEC     mp_int
 *   f HEX16     mp_f64 of these IEEE-754 bits
 *   s HEX       mp_strn            S HEX     mp_str (NUL-terminated copy)
 *   snull       mp_str(NULL)       b HEX     mp_bin
 *   bnull       mp_bin(NULL, 0)    bh HEX    mp_bin_header + gp_buf_put_raw
 *   e TYPE HEX  mp_ext             a N       mp_array      m N   mp_map
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gp_msgpack.h"

static void die(const char *what, size_t off)
{
    fprintf(stderr, "msgpack_roundtrip: %s (at offset %zu)\n", what, off);
    exit(1);
}

static uint8_t *read_all(FILE *f, size_t *n)
{
    size_t cap = 1 << 16, len = 0;
    uint8_t *p = malloc(cap);
    size_t got;
    while ((got = fread(p + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            cap *= 2;
            p = realloc(p, cap);
        }
    }
    *n = len;
    return p;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes a hex argument ("-": empty) into a fresh buffer of exactly n bytes
 * (1 byte for n == 0, so that the pointer is never NULL). */
static uint8_t *unhex(const char *s, size_t *n)
{
    if (!s) die("missing payload", 0);
    if (!strcmp(s, "-")) {
        *n = 0;
        return malloc(1);
    }
    size_t len = strlen(s);
    if (len % 2) die("odd hex length", 0);
    uint8_t *p = malloc(len / 2 ? len / 2 : 1);
    for (size_t i = 0; i < len / 2; i++) {
        int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
        if (hi < 0 || lo < 0) die("bad hex digit", i);
        p[i] = (uint8_t)(hi << 4 | lo);
    }
    *n = len / 2;
    return p;
}

static int encode(void)
{
    gp_buf b;
    gp_buf_init(&b);
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, stdin)) > 0) {
        if (line[got - 1] == '\n')
            line[got - 1] = 0;
        char *cmd = strtok(line, " ");
        char *a1 = strtok(NULL, " ");
        char *a2 = strtok(NULL, " ");
        if (!cmd) continue;
        size_t n;
        uint8_t *p;
        if (!strcmp(cmd, "nil")) mp_nil(&b);
        else if (!strcmp(cmd, "true")) mp_bool(&b, 1);
        else if (!strcmp(cmd, "false")) mp_bool(&b, 0);
        else if (!strcmp(cmd, "u")) mp_uint(&b, strtoull(a1, NULL, 10));
        else if (!strcmp(cmd, "i")) mp_int(&b, strtoll(a1, NULL, 10));
        else if (!strcmp(cmd, "f")) {
            uint64_t bits = strtoull(a1, NULL, 16);
            double d;
            memcpy(&d, &bits, 8);
            mp_f64(&b, d);
        } else if (!strcmp(cmd, "s")) {
            p = unhex(a1, &n);
            mp_strn(&b, (const char *)p, n);
            free(p);
        } else if (!strcmp(cmd, "S")) {
            p = unhex(a1, &n);
            char *z = malloc(n + 1);
            memcpy(z, p, n);
            z[n] = 0;
            mp_str(&b, z);
            free(z);
            free(p);
        } else if (!strcmp(cmd, "snull")) mp_str(&b, NULL);
        else if (!strcmp(cmd, "b")) {
            p = unhex(a1, &n);
            mp_bin(&b, p, n);
            free(p);
        } else if (!strcmp(cmd, "bnull")) mp_bin(&b, NULL, 0);
        else if (!strcmp(cmd, "bh")) {
            p = unhex(a1, &n);
            mp_bin_header(&b, n);
            gp_buf_put_raw(&b, p, n);
            free(p);
        } else if (!strcmp(cmd, "e")) {
            p = unhex(a2, &n);
            mp_ext(&b, (int8_t)strtol(a1, NULL, 10), p, n);
            free(p);
        } else if (!strcmp(cmd, "a")) mp_array(&b, (uint32_t)strtoul(a1, NULL, 10));
        else if (!strcmp(cmd, "m")) mp_map(&b, (uint32_t)strtoul(a1, NULL, 10));
        else die("unknown command", 0);
    }
    free(line);
    fwrite(b.p, 1, b.len, stdout);
    gp_buf_free(&b);
    return 0;
}

/* Re-encodes one object read from r into out; checks the typed getters and
 * mp_skip against mp_next on the way. */
static void transcode_one(gp_rd *r, gp_buf *out, const uint8_t *base, int depth)
{
    if (depth > 64) die("nesting too deep", (size_t)(r->p - base));
    size_t at = (size_t)(r->p - base);
    gp_rd skip = *r, typed = *r;
    if (mp_skip(&skip) != 0 || skip.err) die("mp_skip failed", at);
    mp_obj o;
    if (mp_next(r, &o) != 0 || r->err) die("mp_next failed", at);
    switch (o.type) {
    case MP_NIL:
        if (mp_get_int(&typed) != 0) die("mp_get_int of nil", at);
        mp_nil(out);
        break;
    case MP_BOOL:
        if (mp_get_int(&typed) != o.v.b) die("mp_get_int of a bool", at);
        mp_bool(out, o.v.b);
        break;
    case MP_UINT:
        if (mp_get_uint(&typed) != o.v.u) die("mp_get_uint disagrees with mp_next", at);
        mp_uint(out, o.v.u);
        break;
    case MP_INT:
        if (mp_get_int(&typed) != o.v.i) die("mp_get_int disagrees with mp_next", at);
        mp_int(out, o.v.i);
        break;
    case MP_F64: {
        double d = mp_get_f64(&typed);
        if (memcmp(&d, &o.v.f, 8) != 0) die("mp_get_f64 disagrees with mp_next", at);
        mp_f64(out, o.v.f);
        break;
    }
    case MP_STR:
    case MP_BIN: {
        size_t n;
        const uint8_t *p = mp_get_bytes(&typed, &n);
        if (p != o.data || n != o.len) die("mp_get_bytes disagrees with mp_next", at);
        if (o.type == MP_STR) mp_strn(out, (const char *)o.data, o.len);
        else mp_bin(out, o.data, o.len);
        break;
    }
    case MP_EXT:
        mp_skip(&typed);
        mp_ext(out, o.ext_type, o.data, o.len);
        break;
    case MP_ARRAY:
        if (mp_get_array(&typed) != o.v.n) die("mp_get_array disagrees with mp_next", at);
        mp_array(out, o.v.n);
        for (uint32_t i = 0; i < o.v.n; i++)
            transcode_one(r, out, base, depth + 1);
        break;
    case MP_MAP:
        if (mp_get_map(&typed) != o.v.n) die("mp_get_map disagrees with mp_next", at);
        mp_map(out, o.v.n);
        for (uint32_t i = 0; i < 2 * o.v.n; i++)
            transcode_one(r, out, base, depth + 1);
        break;
    default: die("mp_next returned a bad type", at);
    }
    if (typed.err) die("typed getter set the error flag", at);
    if (typed.p != skip.p && o.type != MP_ARRAY && o.type != MP_MAP)
        die("typed getter consumed a different length than mp_skip", at);
    if (r->p != skip.p) die("mp_skip and mp_next consumed different lengths", at);
}

static int transcode(void)
{
    size_t n;
    uint8_t *in = read_all(stdin, &n);
    /* an exactly sized copy: reading past the end is caught by ASan */
    uint8_t *buf = malloc(n ? n : 1);
    memcpy(buf, in, n);
    free(in);
    gp_rd r;
    gp_rd_init(&r, buf, n);
    gp_buf out;
    gp_buf_init(&out);
    while (r.p < r.end)
        transcode_one(&r, &out, buf, 0);
    fwrite(out.p, 1, out.len, stdout);
    gp_buf_free(&out);
    free(buf);
    return 0;
}

static int truncate_test(void)
{
    size_t n;
    uint8_t *in = read_all(stdin, &n);
    for (size_t k = 0; k < n; k++) {
        /* a long object: every prefix of its first 4 KiB and last 64 bytes, a sample between */
        if (n > 4096 && k >= 4096 && k + 64 < n && k % 997 != 0)
            continue;
        uint8_t *p = malloc(k ? k : 1);
        memcpy(p, in, k);
        gp_rd r;
        gp_rd_init(&r, p, k);
        int rc = mp_skip(&r);
        if (rc == 0 || !r.err) {
            fprintf(stderr, "msgpack_roundtrip: prefix of %zu of %zu bytes was accepted\n", k, n);
            return 1;
        }
        /* the error is sticky: a further read fails too */
        mp_obj o;
        if (mp_next(&r, &o) == 0) {
            fprintf(stderr, "msgpack_roundtrip: read after an error succeeded (prefix %zu)\n", k);
            return 1;
        }
        free(p);
    }
    uint8_t *p = malloc(n ? n : 1);
    memcpy(p, in, n);
    gp_rd r;
    gp_rd_init(&r, p, n);
    if (mp_skip(&r) != 0 || r.err || r.p != r.end) {
        fprintf(stderr, "msgpack_roundtrip: the whole object (%zu bytes) was not skipped exactly\n", n);
        return 1;
    }
    free(p);
    free(in);
    printf("ok %zu\n", n);
    return 0;
}

static int get(const char *kind)
{
    size_t n;
    uint8_t *in = read_all(stdin, &n);
    uint8_t *buf = malloc(n ? n : 1);
    memcpy(buf, in, n);
    free(in);
    gp_rd r;
    gp_rd_init(&r, buf, n);
    if (!strcmp(kind, "int")) printf("%" PRId64, mp_get_int(&r));
    else if (!strcmp(kind, "uint")) printf("%" PRIu64, mp_get_uint(&r));
    else if (!strcmp(kind, "f64")) printf("%.17g", mp_get_f64(&r));
    else if (!strcmp(kind, "array")) printf("%" PRIu32, mp_get_array(&r));
    else if (!strcmp(kind, "map")) printf("%" PRIu32, mp_get_map(&r));
    else if (!strcmp(kind, "bytes")) {
        size_t len;
        const uint8_t *p = mp_get_bytes(&r, &len);
        if (!p) printf("NULL");
        else if (len == 0) printf("-");
        for (size_t i = 0; p && i < len; i++) printf("%02x", p[i]);
    } else {
        die("unknown getter", 0);
    }
    printf(" err=%d rest=%zu\n", r.err, (size_t)(r.end - r.p));
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "encode")) return encode();
    if (argc >= 2 && !strcmp(argv[1], "transcode")) return transcode();
    if (argc >= 2 && !strcmp(argv[1], "truncate")) return truncate_test();
    if (argc >= 3 && !strcmp(argv[1], "get")) return get(argv[2]);
    fprintf(stderr, "usage: msgpack_roundtrip encode|transcode|truncate|get KIND\n");
    return 2;
}
