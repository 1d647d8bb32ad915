/* The library API (cuLibrary*, cuKernel*; CUDA Driver API reference,
 * "Library Management"), kept in the shim on top of the module API that the
 * shim remotes.
 *
 * NVIDIA's static runtime (libcudart_static.a, and libraries that embed it)
 * loads the program's fat binaries with cuLibraryLoadData, gets CUkernels
 * with cuLibraryGetKernel and passes them straight to cuLaunchKernel and the
 * cuFunc* calls as CUfunctions (cuda.h allows that). The driver's libraries
 * and kernels are context-independent: a library is loaded into each context
 * that uses it, on first use, and survives the destruction of a context
 * (cudaDeviceReset resets the primary context; the runtime keeps using the
 * same CUlibrary and CUkernel handles afterwards).
 *
 * So the shim keeps, per library, a copy of its image and the module it has
 * in each context, and per kernel its name and its function in each context;
 * both are loaded in a context when first used there (cuModuleLoadDataEx and
 * cuModuleGetFunction, remoted as usual, so checkpoints carry them as
 * ordinary modules and functions). Handles are shim-local kinds
 * (GP_K_LIBRARY, GP_K_KERNEL): gp_function_of() (context.c, which calls
 * the resolver this file registers) turns a CUkernel into the function of
 * the current context wherever a CUfunction goes to proxyd (launches in
 * driver.c and launch_ex.c, the generated stubs). A context that is
 * destroyed or reset takes its modules and functions with it
 * (gp_library_context_gone).
 *
 * Library options (CU_LIBRARY_BINARY_IS_PRESERVED, host-variable handles)
 * tell the driver how it may keep the image; the shim copies it either way.
 * JIT options are not forwarded, as for cuModuleLoadDataEx (driver.c).
 *
 * Locking: the tables are under gp_lock (recursive); the remoted calls made
 * while it is held take it again. */
#include <stdlib.h>
#include <string.h>

#include "gp_gen.h"
#include "gp_shim.h"

size_t gp_image_size(const void *image, const void **start);   /* driver.c */

#define MAX_LIBS 4096
#define MAX_KERNELS 65536

struct per_ctx {
    CUcontext ctx;
    void *obj;            /* CUmodule (library) or CUfunction (kernel) */
};

struct lib {
    int used;
    void *image;          /* own copy */
    struct per_ctx *mods;
    int nmods;
};

struct kern {
    int used;
    uint32_t lib;
    char *name;
    struct per_ctx *fns;
    int nfns;
};

static struct lib libs[MAX_LIBS];
static struct kern *kerns;     /* MAX_KERNELS entries, allocated on first use */
static uint32_t nkerns;        /* ids handed out so far */

#define HANDLE(kind, id) ((void *)(uintptr_t)(((uint64_t)(kind) << 32) | (uint64_t)(id)))

static int handle_id(const void *h, int kind, uint32_t limit, uint32_t *id)
{
    uint64_t v = (uint64_t)(uintptr_t)h;
    if ((int)(v >> 32) != kind || (uint32_t)v == 0 || (uint32_t)v > limit)
        return -1;
    *id = (uint32_t)v;
    return 0;
}

static struct lib *lib_of(CUlibrary l)
{
    uint32_t id;
    if (handle_id(l, GP_K_LIBRARY, MAX_LIBS - 1, &id) || !libs[id].used)
        return NULL;
    return &libs[id];
}

static struct kern *kern_of(const void *k)
{
    uint32_t id;
    if (!kerns || handle_id(k, GP_K_KERNEL, nkerns, &id) || !kerns[id].used)
        return NULL;
    return &kerns[id];
}

static void *per_ctx_find(struct per_ctx *v, int n, CUcontext ctx)
{
    for (int i = 0; i < n; i++)
        if (v[i].ctx == ctx)
            return v[i].obj;
    return NULL;
}

static int per_ctx_add(struct per_ctx **v, int *n, CUcontext ctx, void *obj)
{
    struct per_ctx *nv = realloc(*v, (size_t)(*n + 1) * sizeof **v);
    if (!nv)
        return -1;
    nv[*n] = (struct per_ctx){ctx, obj};
    *v = nv;
    (*n)++;
    return 0;
}

static void per_ctx_drop(struct per_ctx *v, int *n, CUcontext ctx)
{
    for (int i = 0; i < *n; i++)
        if (v[i].ctx == ctx) {
            v[i] = v[--*n];
            return;
        }
}

/* The library's module in the current context, loaded there if needed.
 * Caller holds gp_lock. */
