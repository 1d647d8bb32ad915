/* Hand-written parts of the libcusparse.so.12 stand-in (spec: shim:
 * override in specs/cusparse/cusparse.yaml). docs/libraries.md. The
 * handle's pointer mode decides how alpha/beta travel (lib_state.c, the
 * same table as cuBLAS's handles). Locking: as lib_cufft.c. */
#include "gp_lib_cusparse.h"

extern int cudaFree(void *devPtr);     /* cuda_runtime_api.h; see lib_cufft.c */

enum { CUSPARSE_STATUS_NOT_INITIALIZED = 1 };   /* cusparse.h */

cusparseStatus_t gpo_cusparseCreate(cusparseHandle_t *handle)
{
    if (cudaFree(NULL) != 0)
        return (cusparseStatus_t)CUSPARSE_STATUS_NOT_INITIALIZED;
    cusparseStatus_t s = gpg_cusparseCreate(handle);
    if (s == GP_CUSPARSE_SUCCESS && handle)
        gp_cusparse_note_pointer_mode(*handle, 0);  /* cusparseCreate: CUSPARSE_POINTER_MODE_HOST */
    return s;
}

cusparseStatus_t gpo_cusparseDestroy(cusparseHandle_t handle)
{
    cusparseStatus_t s = gpg_cusparseDestroy(handle);
    if (s == GP_CUSPARSE_SUCCESS)
        gp_cublas_forget(handle);
    return s;
}

cusparseStatus_t gpo_cusparseSetPointerMode(cusparseHandle_t handle, cusparsePointerMode_t mode)
{
    cusparseStatus_t s = gpg_cusparseSetPointerMode(handle, mode);
    if (s == GP_CUSPARSE_SUCCESS)
        gp_cusparse_note_pointer_mode(handle, (int)mode);
    return s;
}
