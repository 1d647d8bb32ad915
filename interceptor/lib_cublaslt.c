/* Hand-written parts of the libcublasLt.so.13 stand-in (spec: shim:
 * override in specs/cublaslt/cublaslt.yaml). docs/libraries.md, "cuBLASLt
 * descriptors".
 *
 * PyTorch builds a matmul descriptor, four layouts and a preference around
 * every cuBLASLt matmul and destroys them after it (about 20 calls per
 * matmul, measured on the H100 with GPUPROXY_PROFILE, 2026-11-24). Sending
 * each to proxyd made the descriptors a third of all ops of a training
 * step. So the app's descriptors live only in the shim (lt_heuristic.c
 * keeps their creation arguments and attributes), under handles the shim
 * chooses (lib_ids.c); creating, setting and destroying them costs no op.
 * When a call needs one in proxyd (a matmul, a heuristic question the
 * cache cannot answer, a get-attribute), realize() finds or makes proxyd's
 * copy: copies are shared by content, so the descriptors PyTorch rebuilds
 * for every step map to the few proxyd already has. Device-pointer
 * attributes (bias, aux, scale pointers) are not part of a copy's identity:
 * they are set on the copy when they differ from what it has.
 *
 * Errors: what only NVIDIA's library can judge (an attribute id or size it
 * does not know) shows when the copy is made, as the asynchronous failure
 * of the call that needed it (reported at the next synchronising CUDA call,
 * like a failed launch); what the shim can judge (NULL pointers, unknown
 * descriptors) fails at once.
 *
 * Checkpoints: proxyd's copies are library objects like any (created under
 * shim-chosen handles, settings recorded), so a restore brings them back
 * under the same handles; the app's descriptors are app memory.
 *
 * Locking: everything under gp_lock (the generated bodies take it too; it
 * is recursive). Protocol kind codes: proxyd/core/protocol.py. */
#include <stdlib.h>
#include <string.h>

#include "gp_lib_cublaslt.h"

enum { K_MATMUL_DESC = 34, K_LAYOUT = 35, K_PREFERENCE = 36 };
enum { LT_DESC_SCALE_TYPE = 1 };                    /* cublasLt.h */
#define CUBLAS_ALLOC_FAILED 3                       /* cublas_api.h */

extern int cudaFree(void *devPtr);     /* cuda_runtime_api.h; see lib_cublas.c */

cublasStatus_t gpo_cublasLtCreate(cublasLtHandle_t *lightHandle)
{
    if (!lightHandle)
        return GP_CUBLASLT_INVALID;
    if (cudaFree(NULL) != 0)
        return 1;       /* CUBLAS_STATUS_NOT_INITIALIZED */
    return gpg_cublasLtCreate(lightHandle);
}

/* ------------------------------------------------------ proxyd's copies */

#define RZ_BUCKETS 256
#define RZ_MAX 1024             /* copies kept; then all go and are made again on demand */
#define RZ_PTRS 16

typedef struct rz_copy {
    uint64_t hash;
    unsigned char *key;
    size_t nkey;
    int kind;
    void *wh;                   /* proxyd's handle */
    int nptr;                   /* device-pointer attributes as last set on the copy */
    int ptr_id[RZ_PTRS];
    uint64_t ptr_val[RZ_PTRS];
    struct rz_copy *next;
} rz_copy;

static rz_copy *copies[RZ_BUCKETS];
static size_t ncopies;

static void destroy_copy(rz_copy *c)
{
    if (c->kind == K_MATMUL_DESC) {
        gpg_cublasLtMatmulDescDestroy(c->wh);
        gp_lt_forget(c->wh);
    } else if (c->kind == K_LAYOUT) {
        gpg_cublasLtMatrixLayoutDestroy(c->wh);
    } else {
        gpg_cublasLtMatmulPreferenceDestroy(c->wh);
    }
    gp_lib_free_handle(c->wh);
    free(c->key);
    free(c);
}

