/* The runtime's stream capture and graph launch, on the driver API
 * (cuda_runtime_api.h, "Graph Management"; proxyd/families/graphs.py keeps the
 * graphs). cudaGraph_t, cudaGraphExec_t, cudaStreamCaptureMode and
 * cudaStreamCaptureStatus are the driver's types and values under other
 * names.
 *
 * Locking: each driver call takes gp_lock itself. */
#include <stddef.h>
#include <string.h>

#include "gp_rt.h"

/* graph memory nodes, below */
cudaError_t gpo_cudaGraphAddMemAllocNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                         const cudaGraphNode_t *pDependencies, size_t numDependencies,
                                         struct cudaMemAllocNodeParams *nodeParams);
cudaError_t gpo_cudaGraphAddMemFreeNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                        const cudaGraphNode_t *pDependencies, size_t numDependencies, void *dptr);

/* rt_graph_cond.c */
cudaError_t gp_rt_graph_add_conditional(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                        const cudaGraphNode_t *pDependencies, size_t numDependencies,
                                        struct cudaGraphNodeParams *nodeParams);

cudaError_t gpo_cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    RT_INIT();
    RT_RETURN_CU(cuStreamBeginCapture(gp_rt_stream(stream), (CUstreamCaptureMode)mode));
}

/* pGraph may be NULL: NVIDIA's samples end a capture into a conditional
 * node's body graph (cudaStreamBeginCaptureToGraph) so, the application
 * already holding the graph; the driver call takes NULL there too. */
cudaError_t gpo_cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
    RT_INIT();
    RT_RETURN_CU(cuStreamEndCapture(gp_rt_stream(stream), (CUgraph *)pGraph));
}

cudaError_t gpo_cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *pCaptureStatus)
{
    if (!pCaptureStatus)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult r = cuStreamIsCapturing(gp_rt_stream(stream), &st);
    *pCaptureStatus = (enum cudaStreamCaptureStatus)st;
    RT_RETURN_CU(r);
}

cudaError_t gpo_cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    if (!mode)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_RETURN_CU(cuThreadExchangeStreamCaptureMode((CUstreamCaptureMode *)mode));
}

cudaError_t gpo_cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph, unsigned long long flags)
{
    if (!pGraphExec)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    RT_RETURN_CU(cuGraphInstantiateWithFlags((CUgraphExec *)pGraphExec, (CUgraph)graph, flags));
}

cudaError_t gpo_cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                              unsigned long long flags)
{
    return gpo_cudaGraphInstantiate(pGraphExec, graph, flags);
}

cudaError_t gpo_cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphLaunch((CUgraphExec)graphExec, gp_rt_stream(stream)));
}

cudaError_t gpo_cudaGraphExecDestroy(cudaGraphExec_t graphExec)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphExecDestroy((CUgraphExec)graphExec));
}

cudaError_t gpo_cudaGraphDestroy(cudaGraph_t graph)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphDestroy((CUgraph)graph));
}

cudaError_t gpo_cudaStreamGetCaptureInfo(cudaStream_t stream, enum cudaStreamCaptureStatus *captureStatus_out,
                                         unsigned long long *id_out, cudaGraph_t *graph_out,
                                         const cudaGraphNode_t **dependencies_out,
                                         const cudaGraphEdgeData **edgeData_out, size_t *numDependencies_out)
{
    if (!captureStatus_out)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t id = 0;
    CUresult r = cuStreamGetCaptureInfo_v3(gp_rt_stream(stream), &st, id_out ? &id : NULL, (CUgraph *)graph_out,
                                           (const CUgraphNode **)dependencies_out,
                                           (const CUgraphEdgeData **)edgeData_out, numDependencies_out);
    *captureStatus_out = (enum cudaStreamCaptureStatus)st;
    if (id_out)
        *id_out = id;
    RT_RETURN_CU(r);
}

/* ------------------------------------------------- explicit construction
 * (cuda_runtime_api.h, "Graph Management"): each runtime call maps to its
 * driver twin (interceptor/graph_build.c). The runtime's node parameter
 * structures differ from the driver's only where the runtime names a
 * kernel by its host function and copies by cudaMemcpy3DParms. */

