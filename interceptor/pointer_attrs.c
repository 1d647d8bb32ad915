/* cuPointerGetAttributes and cuPointerGetAttribute, answered in the shim from what the client knows
 * about its addresses: the session's device arena and module globals
 * (gp_is_device_ptr), its GPU-visible host segments (gp_hostmap_info:
 * mapped, registered and managed memory, docs/host-memory.md) and its
 * page-locked staging segments (gp_host_lookup).
 * NVIDIA's static runtime implements cudaPointerGetAttributes with it
 * (CuPy asks it of every host array it copies, to learn whether it is
 * pinned).
 *
 * cuda.h, cuPointerGetAttributes: an address that is not CUDA memory is no
 * error; its attributes get their NULL/zero values (memory type 0, context
 * NULL, pointers NULL, ordinal -2 as for cudaMemoryTypeUnregistered).
 *
 * Limits: a device address is one inside the session's arena (its range,
 * not each live allocation), so an address of freed arena memory still
 * answers as device memory. The context of a device address is the calling thread's current
 * one and its device that context's device (the shim does not record which
 * context made each allocation; one context per device is the common case).
 * The range and mapping attributes answer the allocation holding the
 * address (cuMemGetAddressRange for device memory: XLA asks
 * CU_POINTER_ATTRIBUTE_RANGE_START_ADDR to pick kernels whose alignment the
 * range allows), the allowed handle types none, the access flags read-write.
 * Attributes the shim cannot answer (P2P tokens, buffer ids, mempools, ...)
 * fail the call with CUDA_ERROR_NOT_SUPPORTED and one stderr line naming
 * the attribute.
 *
 * cuPointerGetAttribute (one attribute) differs in one way (cuda.h): an
 * address CUDA does not know fails with CUDA_ERROR_INVALID_VALUE. Triton's
 * kernel launcher (torch.compile) relies on that to reject CPU tensors and
 * asks CU_POINTER_ATTRIBUTE_DEVICE_POINTER of every pointer argument.
 *
 * Locking: the address tables are read under gp_lock. */
#include <stdio.h>
#include <string.h>

#include "gp_gen.h"
#include "gp_shim.h"
#include "gp_peer.h"

/* The allocation holding ptr: device memory as cuMemGetAddressRange
 * answers it (a slab block, or the worker's allocation), host memory the
 * shared segment (or the registered range) holding it. 0/0 when none is
 * known (an address of freed arena memory). Called without gp_lock. */
static void range_of(CUdeviceptr ptr, int device, CUdeviceptr *base, size_t *size)
{
    *base = 0, *size = 0;
    if (device) {
        CUdeviceptr b;
        size_t n;
        if (gpo_cuMemGetAddressRange_v2(&b, &n, ptr) == CUDA_SUCCESS)
            *base = b, *size = n;
        return;
    }
    const void *p = (const void *)(uintptr_t)ptr;
    void *user = NULL, *sbase = NULL;
    size_t user_size = 0, ssize = 0;
    uint32_t seg;
    uint64_t off, avail;
    gp_lock();
    if (gp_hostmap_info(p, NULL, NULL, &user, &user_size, NULL, &sbase, &ssize) == 0) {
        if (user && user_size && (uintptr_t)p >= (uintptr_t)user && (uintptr_t)p - (uintptr_t)user < user_size)
            *base = (CUdeviceptr)(uintptr_t)user, *size = user_size;
        else
            *base = (CUdeviceptr)(uintptr_t)sbase, *size = ssize;
    } else if (gp_host_lookup(p, &seg, &off, &avail) == 0) {
        *base = ptr - off, *size = off + avail;
    }
    gp_unlock();
}

