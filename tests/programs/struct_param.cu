// struct_param: kernel parameters passed by value. Structs with padding, a
// struct holding a device pointer, a 1 KiB struct, doubles, chars, shorts,
// 64-bit integers and an int4 (16-byte aligned). Every kernel writes what it
// saw back to device memory (bit patterns for floating point) and the host
// compares them bit for bit with what it passed.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#define NAME "struct_param"
#define CHECK(call)                                                             \
    do {                                                                        \
        cudaError_t err_ = (call);                                              \
        if (err_ != cudaSuccess) {                                              \
            printf("FAIL " NAME ": %s -> %s (%s) at %s:%d\n", #call,            \
                   cudaGetErrorName(err_), cudaGetErrorString(err_),            \
                   __FILE__, __LINE__);                                         \
            fflush(stdout);                                                     \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

// layout: c@0, (7 bytes padding), d@8, i@16, f@20..31; size 32, alignment 8
struct Padded {
    char c;
    double d;
    int i;
    float f[3];
};

// layout: dst@0, n@8, vals@12..31; size 32, alignment 8
struct Job {
    int *dst;
    int n;
    int vals[5];
};

// 1 KiB by value
struct Big {
    int v[256];
};

// parameter layout: p@0 (32), x@32, ch@40, out@48; 56 bytes of parameters
__global__ void check_struct(Padded p, double x, char ch, long long *out)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        out[0] = (long long)p.c;
        out[1] = __double_as_longlong(p.d);
        out[2] = (long long)p.i;
        out[3] = (long long)__float_as_int(p.f[0]);
        out[4] = (long long)__float_as_int(p.f[1]);
        out[5] = (long long)__float_as_int(p.f[2]);
        out[6] = __double_as_longlong(x);
        out[7] = (long long)ch;
    }
}

// parameter layout: a@0, b@8, c@16, s@18, q@24, g@32, h@36, v@48 (int4), out@64
__global__ void mixed_scalars(char a, double b, char c, short s, long long q, float g,
                              unsigned char h, int4 v, long long *out)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        out[0] = (long long)a;
        out[1] = __double_as_longlong(b);
        out[2] = (long long)c;
        out[3] = (long long)s;
        out[4] = q;
        out[5] = (long long)__float_as_int(g);
        out[6] = (long long)h;
        out[7] = (long long)v.x;
        out[8] = (long long)v.y;
        out[9] = (long long)v.z;
        out[10] = (long long)v.w;
    }
}

// j.dst[i] = j.vals[i % 5] * (i + 1) for i < j.n (one block)
__global__ void apply_job(Job j)
{
    int i = threadIdx.x;
    if (i < j.n)
        j.dst[i] = j.vals[i % 5] * (i + 1);
}

// out[t] = b.v[t] * 2 + t for every thread t of the grid with t < 256
__global__ void sum_big(Big b, int *out)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < 256)
        out[t] = b.v[t] * 2 + t;
}

static long long dbits(double d) { long long r; memcpy(&r, &d, 8); return r; }
static long long fbits(float f) { int r; memcpy(&r, &f, 4); return (long long)r; }

static int compare(const char *what, const long long *got, const long long *want, int n)
{
    for (int k = 0; k < n; ++k) {
        if (got[k] != want[k]) {
            printf("FAIL " NAME ": %s field %d: got %llx want %llx\n", what, k,
                   (unsigned long long)got[k], (unsigned long long)want[k]);
            return 1;
        }
    }
    return 0;
}

