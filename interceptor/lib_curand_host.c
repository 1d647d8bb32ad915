/* cuRAND host generators in the libcurand.so.10 stand-in
 * (curandCreateGeneratorHost; spec: shim: override on it and on the
 * generate calls). curand.h: a host generator computes on the CPU and writes
 * its results to host memory. Here it is NVIDIA's host generator in the
 * worker (the same library and algorithm: the numbers are native's), so a
 * generate call on one is sent synchronously and its results come back in
 * the answer, copied to the application's buffer before the call returns,
 * as natively. A device generator's calls take the generated path
 * (asynchronous, results in device memory). The worker side is
 * proxyd/families/curand_host.py.
 *
 * Which generators are host ones: a table filled at creation. Handles are
 * session ids that are never reused, so a destroyed generator's entry is
 * simply never asked for again (the table is bounded by the generators a
 * process creates). It is client state: a GPU-only restore keeps it with
 * the handles, CRIU with the process.
 *
 * Locking: the table under gp_lock (the shim's one lock), as the op. */
#include <stdint.h>
#include <stdlib.h>

#include "gp_lib_curand.h"

extern int cudaFree(void *devPtr);     /* cuda_runtime_api.h; see lib_cufft.c */

enum { CURAND_STATUS_ALLOCATION_FAILED = 102, CURAND_STATUS_INITIALIZATION_FAILED = 203 };   /* curand.h */

static uint64_t *host_gens;
static size_t n_host, cap_host;

static int is_host(curandGenerator_t g)
{
    uint64_t h = (uint64_t)(uintptr_t)g;
    for (size_t i = 0; i < n_host; i++)
        if (host_gens[i] == h)
            return 1;
    return 0;
}

curandStatus_t gpo_curandCreateGeneratorHost(curandGenerator_t *generator, curandRngType_t rng_type)
{
    if (cudaFree(NULL) != 0)      /* the op names the calling thread's context, as a device generator's */
        return (curandStatus_t)CURAND_STATUS_INITIALIZATION_FAILED;
    curandStatus_t s = gpg_curandCreateGeneratorHost(generator, rng_type);
    if (s != GP_CURAND_SUCCESS || !generator)
        return s;
    gp_lock();
    if (n_host == cap_host) {
        size_t nc = cap_host ? 2 * cap_host : 8;
        uint64_t *t = realloc(host_gens, nc * sizeof *t);
        if (!t) {
            gp_unlock();
            gpg_curandDestroyGenerator(*generator);
            return (curandStatus_t)CURAND_STATUS_ALLOCATION_FAILED;
        }
        host_gens = t;
        cap_host = nc;
    }
    host_gens[n_host++] = (uint64_t)(uintptr_t)*generator;
    gp_unlock();
    return s;
}

/* The generate op of a host generator: [generator, output address, num,
 * extra scalars...], answered with the results' bytes. */
typedef enum { X_NONE, X_FLOAT2, X_DOUBLE2, X_DOUBLE1 } extra_t;

static curandStatus_t host_generate(int fid, curandGenerator_t g, void *out, size_t num, size_t elem, extra_t x,
                                    double a, double b)
{
    gp_lock();
    if (gp_session() != CUDA_SUCCESS) {
        gp_unlock();
        return (curandStatus_t)GP_CURAND_UNAVAILABLE;
    }
    int nargs = 3 + (x == X_DOUBLE1 ? 1 : x == X_NONE ? 0 : 2);
    gp_buf *b_ = gp_op_begin(fid, nargs);
    mp_uint(b_, (uint64_t)(uintptr_t)g);
    mp_uint(b_, (uint64_t)(uintptr_t)out);
    GP_PUT_SCALAR(b_, num);
    if (x == X_FLOAT2) {
        float fa = (float)a, fb = (float)b;
        GP_PUT_SCALAR(b_, fa);
        GP_PUT_SCALAR(b_, fb);
    } else if (x == X_DOUBLE2) {
        GP_PUT_SCALAR(b_, a);
        GP_PUT_SCALAR(b_, b);
    } else if (x == X_DOUBLE1) {
        GP_PUT_SCALAR(b_, a);
    }
    gp_reply r_;
    if (gp_lib_op_sync(&r_) < 0) {
        gp_reply_done(&r_);
        gp_unlock();
        return (curandStatus_t)GP_CURAND_UNAVAILABLE;
    }
    if (r_.code == GP_CURAND_SUCCESS && r_.have_outs && r_.nouts >= 1)
        gp_out_buffer(&r_, out, out ? num * elem : 0);
    curandStatus_t ret = (curandStatus_t)r_.code;
    gp_reply_done(&r_);
    gp_unlock();
    return ret;
}

