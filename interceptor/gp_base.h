/* Bottom layer of the shim (interceptor/LAYERS: base): what every other
 * file may use and what itself uses nothing of the shim's own: the process
 * lock, diagnostics, the kinds of client-visible handles, SHA-256, turning
 * shared memory private and back. Everything above includes this header.
 *
 * Locking: gp_lock is one process-wide recursive mutex. It protects the
 * transport's batch and socket and all shim tables; every exported entry
 * point that talks to proxyd holds it for the whole call, so the order in
 * which threads issue calls is the order in which proxyd executes them. */
#ifndef GP_BASE_H
#define GP_BASE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "gp_msgpack.h"

#define GP_EXPORT __attribute__((visibility("default")))

/* Object kinds of client-visible handles; must match proxyd/protocol.py. A
 * handle value is (kind << 32) | id, so it is never NULL and never one of the
 * special stream values CU_STREAM_LEGACY (0x1) / CU_STREAM_PER_THREAD (0x2). */
enum gp_kind {
    GP_K_CONTEXT = 1,
    GP_K_MODULE = 2,
    GP_K_FUNCTION = 3,
    GP_K_STREAM = 4,
    GP_K_EVENT = 5,
    /* kinds the shim hands out itself (never sent to proxyd): CUlibrary and
     * CUkernel of the library API (library.c) */
    GP_K_LIBRARY = 16,
    GP_K_KERNEL = 17,
};

/* ---- the process lock (lock.c) ---- */
void gp_lock(void);
void gp_unlock(void);
int gp_trylock(void);               /* 0 when taken (park.c) */
/* The gate (park.c): while closed, a thread that does not hold the lock
 * waits before taking it, so that a thread that wants to park gets the lock
 * as soon as the call in progress ends, instead of racing threads that
 * re-take it at once (a mutex is not fair). */
void gp_lock_gate(int closed);
long long gp_lock_gate_first_wait(void);    /* lock.c: when a thread first waited at the closed gate */
/* Registers fn to run in the child after a fork(), once the lock is a fresh
 * unlocked mutex again (pthread_atfork's child handler, installed at the
 * first gp_lock: a process that never took the lock runs none). Called
 * from constructors only (single-threaded, before any entry point runs);
 * the functions run in the order registered, at most GP_FORK_HOOKS. */
#define GP_FORK_HOOKS 8
void gp_on_fork_child(void (*fn)(void));

/* ---- diagnostics (log.c) ---- */
/* One stderr line "gpuproxy: ...". */
void gp_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The one stderr line of an unsupported entry point, naming it. */
void gp_warn_unsupported(const char *fn);
/* GPUPROXY_DEBUG, as transport.c read it when the session started (0 before). */
int gp_debug_enabled(void);
void gp_set_debug(int on);

/* ---- sha256.c: the SHA-256 digest of n bytes ---- */
void gp_sha256(const void *data, size_t n, uint8_t out[32]);

/* shm_name.c: the public id that names a session's shared memory in /dev/shm
 * (16 hex digits of SHA-256("gpuproxy shm\0" token), '-', pid): no token in
 * world-readable names (issue 21). Thread-local result. */
const char *gp_shm_id_of(const char *token);

/* ---- shm_private.c: shared segments around a whole-process checkpoint ---- */
/* Replaces the shared mapping [base, base+size) by private memory with the
 * same bytes at the same address and unlinks name (when not empty). 0 / -1. */
int gp_shm_to_private(void *base, size_t size, const char *name);
/* The reverse: segment `name` again, holding the bytes, mapped shared at base. */
int gp_shm_from_private(void *base, size_t size, const char *name);

/* ---- pmemcpy.c: memcpy spread over helper threads (large staging copies) ---- */
void gp_pmemcpy(void *dst, const void *src, size_t n);

/* Generated (gp_errors_cu.c): the name of a CUresult. */
const char *gp_cu_error_name(CUresult e);

#endif
