/* Client-side state below the transport (interceptor/LAYERS: state): the
 * per-thread context stack and what is known of each context (context.c),
 * and the two notifications about handles and contexts that lower files
 * raise and higher files answer (hooks, set by the file named).
 *
 * Locking: the stack is thread-local; the context tables are under gp_lock. */
#ifndef GP_CONTEXT_H
#define GP_CONTEXT_H

#include "gp_base.h"

/* ---- per-thread context stack (driver API semantics, kept in the client) ---- */
CUcontext gp_ctx_current(void);
void gp_ctx_set_current(CUcontext ctx);
int gp_ctx_push(CUcontext ctx);
CUcontext gp_ctx_pop(void);
/* Remembers which device a context belongs to (for cuCtxGetDevice). */
void gp_ctx_note_device(CUcontext ctx, CUdevice dev);
int gp_ctx_device(CUcontext ctx, CUdevice *dev);
void gp_ctx_forget(CUcontext ctx);
/* Primary contexts: noted at cuDevicePrimaryCtxRetain; proxyd keeps a
 * device's primary handle across resets, so the handle stays known. */
void gp_ctx_note_primary(CUcontext ctx, CUdevice dev);
CUcontext gp_ctx_primary_of(CUdevice dev);   /* NULL: never retained */
/* Adds delta to ctx's cuCtxAttach/cuCtxDetach usage count; returns the new count, -1 if unknown. */
int gp_ctx_add_use(CUcontext ctx, int delta);

/* ---- a CUkernel passed as a CUfunction ----
 * The function a CUfunction argument stands for: f itself, or, for a
 * CUkernel (which cuda.h lets callers pass as a CUfunction), that kernel's
 * function in the calling thread's current context, loaded there on first
 * use; NULL when it cannot be had. The kernel part is library.c's (the only
 * file that makes CUkernel handles), through the resolver it registers from
 * its constructor; without one, a kernel handle resolves to NULL. */
CUfunction gp_function_of(CUfunction f);
void gp_set_kernel_resolver(CUfunction (*fn)(CUfunction kernel));
/* At the top of an entry point taking a CUfunction f (before the lock): a
 * CUkernel becomes its function in the current context. */
#define GP_RESOLVE_FUNCTION(f)                                                  \
    do {                                                                        \
        if (((uint64_t)(uintptr_t)(f) >> 32) == GP_K_KERNEL && !((f) = gp_function_of(f))) \
            return CUDA_ERROR_INVALID_HANDLE;                                   \
    } while (0)

/* ---- a context was destroyed or reset ----
 * driver.c calls gp_ctx_gone (without gp_lock held: the hook may call the
 * driver API) after proxyd destroyed or reset ctx; the hook is
 * export_tables.c's gp_cls_context_gone (the library modules of library.c
 * and the static runtime's context-local values go with the context), set
 * from its constructor. */
void gp_ctx_gone(CUcontext ctx);
void gp_set_ctx_gone_hook(void (*fn)(CUcontext ctx));

#endif
