/* CUDA graphs built explicitly, driver API (cuda.h, "Graph Management"):
 * cuGraphAdd{Kernel,Memcpy,Memset,Host,ChildGraph,Empty,EventRecord,
 * EventWait}Node (cuGraphAddNode: graph_add_node.c; memory nodes:
 * graph_mem.c), node and
 * executable-node parameter
 * setters, dependencies and topology queries, cuGraphExecUpdate,
 * cuGraphInstantiateWithParams. proxyd keeps the graphs (proxyd/
 * graph_nodes.py).
 *
 * A node that does work travels as the op the equivalent stream call would
 * send (docs/protocol.md), nested in the add call's op and with stream 0:
 * a kernel node is cuLaunchKernel's op, its parameters packed by the
 * function's layout exactly like a launch's (gp_launch_args: kernelParams
 * or `extra`); a memcpy node is cuMemcpy{DtoD,HtoD,DtoH}Async's op; a
 * memset node cuMemsetD{8,16,32}Async's; a host node cuLaunchHostFunc's
 * (hostfn.c keeps the function in its table). The worker runs these ops on
 * the launch stream when the executable graph is launched.
 *
 * A memcpy node with pageable host memory, which the worker cannot reach,
 * goes through a page-locked bounce buffer of its own (a hostmem.c segment)
 * and a host function that runs in the application, in graph order: before
 * a host-to-device copy it copies the application's bytes into the buffer,
 * after a device-to-host copy it copies the buffer's bytes out. The node
 * then carries two ops. Buffer and function live as long as the process
 * (a node's parameters may be copied into any number of clones and
 * executable graphs); nodes that copy the same application bytes the same
 * way share them (bounce_for).
 *
 * What is refused, with CUDA_ERROR_NOT_SUPPORTED and one stderr line:
 * copies between CUDA arrays, non-contiguous 2D/3D copies, host-to-host
 * copies, 2D memsets (height > 1), node types other than those above and
 * the memory nodes of cuGraphAddNode (graph_mem.c).
 *
 * Locking: every entry takes gp_lock (GP_ENTER) for the whole call, so the
 * nested op is built and sent under it. CUkernel arguments are resolved to
 * functions before the lock is taken (GP_RESOLVE_FUNCTION). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gp_gen.h"
#include "gp_launch.h"
#include "gp_shim.h"

/* hostfn.c: keeps fn/userData for a host node; where the gate is */
CUresult gp_hostfn_node(void *fn, void *user, uint64_t *id, uint32_t *seg, uint64_t *off, uint64_t *len);

