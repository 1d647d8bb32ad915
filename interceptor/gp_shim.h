/* Internal interface of the gpuproxy shim's API surfaces (libcuda.so.1 +
 * libcudart.so.13; interceptor/LAYERS: driver_api and above).
 *
 * The shim is a client of proxyd. Every remoted driver call becomes one "op"
 * in the wire protocol (docs/protocol.md): [fid, ctx, arg...]. The layers
 * below have headers of their own, which this one includes: gp_base.h (lock,
 * log, handle kinds), gp_context.h (context stack, kernel resolver),
 * gp_transport.h (session and ops), gp_memory.h (host memory, slabs, device
 * ranges). A file below the API surfaces includes only the headers of its
 * own layer and lower ones, never this one (tests/test_shim_layers.py).
 *
 * Locking: one process-wide recursive mutex (gp_lock/gp_unlock) protects the
 * batch, the socket and all shim tables. Every exported entry point that talks
 * to the daemon holds it for the whole call, so the order in which threads
 * issue calls is the order in which proxyd executes them. */
#ifndef GP_SHIM_H
#define GP_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "gp_base.h"
#include "gp_context.h"
#include "gp_memory.h"
#include "gp_transport.h"

/* A context was destroyed or reset: forget the library modules and kernel
 * functions loaded in it (they went with it in proxyd). library.c; called
 * by export_tables.c's context-gone hook. */
void gp_library_context_gone(CUcontext ctx);

/* driver.c: loads a module image, named by its SHA-256 digest first (sent
 * whole only when the worker has no copy); digest may be NULL (computed
 * here). fid is the cu* function the application called. */
CUresult gp_module_load_image(uint32_t fid, uint32_t nargs, CUmodule *module, const void *data, size_t n,
                              const uint8_t *digest);
/* driver.c: the size of a module image (ELF, fatbin or PTX text) and where it starts. */
size_t gp_image_size(const void *image, const void **start);

/* proc_address.c: the GPUPROXY_DEBUG line for a symbol with no entry point. */
void gp_proc_note_missing(const char *api, const char *symbol, int version, const void *found);
/* Generated (gp_proc_table.c): symbol lookup for cuGetProcAddress. */
void *gp_proc_lookup(const char *symbol, int cuda_version, int per_thread, int *found_other_version);

#endif