cudaError_t gpo_cudaGraphCreate(cudaGraph_t *pGraph, unsigned int flags)
{
    if (!pGraph)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    RT_RETURN_CU(cuGraphCreate((CUgraph *)pGraph, flags));
}

/* The driver's kernel node parameters for a runtime kernel: the function
 * registered for the host stub, loaded in the current context. */
static cudaError_t kernel_node_params(const struct cudaKernelNodeParams *p, CUDA_KERNEL_NODE_PARAMS *kp)
{
    if (!p)
        return cudaErrorInvalidValue;
    cudaError_t e = gp_rt_init_thread();
    if (e != cudaSuccess)
        return e;
    gp_rt_kernel *k = gp_rt_kernel_for(p->func);
    if (!k)
        return cudaErrorInvalidDeviceFunction;
    CUfunction f;
    gp_lock();
    e = gp_rt_kernel_handle(k, &f);
    gp_unlock();
    if (e != cudaSuccess)
        return e;
    memset(kp, 0, sizeof *kp);
    kp->func = f;
    kp->gridDimX = p->gridDim.x, kp->gridDimY = p->gridDim.y, kp->gridDimZ = p->gridDim.z;
    kp->blockDimX = p->blockDim.x, kp->blockDimY = p->blockDim.y, kp->blockDimZ = p->blockDim.z;
    kp->sharedMemBytes = p->sharedMemBytes;
    kp->kernelParams = p->kernelParams;
    kp->extra = p->extra;
    return cudaSuccess;
}

cudaError_t gpo_cudaGraphAddKernelNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                       const cudaGraphNode_t *pDependencies, size_t numDependencies,
                                       const struct cudaKernelNodeParams *pNodeParams)
{
    CUDA_KERNEL_NODE_PARAMS kp;
    cudaError_t e = kernel_node_params(pNodeParams, &kp);
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    RT_RETURN_CU(cuGraphAddKernelNode_v2((CUgraphNode *)pGraphNode, (CUgraph)graph, (const CUgraphNode *)pDependencies,
                                         numDependencies, &kp));
}

cudaError_t gpo_cudaGraphKernelNodeSetParams(cudaGraphNode_t node, const struct cudaKernelNodeParams *pNodeParams)
{
    CUDA_KERNEL_NODE_PARAMS kp;
    cudaError_t e = kernel_node_params(pNodeParams, &kp);
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    RT_RETURN_CU(cuGraphKernelNodeSetParams_v2((CUgraphNode)node, &kp));
}

cudaError_t gpo_cudaGraphExecKernelNodeSetParams(cudaGraphExec_t hGraphExec, cudaGraphNode_t node,
                                                 const struct cudaKernelNodeParams *pNodeParams)
{
    CUDA_KERNEL_NODE_PARAMS kp;
    cudaError_t e = kernel_node_params(pNodeParams, &kp);
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    RT_RETURN_CU(cuGraphExecKernelNodeSetParams_v2((CUgraphExec)hGraphExec, (CUgraphNode)node, &kp));
}

/* cudaMemcpy3DParms -> CUDA_MEMCPY3D for linear memory (cuda_runtime_api.h,
 * cudaMemcpy3D: positions and the extent's width are in bytes for memory
 * that is not a CUDA array). A CUDA array is passed on, and the driver
 * side refuses it. The kind gives each side's memory type; cudaMemcpyDefault
 * lets the address decide (unified addressing). */
