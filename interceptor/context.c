/* The calling thread's context stack (driver API semantics: cuCtxPushCurrent,
 * cuCtxPopCurrent, cuCtxSetCurrent replace the top, cuCtxGetCurrent reads it;
 * CUDA Driver API reference, "Context Management"). It lives in the client,
 * not in proxyd: every op carries the thread's current context, so proxyd
 * needs no per-thread state and a restored process keeps its own stacks.
 *
 * Locking: the stack is thread-local; the context -> device table is under
 * gp_lock. */
#include "gp_shim.h"
#include "gp_peer.h"

#define GP_CTX_DEPTH 64
#define GP_MAX_CTX 1024

static __thread CUcontext stack[GP_CTX_DEPTH];
static __thread int depth;

CUcontext gp_ctx_current(void) { return depth ? stack[depth - 1] : NULL; }

void gp_ctx_set_current(CUcontext ctx)
{
    if (depth == 0) {
        if (ctx)
            stack[depth++] = ctx;
    } else if (ctx) {
        stack[depth - 1] = ctx;
    } else {
        depth--;   /* cuCtxSetCurrent(NULL) pops the current context */
    }
}

int gp_ctx_push(CUcontext ctx)
{
    if (depth == GP_CTX_DEPTH)
        return -1;
    stack[depth++] = ctx;
    return 0;
}

CUcontext gp_ctx_pop(void) { return depth ? stack[--depth] : NULL; }

/* uses: the usage count of the deprecated cuCtxAttach/cuCtxDetach pair
 * (cuda.h: a created context starts at 1, attach adds one, detach removes
 * one and destroys the context at 0). */
static struct { CUcontext ctx; CUdevice dev; int uses; int primary; } devs[GP_MAX_CTX];
static int ndevs;

void gp_ctx_note_device(CUcontext ctx, CUdevice dev)
{
    gp_lock();
    for (int i = 0; i < ndevs; i++)
        if (devs[i].ctx == ctx) {
            devs[i].dev = dev;
            gp_unlock();
            return;
        }
    if (ndevs < GP_MAX_CTX) {
        devs[ndevs].ctx = ctx;
        devs[ndevs].dev = dev;
        devs[ndevs].uses = 1;
        ndevs++;
    }
    gp_unlock();
}

int gp_ctx_device(CUcontext ctx, CUdevice *dev)
{
    int found = -1;
    gp_lock();
    for (int i = 0; i < ndevs; i++)
        if (devs[i].ctx == ctx) {
            *dev = devs[i].dev;
            found = 0;
        }
    gp_unlock();
    return found;
}

void gp_ctx_forget(CUcontext ctx)
{
    gp_peer_forget(ctx);
    gp_lock();
    for (int i = 0; i < ndevs; i++)
        if (devs[i].ctx == ctx) {
            devs[i] = devs[--ndevs];
            break;
        }
    gp_unlock();
    /* cuCtxDestroy (cuda.h): "If the context is current to the calling
     * thread then it is also popped from the current thread's context
     * stack". A program that creates (pushes) and destroys contexts without
     * popping them -- pycuda's tests do, one context per test -- must not
     * fill the stack. Deeper entries stay, as dangling ones do natively,
     * but as NULL: calls made after popping down to one find no context. */
    if (depth && stack[depth - 1] == ctx)
        depth--;
    for (int i = 0; i < depth; i++)
        if (stack[i] == ctx)
            stack[i] = NULL;
}

int gp_ctx_add_use(CUcontext ctx, int delta)
{
    int uses = -1;
    gp_lock();
    for (int i = 0; i < ndevs; i++)
        if (devs[i].ctx == ctx) {
            devs[i].uses += delta;
            uses = devs[i].uses;
            break;
        }
    gp_unlock();
    return uses;
}

void gp_ctx_note_primary(CUcontext ctx, CUdevice dev)
{
    gp_ctx_note_device(ctx, dev);
    gp_lock();
    for (int i = 0; i < ndevs; i++)
        if (devs[i].ctx == ctx)
            devs[i].primary = 1;
    gp_unlock();
}

CUcontext gp_ctx_primary_of(CUdevice dev)
{
    CUcontext c = NULL;
    gp_lock();
    for (int i = 0; i < ndevs; i++)
        if (devs[i].primary && devs[i].dev == dev)
            c = devs[i].ctx;
    gp_unlock();
    return c;
}