static void put_nodes(gp_buf *b, const CUgraphNode *nodes, size_t n)
{
    mp_array(b, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        gp_put_handle(b, nodes[i]);
}

static CUresult refuse(const char *fn, const char *why)
{
    char msg[256];
    snprintf(msg, sizeof msg, "%s (%s)", fn, why);
    gp_warn_unsupported(msg);
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---------------------------------------------------------------- payloads
 * A payload is a node's nested op [fid, ctx, args...]; p_* prepare it
 * (anything that can fail, before the outer op is begun) and w_* write it. */

typedef struct payload {
    int kind;                   /* PL_* */
    uint32_t fid;
    CUfunction f;               /* kernel */
    unsigned grid[3], block[3], shmem;
    const void *buf;            /* kernel: packed arguments */
    size_t n;
    uint8_t small[4096];
    int owned;                  /* buf is malloc'ed */
    CUdeviceptr dst, src;       /* memcpy (device sides), memset */
    uint32_t seg;               /* memcpy: the host side's shared segment */
    uint64_t off;
    unsigned value;             /* memset */
    size_t pitch, height;       /* memset: rows (height > 1: a 2D memset op) */
    uint64_t id;                /* host (and bounce): the table id */
    uint32_t gate_seg;          /* bounce: where the host-function gate is */
    uint64_t gate_off;
    uint64_t gate_len;          /* host: bytes of the gate */
    int bounce;                 /* memcpy with pageable memory: the host function's op goes with it */
} payload;

enum { PL_NONE, PL_KERNEL, PL_DTOD, PL_HTOD, PL_DTOH, PL_MEMSET, PL_HOST };

static void pl_done(payload *p)
{
    if (p->owned)
        free((void *)p->buf);
    p->owned = 0;
}

/* caller holds the lock */
static CUresult p_kernel(payload *p, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, unsigned shmem, void **kernelParams, void **extra)
{
    if (!f)
        return CUDA_ERROR_INVALID_VALUE;
    if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0)
        return CUDA_ERROR_INVALID_VALUE;
    p->kind = PL_KERNEL;
    p->fid = GP_FID_cuLaunchKernel;
    p->f = f;
    p->grid[0] = gx, p->grid[1] = gy, p->grid[2] = gz;
    p->block[0] = bx, p->block[1] = by, p->block[2] = bz;
    p->shmem = shmem;
    CUresult rc = gp_launch_args(f, kernelParams, extra, p->small, sizeof p->small, &p->buf, &p->n);
    if (rc == CUDA_SUCCESS && (kernelParams || !extra) && p->buf != p->small)
        p->owned = 1;
    return rc;
}

/* A pageable side of a memcpy node: the bounce buffer and the host
 * function that moves the bytes between it and the application's memory
 * (hostfn.c runs it in the application, in graph order). */
typedef struct bounce {
    void *app, *pinned;
    size_t n;
    int to_pinned;          /* host-to-device: application -> buffer, before the copy */
} bounce;

static void CUDA_CB bounce_run(void *arg)
{
    bounce *b = arg;
    if (b->to_pinned)
        memcpy(b->pinned, b->app, b->n);
    else
        memcpy(b->app, b->pinned, b->n);
}

/* Bounce buffers made so far; one per (application address, size,
 * direction), shared by every node that copies the same bytes the same way,
 * so that building graphs again and again does not grow them (the ops of one
 * node run back to back: a shared buffer is never used by two nodes at
 * once within a stream). Guarded by gp_lock; never freed (see the top). */
static bounce **bounces;
static size_t nbounces;

/* caller holds the lock and has a session */
static CUresult bounce_for(payload *p, void *app, size_t n, int to_pinned)
{
    bounce *b = NULL;
    for (size_t i = 0; i < nbounces && !b; i++)
        if (bounces[i]->app == app && bounces[i]->n == n && bounces[i]->to_pinned == to_pinned)
            b = bounces[i];
    if (!b) {
        bounce **grown = realloc(bounces, (nbounces + 1) * sizeof *bounces);
        if (!grown)
            return CUDA_ERROR_OUT_OF_MEMORY;
        bounces = grown;
        b = calloc(1, sizeof *b);
        void *buf = b ? gp_host_alloc(n) : NULL;
        if (!buf) {
            free(b);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        b->app = app, b->pinned = buf, b->n = n, b->to_pinned = to_pinned;
        bounces[nbounces++] = b;
    }
    uint64_t avail;
    if (gp_host_lookup(b->pinned, &p->seg, &p->off, &avail) != 0 || avail < n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = gp_hostfn_node((void *)bounce_run, b, &p->id, &p->gate_seg, &p->gate_off, &p->gate_len);
    if (rc == CUDA_SUCCESS)
        p->bounce = 1;
    return rc;
}

/* The bounce buffer of (app, n, direction) for a copy captured from a
 * stream (capture_copy.c): where it is, and the host function that moves
 * the bytes, with its gate. Caller holds the lock and has a session. */
CUresult gp_graph_bounce(void *app, size_t n, int to_pinned, uint32_t *seg, uint64_t *off, uint64_t *id,
                         uint32_t *gate_seg, uint64_t *gate_off, uint64_t *gate_len)
{
    payload p = { 0 };
    CUresult rc = bounce_for(&p, app, n, to_pinned);
    if (rc != CUDA_SUCCESS)
        return rc;
    *seg = p.seg, *off = p.off, *id = p.id;
    *gate_seg = p.gate_seg, *gate_off = p.gate_off, *gate_len = p.gate_len;
    return CUDA_SUCCESS;
}

/* One side of a CUDA_MEMCPY3D: its first byte, whether it is device memory,
 * and whether the bytes it names are contiguous. */
static CUresult copy_side(const char *api, CUmemorytype t, const void *host, CUdeviceptr dev, CUarray arr,
                          size_t x, size_t y, size_t z, size_t pitch, size_t height, size_t w, size_t h, size_t d,
                          uintptr_t *addr, int *is_dev)
{
    if (t == CU_MEMORYTYPE_ARRAY || arr)
        return refuse(api, "copies to or from CUDA arrays in graph nodes are not supported");
    uintptr_t base = t == CU_MEMORYTYPE_HOST ? (uintptr_t)host : (uintptr_t)dev;
    if (!base)
        return CUDA_ERROR_INVALID_VALUE;
    if (h * d > 1 && (pitch != w || (d > 1 && height != h)))
        return refuse(api, "only contiguous copies are supported in graph nodes");
    size_t p = pitch ? pitch : w, hh = height ? height : h;
    *addr = base + x + y * p + z * hh * p;
    *is_dev = t == CU_MEMORYTYPE_DEVICE || (t == CU_MEMORYTYPE_UNIFIED && gp_is_device_ptr((void *)*addr));
    return CUDA_SUCCESS;
}

/* caller holds the lock */
static CUresult p_memcpy(payload *p, const char *api, const CUDA_MEMCPY3D *c)
{
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    size_t w = c->WidthInBytes, h = c->Height ? c->Height : 1, d = c->Depth ? c->Depth : 1;
    uintptr_t sa, da;
    int sdev, ddev;
    CUresult rc = copy_side(api, c->srcMemoryType, c->srcHost, c->srcDevice, c->srcArray, c->srcXInBytes, c->srcY,
                            c->srcZ, c->srcPitch, c->srcHeight, w, h, d, &sa, &sdev);
    if (rc == CUDA_SUCCESS)
        rc = copy_side(api, c->dstMemoryType, c->dstHost, c->dstDevice, c->dstArray, c->dstXInBytes, c->dstY,
                       c->dstZ, c->dstPitch, c->dstHeight, w, h, d, &da, &ddev);
    if (rc != CUDA_SUCCESS)
        return rc;
    size_t n = w * h * d;
    if (n == 0)
        return CUDA_ERROR_INVALID_VALUE;
    p->n = n;
    uint64_t avail;
    if (sdev && ddev) {
        p->kind = PL_DTOD, p->fid = GP_FID_cuMemcpyDtoDAsync_v2, p->dst = da, p->src = sa;
        return CUDA_SUCCESS;
    }
    if (!sdev && !ddev)
        return refuse(api, "host-to-host memcpy nodes are not supported");
    void *host = (void *)(ddev ? sa : da);
    if (ddev)
        p->kind = PL_HTOD, p->fid = GP_FID_cuMemcpyHtoDAsync_v2, p->dst = da;
    else
        p->kind = PL_DTOH, p->fid = GP_FID_cuMemcpyDtoHAsync_v2, p->src = sa;
    if (gp_host_lookup(host, &p->seg, &p->off, &avail) == 0 && avail >= n)
        return CUDA_SUCCESS;
    return bounce_for(p, host, n, ddev);
    return CUDA_SUCCESS;
}

/* caller holds the lock */
static CUresult p_memset(payload *p, const char *api, CUdeviceptr dst, size_t pitch, unsigned value,
                         unsigned elementSize, size_t width, size_t height)
{
    (void)api;
    if (!dst || width == 0 || height == 0)
        return CUDA_ERROR_INVALID_VALUE;
    p->kind = PL_MEMSET;
    p->dst = dst;
    p->n = width;
    p->value = value;
    p->pitch = pitch;
    p->height = height;
    /* cuda.h, CUDA_MEMSET_NODE_PARAMS: elementSize must be 1, 2, or 4; a
     * node of several rows is the 2D memset op (pitch in bytes, checked by
     * proxyd's memset2d handler when the graph runs) */
    int rows = height > 1;
    switch (elementSize) {
    case 1: p->fid = rows ? GP_FID_cuMemsetD2D8Async : GP_FID_cuMemsetD8Async; break;
    case 2: p->fid = rows ? GP_FID_cuMemsetD2D16Async : GP_FID_cuMemsetD16Async; break;
    case 4: p->fid = rows ? GP_FID_cuMemsetD2D32Async : GP_FID_cuMemsetD32Async; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    if (rows && pitch < width * elementSize)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* caller holds the lock and has a session */
static CUresult p_host(payload *p, CUhostFn fn, void *user)
{
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    p->kind = PL_HOST;
    p->fid = GP_FID_cuLaunchHostFunc;
    return gp_hostfn_node((void *)fn, user, &p->id, &p->seg, &p->off, &p->gate_len);
}

static void w_hostfn(gp_buf *b, uint64_t ctx, uint64_t id, uint32_t seg, uint64_t off, uint64_t len)
{
    /* cuLaunchHostFunc(stream, id, gate) */
    mp_array(b, 5);
    mp_uint(b, GP_FID_cuLaunchHostFunc);
    mp_uint(b, ctx);
    mp_uint(b, 0);
    mp_uint(b, id);
    gp_put_shm(b, seg, off, len);
}

static void w_op(gp_buf *b, const payload *p, uint64_t ctx)
{
    switch (p->kind) {
    case PL_KERNEL:         /* cuLaunchKernel(f, grid, block, shmem, stream, kernelParams, extra) */
        mp_array(b, 13);
        mp_uint(b, p->fid);
        mp_uint(b, ctx);
        gp_put_handle(b, p->f);
        for (int i = 0; i < 3; i++)
            mp_uint(b, p->grid[i]);
        for (int i = 0; i < 3; i++)
            mp_uint(b, p->block[i]);
        mp_uint(b, p->shmem);
        mp_uint(b, 0);
        gp_put_data(b, p->buf, p->n, 1);
        mp_nil(b);
        break;
    case PL_DTOD:           /* cuMemcpyDtoDAsync_v2(dst, src, n, stream) */
        mp_array(b, 6);
        mp_uint(b, p->fid);
        mp_uint(b, ctx);
        mp_uint(b, p->dst);
        mp_uint(b, p->src);
        mp_uint(b, p->n);
        mp_uint(b, 0);
        break;
    case PL_HTOD:           /* cuMemcpyHtoDAsync_v2(dst, host, n, stream) */
        mp_array(b, 6);
        mp_uint(b, p->fid);
        mp_uint(b, ctx);
        mp_uint(b, p->dst);
        gp_put_shm(b, p->seg, p->off, p->n);
        mp_uint(b, p->n);
        mp_uint(b, 0);
        break;
    case PL_DTOH:           /* cuMemcpyDtoHAsync_v2(host, src, n, stream) */
        mp_array(b, 6);
        mp_uint(b, p->fid);
        mp_uint(b, ctx);
        gp_put_shm(b, p->seg, p->off, p->n);
        mp_uint(b, p->src);
        mp_uint(b, p->n);
        mp_uint(b, 0);
        break;
    case PL_MEMSET:         /* cuMemsetD*Async(dst, value, n, stream) */
        if (p->height > 1) {    /* cuMemsetD2D*Async(dst, pitch, value, width, height, stream) */
            mp_array(b, 8);
            mp_uint(b, p->fid);
            mp_uint(b, ctx);
            mp_uint(b, p->dst);
            mp_uint(b, p->pitch);
            mp_uint(b, p->value);
            mp_uint(b, p->n);
            mp_uint(b, p->height);
            mp_uint(b, 0);
            break;
        }
        mp_array(b, 6);
        mp_uint(b, p->fid);
        mp_uint(b, ctx);
        mp_uint(b, p->dst);
        mp_uint(b, p->value);
        mp_uint(b, p->n);
        mp_uint(b, 0);
        break;
    case PL_HOST:
        w_hostfn(b, ctx, p->id, p->seg, p->off, p->gate_len);
        break;
    default:
        mp_nil(b);
    }
}

/* The payload: one op, or for a bounced copy [op, op] in run order (the
 * host function first for host-to-device, last for device-to-host). */
static void w_payload(gp_buf *b, const payload *p)
{
    uint64_t ctx = (uint64_t)(uintptr_t)gp_ctx_current();
    if (!p->bounce) {
        w_op(b, p, ctx);
        return;
    }
    mp_array(b, 2);
    if (p->kind == PL_HTOD)
        w_hostfn(b, ctx, p->id, p->gate_seg, p->gate_off, p->gate_len);
    w_op(b, p, ctx);
    if (p->kind == PL_DTOH)
        w_hostfn(b, ctx, p->id, p->gate_seg, p->gate_off, p->gate_len);
}

/* ---------------------------------------------------------------- adding */

/* One add call: op [out, graph, [deps], count, payload, nil...] of fid,
 * which has nparams parameters; `handle` (event, child graph) stands in
 * for the payload when p is NULL. Caller holds the lock and has a session. */
static CUresult add_node(uint32_t fid, uint32_t nparams, CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                         size_t ndeps, const payload *p, const void *handle)
{
    if (!out || !g || (ndeps && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    gp_buf *b = gp_op_begin(fid, nparams);
    mp_bool(b, 1);
    gp_put_handle(b, g);
    put_nodes(b, deps, ndeps);
    mp_uint(b, ndeps);
    uint32_t used = 4;
    if (nparams > 4) {
        if (p)
            w_payload(b, p);
        else
            gp_put_handle(b, handle);
        used++;
    }
    for (; used < nparams; used++)
        mp_nil(b);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    if (rc == CUDA_SUCCESS && r.have_outs && r.nouts >= 1)
        gp_out_handle(&r, (void **)out);
    gp_reply_done(&r);
    return rc;
}

/* An add call whose payload is one integer (a free node's address:
 * graph_mem.c). Caller holds the lock and has a session. */
CUresult gp_graph_add_value_node(uint32_t fid, uint32_t nparams, CUgraphNode *out, CUgraph g,
                                 const CUgraphNode *deps, size_t ndeps, uint64_t value)
{
    return add_node(fid, nparams, out, g, deps, ndeps, NULL, (const void *)(uintptr_t)value);
}

/* The add call of a payload just built (rc: how building it went), then
 * what the payload owns freed. Caller holds the lock and has a session. */
static CUresult add_built(uint32_t fid, uint32_t nparams, CUgraphNode *out, CUgraph g, const CUgraphNode *deps,
                          size_t ndeps, payload *p, CUresult rc)
{
    if (rc == CUDA_SUCCESS)
        rc = add_node(fid, nparams, out, g, deps, ndeps, p, NULL);
    pl_done(p);
    return rc;
}

static CUresult add_kernel(CUgraphNode *out, CUgraph g, const CUgraphNode *deps, size_t n, CUfunction f,
                           const CUDA_KERNEL_NODE_PARAMS *kp)
{
    GP_ENTER();
    payload p = { 0 };
    CUresult rc = p_kernel(&p, f, kp->gridDimX, kp->gridDimY, kp->gridDimZ, kp->blockDimX, kp->blockDimY,
                           kp->blockDimZ, kp->sharedMemBytes, kp->kernelParams, kp->extra);
    GP_LEAVE(add_built(GP_FID_cuGraphAddKernelNode_v2, 5, out, g, deps, n, &p, rc));
}

CUresult gpo_cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                     size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    /* cuda.h: kern is used only when func is NULL; a CUkernel may also be
     * passed as func */
    CUfunction f = nodeParams->func ? nodeParams->func : (CUfunction)nodeParams->kern;
    GP_RESOLVE_FUNCTION(f);
    return add_kernel(phGraphNode, hGraph, dependencies, numDependencies, f, nodeParams);
}

/* The CUDA 11 form: CUDA_KERNEL_NODE_PARAMS_v1 lacks kern and ctx. */
CUresult gpo_cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                  size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams)
{
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_KERNEL_NODE_PARAMS kp = { 0 };
    memcpy(&kp, nodeParams, sizeof *nodeParams);
    return gpo_cuGraphAddKernelNode_v2(phGraphNode, hGraph, dependencies, numDependencies, &kp);
}

CUresult gpo_cuGraphAddMemcpyNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                  size_t numDependencies, const CUDA_MEMCPY3D *copyParams, CUcontext ctx)
{
    (void)ctx;      /* the node runs in the context current at launch, as proxyd runs every op */
    GP_ENTER();
    payload p = { 0 };
    CUresult rc = p_memcpy(&p, "cuGraphAddMemcpyNode", copyParams);
    GP_LEAVE(add_built(GP_FID_cuGraphAddMemcpyNode, 6, phGraphNode, hGraph, dependencies, numDependencies, &p, rc));
}

CUresult gpo_cuGraphAddMemsetNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                  size_t numDependencies, const CUDA_MEMSET_NODE_PARAMS *m, CUcontext ctx)
{
    (void)ctx;
    if (!m)
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    payload p = { 0 };
    CUresult rc = p_memset(&p, "cuGraphAddMemsetNode", m->dst, m->pitch, m->value, m->elementSize, m->width,
                           m->height);
    GP_LEAVE(add_built(GP_FID_cuGraphAddMemsetNode, 6, phGraphNode, hGraph, dependencies, numDependencies, &p, rc));
}

CUresult gpo_cuGraphAddHostNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                size_t numDependencies, const CUDA_HOST_NODE_PARAMS *hp)
{
    if (!hp)
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    payload p = { 0 };
    CUresult rc = p_host(&p, hp->fn, hp->userData);
    GP_LEAVE(add_built(GP_FID_cuGraphAddHostNode, 5, phGraphNode, hGraph, dependencies, numDependencies, &p, rc));
}

CUresult gpo_cuGraphAddChildGraphNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                      size_t numDependencies, CUgraph childGraph)
{
    if (!childGraph)
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    GP_LEAVE(add_node(GP_FID_cuGraphAddChildGraphNode, 5, phGraphNode, hGraph, dependencies, numDependencies, NULL,
                      childGraph));
}

CUresult gpo_cuGraphAddEmptyNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                 size_t numDependencies)
{
    GP_ENTER();
    GP_LEAVE(add_node(GP_FID_cuGraphAddEmptyNode, 4, phGraphNode, hGraph, dependencies, numDependencies, NULL,
                      NULL));
}

CUresult gpo_cuGraphAddEventRecordNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                       size_t numDependencies, CUevent event)
{
    if (!event)
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    GP_LEAVE(add_node(GP_FID_cuGraphAddEventRecordNode, 5, phGraphNode, hGraph, dependencies, numDependencies,
                      NULL, event));
}

CUresult gpo_cuGraphAddEventWaitNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                     size_t numDependencies, CUevent event)
{
    if (!event)
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    GP_LEAVE(add_node(GP_FID_cuGraphAddEventWaitNode, 5, phGraphNode, hGraph, dependencies, numDependencies,
                      NULL, event));
}

/* cuGraphAddNode: graph_add_node.c */

/* ------------------------------------------------------ changing parameters */

/* op [target..., payload, nil...] of fid: the node (graph setters) or the
 * executable graph and node (exec setters). Caller holds the lock. */
static CUresult set_params(uint32_t fid, uint32_t nparams, CUgraphExec exec, CUgraphNode node, const payload *p)
{
    if (!node)
        return CUDA_ERROR_INVALID_VALUE;
    gp_buf *b = gp_op_begin(fid, nparams);
    uint32_t used = 0;
    if (exec) {
        gp_put_handle(b, exec);
        used++;
    }
    gp_put_handle(b, node);
    w_payload(b, p);
    for (used += 2; used < nparams; used++)
        mp_nil(b);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    gp_reply_done(&r);
    return rc;
}