static cudaError_t copy3d_params(const struct cudaMemcpy3DParms *p, CUDA_MEMCPY3D *c)
{
    if (!p)
        return cudaErrorInvalidValue;
    memset(c, 0, sizeof *c);
    CUmemorytype st, dt;
    switch (p->kind) {
    case cudaMemcpyHostToHost: st = dt = CU_MEMORYTYPE_HOST; break;
    case cudaMemcpyHostToDevice: st = CU_MEMORYTYPE_HOST, dt = CU_MEMORYTYPE_DEVICE; break;
    case cudaMemcpyDeviceToHost: st = CU_MEMORYTYPE_DEVICE, dt = CU_MEMORYTYPE_HOST; break;
    case cudaMemcpyDeviceToDevice: st = dt = CU_MEMORYTYPE_DEVICE; break;
    case cudaMemcpyDefault: st = dt = CU_MEMORYTYPE_UNIFIED; break;
    default: return cudaErrorInvalidMemcpyDirection;
    }
    c->srcMemoryType = p->srcArray ? CU_MEMORYTYPE_ARRAY : st;
    c->srcArray = (CUarray)p->srcArray;
    c->srcHost = p->srcPtr.ptr;
    c->srcDevice = (CUdeviceptr)(uintptr_t)p->srcPtr.ptr;
    c->srcPitch = p->srcPtr.pitch;
    c->srcHeight = p->srcPtr.ysize;
    c->srcXInBytes = p->srcPos.x, c->srcY = p->srcPos.y, c->srcZ = p->srcPos.z;
    c->dstMemoryType = p->dstArray ? CU_MEMORYTYPE_ARRAY : dt;
    c->dstArray = (CUarray)p->dstArray;
    c->dstHost = p->dstPtr.ptr;
    c->dstDevice = (CUdeviceptr)(uintptr_t)p->dstPtr.ptr;
    c->dstPitch = p->dstPtr.pitch;
    c->dstHeight = p->dstPtr.ysize;
    c->dstXInBytes = p->dstPos.x, c->dstY = p->dstPos.y, c->dstZ = p->dstPos.z;
    c->WidthInBytes = p->extent.width;
    c->Height = p->extent.height;
    c->Depth = p->extent.depth;
    return cudaSuccess;
}

static struct cudaMemcpy3DParms copy1d(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    struct cudaMemcpy3DParms p = { 0 };
    p.srcPtr.ptr = (void *)src, p.srcPtr.pitch = count, p.srcPtr.xsize = count, p.srcPtr.ysize = 1;
    p.dstPtr.ptr = dst, p.dstPtr.pitch = count, p.dstPtr.xsize = count, p.dstPtr.ysize = 1;
    p.extent.width = count, p.extent.height = 1, p.extent.depth = 1;
    p.kind = kind;
    return p;
}

cudaError_t gpo_cudaGraphAddMemcpyNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                       const cudaGraphNode_t *pDependencies, size_t numDependencies,
                                       const struct cudaMemcpy3DParms *pCopyParams)
{
    CUDA_MEMCPY3D c;
    cudaError_t e = copy3d_params(pCopyParams, &c);
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    RT_INIT();
    RT_RETURN_CU(cuGraphAddMemcpyNode((CUgraphNode *)pGraphNode, (CUgraph)graph, (const CUgraphNode *)pDependencies,
                                      numDependencies, &c, gp_ctx_current()));
}

cudaError_t gpo_cudaGraphAddMemcpyNode1D(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                         const cudaGraphNode_t *pDependencies, size_t numDependencies, void *dst,
                                         const void *src, size_t count, enum cudaMemcpyKind kind)
{
    struct cudaMemcpy3DParms p = copy1d(dst, src, count, kind);
    return gpo_cudaGraphAddMemcpyNode(pGraphNode, graph, pDependencies, numDependencies, &p);
}

cudaError_t gpo_cudaGraphMemcpyNodeSetParams(cudaGraphNode_t node, const struct cudaMemcpy3DParms *pNodeParams)
{
    CUDA_MEMCPY3D c;
    cudaError_t e = copy3d_params(pNodeParams, &c);
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    RT_INIT();
    RT_RETURN_CU(cuGraphMemcpyNodeSetParams((CUgraphNode)node, &c));
}

cudaError_t gpo_cudaGraphMemcpyNodeSetParams1D(cudaGraphNode_t node, void *dst, const void *src, size_t count,
                                               enum cudaMemcpyKind kind)
{
    struct cudaMemcpy3DParms p = copy1d(dst, src, count, kind);
    return gpo_cudaGraphMemcpyNodeSetParams(node, &p);
}

