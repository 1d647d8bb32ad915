/* A stand-in for libcuda.so.1 with the driver functions proxyd's C serving
 * loop calls (proxyd/native/gpxd.c, gpx_serve), over host memory, for
 * tests/test_native_serve.py: no GPU needed. Launches are recorded; streams
 * and events listed in busy[] / bad[] answer CUDA_ERROR_NOT_READY (600) /
 * CUDA_ERROR_ILLEGAL_ADDRESS (700); "device memory" is mem[], at dev_base;
 * event records are listed. */
#include <stdint.h>
#include <string.h>

typedef int CUresult;
struct launch_rec { uintptr_t f, s, ctx; unsigned d[7]; size_t n; unsigned char p[64]; };
struct launch_rec launches[64];
int nlaunches;
uintptr_t cur, busy[4], bad[4];
uint64_t dev_base;
unsigned char mem[1 << 16];
int ctx_syncs, dtohs;

static int in(uintptr_t *set, void *h)
{
    for (int i = 0; i < 4; i++)
        if (set[i] && set[i] == (uintptr_t)h)
            return 1;
    return 0;
}

CUresult cuCtxSetCurrent(void *c) { cur = (uintptr_t)c; return 0; }
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned sh, void *s, void **kp, void **extra)
{
    (void)kp;
    if (in(bad, f))
        return 719;
    struct launch_rec *r = &launches[nlaunches++ & 63];
    r->f = (uintptr_t)f; r->s = (uintptr_t)s; r->ctx = cur;
    unsigned d[7] = {gx, gy, gz, bx, by, bz, sh};
    memcpy(r->d, d, sizeof d);
    r->n = 0;
    if (extra) { r->n = *(size_t *)extra[3]; memcpy(r->p, extra[1], r->n < 64 ? r->n : 64); }
    return 0;
}
CUresult cuStreamQuery(void *s) { return in(bad, s) ? 700 : in(busy, s) ? 600 : 0; }
CUresult cuEventQuery(void *e) { return in(bad, e) ? 700 : in(busy, e) ? 600 : 0; }
CUresult cuStreamSynchronize(void *s) { return in(bad, s) ? 700 : 0; }
CUresult cuEventSynchronize(void *e) { return in(bad, e) ? 700 : 0; }
CUresult cuCtxSynchronize(void) { ctx_syncs++; return in(bad, (void *)cur) ? 700 : 0; }
CUresult cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t n)
{
    dtohs++;
    if (src < dev_base || src + n > dev_base + sizeof mem)
        return 1;
    memcpy(dst, mem + (src - dev_base), n);
    return 0;
}
CUresult cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t n)
{
    if (dst < dev_base || dst + n > dev_base + sizeof mem)
        return 1;
    memcpy(mem + (dst - dev_base), src, n);
    return 0;
}
/* the asynchronous forms copy at once (a stand-in has no streams to order
 * by); the stream they were given is kept for the tests to look at */
void *last_copy_stream;
int async_copies;
CUresult cuMemcpyDtoHAsync_v2(void *dst, uint64_t src, size_t n, void *s)
{
    last_copy_stream = s;
    async_copies++;
    return cuMemcpyDtoH_v2(dst, src, n);
}
CUresult cuMemcpyHtoDAsync_v2(uint64_t dst, const void *src, size_t n, void *s)
{
    last_copy_stream = s;
    async_copies++;
    return cuMemcpyHtoD_v2(dst, src, n);
}
static CUresult fill(uint64_t dst, unsigned v, size_t n, int w, void *s)
{
    if (in(bad, s))
        return 700;
    if (dst < dev_base || dst + n * w > dev_base + sizeof mem)
        return 1;
    for (size_t i = 0; i < n; i++)
        memcpy(mem + (dst - dev_base) + i * w, &v, w);     /* little-endian, as the device */
    return 0;
}
CUresult cuMemsetD8Async(uint64_t d, unsigned char v, size_t n, void *s) { return fill(d, v, n, 1, s); }
CUresult cuMemsetD16Async(uint64_t d, unsigned short v, size_t n, void *s) { return fill(d, v, n, 2, s); }
CUresult cuMemsetD32Async(uint64_t d, unsigned v, size_t n, void *s) { return fill(d, v, n, 4, s); }
uintptr_t records[16][2];
int nrecords;
CUresult cuEventRecord(void *e, void *s)
{
    if (in(bad, e))
        return 400;
    records[nrecords & 15][0] = (uintptr_t)e;
    records[nrecords++ & 15][1] = (uintptr_t)s;
    return 0;
}
int attr_values[256];
CUresult cuDeviceGetAttribute(int *pi, int attrib, int dev)
{
    if (attrib < 0 || attrib >= 256 || dev != 0)
        return 101;           /* CUDA_ERROR_INVALID_DEVICE / value: the code alone travels */
    *pi = attr_values[attrib];
    return 0;
}
