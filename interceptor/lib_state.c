/* State the library stand-ins keep in the application (docs/libraries.md):
 * what decides how alpha/beta travel. A host-mode scalar is sent as its
 * value (the worker's copy of the handle is in host mode too, so NVIDIA's
 * library reads the value from the worker's memory); a device-mode scalar is
 * a device address, the same in the app and its worker (session arena).
 *
 * Handles are the ids proxyd hands out ((kind << 32) | id), so a small
 * table keyed by value is enough. Locking: gp_lock around every table
 * access (recursive, so callers holding it are fine). Lives in
 * libcuda.so.1, which exports gp_* to the stand-ins. */
#include <stdlib.h>
#include <string.h>

#include "gp_lib.h"

/* cublas_api.h: CUBLAS_POINTER_MODE_DEVICE = 1. cublasLt.h:
 * CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1, CUBLASLT_MATMUL_DESC_POINTER_MODE = 2;
 * CUBLASLT_POINTER_MODE_HOST = 0, _DEVICE = 1, _DEVICE_VECTOR = 2,
 * _ALPHA_DEVICE_VECTOR_BETA_ZERO = 3, _ALPHA_DEVICE_VECTOR_BETA_HOST = 4. */
enum { CUBLAS_PM_DEVICE = 1 };
enum { LT_DESC_SCALE_TYPE = 1, LT_DESC_POINTER_MODE = 2 };
enum { LT_PM_HOST = 0, LT_PM_ALPHA_DEVICE_VECTOR_BETA_HOST = 4 };

typedef struct lib_obj {
    uint64_t h;
    int pointer_mode;
    int scale_type;
    struct lib_obj *next;
} lib_obj;

static lib_obj *objs;

static lib_obj *find(const void *h, int make)
{
    uint64_t k = (uint64_t)(uintptr_t)h;
    for (lib_obj *o = objs; o; o = o->next)
        if (o->h == k)
            return o;
    if (!make)
        return NULL;
    lib_obj *o = calloc(1, sizeof *o);
    if (!o)
        return NULL;
    o->h = k;
    o->next = objs;
    objs = o;
    return o;
}

static void forget(const void *h)
{
    uint64_t k = (uint64_t)(uintptr_t)h;
    for (lib_obj **p = &objs; *p; p = &(*p)->next)
        if ((*p)->h == k) {
            lib_obj *o = *p;
            *p = o->next;
            free(o);
            return;
        }
}

int gp_cublas_device_mode(const void *h)
{
    gp_lock();
    lib_obj *o = find(h, 0);
    int m = o ? o->pointer_mode == CUBLAS_PM_DEVICE : 0;
    gp_unlock();
    return m;
}

void gp_cublas_note_pointer_mode(const void *h, int mode)
{
    gp_lock();
    lib_obj *o = find(h, 1);
    if (o)
        o->pointer_mode = mode;
    gp_unlock();
}

/* gp_lib_failure_gen (failed asynchronous ops) is counted where they are
 * seen: transport.c. */

static void (*flush_hook)(const void *h);

void gp_cublas_set_flush_hook(void (*fn)(const void *h)) { flush_hook = fn; }

void gp_cublas_flush(const void *h)
{
    if (flush_hook && h)
        flush_hook(h);
}

int gp_cublas_known(const void *h)
{
    gp_lock();
    int k = find(h, 0) != NULL;
    gp_unlock();
    return k;
}

void gp_cublas_forget(const void *h)
{
    gp_lock();
    forget(h);
    gp_unlock();
}

/* library_types.h: cudaDataType values; cublas_api.h: cublasComputeType_t */
static size_t data_type_size(int t)
{
    switch (t) {
    case 0: return 4;    /* CUDA_R_32F */
    case 1: return 8;    /* CUDA_R_64F */
    case 2: return 2;    /* CUDA_R_16F */
    case 3: return 1;    /* CUDA_R_8I */
    case 4: return 8;    /* CUDA_C_32F */
    case 5: return 16;   /* CUDA_C_64F */
    case 6: return 4;    /* CUDA_C_16F */
    case 10: return 4;   /* CUDA_R_32I */
    case 11: return 8;   /* CUDA_C_32I */
    case 14: return 2;   /* CUDA_R_16BF */
    case 15: return 4;   /* CUDA_C_16BF */
    default: return 4;
    }
}

