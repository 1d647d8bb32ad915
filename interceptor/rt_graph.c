/* The runtime's stream capture and graph launch, on the driver API
 * (cuda_runtime_api.h, "Graph Management"; proxyd/graphs.py keeps the
 * graphs). cudaGraph_t, cudaGraphExec_t, cudaStreamCaptureMode and
 * cudaStreamCaptureStatus are the driver's types and values under other
 * names.
 *
 * Locking: each driver call takes gp_lock itself. */
#include "gp_rt.h"

#define RT_INIT()                                   \
    do {                                            \
        cudaError_t e_ = gp_rt_init_thread();       \
        if (e_ != cudaSuccess)                      \
            return gp_rt_ret(e_);                   \
    } while (0)

cudaError_t gpo_cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    RT_INIT();
    RT_RETURN_CU(cuStreamBeginCapture(gp_rt_stream(stream), (CUstreamCaptureMode)mode));
}

cudaError_t gpo_cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
    if (!pGraph)
        return gp_rt_ret(cudaErrorInvalidValue);
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
