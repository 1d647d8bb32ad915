/* Hand-written parts of the libcudnn.so.9 stand-in (spec: shim: override in
 * specs/cudnn/cudnn.yaml); everything else is generated (autogen/gen_lib.py).
 * docs/libraries.md, "cuDNN".
 *
 * The backend (graph) API (cudnn_graph.h, "Backend API"): cudnn-frontend,
 * and so PyTorch, builds each convolution or attention graph out of dozens
 * of descriptors and attribute settings. To keep that cheap:
 *   - cudnnBackendCreateDescriptor picks the descriptor's handle here,
 *     (K_CUDNN_BACKEND_DESC << 32) | n, and sends the creation
 *     asynchronously; proxyd never allocates ids of this kind.
 *   - cudnnBackendSetAttribute and cudnnBackendDestroyDescriptor are
 *     asynchronous too. A failure of an asynchronous create or set
 *     (natively: the status that call returns) is kept by the worker on
 *     the descriptor and answered by the next synchronous call on it,
 *     cudnnBackendFinalize or cudnnBackendGetAttribute, which is where
 *     cudnn-frontend checks. cudnnBackendExecute (asynchronous, like a
 *     kernel) fails at the next synchronising CUDA call
 *     (docs/libraries.md, "Asynchronous calls").
 *   - cudnnBackendFinalize and cudnnBackendGetAttribute are synchronous
 *     (they answer statuses and values), except the finalize of a variant
 *     pack: PyTorch builds one per convolution call (cached plan, fresh
 *     pointers), so it is sent asynchronously and a failure is answered by
 *     the cudnnBackendExecute that uses the pack (reported at the next
 *     synchronising CUDA call). A cached convolution so costs no round trip.
 *
 * Attribute arrays travel as bytes: elementCount elements whose size follows
 * the attribute type (cudnn_graph.h, cudnnBackendAttributeType_t and the
 * cuDNN Backend API reference's type table). Descriptor elements are this
 * shim's handles and cudnnHandle_t elements the shim's cudnn handles; the
 * worker translates both. Device pointers (CUDNN_TYPE_VOID_PTR) are the same
 * addresses in the app and its worker (session arena), except one case: a
 * variant pack's data pointer for a tensor passed by value
 * (CUDNN_ATTR_TENSOR_IS_BY_VALUE; PyTorch's attention scale) points to host
 * memory; its first 8 bytes (the largest scalar type cuDNN passes by value)
 * go along and the worker points cuDNN at its own copy.
 *
 * Locking: gp_lock (recursive) around the descriptor counter and every op. */
#include <stdlib.h>
#include <string.h>

#include "gp_lib_cudnn.h"

extern int cudaFree(void *devPtr);     /* cuda_runtime_api.h; see lib_cublas.c */

/* proxyd/core/protocol.py: K_CUDNN_BACKEND_DESC (tests/test_libraries.py checks both agree) */
#define GP_K_CUDNN_BACKEND_DESC 39ull

/* cudnn_graph.h cudnnStatus_t */
enum {
    ST_SUCCESS = 0,
    ST_BAD_PARAM = 2000,
    ST_BAD_PARAM_NULL_POINTER = 2002,
    ST_BAD_PARAM_ATTRIBUTE_TYPE = 2010,
    ST_ALLOC_FAILED = 4003,     /* CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED */
};
/* cudnn_graph.h cudnnBackendAttributeType_t / cudnnBackendAttributeName_t */
enum { T_HANDLE = 0, T_BOOLEAN = 2, T_INT64 = 3, T_FLOAT = 4, T_DOUBLE = 5, T_VOID_PTR = 6,
       T_BACKEND_DESCRIPTOR = 15, T_INT32 = 23, T_CHAR = 24, T_FRACTION = 26, T_LAST = 30 };
enum { ATTR_VARIANT_PACK_DATA_POINTERS = 1001 };

enum { D_VARIANT_PACK = 16 };   /* cudnnBackendDescriptorType_t */

static uint64_t next_desc;      /* under gp_lock */

/* The live variant packs (few at a time: PyTorch destroys each after its
 * execution). Under gp_lock. */
static uint64_t *packs;
static size_t npacks, cap_packs;

static int pack_index(uint64_t h)
{
    for (size_t i = 0; i < npacks; i++)
        if (packs[i] == h)
            return (int)i;
    return -1;
}

/* Bytes of one element of an attribute of type t, 0 for an unknown type.
 * Enumerated types are C enums (4 bytes), CUDNN_TYPE_BOOLEAN a C++ bool,
 * CUDNN_TYPE_FRACTION cudnnFraction_t (two int64_t). */
