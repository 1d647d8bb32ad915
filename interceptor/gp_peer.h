/* Several GPUs in one process (peer.c): which device owns an address. */
#ifndef GP_PEER_H
#define GP_PEER_H

#include <cuda.h>

/* Notes that [base, base + size) is an allocation on dev (replacing any
 * overlapping note); gp_owner_forget drops the note of an allocation freed. */
void gp_owner_note(CUdeviceptr base, size_t size, CUdevice dev);
void gp_owner_forget(CUdeviceptr base);
/* 0 with *dev set when p's device is known (a slab's, or a noted allocation's). */
int gp_owner_of(CUdeviceptr p, CUdevice *dev);
/* The slab holding p: 0 with its device (slab.c). */
int gp_slab_device(CUdeviceptr p, CUdevice *dev);
/* A context that goes away takes its peer-access pairs with it. */
void gp_peer_forget(CUcontext ctx);

#endif
