/* Hand-written part of the libcusolver.so.12 stand-in (spec: shim:
 * override in specs/cusolver/cusolver.yaml). docs/libraries.md. Locking:
 * as lib_cufft.c. */
#include "gp_lib_cusolver.h"

extern int cudaFree(void *devPtr);     /* cuda_runtime_api.h; see lib_cufft.c */

enum { CUSOLVER_STATUS_NOT_INITIALIZED = 1 };   /* cusolver_common.h */

cusolverStatus_t gpo_cusolverDnCreate(cusolverDnHandle_t *handle)
{
    if (cudaFree(NULL) != 0)
        return (cusolverStatus_t)CUSOLVER_STATUS_NOT_INITIALIZED;
    return gpg_cusolverDnCreate(handle);
}
