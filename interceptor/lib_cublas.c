/* Hand-written parts of the libcublas.so.13 stand-in (spec: shim: override
 * in specs/cublas/cublas.yaml); everything else is generated
 * (autogen/gen_lib.py). docs/libraries.md. Locking: the generated gpg_
 * bodies take gp_lock; the pointer-mode table takes it too (lib_state.c). */
#include "gp_lib_cublas.h"

/* cuda_runtime_api.h: cudaFree(NULL) initialises the runtime's context on
 * the calling thread, as NVIDIA's libcublas does through its own runtime
 * before it creates a handle; the handle belongs to that context. */
extern int cudaFree(void *devPtr);

cublasStatus_t gpo_cublasCreate_v2(cublasHandle_t *handle)
{
    if (!handle)
        return 7;       /* CUBLAS_STATUS_INVALID_VALUE */
    if (cudaFree(NULL) != 0)
        return 1;       /* CUBLAS_STATUS_NOT_INITIALIZED: no usable device */
    cublasStatus_t s = gpg_cublasCreate_v2(handle);
    if (s == GP_CUBLAS_SUCCESS)
        gp_cublas_note_pointer_mode(*handle, 0);    /* a new handle is in host mode (cublasCreate) */
    return s;
}

cublasStatus_t gpo_cublasDestroy_v2(cublasHandle_t handle)
{
    cublasStatus_t s = gpg_cublasDestroy_v2(handle);
    if (s == GP_CUBLAS_SUCCESS)
        gp_cublas_forget(handle);
    return s;
}

cublasStatus_t gpo_cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode)
{
    cublasStatus_t s = gpg_cublasSetPointerMode_v2(handle, mode);
    if (s == GP_CUBLAS_SUCCESS)
        gp_cublas_note_pointer_mode(handle, (int)mode);
    return s;
}

/* cublasGetMathMode/SetMathMode: the mode is remembered in the app so that
 * the question PyTorch asks around every gemm costs no round trip
 * (lib_state.c). The set travels asynchronously (spec sync: false). */
cublasStatus_t gpo_cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    cublasStatus_t s = gpg_cublasSetMathMode(handle, mode);
    if (s == GP_CUBLAS_SUCCESS)
        gp_cublas_note_math_mode(handle, (int)mode);
    return s;
}

cublasStatus_t gpo_cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode)
{
    int m;
    if (!mode)
        return GP_CUBLAS_INVALID;
    if (gp_cublas_math_mode(handle, &m)) {
        *mode = (cublasMath_t)m;
        return GP_CUBLAS_SUCCESS;
    }
    cublasStatus_t s = gpg_cublasGetMathMode(handle, mode);
    if (s == GP_CUBLAS_SUCCESS)
        gp_cublas_note_math_mode(handle, (int)*mode);
    return s;
}

/* cublas_api.h: names and descriptions of cublasStatus_t, answered here (lib_state.c) */
const char *gpo_cublasGetStatusName(cublasStatus_t status) { return gp_cublas_status_name((int)status); }
const char *gpo_cublasGetStatusString(cublasStatus_t status) { return gp_cublas_status_string((int)status); }
