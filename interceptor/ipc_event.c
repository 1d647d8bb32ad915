/* IPC event handles (cuda.h, cuIpcGetEventHandle / cuIpcOpenEventHandle;
 * proxyd/families/ipc.py does the work). What the shim adds is ordering: natively,
 * cuEventRecord on a shared event is submitted to the GPU when it returns,
 * so the other process may wait on it at once (the usual pattern signals
 * through a pipe or barrier right after the record). Here an event record is
 * an asynchronous op that waits in the batch until the next synchronous
 * call; for an event this process has exported or opened, the record is
 * therefore flushed and acknowledged by the worker (which has then issued
 * it to the GPU) before cuEventRecord returns.
 *
 * Locking: the table is under gp_lock; the generated stubs take it
 * themselves, so it is taken again after them. */
#include "gp_gen.h"
#include "gp_shim.h"

#define GP_MAX_IPC_EVENTS 256
static CUevent ipc_events[GP_MAX_IPC_EVENTS];
static int n_ipc_events;

static void note_ipc_event(CUevent ev)
{
    gp_lock();
    int known = 0;
    for (int i = 0; i < n_ipc_events; i++)
        known |= ipc_events[i] == ev;
    if (!known && n_ipc_events < GP_MAX_IPC_EVENTS)
        ipc_events[n_ipc_events++] = ev;
    gp_unlock();
}

/* Flushes the batch if ev is shared with another process. */
static CUresult flush_if_shared(CUresult rc, CUevent ev)
{
    if (rc != CUDA_SUCCESS)
        return rc;
    gp_lock();
    int shared = 0;
    for (int i = 0; i < n_ipc_events; i++)
        shared |= ipc_events[i] == ev;
    if (shared && gp_session() == CUDA_SUCCESS)
        rc = gp_flush();
    gp_unlock();
    return rc;
}

CUresult gpo_cuIpcGetEventHandle(CUipcEventHandle *pHandle, CUevent event)
{
    if (!pHandle)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = gpg_cuIpcGetEventHandle(pHandle, event);
    if (rc == CUDA_SUCCESS)
        note_ipc_event(event);
    return rc;
}

CUresult gpo_cuIpcOpenEventHandle(CUevent *phEvent, CUipcEventHandle handle)
{
    if (!phEvent)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = gpg_cuIpcOpenEventHandle(phEvent, handle);
    if (rc == CUDA_SUCCESS)
        note_ipc_event(*phEvent);
    return rc;
}

CUresult gpo_cuEventRecord(CUevent hEvent, CUstream hStream)
{
    return flush_if_shared(gpg_cuEventRecord(hEvent, hStream), hEvent);
}

CUresult gpo_cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
    return flush_if_shared(gpg_cuEventRecord_ptsz(hEvent, hStream), hEvent);
}

CUresult gpo_cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    return flush_if_shared(gpg_cuEventRecordWithFlags(hEvent, hStream, flags), hEvent);
}

CUresult gpo_cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    return flush_if_shared(gpg_cuEventRecordWithFlags_ptsz(hEvent, hStream, flags), hEvent);
}
