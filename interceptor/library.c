/* The library API (cuLibrary*, cuKernel*; CUDA Driver API reference,
 * "Library Management"), mapped onto the module API that the shim remotes.
 *
 * NVIDIA's static runtime (libcudart_static.a, and libraries that embed it)
 * loads the program's fat binaries with cuLibraryLoadData and launches
 * through cuLibraryGetKernel/cuKernelGetFunction. The shim answers a library
 * with a module loaded into the calling thread's current context and a
 * kernel with that module's function: a CUlibrary handle *is* a CUmodule
 * handle and a CUkernel handle *is* a CUfunction handle (both carry their
 * object kind, gp_shim.h), so cuLibraryGetModule and cuKernelGetFunction are
 * identities. Checkpoints need nothing new: modules and functions are in the
 * image and come back under their handles.
 *
 * Limit: the driver's libraries are context-independent (a kernel gets a
 * function in each context that uses it); here a library lives in the
 * context that was current when it was loaded, which is how the static
 * runtime uses it (one primary context per device, current when it loads).
 * A load without a current context fails with CUDA_ERROR_INVALID_CONTEXT.
 *
 * Locking: every function here calls the shim's exported driver entry
 * points, which take gp_lock themselves. */
#include <stddef.h>

#include "gp_gen.h"
#include "gp_shim.h"

CUresult gpo_cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                               void **jitOptionsValues, unsigned int numJitOptions,
                               CUlibraryOption *libraryOptions, void **libraryOptionValues,
                               unsigned int numLibraryOptions)
{
    /* Library options (CU_LIBRARY_BINARY_IS_PRESERVED, host-variable
     * handles) tell the driver how it may keep the image; the shim copies it
     * to proxyd either way. */
    (void)libraryOptions;
    (void)libraryOptionValues;
    (void)numLibraryOptions;
    if (!library || !code)
        return CUDA_ERROR_INVALID_VALUE;
    if (!gp_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    return cuModuleLoadDataEx((CUmodule *)library, code, numJitOptions, jitOptions, jitOptionsValues);
}

CUresult gpo_cuLibraryUnload(CUlibrary library) { return cuModuleUnload((CUmodule)library); }

CUresult gpo_cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    return cuModuleGetFunction((CUfunction *)pKernel, (CUmodule)library, name);
}

CUresult gpo_cuLibraryGetModule(CUmodule *pMod, CUlibrary library)
{
    if (!pMod || !library)
        return CUDA_ERROR_INVALID_VALUE;
    *pMod = (CUmodule)library;
    return CUDA_SUCCESS;
}

CUresult gpo_cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    if (!pFunc || !kernel)
        return CUDA_ERROR_INVALID_VALUE;
    *pFunc = (CUfunction)kernel;
    return CUDA_SUCCESS;
}

CUresult gpo_cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary library, const char *name)
{
    return cuModuleGetGlobal(dptr, bytes, (CUmodule)library, name);
}

/* The per-device kernel calls act on the one function of the kernel: the
 * module lives in one context, on one device. */
CUresult gpo_cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev)
{
    (void)dev;
    return cuFuncGetAttribute(pi, attrib, (CUfunction)kernel);
}

CUresult gpo_cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel kernel, CUdevice dev)
{
    (void)dev;
    return cuFuncSetAttribute((CUfunction)kernel, attrib, val);
}

CUresult gpo_cuKernelSetCacheConfig(CUkernel kernel, CUfunc_cache config, CUdevice dev)
{
    (void)dev;
    return cuFuncSetCacheConfig((CUfunction)kernel, config);
}

CUresult gpo_cuKernelGetName(const char **name, CUkernel hfunc)
{
    return cuFuncGetName(name, (CUfunction)hfunc);
}

CUresult gpo_cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t *paramOffset, size_t *paramSize)
{
    return cuFuncGetParamInfo((CUfunction)kernel, paramIndex, paramOffset, paramSize);
}
