/* cuGetProcAddress (CUDA Driver API reference, "Driver Entry Point
 * Access"): a driver entry point by name, from the generated table of every
 * symbol the shim exports (gp_proc_table.c). The table names every entry
 * point, so this file and the table sit above all of them (interceptor/LAYERS:
 * entry_tables); the runtime's cudaGetDriverEntryPoint (rt_api.c) uses both.
 *
 * No locking: the table is constant. */
#include <stdio.h>
#include <stdlib.h>

#include "gp_gen.h"
#include "gp_shim.h"

/* With GPUPROXY_DEBUG set, one stderr line for each symbol a program asks
 * for that the shim has no entry point for: frameworks resolve driver
 * functions by name (PyTorch's c10::cuda::DriverAPI, Triton, the static
 * runtime) and fall back or fail silently on a NULL answer, so this is how
 * a missing one is found. getenv, not the transport's flag: lookups run
 * before the first connection. */
void gp_proc_note_missing(const char *api, const char *symbol, int version, const void *found)
{
    if (!found && getenv("GPUPROXY_DEBUG"))
        fprintf(stderr, "gpuproxy: %s(\"%s\", %d): no such entry point in the shim\n", api, symbol, version);
}

static CUresult proc_address(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    int other = 0;
    void *p = gp_proc_lookup(symbol, cudaVersion, (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0, &other);
    gp_proc_note_missing("cuGetProcAddress", symbol, cudaVersion, p);
    *pfn = p;
    if (status)
        *status = p ? CU_GET_PROC_ADDRESS_SUCCESS
                    : (other ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    return p ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult gpo_cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *symbolStatus)
{
    return proc_address(symbol, pfn, cudaVersion, flags, symbolStatus);
}

CUresult gpo_cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return proc_address(symbol, pfn, cudaVersion, flags, NULL);
}
