/* Driver API entry points for host memory the GPU reaches directly: mapped
 * page-locked memory, registered application memory, managed memory
 * (docs/host-memory.md). The memory itself is a shared segment at the same
 * address in the application and its worker (hostmem.c: gp_hostmap_*); here
 * the shim tells the worker to map and register each segment, and answers the
 * queries itself.
 *
 * Wire format (docs/protocol.md): a segment is announced with
 * cuMemHostRegister_v2's op, whatever call made it:
 *   [fid, ctx, [shm ref (segment, 0, length), address, kind], length, flags]
 * and withdrawn with cuMemHostUnregister's op: [fid, ctx, shm ref].
 * The worker maps the segment at `address` (MAP_FIXED_NOREPLACE) and
 * registers it (CU_MEMHOSTREGISTER_DEVICEMAP | PORTABLE); it answers
 * CUDA_ERROR_OUT_OF_MEMORY when the range is taken in its own address space.
 *
 * Locking: every entry point holds gp_lock (HM_ENTER / HM_LEAVE). */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "gp_gen.h"
#include "gp_shim.h"
#include "gp_peer.h"

#define HM_ENTER()                                   \
    gp_lock();                                       \
    do {                                             \
        CUresult s_ = gp_session();                  \
        if (s_ != CUDA_SUCCESS) {                    \
            gp_unlock();                             \
            return s_;                               \
        }                                            \
    } while (0)
#define HM_LEAVE(rc) do { CUresult r_ = (rc); gp_unlock(); return r_; } while (0)

static void need_shm(const char *fn)
{
    fprintf(stderr, "gpuproxy: %s needs proxyd on the same host (shared memory); not supported over this endpoint\n",
            fn);
}