static void drop_all_copies(void)
{
    for (size_t b = 0; b < RZ_BUCKETS; b++) {
        for (rz_copy *c = copies[b], *nx; c; c = nx) {
            nx = c->next;
            destroy_copy(c);
        }
        copies[b] = NULL;
    }
    ncopies = 0;
}

static cublasStatus_t set_attr(int kind, void *wh, int id, const void *v, size_t n)
{
    if (kind == K_MATMUL_DESC) {
        gp_lt_note_attr(wh, id, v, n);      /* scale type, pointer mode: how alpha/beta travel */
        return gpg_cublasLtMatmulDescSetAttribute(wh, (cublasLtMatmulDescAttributes_t)id, v, n);
    }
    if (kind == K_LAYOUT)
        return gpg_cublasLtMatrixLayoutSetAttribute(wh, (cublasLtMatrixLayoutAttribute_t)id, v, n);
    return gpg_cublasLtMatmulPreferenceSetAttribute(wh, (cublasLtMatmulPreferenceAttributes_t)id, v, n);
}

/* proxyd's handle for the app's descriptor h; h itself when the shim does
 * not know it (proxyd then answers for an invalid handle). */
static void *realize(const void *h)
{
    int kind;
    const void *args;
    size_t nargs, nattrs;
    if (!h || !gp_lt_state_get(h, &kind, &args, &nargs, &nattrs))
        return (void *)h;
    unsigned char *key;
    size_t nkey;
    uint64_t hash;
    if (gp_lt_copy_key(h, &key, &nkey, &hash) != 0)
        return (void *)h;
    gp_lock();
    rz_copy *c = copies[hash % RZ_BUCKETS];
    while (c && !(c->hash == hash && c->nkey == nkey && !memcmp(c->key, key, nkey)))
        c = c->next;
    if (c) {
        free(key);
    } else {
        if (ncopies >= RZ_MAX)
            drop_all_copies();
        c = calloc(1, sizeof *c);
        if (!c) {
            free(key);
            gp_unlock();
            return (void *)h;
        }
        c->hash = hash;
        c->key = key;
        c->nkey = nkey;
        c->kind = kind;
        if (kind == K_MATMUL_DESC) {
            int32_t a[2];
            memcpy(a, args, sizeof a);
            gpg_cublasLtMatmulDescCreate((cublasLtMatmulDesc_t *)&c->wh, (cublasComputeType_t)a[0],
                                         (cudaDataType_t)a[1]);
            gp_lt_note_desc(c->wh, a[1]);
        } else if (kind == K_LAYOUT) {
            uint64_t a[4];
            memcpy(a, args, sizeof a);
            gpg_cublasLtMatrixLayoutCreate((cublasLtMatrixLayout_t *)&c->wh, (cudaDataType)a[0], a[1], a[2],
                                           (int64_t)a[3]);
        } else {
            gpg_cublasLtMatmulPreferenceCreate((cublasLtMatmulPreference_t *)&c->wh);
        }
        for (size_t i = 0; i < nattrs; i++) {
            int id;
            const void *v;
            size_t n;
            gp_lt_state_attr_at(h, i, &id, &v, &n);
            if (!(kind == K_MATMUL_DESC && gp_lt_pointer_attr(id) && n == sizeof(uint64_t)))
                set_attr(kind, c->wh, id, v, n);
        }
        c->next = copies[hash % RZ_BUCKETS];
        copies[hash % RZ_BUCKETS] = c;
        ncopies++;
    }
    /* device-pointer attributes: set where the copy differs (same ids by the key) */
    if (kind == K_MATMUL_DESC) {
        for (size_t i = 0; i < nattrs; i++) {
            int id;
            const void *v;
            size_t n;
            gp_lt_state_attr_at(h, i, &id, &v, &n);
            if (!gp_lt_pointer_attr(id) || n != sizeof(uint64_t))
                continue;
            uint64_t val;
            memcpy(&val, v, sizeof val);
            int j = 0;
            while (j < c->nptr && c->ptr_id[j] != id)
                j++;
            if (j < c->nptr && c->ptr_val[j] == val)
                continue;
            set_attr(kind, c->wh, id, v, n);
            if (j == c->nptr && c->nptr < RZ_PTRS)
                c->ptr_id[c->nptr++] = id;
            if (j < c->nptr)
                c->ptr_val[j] = val;
        }
    }
    void *wh = c->wh;
    gp_unlock();
    return wh;
}