static size_t elem_size(unsigned t)
{
    switch (t) {
    case T_HANDLE: case T_INT64: case T_DOUBLE: case T_VOID_PTR: case T_BACKEND_DESCRIPTOR:
        return 8;
    case T_BOOLEAN: case T_CHAR:
        return 1;
    case T_FRACTION:
        return 16;
    case T_FLOAT: case T_INT32:
        return 4;
    default:
        return t <= T_LAST ? 4 : 0;
    }
}

cudnnStatus_t gpo_cudnnCreate(cudnnHandle_t *handle)
{
    if (!handle)
        return ST_BAD_PARAM_NULL_POINTER;
    /* cuDNN creates its handle in the calling thread's current context,
     * initialising the runtime's primary one first (cudnnCreate) */
    if (cudaFree(NULL) != 0)
        return 1001;    /* CUDNN_STATUS_NOT_INITIALIZED */
    return gpg_cudnnCreate(handle);
}

cudnnStatus_t gpo_cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t descriptorType,
                                               cudnnBackendDescriptor_t *descriptor)
{
    if (!descriptor)
        return ST_BAD_PARAM_NULL_POINTER;
    gp_lock();
    if (gp_session() != CUDA_SUCCESS) {
        gp_unlock();
        return GP_CUDNN_UNAVAILABLE;
    }
    if (next_desc >= 0xffffffffull) {
        gp_unlock();
        return ST_ALLOC_FAILED;
    }
    uint64_t h = (GP_K_CUDNN_BACKEND_DESC << 32) | ++next_desc;
    if (descriptorType == D_VARIANT_PACK) {
        if (npacks == cap_packs) {
            size_t nc = cap_packs ? 2 * cap_packs : 16;
            uint64_t *np = realloc(packs, nc * sizeof *np);
            if (!np) {
                gp_unlock();
                return ST_ALLOC_FAILED;
            }
            packs = np;
            cap_packs = nc;
        }
        packs[npacks++] = h;
    }
    gp_buf *b = gp_op_begin(GP_FID_cudnnBackendCreateDescriptor, 2);
    mp_uint(b, (uint64_t)descriptorType);
    mp_uint(b, h);
    int rc = gp_lib_op_async();
    gp_unlock();
    if (rc < 0)
        return GP_CUDNN_UNAVAILABLE;
    *descriptor = (cudnnBackendDescriptor_t)(uintptr_t)h;
    return ST_SUCCESS;
}

cudnnStatus_t gpo_cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor)
{
    if (!descriptor)
        return ST_BAD_PARAM_NULL_POINTER;
    gp_lock();
    if (gp_session() != CUDA_SUCCESS) {
        gp_unlock();
        return GP_CUDNN_UNAVAILABLE;
    }
    int pi = pack_index((uint64_t)(uintptr_t)descriptor);
    if (pi >= 0)
        packs[pi] = packs[--npacks];
    gp_buf *b = gp_op_begin(GP_FID_cudnnBackendDestroyDescriptor, 1);
    mp_uint(b, (uint64_t)(uintptr_t)descriptor);
    int rc = gp_lib_op_async();
    gp_unlock();
    return rc < 0 ? GP_CUDNN_UNAVAILABLE : ST_SUCCESS;
}

cudnnStatus_t gpo_cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor)
{
    if (!descriptor)
        return ST_BAD_PARAM_NULL_POINTER;
    gp_lock();
    int pack = pack_index((uint64_t)(uintptr_t)descriptor) >= 0;
    if (!pack) {
        gp_unlock();
        return gpg_cudnnBackendFinalize(descriptor);
    }
    if (gp_session() != CUDA_SUCCESS) {
        gp_unlock();
        return GP_CUDNN_UNAVAILABLE;
    }
    gp_buf *b = gp_op_begin(GP_FID_cudnnBackendFinalize, 1);
    mp_uint(b, (uint64_t)(uintptr_t)descriptor);
    int rc = gp_lib_op_async();
    gp_unlock();
    return rc < 0 ? GP_CUDNN_UNAVAILABLE : ST_SUCCESS;
}

/* A variant pack data pointer that is neither device memory nor GPU-visible
 * host memory: a by-value scalar in the app's memory (see the file comment). Caller holds gp_lock. */
static int by_value_ptr(const void *p)
{
    if (!p || gp_is_device_ptr(p))
        return 0;
    int kind;
    unsigned flags;
    void *user, *base;
    size_t user_size, size;
    uint32_t id;
    return gp_hostmap_info(p, &kind, &flags, &user, &user_size, &id, &base, &size) != 0;
}

