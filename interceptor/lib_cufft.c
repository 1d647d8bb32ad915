/* Hand-written parts of the libcufft.so.12 stand-in (spec: shim: override
 * in specs/cufft/cufft.yaml); everything else is generated
 * (autogen/gen_lib.py). docs/libraries.md. Locking: the generated gpg_
 * bodies take gp_lock themselves; nothing here holds it. */
#include "gp_lib_cufft.h"

/* cuda_runtime_api.h: cudaFree(NULL) initialises the runtime's context on
 * the calling thread, as NVIDIA's libcufft does through its own runtime
 * before it makes a plan; the plan belongs to that context. */
extern int cudaFree(void *devPtr);

enum { CUFFT_SETUP_FAILED = 7 };     /* cufft.h: "the cuFFT library failed to initialize" */

cufftResult gpo_cufftCreate(cufftHandle *handle)
{
    if (cudaFree(NULL) != 0)
        return (cufftResult)CUFFT_SETUP_FAILED;
    return gpg_cufftCreate(handle);
}

cufftResult gpo_cufftPlan1d(cufftHandle *plan, int nx, cufftType type, int batch)
{
    if (cudaFree(NULL) != 0)
        return (cufftResult)CUFFT_SETUP_FAILED;
    return gpg_cufftPlan1d(plan, nx, type, batch);
}

cufftResult gpo_cufftPlan2d(cufftHandle *plan, int nx, int ny, cufftType type)
{
    if (cudaFree(NULL) != 0)
        return (cufftResult)CUFFT_SETUP_FAILED;
    return gpg_cufftPlan2d(plan, nx, ny, type);
}

cufftResult gpo_cufftPlanMany(cufftHandle *plan, int rank, int *n, int *inembed, int istride, int idist,
                              int *onembed, int ostride, int odist, cufftType type, int batch)
{
    if (cudaFree(NULL) != 0)
        return (cufftResult)CUFFT_SETUP_FAILED;
    return gpg_cufftPlanMany(plan, rank, n, inembed, istride, idist, onembed, ostride, odist, type, batch);
}