cudaError_t gpo_cudaGraphExecMemcpyNodeSetParams(cudaGraphExec_t hGraphExec, cudaGraphNode_t node,
                                                 const struct cudaMemcpy3DParms *pNodeParams)
{
    CUDA_MEMCPY3D c;
    cudaError_t e = copy3d_params(pNodeParams, &c);
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    RT_INIT();
    RT_RETURN_CU(cuGraphExecMemcpyNodeSetParams((CUgraphExec)hGraphExec, (CUgraphNode)node, &c, gp_ctx_current()));
}

cudaError_t gpo_cudaGraphExecMemcpyNodeSetParams1D(cudaGraphExec_t hGraphExec, cudaGraphNode_t node, void *dst,
                                                   const void *src, size_t count, enum cudaMemcpyKind kind)
{
    struct cudaMemcpy3DParms p = copy1d(dst, src, count, kind);
    return gpo_cudaGraphExecMemcpyNodeSetParams(hGraphExec, node, &p);
}

/* cudaMemsetParams and CUDA_MEMSET_NODE_PARAMS have the same fields */
static CUDA_MEMSET_NODE_PARAMS memset_params(const struct cudaMemsetParams *p)
{
    CUDA_MEMSET_NODE_PARAMS m = { (CUdeviceptr)(uintptr_t)p->dst, p->pitch, p->value, p->elementSize, p->width,
                                  p->height };
    return m;
}

cudaError_t gpo_cudaGraphAddMemsetNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                       const cudaGraphNode_t *pDependencies, size_t numDependencies,
                                       const struct cudaMemsetParams *pMemsetParams)
{
    if (!pMemsetParams)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUDA_MEMSET_NODE_PARAMS m = memset_params(pMemsetParams);
    RT_RETURN_CU(cuGraphAddMemsetNode((CUgraphNode *)pGraphNode, (CUgraph)graph, (const CUgraphNode *)pDependencies,
                                      numDependencies, &m, gp_ctx_current()));
}

cudaError_t gpo_cudaGraphMemsetNodeSetParams(cudaGraphNode_t node, const struct cudaMemsetParams *pNodeParams)
{
    if (!pNodeParams)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUDA_MEMSET_NODE_PARAMS m = memset_params(pNodeParams);
    RT_RETURN_CU(cuGraphMemsetNodeSetParams((CUgraphNode)node, &m));
}

cudaError_t gpo_cudaGraphExecMemsetNodeSetParams(cudaGraphExec_t hGraphExec, cudaGraphNode_t node,
                                                 const struct cudaMemsetParams *pNodeParams)
{
    if (!pNodeParams)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUDA_MEMSET_NODE_PARAMS m = memset_params(pNodeParams);
    RT_RETURN_CU(cuGraphExecMemsetNodeSetParams((CUgraphExec)hGraphExec, (CUgraphNode)node, &m, gp_ctx_current()));
}

/* cudaHostNodeParams and CUDA_HOST_NODE_PARAMS: { fn, userData } */
static CUDA_HOST_NODE_PARAMS host_params(const struct cudaHostNodeParams *p)
{
    CUDA_HOST_NODE_PARAMS h = { (CUhostFn)p->fn, p->userData };
    return h;
}

cudaError_t gpo_cudaGraphAddHostNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                     const cudaGraphNode_t *pDependencies, size_t numDependencies,
                                     const struct cudaHostNodeParams *pNodeParams)
{
    if (!pNodeParams)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUDA_HOST_NODE_PARAMS h = host_params(pNodeParams);
    RT_RETURN_CU(cuGraphAddHostNode((CUgraphNode *)pGraphNode, (CUgraph)graph, (const CUgraphNode *)pDependencies,
                                    numDependencies, &h));
}

cudaError_t gpo_cudaGraphHostNodeSetParams(cudaGraphNode_t node, const struct cudaHostNodeParams *pNodeParams)
{
    if (!pNodeParams)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUDA_HOST_NODE_PARAMS h = host_params(pNodeParams);
    RT_RETURN_CU(cuGraphHostNodeSetParams((CUgraphNode)node, &h));
}