/* set_params with a payload just built (rc: how building it went), then
 * what the payload owns freed. Caller holds the lock and has a session. */
static CUresult set_built(uint32_t fid, uint32_t nparams, CUgraphExec exec, CUgraphNode node, payload *p,
                          CUresult rc)
{
    if (rc == CUDA_SUCCESS)
        rc = set_params(fid, nparams, exec, node, p);
    pl_done(p);
    return rc;
}

static CUresult kernel_params(uint32_t fid, uint32_t nparams, CUgraphExec exec, CUgraphNode node,
                              const CUDA_KERNEL_NODE_PARAMS *kp)
{
    if (!kp || (fid == GP_FID_cuGraphExecKernelNodeSetParams_v2 && !exec))
        return CUDA_ERROR_INVALID_VALUE;
    CUfunction f = kp->func ? kp->func : (CUfunction)kp->kern;
    GP_RESOLVE_FUNCTION(f);
    GP_ENTER();
    payload p = { 0 };
    CUresult rc = p_kernel(&p, f, kp->gridDimX, kp->gridDimY, kp->gridDimZ, kp->blockDimX, kp->blockDimY,
                           kp->blockDimZ, kp->sharedMemBytes, kp->kernelParams, kp->extra);
    GP_LEAVE(set_built(fid, nparams, exec, node, &p, rc));
}

