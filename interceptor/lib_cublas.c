/* Hand-written parts of the libcublas.so.13 stand-in (spec: shim: override
 * in specs/cublas/cublas.yaml); everything else is generated
 * (autogen/gen_lib.py). docs/libraries.md. Locking: the generated gpg_
 * bodies take gp_lock; the tables here are touched under it too. */
#include <stdlib.h>
#include <string.h>

#include "gp_lib_cublas.h"

/* cuda_runtime_api.h: cudaFree(NULL) initialises the runtime's context on
 * the calling thread, as NVIDIA's libcublas does through its own runtime
 * before it creates a handle; the handle belongs to that context. */
extern int cudaFree(void *devPtr);

/* ---------------------------------------------------- coalesced settings
 * PyTorch sets a handle's stream, workspace and math mode before every
 * cuBLAS call (at::cuda::getCurrentCUDABlasHandle), nearly always to the
 * values they already have: measured on the H100 (2026-11-24), 3 settings
 * per gemm, half of all library ops of a GPT step. The shim keeps the
 * values the app wants (want) and the ones proxyd has (sent), and sends
 * only the difference, just before the next call that uses the handle
 * (gp_cublas_flush, called by every generated body on a cuBLAS handle).
 *
 * cublas_api.h semantics kept exactly: cublasSetStream also resets the
 * workspace to the default pool ("cublasSetStream() unconditionally resets
 * the cuBLAS library workspace back to the default workspace pool"), so a
 * flush resends the stream whenever the wanted workspace is the default and
 * proxyd's is not. A failed asynchronous op may have been one of these
 * sets: after any failure (gp_lib_failure_gen) everything is resent.
 * A restore rebuilds proxyd's side from the settings it recorded (what was
 * sent); what was still pending lives in the app and is sent at next use. */
typedef struct {
    uint64_t stream;
    int ws_default;
    uint64_t ws_ptr, ws_size;
    int math;
} cb_settings;

typedef struct cb_handle {
    const void *h;
    cb_settings want, sent;
    uint64_t failures;          /* gp_lib_failure_gen() when sent was last right */
    struct cb_handle *next;
} cb_handle;

static cb_handle *handles;

static cb_handle *find(const void *h)
{
    for (cb_handle *c = handles; c; c = c->next)
        if (c->h == h)
            return c;
    return NULL;
}

static void flush(const void *h)
{
    gp_lock();
    cb_handle *c = find(h);
    if (!c) {
        gp_unlock();
        return;
    }
    uint64_t fails = gp_lib_failure_gen();
    int resend = c->failures != fails;
    cb_settings *w = &c->want, *s = &c->sent;
    if (resend || w->stream != s->stream || (w->ws_default && !s->ws_default)) {
        gpg_cublasSetStream_v2((cublasHandle_t)h, (cudaStream_t)(uintptr_t)w->stream);
        s->stream = w->stream;
        s->ws_default = 1;
    }
    if (!w->ws_default && (resend || s->ws_default || s->ws_ptr != w->ws_ptr || s->ws_size != w->ws_size)) {
        gpg_cublasSetWorkspace_v2((cublasHandle_t)h, (void *)(uintptr_t)w->ws_ptr, (size_t)w->ws_size);
        s->ws_default = 0;
        s->ws_ptr = w->ws_ptr;
        s->ws_size = w->ws_size;
    }
    if (resend || w->math != s->math) {
        gpg_cublasSetMathMode((cublasHandle_t)h, (cublasMath_t)w->math);
        s->math = w->math;
    }
    c->failures = fails;
    gp_unlock();
}

__attribute__((constructor)) static void register_flush(void) { gp_cublas_set_flush_hook(flush); }