cudaError_t gpo_cudaGraphExecHostNodeSetParams(cudaGraphExec_t hGraphExec, cudaGraphNode_t node,
                                               const struct cudaHostNodeParams *pNodeParams)
{
    if (!pNodeParams)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUDA_HOST_NODE_PARAMS h = host_params(pNodeParams);
    RT_RETURN_CU(cuGraphExecHostNodeSetParams((CUgraphExec)hGraphExec, (CUgraphNode)node, &h));
}

cudaError_t gpo_cudaGraphAddChildGraphNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                           const cudaGraphNode_t *pDependencies, size_t numDependencies,
                                           cudaGraph_t childGraph)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphAddChildGraphNode((CUgraphNode *)pGraphNode, (CUgraph)graph,
                                          (const CUgraphNode *)pDependencies, numDependencies, (CUgraph)childGraph));
}

cudaError_t gpo_cudaGraphAddEmptyNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                      const cudaGraphNode_t *pDependencies, size_t numDependencies)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphAddEmptyNode((CUgraphNode *)pGraphNode, (CUgraph)graph, (const CUgraphNode *)pDependencies,
                                     numDependencies));
}

cudaError_t gpo_cudaGraphAddEventRecordNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                            const cudaGraphNode_t *pDependencies, size_t numDependencies,
                                            cudaEvent_t event)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphAddEventRecordNode((CUgraphNode *)pGraphNode, (CUgraph)graph,
                                           (const CUgraphNode *)pDependencies, numDependencies, (CUevent)event));
}

cudaError_t gpo_cudaGraphAddEventWaitNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                          const cudaGraphNode_t *pDependencies, size_t numDependencies,
                                          cudaEvent_t event)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphAddEventWaitNode((CUgraphNode *)pGraphNode, (CUgraph)graph,
                                         (const CUgraphNode *)pDependencies, numDependencies, (CUevent)event));
}

/* cudaGraphAddNode (CUDA 12.2+): by node type, through the calls above. */
cudaError_t gpo_cudaGraphAddNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph, const cudaGraphNode_t *pDependencies,
                                 const cudaGraphEdgeData *dependencyData, size_t numDependencies,
                                 struct cudaGraphNodeParams *nodeParams)
{
    if (!nodeParams)
        return gp_rt_ret(cudaErrorInvalidValue);
    if (dependencyData) {
        static const cudaGraphEdgeData zero;
        for (size_t i = 0; i < numDependencies; i++)
            if (memcmp(&dependencyData[i], &zero, sizeof zero) != 0) {
                gp_warn_unsupported("cudaGraphAddNode (edge data other than the default)");
                return gp_rt_ret(cudaErrorNotSupported);
            }
    }
    switch (nodeParams->type) {
    case cudaGraphNodeTypeKernel: {
        struct cudaKernelNodeParams k = { nodeParams->kernel.func, nodeParams->kernel.gridDim,
                                          nodeParams->kernel.blockDim, nodeParams->kernel.sharedMemBytes,
                                          nodeParams->kernel.kernelParams, nodeParams->kernel.extra };
        return gpo_cudaGraphAddKernelNode(pGraphNode, graph, pDependencies, numDependencies, &k);
    }
    case cudaGraphNodeTypeMemcpy:
        return gpo_cudaGraphAddMemcpyNode(pGraphNode, graph, pDependencies, numDependencies,
                                          &nodeParams->memcpy.copyParams);
    case cudaGraphNodeTypeMemset: {
        struct cudaMemsetParams m = { nodeParams->memset.dst, nodeParams->memset.pitch, nodeParams->memset.value,
                                      nodeParams->memset.elementSize, nodeParams->memset.width,
                                      nodeParams->memset.height };
        return gpo_cudaGraphAddMemsetNode(pGraphNode, graph, pDependencies, numDependencies, &m);
    }
    case cudaGraphNodeTypeHost: {
        struct cudaHostNodeParams h = { nodeParams->host.fn, nodeParams->host.userData };
        return gpo_cudaGraphAddHostNode(pGraphNode, graph, pDependencies, numDependencies, &h);
    }
    case cudaGraphNodeTypeGraph:
        return gpo_cudaGraphAddChildGraphNode(pGraphNode, graph, pDependencies, numDependencies,
                                              nodeParams->graph.graph);
    case cudaGraphNodeTypeEmpty:
        return gpo_cudaGraphAddEmptyNode(pGraphNode, graph, pDependencies, numDependencies);
    case cudaGraphNodeTypeWaitEvent:
        return gpo_cudaGraphAddEventWaitNode(pGraphNode, graph, pDependencies, numDependencies,
                                             nodeParams->eventWait.event);
    case cudaGraphNodeTypeEventRecord:
        return gpo_cudaGraphAddEventRecordNode(pGraphNode, graph, pDependencies, numDependencies,
                                               nodeParams->eventRecord.event);
    case cudaGraphNodeTypeMemAlloc: {
        struct cudaMemAllocNodeParams a;
        _Static_assert(sizeof a == sizeof nodeParams->alloc, "cudaMemAllocNodeParamsV2 has V1's layout");
        memcpy(&a, &nodeParams->alloc, sizeof a);
        cudaError_t e = gpo_cudaGraphAddMemAllocNode(pGraphNode, graph, pDependencies, numDependencies, &a);
        if (e == cudaSuccess)
            nodeParams->alloc.dptr = a.dptr;     /* out (driver_types.h) */
        return e;
    }
    case cudaGraphNodeTypeMemFree:
        return gpo_cudaGraphAddMemFreeNode(pGraphNode, graph, pDependencies, numDependencies,
                                           nodeParams->free.dptr);
    case cudaGraphNodeTypeConditional:
        return gp_rt_graph_add_conditional(pGraphNode, graph, pDependencies, numDependencies, nodeParams);
    default:
        gp_warn_unsupported("cudaGraphAddNode (this node type)");
        return gp_rt_ret(cudaErrorNotSupported);
    }
}

