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
