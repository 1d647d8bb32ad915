/* Stream capture queries. Capture (cuStreamBeginCapture, graphs) is not
 * supported (README limits): no stream of this process can be capturing, so
 * cuStreamIsCapturing answers CU_STREAM_CAPTURE_STATUS_NONE for every
 * stream (cuda.h). Libraries ask before each asynchronous copy (CuPy, the
 * static runtime's cudaStreamIsCapturing). No daemon round trip; no lock
 * (nothing shared is read). */
#include "gp_gen.h"
#include "gp_shim.h"

CUresult gpo_cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    (void)hStream;
    if (!captureStatus)
        return CUDA_ERROR_INVALID_VALUE;
    *captureStatus = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

CUresult gpo_cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    return gpo_cuStreamIsCapturing(hStream, captureStatus);
}
