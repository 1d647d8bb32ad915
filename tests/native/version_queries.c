/* Every version and property query of the libraries gpuproxy stands in
 * for, called as a program calls them (dlopen by soname, as CuPy and JAX
 * load NVIDIA's libraries), each answer compared with the value the test
 * passes in (tests/test_version_queries.py: the header's version macros
 * where NVIDIA's headers are installed, else the versions the emulated
 * backend reports, proxyd/emu/versions.py). Prints one line per query and
 * "PASS version_queries" when all match; a query that fails or differs
 * prints FAIL and the program exits 1. No NVIDIA header is needed to build
 * it: the prototypes are the headers' (cublas_api.h, cusparse.h, ...), with
 * the handle and enum types as the ABI sees them. */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

static int failures;

static void *lib(const char *soname)
{
    void *h = dlopen(soname, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        printf("FAIL dlopen %s: %s\n", soname, dlerror());
        exit(1);
    }
    return h;
}

static void *sym(void *h, const char *name)
{
    void *f = dlsym(h, name);
    if (!f) {
        printf("FAIL %s not exported\n", name);
        exit(1);
    }
    return f;
}

static void check(const char *what, int status, long long got, long long want)
{
    if (status != 0 || got != want) {
        printf("FAIL %s: status %d, value %lld, want %lld\n", what, status, got, want);
        failures++;
    } else {
        printf("%s %lld\n", what, got);
    }
}

typedef int (*get_int_fn)(int *);
typedef int (*get_prop_fn)(int, int *);
typedef size_t (*get_size_fn)(void);
typedef int (*get_version_handle_fn)(void *, int *);

/* libraryPropertyType (library_types.h): MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL */
static void props(void *h, const char *fn, int major, int minor, int patch)
{
    get_prop_fn f = (get_prop_fn)sym(h, fn);
    int want[3] = {major, minor, patch};
    for (int t = 0; t < 3; t++) {
        int v = -1;
        char what[96];
        snprintf(what, sizeof what, "%s(%d)", fn, t);
        int st = f(t, &v);      /* before v is read: argument order is unspecified */
        check(what, st, v, want[t]);
    }
}