/* ------------------------------------------- the app's descriptors: local */

static cublasStatus_t make_local(void **out, int kind, const void *args, size_t nargs)
{
    if (!out)
        return GP_CUBLASLT_INVALID;
    void *h = (void *)(uintptr_t)gp_lib_new_handle((uint32_t)kind);
    if (gp_lt_state_create(h, kind, args, nargs) != 0) {
        gp_lib_free_handle(h);
        return CUBLAS_ALLOC_FAILED;
    }
    *out = h;
    return GP_CUBLASLT_SUCCESS;
}

static cublasStatus_t set_local(const void *h, int id, const void *buf, size_t n)
{
    if (!buf && n)
        return GP_CUBLASLT_INVALID;
    int rc = gp_lt_state_attr(h, id, buf, n);
    return rc == 0 ? GP_CUBLASLT_SUCCESS : rc == -1 ? GP_CUBLASLT_INVALID : CUBLAS_ALLOC_FAILED;
}

static cublasStatus_t destroy_local(const void *h)
{
    int kind;
    const void *args;
    size_t nargs, nattrs;
    if (h && gp_lt_state_get(h, &kind, &args, &nargs, &nattrs)) {
        gp_lt_state_forget(h);
        gp_lib_free_handle(h);
    }
    return GP_CUBLASLT_SUCCESS;     /* cublasLt.h: destroying NULL is allowed */
}

cublasStatus_t gpo_cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc, cublasComputeType_t computeType,
                                            cudaDataType_t scaleType)
{
    int32_t a[2] = { (int32_t)computeType, (int32_t)scaleType };
    return make_local((void **)matmulDesc, K_MATMUL_DESC, a, sizeof a);
}

cublasStatus_t gpo_cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) { return destroy_local(matmulDesc); }

cublasStatus_t gpo_cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                  cublasLtMatmulDescAttributes_t attr, const void *buf,
                                                  size_t sizeInBytes)
{
    return set_local(matmulDesc, (int)attr, buf, sizeInBytes);
}

cublasStatus_t gpo_cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type, uint64_t rows,
                                              uint64_t cols, int64_t ld)
{
    uint64_t a[4] = { (uint64_t)type, rows, cols, (uint64_t)ld };
    return make_local((void **)matLayout, K_LAYOUT, a, sizeof a);
}

cublasStatus_t gpo_cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) { return destroy_local(matLayout); }

cublasStatus_t gpo_cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                    cublasLtMatrixLayoutAttribute_t attr, const void *buf,
                                                    size_t sizeInBytes)
{
    return set_local(matLayout, (int)attr, buf, sizeInBytes);
}

cublasStatus_t gpo_cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    return make_local((void **)pref, K_PREFERENCE, NULL, 0);
}

cublasStatus_t gpo_cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) { return destroy_local(pref); }

/* The soname major this copy of the stand-in answers: 13, or an older one's
 * (libcublasLt.so.11 links an object of autogen/lib_majors.py defining it;
 * weak and undefined, hence NULL, in libcublasLt.so.13). */
extern const int gp_lib_abi_major __attribute__((weak));

static int abi_major(void) { return &gp_lib_abi_major ? gp_lib_abi_major : 13; }

