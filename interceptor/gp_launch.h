/* Kernel launches shared by the driver and runtime entry points (driver.c,
 * launch_ex.c, rt_register.c). Every launch variant travels as one of two
 * ops: cuLaunchKernel's (no attributes) or cuLaunchKernelEx's (attributes);
 * proxyd runs both through the same backend launch. */
#ifndef GP_LAUNCH_H
#define GP_LAUNCH_H

#include "gp_shim.h"

/* Packed argument buffer of a launch; see driver.c. */
CUresult gp_launch_args(CUfunction f, void **kernelParams, void **extra, uint8_t *small, size_t cap,
                        const void **buf, size_t *n);
/* Enqueues a plain launch (op of cuLaunchKernel / _ptsz). Caller holds the lock. */
CUresult gp_launch(uint32_t fid, CUfunction f, const unsigned grid[3], const unsigned block[3], unsigned shmem,
                   CUstream stream, const void *params, size_t nbytes);
/* Enqueues a launch with attributes (op of cuLaunchKernelEx / _ptsz: fid
 * says which). Attributes whose values name other objects (events) are
 * refused with CUDA_ERROR_NOT_SUPPORTED and one stderr line. Caller holds
 * the lock. */
CUresult gp_launch_ex(uint32_t fid, CUfunction f, const unsigned grid[3], const unsigned block[3], unsigned shmem,
                      CUstream stream, const CUlaunchAttribute *attrs, unsigned nattrs, const void *params,
                      size_t nbytes);

#endif