cudaError_t gpo_cudaGraphClone(cudaGraph_t *pGraphClone, cudaGraph_t originalGraph)
{
    if (!pGraphClone)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    RT_RETURN_CU(cuGraphClone((CUgraph *)pGraphClone, (CUgraph)originalGraph));
}

/* cudaGraphNodeType and CUgraphNodeType have the same values */
cudaError_t gpo_cudaGraphNodeGetType(cudaGraphNode_t node, enum cudaGraphNodeType *pType)
{
    if (!pType)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUgraphNodeType t = CU_GRAPH_NODE_TYPE_EMPTY;
    CUresult r = cuGraphNodeGetType((CUgraphNode)node, &t);
    if (r == CUDA_SUCCESS)
        *pType = (enum cudaGraphNodeType)t;
    RT_RETURN_CU(r);
}

cudaError_t gpo_cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *numNodes)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphGetNodes((CUgraph)graph, (CUgraphNode *)nodes, numNodes));
}

cudaError_t gpo_cudaGraphGetRootNodes(cudaGraph_t graph, cudaGraphNode_t *pRootNodes, size_t *pNumRootNodes)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphGetRootNodes((CUgraph)graph, (CUgraphNode *)pRootNodes, pNumRootNodes));
}

cudaError_t gpo_cudaGraphGetEdges(cudaGraph_t graph, cudaGraphNode_t *from, cudaGraphNode_t *to,
                                  cudaGraphEdgeData *edgeData, size_t *numEdges)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphGetEdges_v2((CUgraph)graph, (CUgraphNode *)from, (CUgraphNode *)to,
                                    (CUgraphEdgeData *)edgeData, numEdges));
}

cudaError_t gpo_cudaGraphAddDependencies(cudaGraph_t graph, const cudaGraphNode_t *from, const cudaGraphNode_t *to,
                                         const cudaGraphEdgeData *edgeData, size_t numDependencies)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphAddDependencies_v2((CUgraph)graph, (const CUgraphNode *)from, (const CUgraphNode *)to,
                                           (const CUgraphEdgeData *)edgeData, numDependencies));
}

