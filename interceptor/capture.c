/* Stream capture queries. Libraries ask cuStreamIsCapturing before nearly
 * every asynchronous copy (CuPy, the static runtime's
 * cudaStreamIsCapturing, PyTorch's allocator), so the answer must not cost
 * a round trip when it cannot be anything but "none": until this process
 * has begun a capture (cuStreamBeginCapture_v2, which every runtime and
 * driver entry reaches), no stream of it can be capturing (cuda.h,
 * CUstreamCaptureStatus) and the shim answers CU_STREAM_CAPTURE_STATUS_NONE
 * itself. After the first capture began, the worker answers (proxyd/
 * graphs.py keeps the capture state, which a restore brings back).
 *
 * Locking: one process-wide flag, set once and never cleared, read without
 * the lock (a stale "none" can only be read by a thread racing the very
 * first cuStreamBeginCapture of another thread, which the driver does not
 * order either). */
#include <stdatomic.h>

#include "gp_gen.h"
#include "gp_shim.h"

static atomic_int capture_begun;

/* whether this process has begun a capture (capture_copy.c asks) */
int gp_capture_begun(void) { return atomic_load(&capture_begun); }

CUresult gpo_cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    atomic_store(&capture_begun, 1);
    return gpg_cuStreamBeginCapture_v2(hStream, mode);
}

CUresult gpo_cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
    atomic_store(&capture_begun, 1);
    return gpg_cuStreamBeginCapture_v2_ptsz(hStream, mode);
}

/* a capture into the application's graph (proxyd/families/graph_capture_into.py) */
CUresult gpo_cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,
                                         const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                         CUstreamCaptureMode mode)
{
    atomic_store(&capture_begun, 1);
    return gpg_cuStreamBeginCaptureToGraph(hStream, hGraph, dependencies, dependencyData, numDependencies, mode);
}

CUresult gpo_cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,
                                              const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                              CUstreamCaptureMode mode)
{
    atomic_store(&capture_begun, 1);
    return gpg_cuStreamBeginCaptureToGraph_ptsz(hStream, hGraph, dependencies, dependencyData, numDependencies,
                                                mode);
}

CUresult gpo_cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    if (!captureStatus)
        return CUDA_ERROR_INVALID_VALUE;
    if (!atomic_load(&capture_begun)) {
        *captureStatus = CU_STREAM_CAPTURE_STATUS_NONE;
        return CUDA_SUCCESS;
    }
    return gpg_cuStreamIsCapturing(hStream, captureStatus);
}

CUresult gpo_cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    if (!captureStatus)
        return CUDA_ERROR_INVALID_VALUE;
    if (!atomic_load(&capture_begun)) {
        *captureStatus = CU_STREAM_CAPTURE_STATUS_NONE;
        return CUDA_SUCCESS;
    }
    return gpg_cuStreamIsCapturing_ptsz(hStream, captureStatus);
}

/* cuStreamGetCaptureInfo: status, capture id and graph come from the worker
 * (proxyd/families/graphs.py) once a capture has begun in this process; before, the
 * answer is "none" here, as for cuStreamIsCapturing. The worker records a
 * capture as the ordered list of its operations, with no graph nodes the
 * application could name: the dependency set is answered empty (a NULL
 * array of 0 entries), which is the set a stream whose next captured node
 * follows every earlier one in order presents. PyTorch asks for the status
 * and id when it begins a graph capture (CUDAGraph::capture_begin). */
static CUresult capture_info(int ptsz, CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                             cuuint64_t *id_out, CUgraph *graph_out, const CUgraphNode **dependencies_out,
                             const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out)
{
    if (!captureStatus_out)
        return CUDA_ERROR_INVALID_VALUE;
    if (dependencies_out)
        *dependencies_out = NULL;
    if (edgeData_out)
        *edgeData_out = NULL;
    if (numDependencies_out)
        *numDependencies_out = 0;
    if (!atomic_load(&capture_begun)) {
        *captureStatus_out = CU_STREAM_CAPTURE_STATUS_NONE;
        return CUDA_SUCCESS;
    }
    return ptsz ? gpg_cuStreamGetCaptureInfo_v3_ptsz(hStream, captureStatus_out, id_out, graph_out, NULL, NULL, NULL)
                : gpg_cuStreamGetCaptureInfo_v3(hStream, captureStatus_out, id_out, graph_out, NULL, NULL, NULL);
}

CUresult gpo_cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                       cuuint64_t *id_out, CUgraph *graph_out, const CUgraphNode **dependencies_out,
                                       const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out)
{
    return capture_info(0, hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                        numDependencies_out);
}

CUresult gpo_cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                            cuuint64_t *id_out, CUgraph *graph_out,
                                            const CUgraphNode **dependencies_out,
                                            const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out)
{
    return capture_info(1, hStream, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                        numDependencies_out);
}

CUresult gpo_cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                       cuuint64_t *id_out, CUgraph *graph_out, const CUgraphNode **dependencies_out,
                                       size_t *numDependencies_out)
{
    return capture_info(0, hStream, captureStatus_out, id_out, graph_out, dependencies_out, NULL,
                        numDependencies_out);
}

CUresult gpo_cuStreamGetCaptureInfo_v2_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                            cuuint64_t *id_out, CUgraph *graph_out,
                                            const CUgraphNode **dependencies_out, size_t *numDependencies_out)
{
    return capture_info(1, hStream, captureStatus_out, id_out, graph_out, dependencies_out, NULL,
                        numDependencies_out);
}