cublasStatus_t gpo_cublasCreate_v2(cublasHandle_t *handle)
{
    if (!handle)
        return GP_CUBLAS_INVALID;
    if (cudaFree(NULL) != 0)
        return 1;       /* CUBLAS_STATUS_NOT_INITIALIZED: no usable device */
    cublasStatus_t s = gpg_cublasCreate_v2(handle);
    if (s == GP_CUBLAS_SUCCESS) {
        gp_cublas_note_pointer_mode(*handle, 0);    /* a new handle is in host mode (cublasCreate) */
        cb_handle *c = calloc(1, sizeof *c);
        if (c) {
            /* cublasCreate: NULL stream, default workspace, CUBLAS_DEFAULT_MATH */
            c->h = *handle;
            c->want.ws_default = c->sent.ws_default = 1;
            c->failures = gp_lib_failure_gen();
            gp_lock();
            c->next = handles;
            handles = c;
            gp_unlock();
        }
    }
    return s;
}

cublasStatus_t gpo_cublasDestroy_v2(cublasHandle_t handle)
{
    cublasStatus_t s = gpg_cublasDestroy_v2(handle);
    if (s == GP_CUBLAS_SUCCESS) {
        gp_cublas_forget(handle);
        gp_lock();
        for (cb_handle **p = &handles; *p; p = &(*p)->next)
            if ((*p)->h == handle) {
                cb_handle *c = *p;
                *p = c->next;
                free(c);
                break;
            }
        gp_unlock();
    }
    return s;
}

/* The setters: no op of their own (a handle the shim does not know is one
 * that was destroyed or never made: CUBLAS_STATUS_NOT_INITIALIZED, as
 * cuBLAS answers). */
cublasStatus_t gpo_cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId)
{
    gp_lock();
    cb_handle *c = find(handle);
    if (c) {
        c->want.stream = (uint64_t)(uintptr_t)streamId;
        c->want.ws_default = 1;
    }
    gp_unlock();
    return c ? GP_CUBLAS_SUCCESS : 1;
}

cublasStatus_t gpo_cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t workspaceSizeInBytes)
{
    gp_lock();
    cb_handle *c = find(handle);
    if (c) {
        c->want.ws_default = 0;
        c->want.ws_ptr = (uint64_t)(uintptr_t)workspace;
        c->want.ws_size = workspaceSizeInBytes;
    }
    gp_unlock();
    return c ? GP_CUBLAS_SUCCESS : 1;
}

cublasStatus_t gpo_cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    gp_lock();
    cb_handle *c = find(handle);
    if (c)
        c->want.math = (int)mode;
    gp_unlock();
    return c ? GP_CUBLAS_SUCCESS : 1;
}

/* Answered from the wanted settings: what the app set is what it reads. */
cublasStatus_t gpo_cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode)
{
    if (!mode)
        return GP_CUBLAS_INVALID;
    gp_lock();
    cb_handle *c = find(handle);
    if (c)
        *mode = (cublasMath_t)c->want.math;
    gp_unlock();
    return c ? GP_CUBLAS_SUCCESS : gpg_cublasGetMathMode(handle, mode);
}

cublasStatus_t gpo_cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *streamId)
{
    if (!streamId)
        return GP_CUBLAS_INVALID;
    gp_lock();
    cb_handle *c = find(handle);
    if (c)
        *streamId = (cudaStream_t)(uintptr_t)c->want.stream;
    gp_unlock();
    return c ? GP_CUBLAS_SUCCESS : gpg_cublasGetStream_v2(handle, streamId);
}

cublasStatus_t gpo_cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode)
{
    cublasStatus_t s = gpg_cublasSetPointerMode_v2(handle, mode);
    if (s == GP_CUBLAS_SUCCESS)
        gp_cublas_note_pointer_mode(handle, (int)mode);
    return s;
}

/* cublas_api.h: names and descriptions of cublasStatus_t, answered here (lib_state.c) */
const char *gpo_cublasGetStatusName(cublasStatus_t status) { return gp_cublas_status_name((int)status); }
const char *gpo_cublasGetStatusString(cublasStatus_t status) { return gp_cublas_status_string((int)status); }
