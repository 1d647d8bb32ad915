/* Host <-> device copies; see memcpy.c. */
#ifndef GP_MEMCPY_H
#define GP_MEMCPY_H

#include "gp_shim.h"

CUresult gp_copy_htod(uint32_t fid, CUdeviceptr dst, const void *src, size_t n, CUstream s, int has_stream, int async);
CUresult gp_copy_dtoh(uint32_t fid, void *dst, CUdeviceptr src, size_t n, CUstream s, int has_stream, int async);

#endif
