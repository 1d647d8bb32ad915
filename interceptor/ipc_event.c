/* Events: creates named by the shim (below), and IPC event handles (cuda.h,
 * cuIpcGetEventHandle / cuIpcOpenEventHandle;
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
#include "gp_lib.h"
#include "gp_shim.h"

/* ------------------------------------------------------------ creates
 * cuEventCreate (and cudaEventCreate/WithFlags, rt_api.c) does not wait
 * for proxyd: the shim picks the handle (gp_lib_new_handle: kind event,
 * id with bit 31 set, never one proxyd hands out; ids of destroyed events
 * come back, LIFO) and sends the create with it asynchronously (spec
 * `ids: shim`, specs/driver/event.yaml); proxyd creates the driver event
 * and registers it under that handle (proxyd/worker/dispatch.py generic),
 * and every later op names it as it would one proxyd had named. Ops reach
 * the worker in order, so the create has run before any op that uses the
 * handle, and the destroy of an id before the create that reuses it. A
 * checkpoint records the create with its handle, and a restore (GPU-only
 * or whole-process) creates the event again under the same id; the id
 * counters live in this process and come back with it.
 * Before it was a round trip that also waited for every asynchronous op
 * queued before it: ~1.1 ms a create in a 4-rank DDP step.
 *
 * What the driver would refuse at once is refused here (cuda.h,
 * CUevent_flags and cuEventCreate): flags other than CU_EVENT_DEFAULT,
 * CU_EVENT_BLOCKING_SYNC, CU_EVENT_DISABLE_TIMING and CU_EVENT_INTERPROCESS,
 * and CU_EVENT_INTERPROCESS without CU_EVENT_DISABLE_TIMING ("must be
 * specified along with"); CUDA_ERROR_INVALID_VALUE. A failure the shim cannot
 * foresee (no current context, out of memory) is reported, as for any
 * asynchronous call, by the next synchronous call; the handle is then
 * unknown to proxyd and its uses fail with CUDA_ERROR_INVALID_HANDLE.
 *
 * Locking: gp_lib_new_handle / gp_lib_free_handle take gp_lock; the
 * generated bodies take it themselves. */
#define GP_EVENT_CREATE_FLAGS (CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS)

CUresult gpo_cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    if (!phEvent || (Flags & ~(unsigned)GP_EVENT_CREATE_FLAGS)
        || ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)))
        return CUDA_ERROR_INVALID_VALUE;
    CUevent ev = (CUevent)(uintptr_t)gp_lib_new_handle(GP_K_EVENT);
    CUresult rc = gpg_cuEventCreate(&ev, Flags);
    /* on failure the id is not given back: the op may have been queued
     * (a send that failed is sent again when the session comes back) */
    if (rc == CUDA_SUCCESS)
        *phEvent = ev;
    return rc;
}

CUresult gpo_cuEventDestroy_v2(CUevent hEvent)
{
    CUresult rc = gpg_cuEventDestroy_v2(hEvent);
    /* queued before any create that takes the id again (above) */
    if (rc == CUDA_SUCCESS)
        gp_lib_free_handle(hEvent);
    return rc;
}

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