CUresult gpo_cuGraphKernelNodeSetParams_v2(CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    return kernel_params(GP_FID_cuGraphKernelNodeSetParams_v2, 2, NULL, hNode, nodeParams);
}

CUresult gpo_cuGraphExecKernelNodeSetParams_v2(CUgraphExec hGraphExec, CUgraphNode hNode,
                                               const CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    return kernel_params(GP_FID_cuGraphExecKernelNodeSetParams_v2, 3, hGraphExec, hNode, nodeParams);
}

static CUresult memcpy_params(uint32_t fid, uint32_t nparams, CUgraphExec exec, CUgraphNode node,
                              const CUDA_MEMCPY3D *c, const char *api)
{
    GP_ENTER();
    payload p = { 0 };
    CUresult rc = p_memcpy(&p, api, c);
    GP_LEAVE(set_built(fid, nparams, exec, node, &p, rc));
}

CUresult gpo_cuGraphMemcpyNodeSetParams(CUgraphNode hNode, const CUDA_MEMCPY3D *nodeParams)
{
    return memcpy_params(GP_FID_cuGraphMemcpyNodeSetParams, 2, NULL, hNode, nodeParams,
                         "cuGraphMemcpyNodeSetParams");
}

CUresult gpo_cuGraphExecMemcpyNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                            const CUDA_MEMCPY3D *copyParams, CUcontext ctx)
{
    (void)ctx;
    if (!hGraphExec)
        return CUDA_ERROR_INVALID_VALUE;
    return memcpy_params(GP_FID_cuGraphExecMemcpyNodeSetParams, 4, hGraphExec, hNode, copyParams,
                         "cuGraphExecMemcpyNodeSetParams");
}