static CUresult lib_module(struct lib *L, CUmodule *mod)
{
    CUcontext ctx = gp_ctx_current();
    if (!ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUmodule m = per_ctx_find(L->mods, L->nmods, ctx);
    if (!m) {
        CUresult rc = cuModuleLoadData(&m, L->image);
        if (rc != CUDA_SUCCESS)
            return rc;
        if (per_ctx_add(&L->mods, &L->nmods, ctx, m)) {
            cuModuleUnload(m);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    *mod = m;
    return CUDA_SUCCESS;
}

/* The kernel's function in the current context. Caller holds gp_lock. */
static CUresult kern_function(struct kern *K, CUfunction *fn)
{
    CUcontext ctx = gp_ctx_current();
    if (!ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUfunction f = per_ctx_find(K->fns, K->nfns, ctx);
    if (!f) {
        CUmodule m;
        CUresult rc = lib_module(&libs[K->lib], &m);
        if (rc == CUDA_SUCCESS)
            rc = cuModuleGetFunction(&f, m, K->name);
        if (rc != CUDA_SUCCESS)
            return rc;
        if (per_ctx_add(&K->fns, &K->nfns, ctx, f))
            return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *fn = f;
    return CUDA_SUCCESS;
}

/* The kernel resolver of gp_function_of (context.c): f is a CUkernel. */
static CUfunction function_of_kernel(CUfunction f)
{
    CUfunction out = NULL;
    gp_lock();
    struct kern *K = kern_of(f);
    if (K && kern_function(K, &out) != CUDA_SUCCESS)
        out = NULL;
    gp_unlock();
    return out;
}

__attribute__((constructor)) static void register_kernel_resolver(void)
{
    gp_set_kernel_resolver(function_of_kernel);
}

void gp_library_context_gone(CUcontext ctx)
{
    gp_lock();
    for (int i = 0; i < MAX_LIBS; i++)
        if (libs[i].used)
            per_ctx_drop(libs[i].mods, &libs[i].nmods, ctx);
    for (uint32_t i = 1; kerns && i <= nkerns; i++)
        if (kerns[i].used)
            per_ctx_drop(kerns[i].fns, &kerns[i].nfns, ctx);
    gp_unlock();
}

CUresult gpo_cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                               void **jitOptionsValues, unsigned int numJitOptions,
                               CUlibraryOption *libraryOptions, void **libraryOptionValues,
                               unsigned int numLibraryOptions)
{
    (void)jitOptions;
    (void)jitOptionsValues;
    (void)numJitOptions;
    (void)libraryOptions;
    (void)libraryOptionValues;
    (void)numLibraryOptions;
    if (!library || !code)
        return CUDA_ERROR_INVALID_VALUE;
    const void *start;
    size_t n = gp_image_size(code, &start);
    void *copy = malloc(n ? n : 1);
    if (!copy)
        return CUDA_ERROR_OUT_OF_MEMORY;
    memcpy(copy, start, n);
    gp_lock();
    int id = 1;
    while (id < MAX_LIBS && libs[id].used)
        id++;
    if (id == MAX_LIBS) {
        gp_unlock();
        free(copy);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    libs[id] = (struct lib){.used = 1, .image = copy};
    /* load it in the current context now, as the driver does with eager
     * loading: a bad image fails here, not at the first launch */
    CUresult rc = CUDA_SUCCESS;
    if (gp_ctx_current()) {
        CUmodule m;
        rc = lib_module(&libs[id], &m);
    }
    if (rc != CUDA_SUCCESS) {
        free(copy);
        libs[id] = (struct lib){0};
    } else {
        *library = HANDLE(GP_K_LIBRARY, id);
    }
    gp_unlock();
    return rc;
}

CUresult gpo_cuLibraryUnload(CUlibrary library)
{
    gp_lock();
    struct lib *L = lib_of(library);
    if (!L) {
        gp_unlock();
        return CUDA_ERROR_INVALID_HANDLE;
    }
    uint32_t id = (uint32_t)(uintptr_t)library;
    CUresult rc = CUDA_SUCCESS;
    for (int i = 0; i < L->nmods; i++) {
        CUresult r = cuModuleUnload((CUmodule)L->mods[i].obj);
        if (rc == CUDA_SUCCESS)
            rc = r;
    }
    for (uint32_t i = 1; kerns && i <= nkerns; i++)
        if (kerns[i].used && kerns[i].lib == id) {
            free(kerns[i].name);
            free(kerns[i].fns);
            kerns[i] = (struct kern){0};
        }
    free(L->mods);
    free(L->image);
    *L = (struct lib){0};
    gp_unlock();
    return rc;
}

CUresult gpo_cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    if (!pKernel || !name)
        return CUDA_ERROR_INVALID_VALUE;
    gp_lock();
    struct lib *L = lib_of(library);
    if (!L) {
        gp_unlock();
        return CUDA_ERROR_INVALID_HANDLE;
    }
    uint32_t lid = (uint32_t)(uintptr_t)library;
    for (uint32_t i = 1; kerns && i <= nkerns; i++)   /* one handle per name, as the driver */
        if (kerns[i].used && kerns[i].lib == lid && strcmp(kerns[i].name, name) == 0) {
            *pKernel = HANDLE(GP_K_KERNEL, i);
            gp_unlock();
            return CUDA_SUCCESS;
        }
    if (!kerns)
        kerns = calloc(MAX_KERNELS, sizeof *kerns);
    if (!kerns || nkerns + 1 >= MAX_KERNELS) {
        gp_unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uint32_t id = nkerns + 1;
    kerns[id] = (struct kern){.used = 1, .lib = lid, .name = strdup(name)};
    if (!kerns[id].name) {
        kerns[id].used = 0;
        gp_unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    nkerns = id;
    /* a name the library lacks fails here (CUDA_ERROR_NOT_FOUND), as in the driver */
    CUresult rc = CUDA_SUCCESS;
    if (gp_ctx_current()) {
        CUfunction f;
        rc = kern_function(&kerns[id], &f);
    }
    if (rc != CUDA_SUCCESS) {
        free(kerns[id].name);
        free(kerns[id].fns);
        kerns[id] = (struct kern){0};
        nkerns = id - 1;
    } else {
        *pKernel = HANDLE(GP_K_KERNEL, id);
    }
    gp_unlock();
    return rc;
}

CUresult gpo_cuLibraryGetModule(CUmodule *pMod, CUlibrary library)
{
    if (!pMod)
        return CUDA_ERROR_INVALID_VALUE;
    gp_lock();
    struct lib *L = lib_of(library);
    CUresult rc = L ? lib_module(L, pMod) : CUDA_ERROR_INVALID_HANDLE;
    gp_unlock();
    return rc;
}

CUresult gpo_cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    if (!pFunc)
        return CUDA_ERROR_INVALID_VALUE;
    gp_lock();
    struct kern *K = kern_of(kernel);
    CUresult rc = K ? kern_function(K, pFunc) : CUDA_ERROR_INVALID_HANDLE;
    gp_unlock();
    return rc;
}

CUresult gpo_cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary library, const char *name)
{
    gp_lock();
    struct lib *L = lib_of(library);
    CUmodule m = NULL;
    CUresult rc = L ? lib_module(L, &m) : CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS)
        rc = cuModuleGetGlobal(dptr, bytes, m, name);
    gp_unlock();
    return rc;
}

/* The per-device kernel calls act on the kernel's function in the current
 * context (whose device the runtime passes as dev). */
static CUresult kernel_fn(CUkernel kernel, CUfunction *f)
{
    gp_lock();
    struct kern *K = kern_of(kernel);
    CUresult rc = K ? kern_function(K, f) : CUDA_ERROR_INVALID_HANDLE;
    gp_unlock();
    return rc;
}

CUresult gpo_cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev)
{
    (void)dev;
    CUfunction f;
    CUresult rc = kernel_fn(kernel, &f);
    return rc == CUDA_SUCCESS ? cuFuncGetAttribute(pi, attrib, f) : rc;
}

CUresult gpo_cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel kernel, CUdevice dev)
{
    (void)dev;
    CUfunction f;
    CUresult rc = kernel_fn(kernel, &f);
    return rc == CUDA_SUCCESS ? cuFuncSetAttribute(f, attrib, val) : rc;
}

CUresult gpo_cuKernelSetCacheConfig(CUkernel kernel, CUfunc_cache config, CUdevice dev)
{
    (void)dev;
    CUfunction f;
    CUresult rc = kernel_fn(kernel, &f);
    return rc == CUDA_SUCCESS ? cuFuncSetCacheConfig(f, config) : rc;
}

CUresult gpo_cuKernelGetName(const char **name, CUkernel hfunc)
{
    CUfunction f;
    CUresult rc = kernel_fn(hfunc, &f);
    return rc == CUDA_SUCCESS ? cuFuncGetName(name, f) : rc;
}

CUresult gpo_cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t *paramOffset, size_t *paramSize)
{
    CUfunction f;
    CUresult rc = kernel_fn(kernel, &f);
    return rc == CUDA_SUCCESS ? cuFuncGetParamInfo(f, paramIndex, paramOffset, paramSize) : rc;
}