cublasStatus_t gpo_cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                        cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                        size_t sizeInBytes)
{
    /* cuBLASLt 11's CUBLASLT_MATMUL_PREF_SM_COUNT_TARGET (13) is
     * CUBLASLT_MATMUL_PREF_GROUPED_AVERAGE_REDUCTION_DIM in 13's cublasLt.h:
     * forwarded, it would set another attribute (specs/abi/library_majors.yaml) */
    if (abi_major() == 11 && (int)attr == 13) {
        gp_warn_unsupported("cublasLtMatmulPreferenceSetAttribute(CUBLASLT_MATMUL_PREF_SM_COUNT_TARGET of cuBLASLt 11)");
        return 15;      /* CUBLAS_STATUS_NOT_SUPPORTED */
    }
    return set_local(pref, (int)attr, buf, sizeInBytes);
}

/* Queries go to proxyd's copy: it also knows the attributes nobody set. */
cublasStatus_t gpo_cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                  cublasLtMatmulDescAttributes_t attr, void *buf, size_t sizeInBytes,
                                                  size_t *sizeWritten)
{
    return gpg_cublasLtMatmulDescGetAttribute(realize(matmulDesc), attr, buf, sizeInBytes, sizeWritten);
}

cublasStatus_t gpo_cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                    cublasLtMatrixLayoutAttribute_t attr, void *buf,
                                                    size_t sizeInBytes, size_t *sizeWritten)
{
    return gpg_cublasLtMatrixLayoutGetAttribute(realize(matLayout), attr, buf, sizeInBytes, sizeWritten);
}

/* --------------------------------------------------- heuristic, matmul */

cublasStatus_t gpo_cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                                  cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                                  cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                                  cublasLtMatmulPreference_t preference, int requestedAlgoCount,
                                                  cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                                  int *returnAlgoCount)
{
    const void *d6[6] = { operationDesc, Adesc, Bdesc, Cdesc, Ddesc, preference };
    const void *ctx = gp_ctx_current();
    int cacheable = requestedAlgoCount > 0 && heuristicResultsArray && returnAlgoCount;
    if (cacheable && gp_lt_heuristic_find(ctx, lightHandle, d6, requestedAlgoCount, heuristicResultsArray,
                                          sizeof heuristicResultsArray[0], returnAlgoCount))
        return GP_CUBLASLT_SUCCESS;
    gp_lock();
    cublasStatus_t s = gpg_cublasLtMatmulAlgoGetHeuristic(lightHandle, realize(operationDesc), realize(Adesc),
                                                          realize(Bdesc), realize(Cdesc), realize(Ddesc),
                                                          realize(preference), requestedAlgoCount,
                                                          heuristicResultsArray, returnAlgoCount);
    gp_unlock();
    if (s == GP_CUBLASLT_SUCCESS && cacheable)
        gp_lt_heuristic_store(ctx, lightHandle, d6, requestedAlgoCount, heuristicResultsArray,
                              sizeof heuristicResultsArray[0], *returnAlgoCount);
    return s;
}

cublasStatus_t gpo_cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void *alpha,
                                  const void *A, cublasLtMatrixLayout_t Adesc, const void *B,
                                  cublasLtMatrixLayout_t Bdesc, const void *beta, const void *C,
                                  cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,
                                  const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspaceSizeInBytes,
                                  cudaStream_t stream)
{
    gp_lock();
    cublasStatus_t s = gpg_cublasLtMatmul(lightHandle, realize(computeDesc), alpha, A, realize(Adesc), B,
                                          realize(Bdesc), beta, C, realize(Cdesc), D, realize(Ddesc), algo, workspace,
                                          workspaceSizeInBytes, stream);
    gp_unlock();
    return s;
}

/* cublasLt.h: the same cublasStatus_t names (lib_state.c) */
const char *gpo_cublasLtGetStatusName(cublasStatus_t status) { return gp_cublas_status_name((int)status); }
const char *gpo_cublasLtGetStatusString(cublasStatus_t status) { return gp_cublas_status_string((int)status); }
