/* Graph memory nodes, driver API (cuda.h, "Graph Management":
 * cuGraphAddMemAllocNode, cuGraphMemAllocNodeGetParams,
 * cuGraphAddMemFreeNode, cuGraphMemFreeNodeGetParams,
 * cuDeviceGetGraphMemAttribute, cuDeviceSetGraphMemAttribute). proxyd keeps
 * the nodes and their allocations (proxyd/graph_mem.py): an alloc node's
 * address is in the session's arena and fixed when the node is added, as
 * natively, so the shim only carries parameters and the address back.
 *
 * The structures travel decoded: CUDA_MEM_ALLOC_NODE_PARAMS as [bytesize,
 * allocType, handleTypes, location type, location id] (the access
 * descriptors are not sent: every device of a session reaches its arena);
 * the attribute value as 8 little-endian bytes, as cuMemPoolSetAttribute's
 * (mempool.c). cudaMemAllocNodeParams has the driver structure's layout
 * (rt_graph.c passes it through).
 *
 * Locking: GP_ENTER/GP_LEAVE take gp_lock around each call. */
#include <string.h>

#include "gp_gen.h"
#include "gp_shim.h"

/* graph_build.c: one add call whose payload is a handle or address */
CUresult gp_graph_add_value_node(uint32_t fid, uint32_t nparams, CUgraphNode *out, CUgraph g,
                                 const CUgraphNode *deps, size_t ndeps, uint64_t value);

CUresult gpo_cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                    size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
{
    if (!phGraphNode || !hGraph || !nodeParams || (numDependencies && !dependencies))
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    gp_buf *b = gp_op_begin(GP_FID_cuGraphAddMemAllocNode, 5);
    mp_bool(b, 1);
    gp_put_handle(b, hGraph);
    mp_array(b, (uint32_t)numDependencies);
    for (size_t i = 0; i < numDependencies; i++)
        gp_put_handle(b, dependencies[i]);
    mp_uint(b, numDependencies);
    const CUmemPoolProps *pp = &nodeParams->poolProps;
    mp_array(b, 5);
    mp_uint(b, nodeParams->bytesize);
    mp_uint(b, (uint64_t)pp->allocType);
    mp_uint(b, (uint64_t)pp->handleTypes);
    mp_uint(b, (uint64_t)pp->location.type);
    mp_uint(b, (uint64_t)(uint32_t)pp->location.id);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    if (rc == CUDA_SUCCESS && r.have_outs && r.nouts >= 2) {
        gp_out_handle(&r, (void **)phGraphNode);
        nodeParams->dptr = (CUdeviceptr)gp_out_int(&r);     /* out: the allocation's address (cuda.h) */
    }
    gp_reply_done(&r);
    GP_LEAVE(rc);
}

/* reply: [dptr, bytesize, device] */
CUresult gpo_cuGraphMemAllocNodeGetParams(CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS *params_out)
{
    if (!hNode || !params_out)
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    gp_buf *b = gp_op_begin(GP_FID_cuGraphMemAllocNodeGetParams, 2);
    gp_put_handle(b, hNode);
    mp_bool(b, 1);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    if (rc == CUDA_SUCCESS && r.have_outs && r.nouts >= 3) {
        memset(params_out, 0, sizeof *params_out);
        params_out->dptr = (CUdeviceptr)gp_out_int(&r);
        params_out->bytesize = (size_t)gp_out_int(&r);
        params_out->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        params_out->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        params_out->poolProps.location.id = (int)gp_out_int(&r);
    }
    gp_reply_done(&r);
    GP_LEAVE(rc);
}

CUresult gpo_cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                   size_t numDependencies, CUdeviceptr dptr)
{
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    GP_LEAVE(gp_graph_add_value_node(GP_FID_cuGraphAddMemFreeNode, 5, phGraphNode, hGraph, dependencies,
                                     numDependencies, (uint64_t)dptr));
}

CUresult gpo_cuGraphMemFreeNodeGetParams(CUgraphNode hNode, CUdeviceptr *dptr_out)
{
    if (!hNode || !dptr_out)
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    gp_buf *b = gp_op_begin(GP_FID_cuGraphMemFreeNodeGetParams, 2);
    gp_put_handle(b, hNode);
    mp_bool(b, 1);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    if (rc == CUDA_SUCCESS && r.have_outs && r.nouts >= 1)
        *dptr_out = (CUdeviceptr)gp_out_int(&r);
    gp_reply_done(&r);
    GP_LEAVE(rc);
}

/* cuda.h: every CUgraphMem_attribute value is a cuuint64_t.
 * op: [device, attr, 8 (the out buffer's size)]; the answer is an integer */
CUresult gpo_cuDeviceGetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value)
{
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    gp_buf *b = gp_op_begin(GP_FID_cuDeviceGetGraphMemAttribute, 3);
    mp_uint(b, (uint64_t)(uint32_t)device);
    mp_uint(b, (uint64_t)attr);
    mp_uint(b, 8);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    if (rc == CUDA_SUCCESS && r.have_outs && r.nouts >= 1) {
        cuuint64_t v = (cuuint64_t)gp_out_int(&r);
        memcpy(value, &v, sizeof v);
    }
    gp_reply_done(&r);
    GP_LEAVE(rc);
}

/* op: [device, attr, value as 8 little-endian bytes] */
CUresult gpo_cuDeviceSetGraphMemAttribute(CUdevice device, CUgraphMem_attribute attr, void *value)
{
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    cuuint64_t v;
    memcpy(&v, value, sizeof v);
    GP_ENTER();
    gp_buf *b = gp_op_begin(GP_FID_cuDeviceSetGraphMemAttribute, 3);
    mp_uint(b, (uint64_t)(uint32_t)device);
    mp_uint(b, (uint64_t)attr);
    mp_bin(b, &v, sizeof v);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    gp_reply_done(&r);
    GP_LEAVE(rc);
}