cudaError_t gpo_cudaGraphRemoveDependencies(cudaGraph_t graph, const cudaGraphNode_t *from,
                                            const cudaGraphNode_t *to, const cudaGraphEdgeData *edgeData,
                                            size_t numDependencies)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphRemoveDependencies_v2((CUgraph)graph, (const CUgraphNode *)from, (const CUgraphNode *)to,
                                              (const CUgraphEdgeData *)edgeData, numDependencies));
}

cudaError_t gpo_cudaGraphNodeGetDependencies(cudaGraphNode_t node, cudaGraphNode_t *pDependencies,
                                             cudaGraphEdgeData *edgeData, size_t *pNumDependencies)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphNodeGetDependencies_v2((CUgraphNode)node, (CUgraphNode *)pDependencies,
                                               (CUgraphEdgeData *)edgeData, pNumDependencies));
}

cudaError_t gpo_cudaGraphNodeGetDependentNodes(cudaGraphNode_t node, cudaGraphNode_t *pDependentNodes,
                                               cudaGraphEdgeData *edgeData, size_t *pNumDependentNodes)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphNodeGetDependentNodes_v2((CUgraphNode)node, (CUgraphNode *)pDependentNodes,
                                                 (CUgraphEdgeData *)edgeData, pNumDependentNodes));
}

cudaError_t gpo_cudaGraphExecChildGraphNodeSetParams(cudaGraphExec_t hGraphExec, cudaGraphNode_t node,
                                                     cudaGraph_t childGraph)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphExecChildGraphNodeSetParams((CUgraphExec)hGraphExec, (CUgraphNode)node, (CUgraph)childGraph));
}

cudaError_t gpo_cudaGraphNodeSetEnabled(cudaGraphExec_t hGraphExec, cudaGraphNode_t hNode, unsigned int isEnabled)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphNodeSetEnabled((CUgraphExec)hGraphExec, (CUgraphNode)hNode, isEnabled));
}

cudaError_t gpo_cudaGraphNodeGetEnabled(cudaGraphExec_t hGraphExec, cudaGraphNode_t hNode, unsigned int *isEnabled)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphNodeGetEnabled((CUgraphExec)hGraphExec, (CUgraphNode)hNode, isEnabled));
}

cudaError_t gpo_cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph,
                                              const cudaGraphNode_t *dependencies,
                                              const cudaGraphEdgeData *dependencyData, size_t numDependencies,
                                              enum cudaStreamCaptureMode mode)
{
    RT_INIT();
    RT_RETURN_CU(cuStreamBeginCaptureToGraph(gp_rt_stream(stream), (CUgraph)graph, (const CUgraphNode *)dependencies,
                                             (const CUgraphEdgeData *)dependencyData, numDependencies,
                                             (CUstreamCaptureMode)mode));
}

cudaError_t gpo_cudaGraphDestroyNode(cudaGraphNode_t node)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphDestroyNode((CUgraphNode)node));
}

/* cudaGraphInstantiateParams and CUDA_GRAPH_INSTANTIATE_PARAMS have the same layout */
cudaError_t gpo_cudaGraphInstantiateWithParams(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                               cudaGraphInstantiateParams *instantiateParams)
{
    _Static_assert(sizeof(cudaGraphInstantiateParams) == sizeof(CUDA_GRAPH_INSTANTIATE_PARAMS),
                   "cudaGraphInstantiateParams layout");
    if (!pGraphExec || !instantiateParams)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    RT_RETURN_CU(cuGraphInstantiateWithParams((CUgraphExec *)pGraphExec, (CUgraph)graph,
                                              (CUDA_GRAPH_INSTANTIATE_PARAMS *)instantiateParams));
}

/* cudaGraphExecUpdateResultInfo and CUgraphExecUpdateResultInfo: same layout and values */
cudaError_t gpo_cudaGraphExecUpdate(cudaGraphExec_t hGraphExec, cudaGraph_t hGraph,
                                    cudaGraphExecUpdateResultInfo *resultInfo)
{
    _Static_assert(sizeof(cudaGraphExecUpdateResultInfo) == sizeof(CUgraphExecUpdateResultInfo),
                   "cudaGraphExecUpdateResultInfo layout");
    RT_INIT();
    RT_RETURN_CU(cuGraphExecUpdate_v2((CUgraphExec)hGraphExec, (CUgraph)hGraph,
                                      (CUgraphExecUpdateResultInfo *)resultInfo));
}

