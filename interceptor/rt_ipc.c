/* Runtime API for IPC between processes (CUDA Runtime API, "Device
 * Management": cudaIpc*), on the driver entry points that proxyd serves
 * (proxyd/families/ipc.py, docs/ipc.md). cudaIpcMemHandle_t and CUipcMemHandle are
 * both 64 opaque bytes.
 *
 * Locking: each driver call takes gp_lock itself. */
#include <string.h>

#include "gp_gen.h"
#include "gp_rt.h"

_Static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(CUipcMemHandle), "IPC handles differ in size");

cudaError_t gpo_cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
    if (!handle)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    RT_RETURN_CU(cuIpcGetMemHandle((CUipcMemHandle *)handle, (CUdeviceptr)(uintptr_t)devPtr));
}

cudaError_t gpo_cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags)
{
    if (!devPtr)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUipcMemHandle h;
    memcpy(&h, &handle, sizeof h);
    CUdeviceptr d = 0;
    CUresult r = cuIpcOpenMemHandle_v2(&d, h, flags);
    if (r == CUDA_SUCCESS)
        *devPtr = (void *)(uintptr_t)d;
    RT_RETURN_CU(r);
}

cudaError_t gpo_cudaIpcCloseMemHandle(void *devPtr)
{
    RT_INIT();
    RT_RETURN_CU(cuIpcCloseMemHandle((CUdeviceptr)(uintptr_t)devPtr));
}

_Static_assert(sizeof(cudaIpcEventHandle_t) == sizeof(CUipcEventHandle), "IPC event handles differ in size");

cudaError_t gpo_cudaIpcGetEventHandle(cudaIpcEventHandle_t *handle, cudaEvent_t event)
{
    if (!handle)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    RT_RETURN_CU(cuIpcGetEventHandle((CUipcEventHandle *)handle, (CUevent)event));
}

cudaError_t gpo_cudaIpcOpenEventHandle(cudaEvent_t *event, cudaIpcEventHandle_t handle)
{
    if (!event)
        return gp_rt_ret(cudaErrorInvalidValue);
    RT_INIT();
    CUipcEventHandle h;
    memcpy(&h, &handle, sizeof h);
    RT_RETURN_CU(cuIpcOpenEventHandle((CUevent *)event, h));
}