static int host_gen(curandGenerator_t g)
{
    gp_lock();
    int h = is_host(g);
    gp_unlock();
    return h;
}

curandStatus_t gpo_curandGenerate(curandGenerator_t g, unsigned int *out, size_t num)
{
    return host_gen(g) ? host_generate(GP_FID_curandGenerate, g, out, num, sizeof *out, X_NONE, 0, 0)
                       : gpg_curandGenerate(g, out, num);
}

curandStatus_t gpo_curandGenerateLongLong(curandGenerator_t g, unsigned long long *out, size_t num)
{
    return host_gen(g) ? host_generate(GP_FID_curandGenerateLongLong, g, out, num, sizeof *out, X_NONE, 0, 0)
                       : gpg_curandGenerateLongLong(g, out, num);
}

curandStatus_t gpo_curandGenerateUniform(curandGenerator_t g, float *out, size_t num)
{
    return host_gen(g) ? host_generate(GP_FID_curandGenerateUniform, g, out, num, sizeof *out, X_NONE, 0, 0)
                       : gpg_curandGenerateUniform(g, out, num);
}

curandStatus_t gpo_curandGenerateUniformDouble(curandGenerator_t g, double *out, size_t num)
{
    return host_gen(g) ? host_generate(GP_FID_curandGenerateUniformDouble, g, out, num, sizeof *out, X_NONE, 0, 0)
                       : gpg_curandGenerateUniformDouble(g, out, num);
}

curandStatus_t gpo_curandGenerateNormal(curandGenerator_t g, float *out, size_t num, float mean, float stddev)
{
    return host_gen(g) ? host_generate(GP_FID_curandGenerateNormal, g, out, num, sizeof *out, X_FLOAT2, mean, stddev)
                       : gpg_curandGenerateNormal(g, out, num, mean, stddev);
}

curandStatus_t gpo_curandGenerateNormalDouble(curandGenerator_t g, double *out, size_t num, double mean,
                                              double stddev)
{
    return host_gen(g) ? host_generate(GP_FID_curandGenerateNormalDouble, g, out, num, sizeof *out, X_DOUBLE2, mean,
                                       stddev)
                       : gpg_curandGenerateNormalDouble(g, out, num, mean, stddev);
}

curandStatus_t gpo_curandGenerateLogNormal(curandGenerator_t g, float *out, size_t num, float mean, float stddev)
{
    return host_gen(g) ? host_generate(GP_FID_curandGenerateLogNormal, g, out, num, sizeof *out, X_FLOAT2, mean,
                                       stddev)
                       : gpg_curandGenerateLogNormal(g, out, num, mean, stddev);
}

curandStatus_t gpo_curandGenerateLogNormalDouble(curandGenerator_t g, double *out, size_t num, double mean,
                                                 double stddev)
{
    return host_gen(g) ? host_generate(GP_FID_curandGenerateLogNormalDouble, g, out, num, sizeof *out, X_DOUBLE2,
                                       mean, stddev)
                       : gpg_curandGenerateLogNormalDouble(g, out, num, mean, stddev);
}

curandStatus_t gpo_curandGeneratePoisson(curandGenerator_t g, unsigned int *out, size_t num, double lambda)
{
    return host_gen(g) ? host_generate(GP_FID_curandGeneratePoisson, g, out, num, sizeof *out, X_DOUBLE1, lambda, 0)
                       : gpg_curandGeneratePoisson(g, out, num, lambda);
}