static CUresult memset_params(uint32_t fid, uint32_t nparams, CUgraphExec exec, CUgraphNode node,
                              const CUDA_MEMSET_NODE_PARAMS *m, const char *api)
{
    if (!m)
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    payload p = { 0 };
    CUresult rc = p_memset(&p, api, m->dst, m->pitch, m->value, m->elementSize, m->width, m->height);
    GP_LEAVE(set_built(fid, nparams, exec, node, &p, rc));
}

CUresult gpo_cuGraphMemsetNodeSetParams(CUgraphNode hNode, const CUDA_MEMSET_NODE_PARAMS *nodeParams)
{
    return memset_params(GP_FID_cuGraphMemsetNodeSetParams, 2, NULL, hNode, nodeParams,
                         "cuGraphMemsetNodeSetParams");
}

CUresult gpo_cuGraphExecMemsetNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                            const CUDA_MEMSET_NODE_PARAMS *memsetParams, CUcontext ctx)
{
    (void)ctx;
    if (!hGraphExec)
        return CUDA_ERROR_INVALID_VALUE;
    return memset_params(GP_FID_cuGraphExecMemsetNodeSetParams, 4, hGraphExec, hNode, memsetParams,
                         "cuGraphExecMemsetNodeSetParams");
}

static CUresult host_params(uint32_t fid, uint32_t nparams, CUgraphExec exec, CUgraphNode node,
                            const CUDA_HOST_NODE_PARAMS *hp)
{
    if (!hp)
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    payload p = { 0 };
    CUresult rc = p_host(&p, hp->fn, hp->userData);
    GP_LEAVE(set_built(fid, nparams, exec, node, &p, rc));
}

CUresult gpo_cuGraphHostNodeSetParams(CUgraphNode hNode, const CUDA_HOST_NODE_PARAMS *nodeParams)
{
    return host_params(GP_FID_cuGraphHostNodeSetParams, 2, NULL, hNode, nodeParams);
}

CUresult gpo_cuGraphExecHostNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                          const CUDA_HOST_NODE_PARAMS *nodeParams)
{
    if (!hGraphExec)
        return CUDA_ERROR_INVALID_VALUE;
    return host_params(GP_FID_cuGraphExecHostNodeSetParams, 3, hGraphExec, hNode, nodeParams);
}

/* ------------------------------------------------------------- topology */

/* What a node or edge query answers in *count (cuda.h, cuGraphGetNodes,
 * cuGraphGetEdges, cuGraphNodeGetDependencies): with an array (nodes not
 * NULL), how many of the total it holds, at most cap; without, the total. */
static size_t fitted_count(size_t total, size_t cap, const void *nodes)
{
    return nodes ? (total < cap ? total : cap) : total;
}

/* Copies a reply's packed handles (little-endian u64 each) into out, at
 * most cap of them. */
static void copy_handles(gp_reply *r, CUgraphNode *out, size_t cap)
{
    size_t n = 0;
    const uint8_t *p = gp_out_bytes(r, &n);
    n /= 8;
    for (size_t i = 0; out && p && i < n && i < cap; i++) {
        uint64_t v;
        memcpy(&v, p + 8 * i, 8);
        out[i] = (CUgraphNode)(uintptr_t)v;
    }
}

/* cuGraphGetNodes / cuGraphGetRootNodes (cuda.h): with nodes NULL, the
 * count; else at most *numNodes handles and the number written. */
static CUresult get_nodes(uint32_t fid, CUgraph g, CUgraphNode *nodes, size_t *numNodes)
{
    if (!g || !numNodes)
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    gp_buf *b = gp_op_begin(fid, 3);
    gp_put_handle(b, g);
    mp_bool(b, 1);
    mp_bool(b, 1);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    if (rc == CUDA_SUCCESS && r.have_outs && r.nouts >= 2) {
        size_t cap = *numNodes;
        copy_handles(&r, nodes, cap);
        *numNodes = fitted_count((size_t)gp_out_int(&r), cap, nodes);
    }
    gp_reply_done(&r);
    GP_LEAVE(rc);
}

CUresult gpo_cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)
{
    return get_nodes(GP_FID_cuGraphGetNodes, hGraph, nodes, numNodes);
}

CUresult gpo_cuGraphGetRootNodes(CUgraph hGraph, CUgraphNode *rootNodes, size_t *numRootNodes)
{
    return get_nodes(GP_FID_cuGraphGetRootNodes, hGraph, rootNodes, numRootNodes);
}

/* The edge data of a reply (CUgraphEdgeData each, proxyd/families/
 * graph_edges.py) for the first n edges returned: into out, or, when the
 * caller passed no array, CUDA_ERROR_LOSSY_QUERY if one of them is not the
 * default (cuda.h, cuGraphGetEdges). */
static CUresult copy_edge_data(const uint8_t *ed, size_t nb, CUgraphEdgeData *out, size_t n)
{
    static const CUgraphEdgeData zero;
    for (size_t i = 0; i < n; i++) {
        CUgraphEdgeData e = zero;
        if (ed && (i + 1) * sizeof e <= nb)
            memcpy(&e, ed + i * sizeof e, sizeof e);
        if (out)
            out[i] = e;
        else if (memcmp(&e, &zero, sizeof e) != 0)
            return CUDA_ERROR_LOSSY_QUERY;
    }
    return CUDA_SUCCESS;
}