cudnnStatus_t gpo_cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                           cudnnBackendAttributeName_t attributeName,
                                           cudnnBackendAttributeType_t attributeType, int64_t elementCount,
                                           const void *arrayOfElements)
{
    size_t es = elem_size((unsigned)attributeType);
    if (!es)
        return ST_BAD_PARAM_ATTRIBUTE_TYPE;
    if (!descriptor || (elementCount > 0 && !arrayOfElements))
        return ST_BAD_PARAM_NULL_POINTER;
    if (elementCount < 0 || (uint64_t)elementCount > (64u << 20) / es)
        return ST_BAD_PARAM;
    size_t n = (size_t)elementCount * es;
    /* by-value scalars of a variant pack: [index, 8 bytes] pairs */
    uint32_t nbyval = 0;
    gp_lock();          /* by_value_ptr reads the shim's tables */
    if (gp_session() != CUDA_SUCCESS) {
        gp_unlock();
        return GP_CUDNN_UNAVAILABLE;
    }
    if (attributeName == ATTR_VARIANT_PACK_DATA_POINTERS && attributeType == T_VOID_PTR)
        for (int64_t i = 0; i < elementCount; i++)
            nbyval += by_value_ptr(((void *const *)arrayOfElements)[i]);
    gp_buf *b = gp_op_begin(GP_FID_cudnnBackendSetAttribute, 5);
    mp_uint(b, (uint64_t)(uintptr_t)descriptor);
    mp_uint(b, (uint64_t)attributeName);
    mp_uint(b, (uint64_t)attributeType);
    mp_int(b, elementCount);
    if (!nbyval) {
        gp_put_data(b, arrayOfElements, n, 1);
    } else {
        mp_array(b, 2);
        gp_put_data(b, arrayOfElements, n, 1);
        mp_map(b, nbyval);
        for (int64_t i = 0; i < elementCount; i++) {
            const void *p = ((void *const *)arrayOfElements)[i];
            if (by_value_ptr(p)) {
                mp_uint(b, (uint64_t)i);
                mp_bin(b, p, 8);
            }
        }
    }
    int rc = gp_lib_op_async();
    gp_unlock();
    return rc < 0 ? GP_CUDNN_UNAVAILABLE : ST_SUCCESS;
}

cudnnStatus_t gpo_cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                           cudnnBackendAttributeName_t attributeName,
                                           cudnnBackendAttributeType_t attributeType,
                                           int64_t requestedElementCount, int64_t *elementCount,
                                           void *arrayOfElements)
{
    size_t es = elem_size((unsigned)attributeType);
    if (!es)
        return ST_BAD_PARAM_ATTRIBUTE_TYPE;
    if (!descriptor)
        return ST_BAD_PARAM_NULL_POINTER;
    if (requestedElementCount < 0 || (uint64_t)requestedElementCount > (64u << 20) / es)
        return ST_BAD_PARAM;
    size_t n = arrayOfElements ? (size_t)requestedElementCount * es : 0;
    gp_lock();
    if (gp_session() != CUDA_SUCCESS) {
        gp_unlock();
        return GP_CUDNN_UNAVAILABLE;
    }
    /* args: descriptor, name, type, requested count, count wanted, and the
     * array: for descriptor outputs the app's descriptors (created
     * beforehand; cuDNN fills them), otherwise its size in bytes or nil */
    gp_buf *b = gp_op_begin(GP_FID_cudnnBackendGetAttribute, 6);
    mp_uint(b, (uint64_t)(uintptr_t)descriptor);
    mp_uint(b, (uint64_t)attributeName);
    mp_uint(b, (uint64_t)attributeType);
    mp_int(b, requestedElementCount);
    mp_bool(b, elementCount != NULL);
    if (!arrayOfElements)
        mp_nil(b);
    else if (attributeType == T_BACKEND_DESCRIPTOR)
        gp_put_data(b, arrayOfElements, n, 0);
    else
        mp_uint(b, (uint64_t)n);
    gp_reply r;
    if (gp_lib_op_sync(&r) < 0) {
        gp_reply_done(&r);
        gp_unlock();
        return GP_CUDNN_UNAVAILABLE;
    }
    cudnnStatus_t s = (cudnnStatus_t)r.code;
    if (s == ST_SUCCESS && r.have_outs && r.nouts >= 2) {
        if (elementCount)
            gp_out_value(&r, elementCount, sizeof *elementCount);
        else
            gp_out_skip(&r);
        if (arrayOfElements && attributeType != T_BACKEND_DESCRIPTOR)
            gp_out_buffer(&r, arrayOfElements, n);
    }
    gp_reply_done(&r);
    gp_unlock();
    return s;
}

/* Legacy tensor descriptors: the data type of each, for the size of the
 * alpha/beta of calls on it (gp_libraries.h). PyTorch makes and destroys a few
 * per call, so the list stays short. Under gp_lock. */
