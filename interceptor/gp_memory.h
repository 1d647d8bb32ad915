/* Session-level services of the shim (interceptor/LAYERS: services), memory
 * part: host memory shared with proxyd and device ranges (hostmem.c), the
 * small allocations the shim places itself (slab.c), and what the worker
 * said about itself at HELLO (hostmem.c).
 *
 * Locking: everything here runs under gp_lock unless said otherwise. */
#ifndef GP_MEMORY_H
#define GP_MEMORY_H

#include "gp_context.h"
#include "gp_transport.h"

/* ---- small allocations placed by the shim (slab.c) ---- */
/* Frees p when it is a block of a slab (*handled = 1, the result returned);
 * *handled = 0: p is not in a slab, the worker decides. */
CUresult gp_slab_free(CUdeviceptr p, int *handled);
/* 1 when p lies in a slab: *rc is CUDA_SUCCESS with the block's base and
 * requested size, or CUDA_ERROR_NOT_FOUND (p is in no live block). */
int gp_slab_range(CUdeviceptr p, CUdeviceptr *base, size_t *size, CUresult *rc);
/* The device's allocations are gone in the worker (primary context reset). */
void gp_slab_device_gone(CUdevice dev);
/* The device of the slab holding p: 0 with *dev set when p is in a slab (peer.c, gp_owner_of). */
int gp_slab_device(CUdeviceptr p, CUdevice *dev);

/* ---- device address ranges known to the client ---- */
/* The session's arena (all allocations) and module globals count as device
 * memory; everything else is host memory. Used to resolve cudaMemcpyDefault
 * and cuMemcpy (unified addressing). */
int gp_is_device_ptr(const void *p);
void gp_note_device_range(uint64_t base, uint64_t size);

/* ---- host memory shared with proxyd (cudaMallocHost / cuMemHostAlloc) ---- */
void *gp_host_alloc(size_t size);
int gp_host_free(void *p);
int gp_host_free_plain(void *p);
int gp_host_lookup(const void *p, uint32_t *seg, uint64_t *off, uint64_t *avail);
int gp_host_segment(const void *p, uint32_t *id, const char **name, size_t *size);
int gp_shm_ok(void);
/* GPU-visible host memory (docs/host-memory.md): shared segments at the same
 * address in the application and its worker. */
enum { GP_HM_HOST = 1, GP_HM_MANAGED = 2, GP_HM_REGISTERED = 3 };
void *gp_hostmap_alloc(size_t size, int kind, unsigned flags);
int gp_hostmap_adopt(void *p, size_t size, unsigned flags);
int gp_hostmap_info(const void *p, int *kind, unsigned *flags, void **user, size_t *user_size,
                    uint32_t *id, void **base, size_t *size);
int gp_hostmap_registered(const void *p);
int gp_hostmap_free(void *base);
size_t gp_staging_size(void);
void *gp_staging_base(void);
uint32_t gp_staging_id(void);
/* park.c: every named segment private while parked, shared again after */
void gp_hostmem_unshare(void);
int gp_hostmem_reshare(void);
/* The worker's CUDA driver version from its HELLO answer (13000 until one
 * said otherwise): cuDriverGetVersion's answer. */
int gp_driver_version(void);

#endif
