/* State of the library stand-ins that libcuda.so.1 keeps for them
 * (lib_state.c, lib_ids.c, lt_heuristic.c; interceptor/LAYERS: services).
 * The stand-ins themselves (libcublas.so.13, libcublasLt.so.13,
 * libnvidia-ml.so.1, libcufft.so.12, libcurand.so.10, libcusparse.so.12,
 * libcusolver.so.12; docs/libraries.md) include gp_libraries.h.
 *
 * The stand-ins are generated from specs/<library>/ (autogen/gen_lib.py)
 * and talk to proxyd through libcuda.so.1's transport, which exports the
 * gp_* functions below. Locking: every function here takes gp_lock (the
 * shim's one recursive lock, gp_base.h) for its tables; callers may hold it. */
#ifndef GP_LIB_H
#define GP_LIB_H

#include <stddef.h>
#include <stdint.h>

#include "gp_transport.h"

/* The ops themselves (gp_lib_op_sync, gp_lib_op_async) and the count of
 * failed asynchronous ops (gp_lib_failure_gen) are the transport's
 * (gp_transport.h). */

/* cuBLAS pointer mode per handle (cublas_api.h, cublasSetPointerMode): 1
 * when alpha/beta of calls on h are device pointers. lib_state.c. */
int gp_cublas_device_mode(const void *h);
void gp_cublas_note_pointer_mode(const void *h, int mode);
void gp_cublas_forget(const void *h);
/* Coalesced cuBLAS settings (lib_cublas.c): sends h's pending stream,
 * workspace and math mode if they differ from what proxyd has; no-op for
 * other handles. The cuBLAS stand-in registers the function (lib_state.c),
 * so the cuBLASLt stand-in can flush a cuBLAS handle passed as its own. */
void gp_cublas_flush(const void *h);
void gp_cublas_set_flush_hook(void (*fn)(const void *h));
/* 1 when h is a live cuBLAS handle of this process */
int gp_cublas_known(const void *h);
/* Bytes of alpha/beta of cublasGemmEx-like calls: the scalar type follows
 * the compute type, complex when C is (cuBLAS docs, cublasGemmEx). */
size_t gp_cublas_scalar_size(int compute_type, int c_type);

/* cuSPARSE pointer mode per handle (cusparse.h, cusparseSetPointerMode;
 * CUSPARSE_POINTER_MODE_DEVICE = 1 like cuBLAS's): the same table as the
 * cuBLAS handles (their values never collide: (kind << 32) | id), freed
 * with gp_cublas_forget. lib_state.c. */
int gp_cusparse_device_mode(const void *h);
void gp_cusparse_note_pointer_mode(const void *h, int mode);
/* Bytes of one value of a cudaDataType_t (library_types.h): alpha/beta of
 * cusparseSpMV/SpMM are of the compute type. lib_state.c. */
size_t gp_data_type_size(int data_type);
/* Bytes of one value of an ncclDataType_t (nccl.h), 0 if unknown. lib_nccl.c. */
size_t gp_nccl_type_size(int datatype);

/* cuBLASLt matmul descriptors: scale type (the type of alpha/beta) and
 * pointer mode (cublasLt.h, CUBLASLT_MATMUL_DESC_SCALE_TYPE and
 * CUBLASLT_MATMUL_DESC_POINTER_MODE). lib_state.c. */
void gp_lt_note_desc(const void *desc, int scale_type);
void gp_lt_note_attr(const void *desc, int attr, const void *buf, size_t size);
void gp_lt_forget(const void *desc);
size_t gp_lt_scale_size(const void *desc);
/* which: 0 alpha, 1 beta; 1 when that scalar is a device pointer */
int gp_lt_device_mode(const void *desc, int which);

/* Handles the shim names (spec `ids: shim`; lib_ids.c): (kind << 32) | id
 * with bit 31 of id set; freed ids are reused. */
uint64_t gp_lib_new_handle(uint32_t kind);
void gp_lib_free_handle(const void *h);
int gp_lib_is_shim_handle(const void *h);

/* cuBLASLt descriptors' contents and the heuristic cache (lt_heuristic.c).
 * kind: the protocol kind code; args: the create call's scalars. */
/* 0, or < 0 (unknown descriptor: -1; out of memory: -2) */
int gp_lt_state_create(const void *h, int kind, const void *args, size_t nargs);
int gp_lt_state_attr(const void *h, int attr, const void *buf, size_t n);
void gp_lt_state_forget(const void *h);
/* 1 with the descriptor's kind, create arguments and attribute count */
int gp_lt_state_get(const void *h, int *kind, const void **args, size_t *nargs, size_t *nattrs);
int gp_lt_state_attr_at(const void *h, size_t i, int *id, const void **v, size_t *n);
/* The identity of proxyd's copy of descriptor h (lib_cublaslt.c): kind,
 * create arguments and attributes, device-pointer values left out. 0 with
 * *key (the caller frees it), its length and hash; -1 for a descriptor the
 * shim does not know or no memory. */
int gp_lt_copy_key(const void *h, unsigned char **key, size_t *n, uint64_t *hash);
/* 1 for matmul descriptor attributes that hold device pointers */
int gp_lt_pointer_attr(int id);
/* descs6: operation descriptor, A, B, C, D layouts, preference */
int gp_lt_heuristic_find(const void *ctx, const void *handle, const void *const descs6[6], int requested,
                         void *results, size_t result_size, int *count);
void gp_lt_heuristic_store(const void *ctx, const void *handle, const void *const descs6[6], int requested,
                           const void *results, size_t result_size, int count);

/* cublas_api.h: names and descriptions of cublasStatus_t. lib_state.c. */
const char *gp_cublas_status_name(int s);
const char *gp_cublas_status_string(int s);

#endif