/* The rest of an edge query's reply once its node lists are read: the
 * edges' data (copy_edge_data) and the count (fitted_count, *count being
 * the caller's capacity until it is set). */
static CUresult edge_reply(gp_reply *r, const void *nodes, CUgraphEdgeData *edgeData, size_t *count)
{
    size_t nb = 0;
    const uint8_t *ed = gp_out_bytes(r, &nb);
    size_t n = fitted_count((size_t)gp_out_int(r), *count, nodes);
    CUresult rc = copy_edge_data(ed, nb, edgeData, nodes ? n : 0);
    if (rc == CUDA_SUCCESS)
        *count = n;
    return rc;
}

CUresult gpo_cuGraphGetEdges_v2(CUgraph hGraph, CUgraphNode *from, CUgraphNode *to, CUgraphEdgeData *edgeData,
                                size_t *numEdges)
{
    if (!hGraph || !numEdges || (!from) != (!to))
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    gp_buf *b = gp_op_begin(GP_FID_cuGraphGetEdges_v2, 5);
    gp_put_handle(b, hGraph);
    mp_bool(b, 1);
    mp_bool(b, 1);
    mp_nil(b);
    mp_bool(b, 1);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    if (rc == CUDA_SUCCESS && r.have_outs && r.nouts >= 4) {
        copy_handles(&r, from, *numEdges);
        copy_handles(&r, to, *numEdges);
        rc = edge_reply(&r, from, edgeData, numEdges);
    }
    gp_reply_done(&r);
    GP_LEAVE(rc);
}

CUresult gpo_cuGraphGetEdges(CUgraph hGraph, CUgraphNode *from, CUgraphNode *to, size_t *numEdges)
{
    return gpo_cuGraphGetEdges_v2(hGraph, from, to, NULL, numEdges);
}

static CUresult dependencies(uint32_t fid, CUgraph g, const CUgraphNode *from, const CUgraphNode *to,
                             const CUgraphEdgeData *edgeData, size_t n, const char *api)
{
    (void)api;
    if (!g || (n && (!from || !to)))
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    gp_buf *b = gp_op_begin(fid, 5);
    gp_put_handle(b, g);
    put_nodes(b, from, n);
    put_nodes(b, to, n);
    /* the edges' data as the caller's array (proxyd checks it against
     * cuda.h's rules: graph_edges.py); NULL: every edge the default */
    if (edgeData && n)
        gp_put_data(b, edgeData, n * sizeof *edgeData, 1);
    else
        mp_nil(b);
    mp_uint(b, n);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    gp_reply_done(&r);
    GP_LEAVE(rc);
}

CUresult gpo_cuGraphAddDependencies_v2(CUgraph hGraph, const CUgraphNode *from, const CUgraphNode *to,
                                       const CUgraphEdgeData *edgeData, size_t numDependencies)
{
    return dependencies(GP_FID_cuGraphAddDependencies_v2, hGraph, from, to, edgeData, numDependencies,
                        "cuGraphAddDependencies");
}

CUresult gpo_cuGraphAddDependencies(CUgraph hGraph, const CUgraphNode *from, const CUgraphNode *to,
                                    size_t numDependencies)
{
    return gpo_cuGraphAddDependencies_v2(hGraph, from, to, NULL, numDependencies);
}

CUresult gpo_cuGraphRemoveDependencies_v2(CUgraph hGraph, const CUgraphNode *from, const CUgraphNode *to,
                                          const CUgraphEdgeData *edgeData, size_t numDependencies)
{
    return dependencies(GP_FID_cuGraphRemoveDependencies_v2, hGraph, from, to, edgeData, numDependencies,
                        "cuGraphRemoveDependencies");
}

CUresult gpo_cuGraphRemoveDependencies(CUgraph hGraph, const CUgraphNode *from, const CUgraphNode *to,
                                       size_t numDependencies)
{
    return gpo_cuGraphRemoveDependencies_v2(hGraph, from, to, NULL, numDependencies);
}

/* cuGraphNodeGetDependencies(_v2) / cuGraphNodeGetDependentNodes(_v2)
 * (cuda.h): with nodes NULL, the count; else at most *count handles (and
 * their edges' data) and the number written. */
static CUresult neighbours(uint32_t fid, CUgraphNode node, CUgraphNode *nodes, CUgraphEdgeData *edgeData,
                           size_t *count)
{
    if (!node || !count || (edgeData && !nodes))
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    gp_buf *b = gp_op_begin(fid, 4);
    gp_put_handle(b, node);
    mp_bool(b, 1);
    mp_nil(b);
    mp_bool(b, 1);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    if (rc == CUDA_SUCCESS && r.have_outs && r.nouts >= 3) {
        copy_handles(&r, nodes, *count);
        rc = edge_reply(&r, nodes, edgeData, count);
    }
    gp_reply_done(&r);
    GP_LEAVE(rc);
}

CUresult gpo_cuGraphNodeGetDependencies_v2(CUgraphNode hNode, CUgraphNode *dependencies, CUgraphEdgeData *edgeData,
                                           size_t *numDependencies)
{
    return neighbours(GP_FID_cuGraphNodeGetDependencies_v2, hNode, dependencies, edgeData, numDependencies);
}

