/* Hand-written parts of the libcusparse.so.12 stand-in (spec: shim:
 * override in specs/cusparse/cusparse.yaml). docs/libraries.md. The
 * handle's pointer mode decides how alpha/beta travel (lib_state.c, the
 * same table as cuBLAS's handles). Locking: as lib_cufft.c. */
#include <stdlib.h>

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

/* cusparse.h, cusparseStatus_t: names and descriptions, answered here
 * without a round trip (PyTorch's TORCH_CUDASPARSE_CHECK prints them) */
const char *gpo_cusparseGetErrorName(cusparseStatus_t status)
{
    switch ((int)status) {
    case 0: return "CUSPARSE_STATUS_SUCCESS";
    case 1: return "CUSPARSE_STATUS_NOT_INITIALIZED";
    case 2: return "CUSPARSE_STATUS_ALLOC_FAILED";
    case 3: return "CUSPARSE_STATUS_INVALID_VALUE";
    case 4: return "CUSPARSE_STATUS_ARCH_MISMATCH";
    case 5: return "CUSPARSE_STATUS_MAPPING_ERROR";
    case 6: return "CUSPARSE_STATUS_EXECUTION_FAILED";
    case 7: return "CUSPARSE_STATUS_INTERNAL_ERROR";
    case 8: return "CUSPARSE_STATUS_MATRIX_TYPE_NOT_SUPPORTED";
    case 9: return "CUSPARSE_STATUS_ZERO_PIVOT";
    case 10: return "CUSPARSE_STATUS_NOT_SUPPORTED";
    case 11: return "CUSPARSE_STATUS_INSUFFICIENT_RESOURCES";
    default: return "CUSPARSE_STATUS_UNKNOWN";
    }
}

const char *gpo_cusparseGetErrorString(cusparseStatus_t status)
{
    switch ((int)status) {
    case 0: return "the operation completed successfully";
    case 1: return "the library was not initialized";
    case 2: return "the resources could not be allocated";
    case 3: return "an invalid numeric value was used as an argument";
    case 4: return "the device does not support the feature required";
    case 5: return "an access to GPU memory space failed";
    case 6: return "the GPU program failed to execute";
    case 7: return "an internal operation failed";
    case 8: return "the matrix type is not supported";
    case 9: return "a zero pivot was found";
    case 10: return "the operation or data type combination is not supported";
    case 11: return "the resources for the computation were insufficient";
    default: return "unknown status";
    }
}

/* The legacy matrix descriptor (cusparse.h, cusparseMatDescr_t): four host
 * fields that NVIDIA's library only reads when a legacy routine gets the
 * descriptor; none of those is remoted, so the descriptor lives in the
 * application alone (CuPy makes one for every sparse matrix it builds).
 * Defaults as cusparseCreateMatDescr documents them: general matrix, lower
 * fill mode, non-unit diagonal, zero-based indices (all 0). A restore keeps
 * them with the application's memory. */
typedef struct {
    int magic;
    int type, fill, diag, base;
} gp_mat_descr;

#define GP_MAT_DESCR_MAGIC 0x6d617464
enum { CUSPARSE_STATUS_ALLOC_FAILED = 2, CUSPARSE_STATUS_INVALID_VALUE = 3 };    /* cusparse.h */

static gp_mat_descr *mat(const void *d)
{
    gp_mat_descr *m = (gp_mat_descr *)d;
    return m && m->magic == GP_MAT_DESCR_MAGIC ? m : NULL;
}

cusparseStatus_t gpo_cusparseCreateMatDescr(cusparseMatDescr_t *descrA)
{
    if (!descrA)
        return (cusparseStatus_t)CUSPARSE_STATUS_INVALID_VALUE;
    gp_mat_descr *m = calloc(1, sizeof *m);
    if (!m)
        return (cusparseStatus_t)CUSPARSE_STATUS_ALLOC_FAILED;
    m->magic = GP_MAT_DESCR_MAGIC;
    *descrA = (cusparseMatDescr_t)m;
    return GP_CUSPARSE_SUCCESS;
}

cusparseStatus_t gpo_cusparseDestroyMatDescr(cusparseMatDescr_t descrA)
{
    gp_mat_descr *m = mat(descrA);
    if (m) {
        m->magic = 0;
        free(m);
    }
    return GP_CUSPARSE_SUCCESS;
}

#define MAT_FIELD(Name, field, ctype)                                                         \
    cusparseStatus_t gpo_cusparseSetMat##Name(cusparseMatDescr_t descrA, ctype v)             \
    {                                                                                         \
        gp_mat_descr *m = mat(descrA);                                                        \
        if (!m)                                                                               \
            return (cusparseStatus_t)CUSPARSE_STATUS_INVALID_VALUE;                           \
        m->field = (int)v;                                                                    \
        return GP_CUSPARSE_SUCCESS;                                                           \
    }                                                                                         \
    ctype gpo_cusparseGetMat##Name(const cusparseMatDescr_t descrA)                           \
    {                                                                                         \
        gp_mat_descr *m = mat(descrA);                                                        \
        return (ctype)(m ? m->field : 0);                                                     \
    }

MAT_FIELD(Type, type, cusparseMatrixType_t)
MAT_FIELD(FillMode, fill, cusparseFillMode_t)
MAT_FIELD(DiagType, diag, cusparseDiagType_t)
MAT_FIELD(IndexBase, base, cusparseIndexBase_t)
