/* Which device owns an address, and which contexts enabled peer access to
 * which (split from peer.c so that slab.c and driver.c can use them without
 * a cycle: interceptor/LAYERS, state).
 *
 * Pointer attributes name the device an allocation lives on (cuda.h,
 * CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL; PyTorch asks for it to find a
 * tensor's device). Blocks of slabs are answered by slab.c; the
 * allocations the worker places (cuMemAlloc above the slab threshold,
 * pitched ones) are noted here with the device of the context that made
 * them. An allocation made another way (pools, VMM, IPC) is not here: its
 * device is the current context's, as before (pointer_attrs.c).
 * Guarded by gp_lock. */
#include <stdlib.h>

#include "gp_base.h"
#include "gp_owner.h"

static struct owner { CUdeviceptr base; size_t size; CUdevice dev; } *owners;
static int nowners, capowners;

void gp_owner_note(CUdeviceptr base, size_t size, CUdevice dev)
{
    gp_lock();
    for (int i = 0; i < nowners;)      /* an address range used again: the newest allocation wins */
        if (owners[i].base < base + size && base < owners[i].base + owners[i].size)
            owners[i] = owners[--nowners];
        else
            i++;
    if (nowners == capowners) {
        int cap = capowners ? 2 * capowners : 64;
        struct owner *v = realloc(owners, (size_t)cap * sizeof *v);
        if (!v) {
            gp_unlock();
            return;                    /* the answer falls back to the current context's device */
        }
        owners = v;
        capowners = cap;
    }
    owners[nowners].base = base;
    owners[nowners].size = size;
    owners[nowners].dev = dev;
    nowners++;
    gp_unlock();
}

void gp_owner_forget(CUdeviceptr base)
{
    gp_lock();
    for (int i = 0; i < nowners; i++)
        if (owners[i].base == base) {
            owners[i] = owners[--nowners];
            break;
        }
    gp_unlock();
}


/* 0 with *dev set when p lies in a noted allocation, -1 otherwise. */
int gp_owner_noted(CUdeviceptr p, CUdevice *dev)
{
    int found = -1;
    gp_lock();
    for (int i = 0; i < nowners; i++)
        if (p >= owners[i].base && p < owners[i].base + owners[i].size) {
            *dev = owners[i].dev;
            found = 0;
            break;
        }
    gp_unlock();
    return found;
}


/* ------------------------------------------------ peer-access pairs
 *
 * Which (context, peer context) pairs the application enabled (cuda.h,
 * cuCtxEnablePeerAccess): client state, kept with the process. Guarded by
 * gp_lock. */
#define GP_MAX_PEER_PAIRS 1024

static struct { CUcontext ctx, peer; } pairs[GP_MAX_PEER_PAIRS];
static int npairs;

static int find_pair(CUcontext ctx, CUcontext peer)
{
    for (int i = 0; i < npairs; i++)
        if (pairs[i].ctx == ctx && pairs[i].peer == peer)
            return i;
    return -1;
}

int gp_peer_pair_add(CUcontext ctx, CUcontext peer)
{
    int r = 0;
    gp_lock();
    if (find_pair(ctx, peer) >= 0)
        r = 1;
    else if (npairs == GP_MAX_PEER_PAIRS)
        r = 2;
    else {
        pairs[npairs].ctx = ctx;
        pairs[npairs].peer = peer;
        npairs++;
    }
    gp_unlock();
    return r;
}

int gp_peer_pair_remove(CUcontext ctx, CUcontext peer)
{
    gp_lock();
    int i = find_pair(ctx, peer);
    if (i >= 0)
        pairs[i] = pairs[--npairs];
    gp_unlock();
    return i >= 0 ? 0 : -1;
}

int gp_peer_enabled(CUcontext ctx, CUcontext peer)
{
    gp_lock();
    int on = find_pair(ctx, peer) >= 0;
    gp_unlock();
    return on;
}

void gp_peer_forget(CUcontext ctx)
{
    gp_lock();
    for (int i = 0; i < npairs;)
        if (pairs[i].ctx == ctx || pairs[i].peer == ctx)
            pairs[i] = pairs[--npairs];
        else
            i++;
    gp_unlock();
}