CUresult gpo_cuGraphNodeGetDependencies(CUgraphNode hNode, CUgraphNode *dependencies, size_t *numDependencies)
{
    return gpo_cuGraphNodeGetDependencies_v2(hNode, dependencies, NULL, numDependencies);
}

CUresult gpo_cuGraphNodeGetDependentNodes_v2(CUgraphNode hNode, CUgraphNode *dependentNodes,
                                             CUgraphEdgeData *edgeData, size_t *numDependentNodes)
{
    return neighbours(GP_FID_cuGraphNodeGetDependentNodes_v2, hNode, dependentNodes, edgeData, numDependentNodes);
}

CUresult gpo_cuGraphNodeGetDependentNodes(CUgraphNode hNode, CUgraphNode *dependentNodes, size_t *numDependentNodes)
{
    return gpo_cuGraphNodeGetDependentNodes_v2(hNode, dependentNodes, NULL, numDependentNodes);
}

/* ------------------------------------------------------- exec update etc. */

/* cuGraphExecUpdate_v2: proxyd answers the CUgraphExecUpdateResult; any
 * result but success is CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE (cuda.h). The
 * error node is not named (NULL), which cuda.h allows for topology
 * changes. */
CUresult gpo_cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphExecUpdateResultInfo *resultInfo)
{
    if (!hGraphExec || !hGraph || !resultInfo)
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    gp_buf *b = gp_op_begin(GP_FID_cuGraphExecUpdate_v2, 3);
    gp_put_handle(b, hGraphExec);
    gp_put_handle(b, hGraph);
    mp_bool(b, 1);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    memset(resultInfo, 0, sizeof *resultInfo);
    if (rc == CUDA_SUCCESS && r.have_outs && r.nouts >= 1) {
        resultInfo->result = (CUgraphExecUpdateResult)gp_out_int(&r);
        if (resultInfo->result != CU_GRAPH_EXEC_UPDATE_SUCCESS)
            rc = CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    } else if (rc == CUDA_SUCCESS) {
        rc = CUDA_ERROR_UNKNOWN;
    }
    gp_reply_done(&r);
    GP_LEAVE(rc);
}

/* cuGraphInstantiateWithParams: the flags of the parameters; the result
 * fields say success or name no node. CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD
 * needs nothing more: proxyd holds the graph ready to run. */
CUresult gpo_cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                          CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
    if (!instantiateParams)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = cuGraphInstantiateWithFlags(phGraphExec, hGraph, instantiateParams->flags);
    instantiateParams->hErrNode_out = NULL;
    instantiateParams->result_out = rc == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
    return rc;
}

CUresult gpo_cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                               CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
    return gpo_cuGraphInstantiateWithParams(phGraphExec, hGraph, instantiateParams);
}

/* ---------------------------------------------------------- DOT output */

static const char *type_name(CUgraphNodeType t)
{
    static const char *names[] = { "kernel", "memcpy", "memset", "host", "graph", "empty", "wait_event",
                                   "event_record" };
    return (unsigned)t < sizeof names / sizeof *names ? names[t] : "node";
}

/* cuGraphDebugDotPrint: the graph's nodes (by type) and edges in Graphviz
 * DOT, written in the application's process (the path is the
 * application's). The flags choose how much detail the driver prints per
 * node; this writes the topology only, which every flag includes. */
CUresult gpo_cuGraphDebugDotPrint(CUgraph hGraph, const char *path, unsigned int flags)
{
    (void)flags;
    if (!hGraph || !path)
        return CUDA_ERROR_INVALID_VALUE;
    size_t n = 0, ne = 0;
    CUresult rc = gpo_cuGraphGetNodes(hGraph, NULL, &n);
    if (rc == CUDA_SUCCESS)
        rc = gpo_cuGraphGetEdges_v2(hGraph, NULL, NULL, NULL, &ne);
    if (rc != CUDA_SUCCESS)
        return rc;
    CUgraphNode *nodes = calloc(n + 1, sizeof *nodes), *from = calloc(ne + 1, sizeof *from),
                *to = calloc(ne + 1, sizeof *to);
    FILE *f = NULL;
    if (!nodes || !from || !to) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    if ((rc = gpo_cuGraphGetNodes(hGraph, nodes, &n)) != CUDA_SUCCESS ||
        (rc = gpo_cuGraphGetEdges_v2(hGraph, from, to, NULL, &ne)) != CUDA_SUCCESS)
        goto out;
    f = fopen(path, "w");
    if (!f) {
        rc = CUDA_ERROR_OPERATING_SYSTEM;
        goto out;
    }
    fprintf(f, "digraph dot {\n");
    for (size_t i = 0; i < n; i++) {
        CUgraphNodeType t = CU_GRAPH_NODE_TYPE_EMPTY;
        if ((rc = cuGraphNodeGetType(nodes[i], &t)) != CUDA_SUCCESS)
            goto out;
        fprintf(f, "  n%llx [label=\"%zu %s\"];\n", (unsigned long long)(uintptr_t)nodes[i], i, type_name(t));
    }
    for (size_t i = 0; i < ne; i++)
        fprintf(f, "  n%llx -> n%llx;\n", (unsigned long long)(uintptr_t)from[i], (unsigned long long)(uintptr_t)to[i]);
    fprintf(f, "}\n");
out:
    if (f && fclose(f) != 0 && rc == CUDA_SUCCESS)
        rc = CUDA_ERROR_OPERATING_SYSTEM;
    free(nodes);
    free(from);
    free(to);
    return rc;
}
