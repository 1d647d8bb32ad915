/* Host <-> device copies.
 *
 * Three paths, chosen per copy:
 *  - pinned host memory (a cudaMallocHost / cuMemHostAlloc segment that proxyd
 *    has mapped): one op naming the segment; proxyd DMAs straight from/to it,
 *    asynchronously when the API is async, exactly like real pinned memory;
 *  - pageable host memory with shared memory available: the data goes through
 *    the staging segment in chunks, two slots used alternately so that the
 *    shim copies one chunk while proxyd moves the other (the same staging the
 *    driver does for pageable memory, CUDA Runtime API, "API synchronization
 *    behavior": pageable copies are synchronous w.r.t. the host);
 *  - no shared memory (proxyd on another host): the bytes travel in the
 *    message, as their own zmq frame when large.
 *
 * Arguments follow the spec'd parameters of the driver function named by fid:
 *   HtoD: [dst, data, ByteCount(, stream)]   data = bin | frame | shm ref
 *   DtoH: [dst, src, ByteCount(, stream)]    dst  = nil (data in the reply) | shm ref
 * Locking: callers hold gp_lock. */
#include "gp_memcpy.h"

#include <string.h>

/* capture_copy.c: a pageable copy on a capturing stream; 1 when it handled it */
int gp_capture_copy(uint32_t fid, void *host, CUdeviceptr dev, size_t n, CUstream s, int to_device, CUresult *rc);

#define GP_CHUNK_MAX (16u << 20)
/* Copies up to this size travel inside the message (one round trip) rather
 * than through the staging segment. */
#define GP_SMALL_COPY (64u << 10)

static uint64_t slot_seq[2];    /* last message that used each staging slot */
static int next_slot;

static size_t chunk_size(void)
{
    size_t half = gp_staging_size() / 2;
    half &= ~(size_t)4095;
    return half < GP_CHUNK_MAX ? half : GP_CHUNK_MAX;
}

static uint32_t nargs_for(int has_stream) { return has_stream ? 4u : 3u; }

static void put_stream(gp_buf *b, int has_stream, CUstream s)
{
    if (has_stream)
        gp_put_handle(b, s);
}

/* The last arguments of a one-op copy (byte count, stream) and its sending:
 * queued (async) or answered. */
static CUresult send_copy(gp_buf *b, size_t n, CUstream s, int has_stream, int async)
{
    mp_uint(b, n);
    put_stream(b, has_stream, s);
    if (async)
        return gp_op_async();
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    gp_reply_done(&r);
    return rc;
}

/* The next of the two staging slots, once the daemon has read (htod) or
 * answered (dtoh) the last message that used it. */
static CUresult take_slot(int *h)
{
    *h = next_slot;
    next_slot ^= 1;
    return slot_seq[*h] ? gp_wait_acked(slot_seq[*h]) : CUDA_SUCCESS;
}

/* Sends a staged chunk's op (byte count and stream still to add) at once
 * and records it as slot h's last user; 0 if it could not be sent. */
static uint64_t send_staged(gp_buf *b, size_t len, CUstream s, int has_stream, int h)
{
    mp_uint(b, len);
    put_stream(b, has_stream, s);
    uint64_t seq = gp_send_now();
    if (seq)
        slot_seq[h] = seq;
    return seq;
}

