/* Entry points that the real libcuda.so.1 (driver 580) exports but that no
 * CUDA header declares, so they have no spec (specs cover the headers).
 * Programs reach them only through dlsym; the shim answers them as
 * unsupported, like every unsupported function: CUDA_ERROR_NOT_SUPPORTED and
 * one stderr line naming the function. autogen/build.py exports every
 * GP_UNDOCUMENTED name (tests/test_gpu.py compares with the real driver). */
#include "gp_shim.h"

#define GP_UNDOCUMENTED(name)                  \
    GP_EXPORT CUresult name(void)              \
    {                                          \
        gp_warn_unsupported(#name);            \
        return CUDA_ERROR_NOT_SUPPORTED;       \
    }

GP_UNDOCUMENTED(cuEGLApiInit)
GP_UNDOCUMENTED(cuMemGetAttribute)
GP_UNDOCUMENTED(cuMemGetAttribute_v2)
