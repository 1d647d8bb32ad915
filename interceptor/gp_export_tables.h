/* Context-local storage of the driver's private tables (export_tables.c). */
#ifndef GP_EXPORT_TABLES_H
#define GP_EXPORT_TABLES_H

#include <stddef.h>

#include <cuda.h>

/* A context was destroyed or reset: forgets the library modules and kernel
 * functions loaded in it (library.c), runs the destructors of the values the
 * static CUDA runtime stored for it and forgets them. Call without gp_lock
 * held (the destructors may call the driver API). driver.c reaches it
 * through gp_ctx_gone (context.c): this file registers it there. */
void gp_cls_context_gone(CUcontext ctx);

/* MD2 (RFC 1319) of len bytes; the hash under the integrity check. */
void gp_md2(const void *msg, size_t len, unsigned char out[16]);

#endif
