/* Hand-written parts of the libcublasLt.so.13 stand-in (spec: shim:
 * override in specs/cublaslt/cublaslt.yaml). docs/libraries.md. The matmul
 * descriptor's scale type and pointer mode decide how alpha/beta travel
 * (lib_state.c). Locking: as lib_cublas.c. */
#include "gp_lib_cublaslt.h"

extern int cudaFree(void *devPtr);     /* cuda_runtime_api.h; see lib_cublas.c */

cublasStatus_t gpo_cublasLtCreate(cublasLtHandle_t *lightHandle)
{
    if (!lightHandle)
        return 7;       /* CUBLAS_STATUS_INVALID_VALUE */
    if (cudaFree(NULL) != 0)
        return 1;       /* CUBLAS_STATUS_NOT_INITIALIZED */
    return gpg_cublasLtCreate(lightHandle);
}

cublasStatus_t gpo_cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc, cublasComputeType_t computeType,
                                            cudaDataType_t scaleType)
{
    cublasStatus_t s = gpg_cublasLtMatmulDescCreate(matmulDesc, computeType, scaleType);
    if (s == GP_CUBLASLT_SUCCESS)
        gp_lt_note_desc(*matmulDesc, (int)scaleType);
    return s;
}

cublasStatus_t gpo_cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc)
{
    cublasStatus_t s = gpg_cublasLtMatmulDescDestroy(matmulDesc);
    if (s == GP_CUBLASLT_SUCCESS)
        gp_lt_forget(matmulDesc);
    return s;
}

cublasStatus_t gpo_cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                  cublasLtMatmulDescAttributes_t attr, const void *buf,
                                                  size_t sizeInBytes)
{
    cublasStatus_t s = gpg_cublasLtMatmulDescSetAttribute(matmulDesc, attr, buf, sizeInBytes);
    if (s == GP_CUBLASLT_SUCCESS)
        gp_lt_note_attr(matmulDesc, (int)attr, buf, sizeInBytes);
    return s;
}

/* cublasLt.h: the same cublasStatus_t names (lib_state.c) */
const char *gpo_cublasLtGetStatusName(cublasStatus_t status) { return gp_cublas_status_name((int)status); }
const char *gpo_cublasLtGetStatusString(cublasStatus_t status) { return gp_cublas_status_string((int)status); }