CUresult gp_copy_htod(uint32_t fid, CUdeviceptr dst, const void *src, size_t n, CUstream s, int has_stream, int async)
{
    if (n == 0)
        return CUDA_SUCCESS;
    if (!src)
        return CUDA_ERROR_INVALID_VALUE;
    uint32_t seg;
    uint64_t off, avail;
    gp_buf *b;
    if (gp_host_lookup(src, &seg, &off, &avail) == 0 && avail >= n) {
        b = gp_op_begin(fid, nargs_for(has_stream));
        mp_uint(b, dst);
        gp_put_shm(b, seg, off, n);
        return send_copy(b, n, s, has_stream, async);
    }
    CUresult crc;
    if (has_stream && async && gp_capture_copy(fid, (void *)src, dst, n, s, 1, &crc))
        return crc;     /* on a capturing stream: through a bounce buffer (capture_copy.c) */
    size_t chunk = chunk_size();
    if (chunk == 0 || n <= GP_SMALL_COPY) {
        b = gp_op_begin(fid, nargs_for(has_stream));
        mp_uint(b, dst);
        gp_put_data(b, src, n, async);
        return send_copy(b, n, s, has_stream, async);
    }
    uint8_t *stage = gp_staging_base();
    uint64_t last = 0;
    for (size_t done = 0; done < n; done += chunk) {
        size_t len = n - done < chunk ? n - done : chunk;
        int h;
        CUresult rc = take_slot(&h);
        if (rc != CUDA_SUCCESS)
            return rc;
        gp_pmemcpy(stage + (size_t)h * chunk, (const uint8_t *)src + done, len);
        b = gp_op_begin(fid, nargs_for(has_stream));
        mp_uint(b, dst + done);
        gp_put_shm(b, gp_staging_id(), (uint64_t)h * chunk, len);
        last = send_staged(b, len, s, has_stream, h);
        if (last == 0)
            return CUDA_ERROR_DEVICE_UNAVAILABLE;
    }
    /* Pageable copies return once the source has been consumed (CUDA does the
     * same); proxyd answers a staged chunk only after reading it. */
    CUresult rc = gp_wait_acked(last);
    if (rc != CUDA_SUCCESS)
        return rc;
    return async ? CUDA_SUCCESS : gp_take_async_error();
}

CUresult gp_copy_dtoh(uint32_t fid, void *dst, CUdeviceptr src, size_t n, CUstream s, int has_stream, int async)
{
    if (n == 0)
        return CUDA_SUCCESS;
    if (!dst)
        return CUDA_ERROR_INVALID_VALUE;
    uint32_t seg;
    uint64_t off, avail;
    gp_buf *b;
    if (gp_host_lookup(dst, &seg, &off, &avail) == 0 && avail >= n) {
        b = gp_op_begin(fid, nargs_for(has_stream));
        gp_put_shm(b, seg, off, n);
        mp_uint(b, src);
        return send_copy(b, n, s, has_stream, async);
    }
    CUresult crc;
    if (has_stream && async && gp_capture_copy(fid, dst, src, n, s, 0, &crc))
        return crc;     /* on a capturing stream: through a bounce buffer (capture_copy.c) */
    size_t chunk = chunk_size();
    if (chunk == 0 || n <= GP_SMALL_COPY) {
        b = gp_op_begin(fid, nargs_for(has_stream));
        mp_nil(b);
        mp_uint(b, src);
        mp_uint(b, n);
        put_stream(b, has_stream, s);
        gp_reply r;
        CUresult rc = gp_op_sync(&r);
        if (r.have_outs && r.nouts >= 1)
            gp_out_buffer(&r, dst, n);
        gp_reply_done(&r);
        return rc;
    }
    /* Copies to pageable memory complete before returning, async or not. */
    uint8_t *stage = gp_staging_base();
    uint64_t pend_seq = 0;
    size_t pend_off = 0, pend_len = 0;
    int pend_slot = 0;
    CUresult rc = CUDA_SUCCESS;
    for (size_t done = 0; done < n; done += chunk) {
        size_t len = n - done < chunk ? n - done : chunk;
        int h;
        if ((rc = take_slot(&h)) != CUDA_SUCCESS)
            return rc;
        b = gp_op_begin(fid, nargs_for(has_stream));
        gp_put_shm(b, gp_staging_id(), (uint64_t)h * chunk, len);
        mp_uint(b, src + done);
        uint64_t seq = send_staged(b, len, s, has_stream, h);
        if (seq == 0)
            return CUDA_ERROR_DEVICE_UNAVAILABLE;
        if (pend_seq) {
            if ((rc = gp_wait_acked(pend_seq)) != CUDA_SUCCESS)
                return rc;
            gp_pmemcpy((uint8_t *)dst + pend_off, stage + (size_t)pend_slot * chunk, pend_len);
        }
        pend_seq = seq;
        pend_off = done;
        pend_len = len;
        pend_slot = h;
    }
    if ((rc = gp_wait_acked(pend_seq)) != CUDA_SUCCESS)
        return rc;
    gp_pmemcpy((uint8_t *)dst + pend_off, stage + (size_t)pend_slot * chunk, pend_len);
    return gp_take_async_error();
}
