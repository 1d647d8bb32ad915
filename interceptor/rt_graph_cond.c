/* Conditional graph nodes, runtime side (cuda_runtime_api.h,
 * cudaGraphConditionalHandleCreate; driver_types.h, cudaConditionalNodeParams):
 * on the driver calls (graph_cond.c, generated cuGraphConditionalHandleCreate)
 * in the calling thread's current context, as the runtime does (the runtime
 * form names no context: "the handle and all body nodes" use the current one).
 * cudaGraphSetConditional runs on the device and needs nothing here: the
 * handle value the application gets is the one proxyd's kernels see.
 * cudaStreamUpdateCaptureDependencies, with which a conditional node added
 * to a capture's graph becomes what the capture's later work follows
 * (proxyd/families/graph_cond_capture.py), is its driver twin's.
 *
 * Locking: none of its own (the driver calls take gp_lock). */
#include <string.h>

#include "gp_gen.h"
#include "gp_rt.h"
#include "gp_shim.h"

cudaError_t gpo_cudaGraphConditionalHandleCreate(cudaGraphConditionalHandle *pHandle_out, cudaGraph_t graph,
                                                 unsigned int defaultLaunchValue, unsigned int flags)
{
    if (!pHandle_out || !graph)
        return gp_rt_ret(cudaErrorInvalidValue);
    cudaError_t e = gp_rt_init_thread();
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    CUcontext ctx = NULL;
    CUresult rc = cuCtxGetCurrent(&ctx);
    if (rc == CUDA_SUCCESS)
        rc = cuGraphConditionalHandleCreate((CUgraphConditionalHandle *)pHandle_out, (CUgraph)graph, ctx,
                                            defaultLaunchValue, flags);
    RT_RETURN_CU(rc);
}

/* cudaGraphAddNode with cudaGraphNodeTypeConditional (rt_graph.c hands it
 * here; edge data is checked there). */
cudaError_t gp_rt_graph_add_conditional(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
                                        const cudaGraphNode_t *pDependencies, size_t numDependencies,
                                        struct cudaGraphNodeParams *nodeParams)
{
    cudaError_t e = gp_rt_init_thread();
    if (e != cudaSuccess)
        return gp_rt_ret(e);
    CUgraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    np.conditional.handle = (CUgraphConditionalHandle)nodeParams->conditional.handle;
    np.conditional.type = (CUgraphConditionalNodeType)nodeParams->conditional.type;
    np.conditional.size = nodeParams->conditional.size;
    np.conditional.phGraph_out = (CUgraph *)nodeParams->conditional.phGraph_out;
    CUresult rc = cuCtxGetCurrent(&np.conditional.ctx);
    if (rc == CUDA_SUCCESS)
        rc = cuGraphAddNode_v2((CUgraphNode *)pGraphNode, (CUgraph)graph, (const CUgraphNode *)pDependencies,
                               NULL, numDependencies, &np);
    if (rc == CUDA_SUCCESS)
        nodeParams->conditional.phGraph_out = (cudaGraph_t *)np.conditional.phGraph_out;   /* out (driver_types.h) */
    RT_RETURN_CU(rc);
}

/* cudaStreamUpdateCaptureDependencies (cuda_runtime_api.h, CUDA 13: with
 * edge data) on cuStreamUpdateCaptureDependencies_v2. */
cudaError_t gpo_cudaStreamUpdateCaptureDependencies(cudaStream_t stream, cudaGraphNode_t *dependencies,
                                                    const cudaGraphEdgeData *dependencyData, size_t numDependencies,
                                                    unsigned int flags)
{
    RT_INIT();
    RT_RETURN_CU(cuStreamUpdateCaptureDependencies_v2(gp_rt_stream(stream), (CUgraphNode *)dependencies,
                                                      (const CUgraphEdgeData *)dependencyData, numDependencies,
                                                      flags));
}
