/* Hand-written part of the libcurand.so.10 stand-in (spec: shim: override
 * in specs/curand/curand.yaml). docs/libraries.md. Locking: as lib_cufft.c. */
#include "gp_lib_curand.h"

extern int cudaFree(void *devPtr);     /* cuda_runtime_api.h; see lib_cufft.c */

enum { CURAND_STATUS_INITIALIZATION_FAILED = 203 };   /* curand.h */

curandStatus_t gpo_curandCreateGenerator(curandGenerator_t *generator, curandRngType_t rng_type)
{
    /* the generator's state lives in the context current at creation */
    if (cudaFree(NULL) != 0)
        return (curandStatus_t)CURAND_STATUS_INITIALIZATION_FAILED;
    return gpg_curandCreateGenerator(generator, rng_type);
}