CUresult gpo_cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes, void **data,
                                    CUdeviceptr ptr)
{
    if (numAttributes && (!attributes || !data))
        return CUDA_ERROR_INVALID_VALUE;
    const void *p = (const void *)(uintptr_t)ptr;
    uint32_t seg;
    uint64_t off, avail;
    int kind = 0;
    gp_lock();
    int device = gp_is_device_ptr(p);
    int mapped = !device && gp_hostmap_info(p, &kind, NULL, NULL, NULL, NULL, NULL, NULL) == 0;
    int managed = mapped && kind == GP_HM_MANAGED;
    int host = !device && (mapped || gp_host_lookup(p, &seg, &off, &avail) == 0);
    gp_unlock();
    CUcontext ctx = (device || host) ? gp_ctx_current() : NULL;
    CUdevice dev = -2;
    if (ctx && gp_ctx_device(ctx, &dev))
        dev = -2;
    CUdevice owner;     /* several GPUs: the allocation's own device and its primary context (peer.c) */
    if (device && gp_owner_of(ptr, &owner) == 0 && owner != dev) {
        CUcontext oc = gp_ctx_primary_of(owner);
        dev = owner;
        if (oc)
            ctx = oc;
    }
    for (unsigned int i = 0; i < numAttributes; i++) {
        void *out = data[i];
        if (!out)
            return CUDA_ERROR_INVALID_VALUE;
        switch (attributes[i]) {
        case CU_POINTER_ATTRIBUTE_CONTEXT:
            *(CUcontext *)out = ctx;
            break;
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            /* cuda.h: managed memory reports CU_MEMORYTYPE_DEVICE with IS_MANAGED set */
            *(unsigned int *)out = (device || managed) ? CU_MEMORYTYPE_DEVICE : host ? CU_MEMORYTYPE_HOST : 0;
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
            /* unified addressing: host segments are mapped at the same address */
            *(CUdeviceptr *)out = (device || host) ? ptr : 0;
            break;
        case CU_POINTER_ATTRIBUTE_HOST_POINTER:
            *(void **)out = host ? (void *)p : NULL;
            break;
        case CU_POINTER_ATTRIBUTE_IS_MANAGED:
            *(unsigned int *)out = (unsigned int)managed;
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            *(int *)out = dev;
            break;
        case CU_POINTER_ATTRIBUTE_MAPPED:
            *(unsigned int *)out = (unsigned int)(device || host);
            break;
        case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
            *(unsigned int *)out = 0;    /* no IPC (README limits) */
            break;
        case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
            *(unsigned int *)out = 1;    /* proxyd orders every copy on its stream */
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: {
            /* the range: the allocation holding ptr. The mapping: the
             * driver backs cuMemAlloc memory with mappings of its 2 MiB
             * granularity (an H100 with driver 580 answers MAPPING_SIZE 4 MiB
             * and MAPPING_BASE_ADDR = the base for a 3 MiB cuMemAlloc, which
             * XLA asks: docs/compatibility.md, JAX), so device memory answers
             * the 2 MiB-aligned span around the allocation; the session's
             * arena hands out device memory in that granularity (core/arena.py),
             * so the span holds no other process's memory */
            CUdeviceptr base = 0;
            size_t size = 0;
            if (device || host)
                range_of(ptr, device, &base, &size);
            CUdeviceptr mbase = base, mend = base + size;
            if (device && size) {
                const CUdeviceptr g = (CUdeviceptr)2 << 20;
                mbase = base & ~(g - 1);
                mend = (base + size + g - 1) & ~(g - 1);
            }
            if (attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
                *(CUdeviceptr *)out = base;
            else if (attributes[i] == CU_POINTER_ATTRIBUTE_RANGE_SIZE)
                *(size_t *)out = size;
            else if (attributes[i] == CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR)
                *(void **)out = (void *)(uintptr_t)mbase;
            else
                *(size_t *)out = (size_t)(mend - mbase);
            break;
        }
        case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
            /* no allocation of a proxied process can be exported as an OS
             * handle (README limits: no IPC of VMM handles), which the driver
             * answers for cuMemAlloc memory as CU_MEM_HANDLE_TYPE_NONE */
            *(unsigned long long *)out = CU_MEM_HANDLE_TYPE_NONE;
            break;
        case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
            /* the current context's device reaches every allocation of the
             * session read-write (peer access is not restricted: peer.c) */
            *(unsigned int *)out = (device || host) ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE
                                                    : CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE;
            break;
        default: {
            char name[80];
            snprintf(name, sizeof name, "cuPointerGetAttributes (attribute %d)", (int)attributes[i]);
            gp_warn_unsupported(name);
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        }
    }
    return CUDA_SUCCESS;
}

CUresult gpo_cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    const void *p = (const void *)(uintptr_t)ptr;
    uint32_t seg;
    uint64_t off, avail;
    gp_lock();
    int known = gp_is_device_ptr(p) || gp_hostmap_info(p, NULL, NULL, NULL, NULL, NULL, NULL, NULL) == 0 ||
                gp_host_lookup(p, &seg, &off, &avail) == 0;
    gp_unlock();
    if (!known)
        return CUDA_ERROR_INVALID_VALUE;
    void *out[1] = {data};
    return gpo_cuPointerGetAttributes(1, &attribute, out, ptr);
}