int main(void)
{
    long long *d_out;
    CHECK(cudaMalloc(&d_out, 16 * sizeof(long long)));
    long long h_out[16];

    // ---- struct with padding + double + char
    Padded p;
    memset(&p, 0x5A, sizeof p);          // padding bytes are garbage on purpose
    p.c = -5;
    p.d = -1.0 / 3.0;
    p.i = 123456789;
    p.f[0] = 1.5f;
    p.f[1] = -2.25f;
    p.f[2] = 1.0f / 3.0f;
    double x = 6.02214076e23;
    char ch = 'z';
    CHECK(cudaMemset(d_out, 0, 16 * sizeof(long long)));
    check_struct<<<1, 32>>>(p, x, ch, d_out);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(h_out, d_out, 8 * sizeof(long long), cudaMemcpyDeviceToHost));
    long long want1[8] = {p.c, dbits(p.d), p.i, fbits(p.f[0]), fbits(p.f[1]), fbits(p.f[2]), dbits(x), ch};
    if (compare("check_struct", h_out, want1, 8)) return 1;
    printf("sizeof(Padded)=%d c=%d d.bits=%016llx i=%d f.bits=%08x,%08x,%08x\n", (int)sizeof(Padded),
           (int)h_out[0], (unsigned long long)h_out[1], (int)h_out[2],
           (unsigned)h_out[3], (unsigned)h_out[4], (unsigned)h_out[5]);
    printf("x.bits=%016llx ch=%d\n", (unsigned long long)h_out[6], (int)h_out[7]);

    // ---- mixed scalar parameters with alignment gaps
    int4 v = make_int4(-1, 2147483647, -2147483647 - 1, 42);
    CHECK(cudaMemset(d_out, 0, 16 * sizeof(long long)));
    mixed_scalars<<<1, 1>>>((char)-128, 0.1, (char)127, (short)-31000, -9000000000000000000LL, 0.75f,
                            (unsigned char)200, v, d_out);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(h_out, d_out, 11 * sizeof(long long), cudaMemcpyDeviceToHost));
    long long want2[11] = {-128, dbits(0.1), 127, -31000, -9000000000000000000LL, fbits(0.75f), 200,
                           -1, 2147483647, -2147483647LL - 1, 42};
    if (compare("mixed_scalars", h_out, want2, 11)) return 1;
    printf("mixed: a=%lld b.bits=%016llx c=%lld s=%lld q=%lld g.bits=%08llx h=%lld v=%lld,%lld,%lld,%lld\n",
           h_out[0], (unsigned long long)h_out[1], h_out[2], h_out[3], h_out[4],
           (unsigned long long)h_out[5], h_out[6], h_out[7], h_out[8], h_out[9], h_out[10]);

    // ---- struct holding a device pointer
    int *d_dst;
    const int jobN = 50;
    CHECK(cudaMalloc(&d_dst, 64 * sizeof(int)));
    CHECK(cudaMemset(d_dst, 0xFF, 64 * sizeof(int)));
    Job job;
    memset(&job, 0, sizeof job);
    job.dst = d_dst;
    job.n = jobN;
    for (int k = 0; k < 5; ++k) job.vals[k] = (k + 1) * 11 - 30;
    apply_job<<<1, 64>>>(job);
    CHECK(cudaGetLastError());
    int h_dst[64];
    CHECK(cudaMemcpy(h_dst, d_dst, sizeof h_dst, cudaMemcpyDeviceToHost));
    long long jsum = 0;
    for (int i = 0; i < 64; ++i) {
        int expect = (i < jobN) ? job.vals[i % 5] * (i + 1) : -1;
        if (h_dst[i] != expect) {
            printf("FAIL " NAME ": apply_job element %d: got %d want %d\n", i, h_dst[i], expect);
            return 1;
        }
        jsum += h_dst[i];
    }
    printf("apply_job sizeof(Job)=%d checksum %lld\n", (int)sizeof(Job), jsum);

    // ---- 1 KiB struct
    Big big;
    for (int k = 0; k < 256; ++k) big.v[k] = k * k - 1000;
    int *d_big;
    CHECK(cudaMalloc(&d_big, 256 * sizeof(int)));
    CHECK(cudaMemset(d_big, 0, 256 * sizeof(int)));
    sum_big<<<3, 100>>>(big, d_big);
    CHECK(cudaGetLastError());
    int h_big[256];
    CHECK(cudaMemcpy(h_big, d_big, sizeof h_big, cudaMemcpyDeviceToHost));
    long long bsum = 0;
    for (int t = 0; t < 256; ++t) {
        if (h_big[t] != big.v[t] * 2 + t) {
            printf("FAIL " NAME ": sum_big element %d: got %d want %d\n", t, h_big[t], big.v[t] * 2 + t);
            return 1;
        }
        bsum += h_big[t];
    }
    printf("sum_big sizeof(Big)=%d checksum %lld\n", (int)sizeof(Big), bsum);

    CHECK(cudaFree(d_out));
    CHECK(cudaFree(d_dst));
    CHECK(cudaFree(d_big));
    printf("PASS " NAME "\n");
    return 0;
}
