/* gp64: the chunk hash of gpuproxy checkpoint images, CPU version in C.
 *
 * Definition (docs/image-format.md, "The gp64 hash"): pad the n input bytes
 * with zeros to a multiple of 8, read little-endian 64-bit words w[0..m-1],
 * and with all arithmetic modulo 2^64
 *
 *     h = mix( (sum over i of mix(w[i] ^ (i * 0x9E3779B97F4A7C15))) ^ n )
 *
 * where mix is the splitmix64 finaliser. The sum makes the hash independent
 * of the order in which words are visited, so a GPU can compute it with any
 * number of threads (proxyd/native/gp64.cu); the Python versions are in
 * proxyd/checkpoint/hashing.py, which loads this code through cffi (ABI
 * mode) when it is compiled into proxyd's helper library.
 *
 * C99 (plus one optional GCC attribute), no allocation, no global state: safe to call from any thread.
 * Only gp64 and gp64_many are exported; everything else is static.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define GP64_STEP 0x9E3779B97F4A7C15ULL

/* With GCC on x86-64 Linux the hot loop is compiled three times (AVX-512,
 * AVX2, baseline) and the loader picks the best one for the CPU (an ifunc):
 * the baseline build cannot vectorise 64-bit multiplies, the others run
 * about 4x faster. Define GP64_NO_CLONES to get one plain build. */
#if !defined(GP64_NO_CLONES) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11 && \
    defined(__x86_64__) && defined(__linux__)
#define GP64_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define GP64_CLONES
#endif

static inline uint64_t gp64_mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    x ^= x >> 31;
    return x;
}

/* One little-endian 64-bit word from any address (no alignment needed). */
static inline uint64_t gp64_load(const unsigned char *p)
{
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
#else
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
#endif
}

GP64_CLONES uint64_t gp64(const void *data, size_t n)
{
    const unsigned char *p = (const unsigned char *)data;
    size_t full = n / 8;
    size_t i = 0;
    /* four independent sums keep the multipliers busy; addition mod 2^64
     * is associative, so splitting the sum does not change the result */
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    uint64_t k = 0; /* i * GP64_STEP, kept incrementally */
    for (; i + 4 <= full; i += 4) {
        const unsigned char *q = p + 8 * i;
        a0 += gp64_mix(gp64_load(q) ^ k);
        a1 += gp64_mix(gp64_load(q + 8) ^ (k + GP64_STEP));
        a2 += gp64_mix(gp64_load(q + 16) ^ (k + 2 * GP64_STEP));
        a3 += gp64_mix(gp64_load(q + 24) ^ (k + 3 * GP64_STEP));
        k += 4 * GP64_STEP;
    }
    for (; i < full; i++) {
        a0 += gp64_mix(gp64_load(p + 8 * i) ^ k);
        k += GP64_STEP;
    }
    if (n % 8) {
        unsigned char tail[8] = {0};
        memcpy(tail, p + 8 * full, n % 8);
        a0 += gp64_mix(gp64_load(tail) ^ k);
    }
    return gp64_mix((a0 + a1 + a2 + a3) ^ (uint64_t)n);
}

/* Hashes consecutive chunk-byte pieces of p[0..n): out[j] = gp64 of bytes
 * [j*chunk, min((j+1)*chunk, n)). out needs room for ceil(n / chunk) values;
 * nothing is written when n or chunk is 0. */
void gp64_many(const void *data, size_t n, size_t chunk, uint64_t *out)
{
    const unsigned char *p = (const unsigned char *)data;
    size_t off, j = 0;
    if (chunk == 0)
        return;
    for (off = 0; off < n; off += chunk, j++)
        out[j] = gp64(p + off, n - off < chunk ? n - off : chunk);
}
