/* Hand-written parts of the libcublasLt.so.13 stand-in (spec: shim:
 * override in specs/cublaslt/cublaslt.yaml). docs/libraries.md.
 *
 * Descriptors (matmul, layout, preference) are created, set and destroyed
 * asynchronously under handles the shim chooses (lib_ids.c); the shim keeps
 * what they contain (lt_heuristic.c) so that a repeated heuristic question
 * is answered from its cache. The matmul descriptor's scale type and pointer
 * mode also decide how alpha/beta travel (lib_state.c). Because these calls
 * no longer wait for proxyd, a bad attribute that only NVIDIA's library can
 * judge fails at the next synchronising CUDA call, as a failed launch does;
 * what the shim can judge (NULL pointers) fails at once.
 *
 * Locking: as lib_cublas.c (the generated bodies and the tables take
 * gp_lock). Protocol kind codes: proxyd/protocol.py. */
#include "gp_lib_cublaslt.h"

enum { K_MATMUL_DESC = 34, K_LAYOUT = 35, K_PREFERENCE = 36 };

extern int cudaFree(void *devPtr);     /* cuda_runtime_api.h; see lib_cublas.c */

cublasStatus_t gpo_cublasLtCreate(cublasLtHandle_t *lightHandle)
{
    if (!lightHandle)
        return GP_CUBLASLT_INVALID;
    if (cudaFree(NULL) != 0)
        return 1;       /* CUBLAS_STATUS_NOT_INITIALIZED */
    return gpg_cublasLtCreate(lightHandle);
}

/* ----------------------------------------------------- matmul descriptor */

cublasStatus_t gpo_cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc, cublasComputeType_t computeType,
                                            cudaDataType_t scaleType)
{
    cublasStatus_t s = gpg_cublasLtMatmulDescCreate(matmulDesc, computeType, scaleType);
    if (s == GP_CUBLASLT_SUCCESS) {
        int32_t a[2] = { (int32_t)computeType, (int32_t)scaleType };
        gp_lt_note_desc(*matmulDesc, (int)scaleType);
        gp_lt_state_create(*matmulDesc, K_MATMUL_DESC, a, sizeof a);
    }
    return s;
}

static void forget(const void *h)
{
    gp_lt_state_forget(h);
    gp_lib_free_handle(h);
}

cublasStatus_t gpo_cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc)
{
    cublasStatus_t s = gpg_cublasLtMatmulDescDestroy(matmulDesc);
    if (s == GP_CUBLASLT_SUCCESS) {
        gp_lt_forget(matmulDesc);
        forget(matmulDesc);
    }
    return s;
}

cublasStatus_t gpo_cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                  cublasLtMatmulDescAttributes_t attr, const void *buf,
                                                  size_t sizeInBytes)
{
    if (!buf && sizeInBytes)
        return GP_CUBLASLT_INVALID;
    cublasStatus_t s = gpg_cublasLtMatmulDescSetAttribute(matmulDesc, attr, buf, sizeInBytes);
    if (s == GP_CUBLASLT_SUCCESS) {
        gp_lt_note_attr(matmulDesc, (int)attr, buf, sizeInBytes);
        gp_lt_state_attr(matmulDesc, (int)attr, buf, sizeInBytes);
    }
    return s;
}

/* --------------------------------------------------------------- layouts */

cublasStatus_t gpo_cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type, uint64_t rows,
                                              uint64_t cols, int64_t ld)
{
    cublasStatus_t s = gpg_cublasLtMatrixLayoutCreate(matLayout, type, rows, cols, ld);
    if (s == GP_CUBLASLT_SUCCESS) {
        uint64_t a[4] = { (uint64_t)type, rows, cols, (uint64_t)ld };
        gp_lt_state_create(*matLayout, K_LAYOUT, a, sizeof a);
    }
    return s;
}

cublasStatus_t gpo_cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout)
{
    cublasStatus_t s = gpg_cublasLtMatrixLayoutDestroy(matLayout);
    if (s == GP_CUBLASLT_SUCCESS)
        forget(matLayout);
    return s;
}

cublasStatus_t gpo_cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                    cublasLtMatrixLayoutAttribute_t attr, const void *buf,
                                                    size_t sizeInBytes)
{
    if (!buf && sizeInBytes)
        return GP_CUBLASLT_INVALID;
    cublasStatus_t s = gpg_cublasLtMatrixLayoutSetAttribute(matLayout, attr, buf, sizeInBytes);
    if (s == GP_CUBLASLT_SUCCESS)
        gp_lt_state_attr(matLayout, (int)attr, buf, sizeInBytes);
    return s;
}

/* ----------------------------------------------------------- preferences */

cublasStatus_t gpo_cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    cublasStatus_t s = gpg_cublasLtMatmulPreferenceCreate(pref);
    if (s == GP_CUBLASLT_SUCCESS)
        gp_lt_state_create(*pref, K_PREFERENCE, NULL, 0);
    return s;
}

cublasStatus_t gpo_cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    cublasStatus_t s = gpg_cublasLtMatmulPreferenceDestroy(pref);
    if (s == GP_CUBLASLT_SUCCESS)
        forget(pref);
    return s;
}

cublasStatus_t gpo_cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                        cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                        size_t sizeInBytes)
{
    if (!buf && sizeInBytes)
        return GP_CUBLASLT_INVALID;
    cublasStatus_t s = gpg_cublasLtMatmulPreferenceSetAttribute(pref, attr, buf, sizeInBytes);
    if (s == GP_CUBLASLT_SUCCESS)
        gp_lt_state_attr(pref, (int)attr, buf, sizeInBytes);
    return s;
}

/* ------------------------------------------------------------- heuristic */

cublasStatus_t gpo_cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                                  cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                                  cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                                  cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                                  cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                                  int *returnAlgoCount)
{
    if (requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount)
        return gpg_cublasLtMatmulAlgoGetHeuristic(lightHandle, operationDesc, Adesc, Bdesc, Cdesc, Ddesc,
                                                  preference, requestedAlgoCount, heuristicResultsArray,
                                                  returnAlgoCount);
    const void *d6[6] = { operationDesc, Adesc, Bdesc, Cdesc, Ddesc, preference };
    const void *ctx = gp_ctx_current();
    if (gp_lt_heuristic_find(ctx, lightHandle, d6, requestedAlgoCount, heuristicResultsArray,
                             sizeof heuristicResultsArray[0], returnAlgoCount))
        return GP_CUBLASLT_SUCCESS;
    cublasStatus_t s = gpg_cublasLtMatmulAlgoGetHeuristic(lightHandle, operationDesc, Adesc, Bdesc, Cdesc, Ddesc,
                                                          preference, requestedAlgoCount, heuristicResultsArray,
                                                          returnAlgoCount);
    if (s == GP_CUBLASLT_SUCCESS)
        gp_lt_heuristic_store(ctx, lightHandle, d6, requestedAlgoCount, heuristicResultsArray,
                              sizeof heuristicResultsArray[0], *returnAlgoCount);
    return s;
}

/* cublasLt.h: the same cublasStatus_t names (lib_state.c) */
const char *gpo_cublasLtGetStatusName(cublasStatus_t status) { return gp_cublas_status_name((int)status); }
const char *gpo_cublasLtGetStatusString(cublasStatus_t status) { return gp_cublas_status_string((int)status); }
