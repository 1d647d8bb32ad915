/* cuThreadExchangeStreamCaptureMode: the calling thread's capture
 * interaction mode (cuda.h: global, thread-local or relaxed; it decides
 * which potentially unsafe calls a thread may make while some stream
 * captures). The mode is per thread of the application, so the shim keeps
 * it; proxyd's capture (proxyd/families/graphs.py) records ops by stream and does
 * not refuse calls by mode.
 *
 * Locking: thread-local state only. */
#include "gp_shim.h"

static __thread int capture_mode;     /* CU_STREAM_CAPTURE_MODE_GLOBAL (0) at thread start */

CUresult gpo_cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    if (!mode)
        return CUDA_ERROR_INVALID_VALUE;
    int m = (int)*mode;
    if (m != CU_STREAM_CAPTURE_MODE_GLOBAL && m != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        m != CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    *mode = (CUstreamCaptureMode)capture_mode;
    capture_mode = m;
    return CUDA_SUCCESS;
}