static CUresult send_map(void *p)
{
    int kind;
    unsigned flags;
    uint32_t id;
    void *base;
    size_t size;
    if (gp_hostmap_info(p, &kind, &flags, NULL, NULL, &id, &base, &size) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    gp_buf *b = gp_op_begin(GP_FID_cuMemHostRegister_v2, 3);
    mp_array(b, 3);
    gp_put_shm(b, id, 0, size);
    mp_uint(b, (uint64_t)(uintptr_t)base);
    mp_uint(b, (uint64_t)kind);
    mp_uint(b, size);
    mp_uint(b, flags);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    gp_reply_done(&r);
    return rc;
}

/* Withdraws the segment holding p from the worker (work still using it
 * finishes first: the worker synchronises, as cuMemFreeHost and
 * cuMemHostUnregister do) and frees or unshares it here. */
static CUresult unmap_and_free(void *p)
{
    uint32_t id;
    void *base;
    size_t size;
    if (gp_hostmap_info(p, NULL, NULL, NULL, NULL, &id, &base, &size) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    gp_buf *b = gp_op_begin(GP_FID_cuMemHostUnregister, 1);
    gp_put_shm(b, id, 0, size);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    gp_reply_done(&r);
    gp_hostmap_free(base);
    return rc;
}

/* A new GPU-visible segment of the given kind; *pp gets its address. Caller
 * holds gp_lock and has a session. */
CUresult gp_hostmap_new(void **pp, size_t size, int kind, unsigned flags, const char *fn)
{
    if (!gp_shm_ok()) {
        need_shm(fn);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    void *p = gp_hostmap_alloc(size, kind, flags);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = send_map(p);
    if (rc != CUDA_SUCCESS) {
        gp_hostmap_free(p);
        return rc;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

/* cuMemFreeHost of a mapped segment; -1 when p is not one (caller holds gp_lock). */
int gp_hostmap_free_host(void *p, CUresult *rc)
{
    int kind;
    void *user;
    if (gp_hostmap_info(p, &kind, NULL, &user, NULL, NULL, NULL, NULL) != 0 || kind != GP_HM_HOST || user != p)
        return -1;
    *rc = unmap_and_free(p);
    return 0;
}

/* ------------------------------------------------------- registration */

#define REGISTER_FLAGS (CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_IOMEMORY | \
                        CU_MEMHOSTREGISTER_READ_ONLY)

CUresult gpo_cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    if (!p || bytesize == 0 || (Flags & ~(unsigned)REGISTER_FLAGS))
        return CUDA_ERROR_INVALID_VALUE;
    if (Flags & CU_MEMHOSTREGISTER_IOMEMORY) {
        /* device memory of a third-party PCIe device: nothing the worker could map */
        fprintf(stderr, "gpuproxy: cuMemHostRegister with CU_MEMHOSTREGISTER_IOMEMORY is not supported\n");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    HM_ENTER();
    if (!gp_shm_ok()) {
        need_shm("cuMemHostRegister");
        HM_LEAVE(CUDA_ERROR_NOT_SUPPORTED);
    }
    int rc = gp_hostmap_adopt(p, bytesize, Flags);
    if (rc != 0)
        HM_LEAVE((CUresult)rc);
    CUresult r = send_map(p);
    if (r != CUDA_SUCCESS)
        gp_hostmap_free(p);       /* private again, contents kept */
    HM_LEAVE(r);
}

CUresult gpo_cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
    return gpo_cuMemHostRegister_v2(p, bytesize, Flags);
}

CUresult gpo_cuMemHostUnregister(void *p)
{
    HM_ENTER();
    if (!p || gp_hostmap_registered(p) != 0)
        HM_LEAVE(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    HM_LEAVE(unmap_and_free(p));
}

/* Unified addressing: the device pointer of mapped host memory is its host
 * address (cuda.h, cuMemHostGetDevicePointer: "Flags ... must be set to 0";
 * the worker checked that the driver agrees when it registered the range). */
CUresult gpo_cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    if (!pdptr || Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    HM_ENTER();
    int kind;
    if (gp_hostmap_info(p, &kind, NULL, NULL, NULL, NULL, NULL, NULL) != 0 || kind == GP_HM_MANAGED)
        HM_LEAVE(CUDA_ERROR_INVALID_VALUE);
    *pdptr = (CUdeviceptr)(uintptr_t)p;
    HM_LEAVE(CUDA_SUCCESS);
}

CUresult gpo_cuMemHostGetFlags(unsigned int *pFlags, void *p)
{
    if (!pFlags)
        return CUDA_ERROR_INVALID_VALUE;
    HM_ENTER();
    int kind;
    unsigned flags;
    if (gp_hostmap_info(p, &kind, &flags, NULL, NULL, NULL, NULL, NULL) != 0 || kind != GP_HM_HOST)
        HM_LEAVE(CUDA_ERROR_INVALID_VALUE);
    /* every allocation is mapped under unified addressing */
    *pFlags = flags | CU_MEMHOSTALLOC_DEVICEMAP;
    HM_LEAVE(CUDA_SUCCESS);
}

/* --------------------------------------------------------- managed memory */

/* Managed memory is a GPU-visible host segment: the host reads and writes
 * it in place, kernels reach it through the same pointer; nothing migrates
 * (docs/host-memory.md, "Managed memory"). */
CUresult gpo_cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    if (!dptr || bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    HM_ENTER();
    void *p = NULL;
    CUresult rc = gp_hostmap_new(&p, bytesize, GP_HM_MANAGED, flags, "cuMemAllocManaged");
    if (rc == CUDA_SUCCESS)
        *dptr = (CUdeviceptr)(uintptr_t)p;
    HM_LEAVE(rc);
}

CUresult gpo_cuMemFree_v2(CUdeviceptr dptr)
{
    HM_ENTER();
    int kind;
    void *user;
    void *p = (void *)(uintptr_t)dptr;
    if (gp_hostmap_info(p, &kind, NULL, &user, NULL, NULL, NULL, NULL) == 0) {
        if (kind != GP_HM_MANAGED || user != p)
            HM_LEAVE(CUDA_ERROR_INVALID_VALUE);
        HM_LEAVE(unmap_and_free(p));
    }
    int slab;       /* a block placed by the shim (slab.c) */
    CUresult rc = gp_slab_free(dptr, &slab);
    if (slab)
        HM_LEAVE(rc);
    gp_owner_forget(dptr);          /* peer.c */
    HM_LEAVE(gpg_cuMemFree_v2(dptr));
}

/* Prefetching and advice only move or place pages; with nothing to migrate
 * they are accepted once the range is checked (cuda.h, cuMemPrefetchAsync:
 * "devPtr ... must refer to managed memory"; cuMemAdvise: managed or, for
 * the advice about accessing devices, system memory). The stream is not
 * waited on: the call's only effect would be the migration. */
static CUresult check_managed(CUdeviceptr dptr, size_t count)
{
    int kind;
    void *user;
    size_t usize;
    void *p = (void *)(uintptr_t)dptr;
    if (count == 0 || gp_hostmap_info(p, &kind, NULL, &user, &usize, NULL, NULL, NULL) != 0 ||
        kind != GP_HM_MANAGED || (uintptr_t)p + count > (uintptr_t)user + usize)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

static CUresult accept_managed(CUdeviceptr dptr, size_t count)
{
    HM_ENTER();
    HM_LEAVE(check_managed(dptr, count));
}

CUresult gpo_cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, CUmemLocation location, unsigned int flags,
                                   CUstream hStream)
{
    (void)location; (void)hStream;
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return accept_managed(devPtr, count);
}

CUresult gpo_cuMemPrefetchAsync_v2_ptsz(CUdeviceptr devPtr, size_t count, CUmemLocation location,
                                        unsigned int flags, CUstream hStream)
{
    return gpo_cuMemPrefetchAsync_v2(devPtr, count, location, flags, hStream);
}

CUresult gpo_cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUmemLocation location)
{
    (void)location;
    if (advice < CU_MEM_ADVISE_SET_READ_MOSTLY || advice > CU_MEM_ADVISE_UNSET_ACCESSED_BY)
        return CUDA_ERROR_INVALID_VALUE;
    return accept_managed(devPtr, count);
}

/* cuStreamAttachMemAsync (cuda.h): a stream-ordered change of which streams
 * may touch a managed allocation. Managed memory here is host memory that
 * every stream and the host reach at all times (above), so the association
 * changes nothing there is to order: the call is checked as the driver
 * documents it and accepted, and nothing is enqueued. Checked: flags one of
 * CUmemAttach_flags; CU_MEM_ATTACH_SINGLE not on the NULL stream; dptr in a
 * managed allocation and length zero or that allocation's whole size
 * ("it is not possible to change stream association for a portion of a
 * managed allocation"); the stream a live one (cuStreamQuery: ready or
 * busy). Pageable system memory (allowed where the device reports
 * CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS) is refused: INVALID_VALUE. */
static CUresult attach_mem(CUstream hStream, CUdeviceptr dptr, size_t length, unsigned int flags)
{
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST && flags != CU_MEM_ATTACH_SINGLE)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags == CU_MEM_ATTACH_SINGLE && (hStream == NULL || hStream == CU_STREAM_LEGACY))
        return CUDA_ERROR_INVALID_VALUE;
    {
        HM_ENTER();
        int kind;
        void *user;
        size_t usize;
        void *p = (void *)(uintptr_t)dptr;
        if (gp_hostmap_info(p, &kind, NULL, &user, &usize, NULL, NULL, NULL) != 0 || kind != GP_HM_MANAGED ||
            (length != 0 && (p != user || length != usize)))
            HM_LEAVE(CUDA_ERROR_INVALID_VALUE);
        gp_unlock();
    }
    if (hStream == NULL || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD)
        return CUDA_SUCCESS;
    CUresult rc = cuStreamQuery(hStream);
    return rc == CUDA_ERROR_NOT_READY ? CUDA_SUCCESS : rc;
}

CUresult gpo_cuStreamAttachMemAsync(CUstream hStream, CUdeviceptr dptr, size_t length, unsigned int flags)
{
    return attach_mem(hStream, dptr, length, flags);
}

CUresult gpo_cuStreamAttachMemAsync_ptsz(CUstream hStream, CUdeviceptr dptr, size_t length, unsigned int flags)
{
    return attach_mem(hStream ? hStream : CU_STREAM_PER_THREAD, dptr, length, flags);
}