size_t gp_data_type_size(int data_type)
{
    return data_type_size(data_type);
}

/* cusparse.h: CUSPARSE_POINTER_MODE_DEVICE = 1, as cuBLAS's: one table */
int gp_cusparse_device_mode(const void *h)
{
    return gp_cublas_device_mode(h);
}

void gp_cusparse_note_pointer_mode(const void *h, int mode)
{
    gp_cublas_note_pointer_mode(h, mode);
}

size_t gp_cublas_scalar_size(int compute_type, int c_type)
{
    /* complex C: complex scalars (cuBLAS docs, cublasGemmEx "alpha"); C_32F, C_64F, C_16F, C_32I, C_16BF */
    int cplx = c_type == 4 || c_type == 5 || c_type == 6 || c_type == 11 || c_type == 15;
    size_t s;
    switch (compute_type) {
    case 64: case 65: s = 2; break;               /* CUBLAS_COMPUTE_16F(_PEDANTIC): __half */
    case 70: case 71: case 79: s = 8; break;      /* CUBLAS_COMPUTE_64F...: double */
    case 72: case 73: s = 4; break;               /* CUBLAS_COMPUTE_32I...: int */
    default: s = 4; break;                        /* CUBLAS_COMPUTE_32F...: float */
    }
    return cplx ? 2 * s : s;
}

void gp_lt_note_desc(const void *desc, int scale_type)
{
    gp_lock();
    lib_obj *o = find(desc, 1);
    if (o) {
        o->scale_type = scale_type;
        o->pointer_mode = LT_PM_HOST;
    }
    gp_unlock();
}

void gp_lt_note_attr(const void *desc, int attr, const void *buf, size_t size)
{
    if (!buf || size < sizeof(int32_t) || (attr != LT_DESC_SCALE_TYPE && attr != LT_DESC_POINTER_MODE))
        return;
    int32_t v;
    memcpy(&v, buf, sizeof v);
    gp_lock();
    lib_obj *o = find(desc, 1);
    if (o) {
        if (attr == LT_DESC_SCALE_TYPE)
            o->scale_type = v;
        else
            o->pointer_mode = v;
    }
    gp_unlock();
}

void gp_lt_forget(const void *desc)
{
    gp_lock();
    forget(desc);
    gp_unlock();
}

size_t gp_lt_scale_size(const void *desc)
{
    gp_lock();
    lib_obj *o = find(desc, 0);
    size_t s = data_type_size(o ? o->scale_type : 0);
    gp_unlock();
    return s;
}

int gp_lt_device_mode(const void *desc, int which)
{
    gp_lock();
    lib_obj *o = find(desc, 0);
    int m = o ? o->pointer_mode : LT_PM_HOST;
    gp_unlock();
    if (m == LT_PM_HOST)
        return 0;
    if (m == LT_PM_ALPHA_DEVICE_VECTOR_BETA_HOST)
        return which == 0;
    return 1;
}

/* Names and descriptions of cublasStatus_t (cublas_api.h), for both cuBLAS
 * stand-ins: answered in the app, no round trip. */
const char *gp_cublas_status_name(int s)
{
    switch (s) {
    case 0: return "CUBLAS_STATUS_SUCCESS";
    case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
    case 7: return "CUBLAS_STATUS_INVALID_VALUE";
    case 8: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case 11: return "CUBLAS_STATUS_MAPPING_ERROR";
    case 13: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case 14: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case 15: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case 16: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_UNKNOWN";
    }
}

const char *gp_cublas_status_string(int s)
{
    switch (s) {
    case 0: return "the operation completed successfully";
    case 1: return "the library was not initialized";
    case 3: return "the resource allocation failed";
    case 7: return "an invalid numeric value was used as an argument";
    case 8: return "an absent device architectural feature is required";
    case 11: return "an access to GPU memory space failed";
    case 13: return "the GPU program failed to execute";
    case 14: return "an internal operation failed";
    case 15: return "the feature required is not supported";
    case 16: return "the functionality requested requires some license";
    default: return "unknown status";
    }
}

