/* Copies between the device and pageable host memory on a capturing stream
 * (cudaMemcpyAsync / cuMemcpy{HtoD,DtoH}Async inside a stream capture).
 *
 * A captured copy runs when the graph is launched, in graph order (CUDA
 * Programming Guide, "CUDA Graphs", stream capture: captured work is not
 * executed at capture, it becomes a node). The worker cannot reach the
 * application's pageable memory then, and the staging segment that carries
 * pageable bytes now (memcpy.c) is reused by the next copy. So the shim
 * captures what an explicit memcpy node with pageable memory becomes
 * (graph_build.c): a copy to or from a page-locked bounce buffer of its own
 * plus a host function that runs in the application, in stream order,
 * moving the bytes between the buffer and the application's memory (after
 * the copy for device-to-host, before it for host-to-device). The
 * application's bytes are then read and written at the node's point of each
 * launch, as natively; a host-to-device source is read at launch, not at
 * capture.
 *
 * Cost: a pageable asynchronous copy asks the worker whether its stream is
 * capturing (one round trip), but only once this process has begun a
 * capture (capture.c); before that nothing changes.
 *
 * Locking: called by gp_copy_htod / gp_copy_dtoh with gp_lock held (it is
 * recursive: the capture query takes it again). */
#include "gp_gen.h"
#include "gp_memcpy.h"
#include "gp_shim.h"

int gp_capture_begun(void);
CUresult gp_graph_bounce(void *app, size_t n, int to_pinned, uint32_t *seg, uint64_t *off, uint64_t *id,
                         uint32_t *gate_seg, uint64_t *gate_off, uint64_t *gate_len);

static int per_thread(uint32_t fid)
{
    return fid == GP_FID_cuMemcpyHtoDAsync_v2_ptsz || fid == GP_FID_cuMemcpyDtoHAsync_v2_ptsz;
}

/* cuLaunchHostFunc(stream, id, gate): the op hostfn.c's host functions use */
static void hostfn_op(int pt, CUstream s, uint64_t id, uint32_t gseg, uint64_t goff, uint64_t glen)
{
    gp_buf *b = gp_op_begin(pt ? GP_FID_cuLaunchHostFunc_ptsz : GP_FID_cuLaunchHostFunc, 3);
    gp_put_handle(b, s);
    mp_uint(b, id);
    gp_put_shm(b, gseg, goff, glen);
    gp_op_async();
}

int gp_capture_copy(uint32_t fid, void *host, CUdeviceptr dev, size_t n, CUstream s, int to_device, CUresult *rc)
{
    if (!gp_capture_begun())
        return 0;
    int pt = per_thread(fid);
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult q = pt ? gpg_cuStreamIsCapturing_ptsz(s, &st) : gpg_cuStreamIsCapturing(s, &st);
    if (q != CUDA_SUCCESS || st != CU_STREAM_CAPTURE_STATUS_ACTIVE)
        return 0;       /* not capturing (or the query failed: the copy reports it) */
    uint32_t seg, gseg;
    uint64_t off, id, goff, glen;
    *rc = gp_graph_bounce(host, n, to_device, &seg, &off, &id, &gseg, &goff, &glen);
    if (*rc != CUDA_SUCCESS)
        return 1;
    if (to_device)
        hostfn_op(pt, s, id, gseg, goff, glen);
    gp_buf *b = gp_op_begin(fid, 4);
    if (to_device) {    /* [dst, host, n, stream] */
        mp_uint(b, dev);
        gp_put_shm(b, seg, off, n);
    } else {            /* [host, src, n, stream] */
        gp_put_shm(b, seg, off, n);
        mp_uint(b, dev);
    }
    mp_uint(b, n);
    gp_put_handle(b, s);
    gp_op_async();
    if (!to_device)
        hostfn_op(pt, s, id, gseg, goff, glen);
    /* the ops are recorded by the worker, not run: wait for that, and for
     * its refusal if the capture refuses them */
    *rc = gp_flush();
    if (*rc == CUDA_SUCCESS)
        *rc = gp_take_async_error();
    return 1;
}
