// The gp64 chunk hash on the GPU (definition: docs/image-format.md; CPU
// versions: proxyd/checkpoint/hashing.py and gp64.c). proxyd carries this as
// PTX, compiled at install time, and launches it over checkpoint snapshots so
// that pre-dump/dump chains can compare chunks without copying them out.
//
// One block per chunk: each thread mixes a strided subset of the chunk's
// 64-bit words, the block sums them (addition mod 2^64 is order-free, so the
// result does not depend on the launch shape), thread 0 finishes the hash.

__device__ __forceinline__ unsigned long long gp_mix(unsigned long long x)
{
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x;
}

extern "C" __global__ void gp64_chunks(const unsigned char *data, unsigned long long total, unsigned long long chunk,
                                       unsigned long long *out)
{
    __shared__ unsigned long long part[32];
    unsigned long long start = chunk * blockIdx.x;
    if (start >= total)
        return;
    unsigned long long n = total - start < chunk ? total - start : chunk;
    const unsigned char *p = data + start;
    unsigned long long words = (n + 7) / 8;
    unsigned long long full = n / 8;
    unsigned long long acc = 0;
    const unsigned long long *w = (const unsigned long long *)p;   // chunks start 8-byte aligned
    for (unsigned long long i = threadIdx.x; i < words; i += blockDim.x) {
        unsigned long long v;
        if (i < full) {
            v = w[i];
        } else {   // the last, partial word: missing bytes count as zero
            v = 0;
            for (unsigned long long b = 0; b < n - 8 * i; b++)
                v |= (unsigned long long)p[8 * i + b] << (8 * b);
        }
        acc += gp_mix(v ^ (i * 0x9E3779B97F4A7C15ull));
    }
    for (int o = 16; o > 0; o >>= 1)
        acc += __shfl_down_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x < 32) {
        unsigned long long v = threadIdx.x < (blockDim.x + 31) / 32 ? part[threadIdx.x] : 0;
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_down_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0)
            out[blockIdx.x] = gp_mix(v ^ n);
    }
}