typedef struct tdesc {
    uint64_t h;
    int dtype;
    struct tdesc *next;
} tdesc;
static tdesc *tdescs;

enum { DATA_DOUBLE = 1 };       /* cudnnDataType_t */

size_t gp_cudnn_scalar_size(const void *desc)
{
    gp_lock();
    int dt = 0;
    for (tdesc *t = tdescs; t; t = t->next)
        if (t->h == (uint64_t)(uintptr_t)desc) {
            dt = t->dtype;
            break;
        }
    gp_unlock();
    return dt == DATA_DOUBLE ? sizeof(double) : sizeof(float);
}

cudnnStatus_t gpo_cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t tensorDesc, cudnnDataType_t dataType, int nbDims,
                                             const int dimA[], const int strideA[])
{
    if (!tensorDesc || (nbDims > 0 && (!dimA || !strideA)))
        return ST_BAD_PARAM_NULL_POINTER;
    if (nbDims <= 0 || nbDims > 8)      /* CUDNN_DIM_MAX */
        return ST_BAD_PARAM;
    cudnnStatus_t s = gpg_cudnnSetTensorNdDescriptor(tensorDesc, dataType, nbDims, dimA, strideA);
    if (s != ST_SUCCESS)
        return s;
    gp_lock();
    tdesc *t = tdescs;
    while (t && t->h != (uint64_t)(uintptr_t)tensorDesc)
        t = t->next;
    if (!t && (t = calloc(1, sizeof *t)) != NULL) {
        t->h = (uint64_t)(uintptr_t)tensorDesc;
        t->next = tdescs;
        tdescs = t;
    }
    if (t)
        t->dtype = (int)dataType;
    gp_unlock();
    return s;
}

cudnnStatus_t gpo_cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc)
{
    gp_lock();
    for (tdesc **p = &tdescs; *p; p = &(*p)->next)
        if ((*p)->h == (uint64_t)(uintptr_t)tensorDesc) {
            tdesc *t = *p;
            *p = t->next;
            free(t);
            break;
        }
    gp_unlock();
    return gpg_cudnnDestroyTensorDescriptor(tensorDesc);
}

/* cudnn_graph.h: cudnnGetErrorString's names, answered here (no round trip) */
const char *gpo_cudnnGetErrorString(cudnnStatus_t status)
{
    switch ((int)status) {
    case 0: return "CUDNN_STATUS_SUCCESS";
    case 1001: return "CUDNN_STATUS_NOT_INITIALIZED";
    case 1002: return "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH";
    case 1003: return "CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH";
    case 1004: return "CUDNN_STATUS_DEPRECATED";
    case 1005: return "CUDNN_STATUS_LICENSE_ERROR";
    case 1006: return "CUDNN_STATUS_RUNTIME_IN_PROGRESS";
    case 1007: return "CUDNN_STATUS_RUNTIME_FP_OVERFLOW";
    case 1008: return "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED";
    case 2000: return "CUDNN_STATUS_BAD_PARAM";
    case 2002: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case 2003: return "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER";
    case 2004: return "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED";
    case 2005: return "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND";
    case 2006: return "CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT";
    case 2007: return "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH";
    case 2008: return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
    case 2009: return "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES";
    case 2010: return "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE";
    case 2011: return "CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH";
    case 2012: return "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE";
    case 3000: return "CUDNN_STATUS_NOT_SUPPORTED";
    case 3001: return "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN";
    case 3002: return "CUDNN_STATUS_NOT_SUPPORTED_SHAPE";
    case 3003: return "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE";
    case 3004: return "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT";
    case 3005: return "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER";
    case 3006: return "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART";
    case 3007: return "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH";
    case 3008: return "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING";
    case 3009: return "CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE";
    case 3010: return "CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT";
    case 3011: return "CUDNN_STATUS_NOT_SUPPORTED_PADDING";
    case 3012: return "CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM";
    case 3013: return "CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API";
    case 3014: return "CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE";
    case 4000: return "CUDNN_STATUS_INTERNAL_ERROR";
    case 4001: return "CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED";
    case 4002: return "CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE";
    case 4003: return "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED";
    case 4004: return "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED";
    case 4005: return "CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM";
    case 4006: return "CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED";
    case 5000: return "CUDNN_STATUS_EXECUTION_FAILED";
    case 5001: return "CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER";
    case 5002: return "CUDNN_STATUS_EXECUTION_FAILED_CUBLAS";
    case 5003: return "CUDNN_STATUS_EXECUTION_FAILED_CUDART";
    case 5004: return "CUDNN_STATUS_EXECUTION_FAILED_CURAND";
    default: return "CUDNN_STATUS_UNKNOWN";
    }
}
