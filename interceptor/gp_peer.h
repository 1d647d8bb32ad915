/* Several GPUs in one process (peer.c; layer: driver_api). */
#ifndef GP_PEER_H
#define GP_PEER_H

#include <cuda.h>

#include "gp_owner.h"

/* 0 with *dev set when p's device is known (a slab's, or a noted allocation's). */
int gp_owner_of(CUdeviceptr p, CUdevice *dev);

#endif