int main(void)
{
    int v, st;

    /* runtime and driver */
    void *rt = lib("libcudart.so.13");
    v = -1; st = ((get_int_fn)sym(rt, "cudaRuntimeGetVersion"))(&v);
    check("cudaRuntimeGetVersion", st, v, WANT_CUDART);
    int drv = -1;
    st = ((get_int_fn)sym(rt, "cudaDriverGetVersion"))(&drv);
    check("cudaDriverGetVersion", st, drv > 0 ? 1 : 0, 1);
    void *cu = lib("libcuda.so.1");
    v = -1; st = ((get_int_fn)sym(cu, "cuDriverGetVersion"))(&v);
    check("cuDriverGetVersion", st, v, drv);

    /* cuBLAS: cublasGetVersion_v2 with a NULL handle, as JAX's plugin calls it */
    void *b = lib("libcublas.so.13");
    v = -1; st = ((get_version_handle_fn)sym(b, "cublasGetVersion_v2"))(NULL, &v);
    check("cublasGetVersion_v2(NULL)", st, v, WANT_CUBLAS_VERSION);
    v = -1; st = ((get_int_fn)sym(b, "cublasGetVersion"))(&v);
    check("cublasGetVersion", st, v, WANT_CUBLAS_VERSION);
    props(b, "cublasGetProperty", WANT_CUBLAS_MAJOR, WANT_CUBLAS_MINOR, WANT_CUBLAS_PATCH);
    check("cublasGetCudartVersion", 0, (long long)((get_size_fn)sym(b, "cublasGetCudartVersion"))(), WANT_CUDART);

    void *lt = lib("libcublasLt.so.13");
    check("cublasLtGetVersion", 0, (long long)((get_size_fn)sym(lt, "cublasLtGetVersion"))(), WANT_CUBLAS_VERSION);
    check("cublasLtGetCudartVersion", 0, (long long)((get_size_fn)sym(lt, "cublasLtGetCudartVersion"))(),
          WANT_CUDART);
    props(lt, "cublasLtGetProperty", WANT_CUBLAS_MAJOR, WANT_CUBLAS_MINOR, WANT_CUBLAS_PATCH);

    /* cuSPARSE: GetProperty needs no handle (JAX's plugin); GetVersion one */
    void *sp = lib("libcusparse.so.12");
    props(sp, "cusparseGetProperty", WANT_CUSPARSE_MAJOR, WANT_CUSPARSE_MINOR, WANT_CUSPARSE_PATCH);
    void *handle = NULL;
    st = ((int (*)(void **))sym(sp, "cusparseCreate"))(&handle);
    v = -1;
    if (st == 0)
        st = ((get_version_handle_fn)sym(sp, "cusparseGetVersion"))(handle, &v);
    check("cusparseGetVersion", st, v, WANT_CUSPARSE_VERSION);
    if (handle)
        ((int (*)(void *))sym(sp, "cusparseDestroy"))(handle);

    void *ff = lib("libcufft.so.12");
    v = -1; st = ((get_int_fn)sym(ff, "cufftGetVersion"))(&v);
    check("cufftGetVersion", st, v, WANT_CUFFT_VERSION);
    props(ff, "cufftGetProperty", WANT_CUFFT_MAJOR, WANT_CUFFT_MINOR, WANT_CUFFT_PATCH);

    void *rn = lib("libcurand.so.10");
    v = -1; st = ((get_int_fn)sym(rn, "curandGetVersion"))(&v);
    check("curandGetVersion", st, v, WANT_CURAND_VERSION);
    props(rn, "curandGetProperty", WANT_CURAND_MAJOR, WANT_CURAND_MINOR, WANT_CURAND_PATCH);

    void *so = lib("libcusolver.so.12");
    v = -1; st = ((get_int_fn)sym(so, "cusolverGetVersion"))(&v);
    check("cusolverGetVersion", st, v, WANT_CUSOLVER_VERSION);
    props(so, "cusolverGetProperty", WANT_CUSOLVER_MAJOR, WANT_CUSOLVER_MINOR, WANT_CUSOLVER_PATCH);

    void *dn = lib("libcudnn.so.9");
    check("cudnnGetVersion", 0, (long long)((get_size_fn)sym(dn, "cudnnGetVersion"))(), WANT_CUDNN_VERSION);
    check("cudnnGetCudartVersion", 0, (long long)((get_size_fn)sym(dn, "cudnnGetCudartVersion"))(), WANT_CUDART);
    props(dn, "cudnnGetProperty", WANT_CUDNN_MAJOR, WANT_CUDNN_MINOR, WANT_CUDNN_PATCH);
    /* cudnn_graph.h, cudnn_ops.h, cudnn_cnn.h, cudnn_adv.h: each answers
     * CUDNN_STATUS_SUCCESS (0) when its sub-library matches the core */
    static const char *const vchecks[] = {"cudnnGraphVersionCheck", "cudnnOpsVersionCheck",
                                          "cudnnCnnVersionCheck", "cudnnAdvVersionCheck"};
    for (unsigned i = 0; i < sizeof vchecks / sizeof *vchecks; i++)
        check(vchecks[i], 0, (long long)((int (*)(void))sym(dn, vchecks[i]))(), 0);

    /* NVML: the strings are answered (not empty) and the CUDA driver
     * version is the driver API's */
    void *nv = lib("libnvidia-ml.so.1");
    st = ((int (*)(void))sym(nv, "nvmlInit_v2"))();
    check("nvmlInit_v2", st, 0, 0);
    char buf[96];
    const char *names[] = {"nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion"};
    for (int i = 0; i < 2; i++) {
        buf[0] = 0;
        st = ((int (*)(char *, unsigned int))sym(nv, names[i]))(buf, sizeof buf);
        check(names[i], st, buf[0] != 0, 1);
    }
    v = -1; st = ((get_int_fn)sym(nv, "nvmlSystemGetCudaDriverVersion"))(&v);
    check("nvmlSystemGetCudaDriverVersion", st, v, drv);
    v = -1; st = ((get_int_fn)sym(nv, "nvmlSystemGetCudaDriverVersion_v2"))(&v);
    check("nvmlSystemGetCudaDriverVersion_v2", st, v, drv);
    ((int (*)(void))sym(nv, "nvmlShutdown"))();

    if (failures)
        return 1;
    printf("PASS version_queries\n");
    return 0;
}
