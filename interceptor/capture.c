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