cudaError_t gpo_cudaGraphInstantiateWithParams_ptsz(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                                    cudaGraphInstantiateParams *instantiateParams)
{
    return gpo_cudaGraphInstantiateWithParams(pGraphExec, graph, instantiateParams);
}

cudaError_t gpo_cudaGraphDebugDotPrint(cudaGraph_t graph, const char *path, unsigned int flags)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphDebugDotPrint((CUgraph)graph, path, flags));
}

/* ---------------------------------------------------------------- graph memory nodes
 * cudaMemAllocNodeParams has CUDA_MEM_ALLOC_NODE_PARAMS' layout
 * (cudaMemPoolProps is CUmemPoolProps: rt_mempool.c), cudaGraphMemAttributeType
 * has CUgraphMem_attribute's values, and a runtime device ordinal is the
 * driver's CUdevice (rt_mempool.c passes them the same way). */
_Static_assert(sizeof(struct cudaMemAllocNodeParams) == sizeof(CUDA_MEM_ALLOC_NODE_PARAMS),
               "cudaMemAllocNodeParams has the driver structure's layout");
_Static_assert(offsetof(struct cudaMemAllocNodeParams, dptr) == offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, dptr),
               "dptr at the same offset");

cudaError_t gpo_cudaGraphAddMemAllocNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                         const cudaGraphNode_t *pDependencies, size_t numDependencies,
                                         struct cudaMemAllocNodeParams *nodeParams)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphAddMemAllocNode((CUgraphNode *)pGraphNode, (CUgraph)graph, (const CUgraphNode *)pDependencies,
                                        numDependencies, (CUDA_MEM_ALLOC_NODE_PARAMS *)nodeParams));
}

cudaError_t gpo_cudaGraphMemAllocNodeGetParams(cudaGraphNode_t node, struct cudaMemAllocNodeParams *params_out)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphMemAllocNodeGetParams((CUgraphNode)node, (CUDA_MEM_ALLOC_NODE_PARAMS *)params_out));
}

cudaError_t gpo_cudaGraphAddMemFreeNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                        const cudaGraphNode_t *pDependencies, size_t numDependencies, void *dptr)
{
    RT_INIT();
    RT_RETURN_CU(cuGraphAddMemFreeNode((CUgraphNode *)pGraphNode, (CUgraph)graph, (const CUgraphNode *)pDependencies,
                                       numDependencies, (CUdeviceptr)(uintptr_t)dptr));
}

/* dptr_out: a void * that receives the address (cuda_runtime_api.h) */
cudaError_t gpo_cudaGraphMemFreeNodeGetParams(cudaGraphNode_t node, void *dptr_out)
{
    if (!dptr_out)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUdeviceptr p = 0;
    CUresult rc = cuGraphMemFreeNodeGetParams((CUgraphNode)node, &p);
    if (rc == CUDA_SUCCESS) {
        void *v = (void *)(uintptr_t)p;
        memcpy(dptr_out, &v, sizeof v);
    }
    RT_RETURN_CU(rc);
}

cudaError_t gpo_cudaDeviceGraphMemTrim(int device)
{
    RT_INIT();
    RT_RETURN_CU(cuDeviceGraphMemTrim((CUdevice)device));
}

cudaError_t gpo_cudaDeviceGetGraphMemAttribute(int device, enum cudaGraphMemAttributeType attr, void *value)
{
    RT_INIT();
    RT_RETURN_CU(cuDeviceGetGraphMemAttribute((CUdevice)device, (CUgraphMem_attribute)attr, value));
}

cudaError_t gpo_cudaDeviceSetGraphMemAttribute(int device, enum cudaGraphMemAttributeType attr, void *value)
{
    RT_INIT();
    RT_RETURN_CU(cuDeviceSetGraphMemAttribute((CUdevice)device, (CUgraphMem_attribute)attr, value));
}
