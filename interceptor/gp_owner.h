/* Which device owns an address; peer-access pairs (owner.c; layer: state).
 * Guarded by gp_lock. */
#ifndef GP_OWNER_H
#define GP_OWNER_H

#include <cuda.h>

/* Notes that [base, base + size) is an allocation on dev (replacing any
 * overlapping note); gp_owner_forget drops the note of an allocation freed. */
void gp_owner_note(CUdeviceptr base, size_t size, CUdevice dev);
void gp_owner_forget(CUdeviceptr base);
/* 0 with *dev set when p lies in a noted allocation, -1 otherwise. */
int gp_owner_noted(CUdeviceptr p, CUdevice *dev);

/* Peer-access pairs: add answers 0, 1 (already there) or 2 (table full);
 * remove 0 or -1 (not there); enabled 1 when ctx enabled access to peer;
 * forget drops every pair of a context that goes away (driver.c, before
 * gp_ctx_forget). */
int gp_peer_pair_add(CUcontext ctx, CUcontext peer);
int gp_peer_pair_remove(CUcontext ctx, CUcontext peer);
int gp_peer_enabled(CUcontext ctx, CUcontext peer);
void gp_peer_forget(CUcontext ctx);

#endif
