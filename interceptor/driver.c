/* Hand-written driver API entry points (spec: `shim: override` or `shim: local`).
 * Each gpo_<symbol> here is called by the generated stub of <symbol>.
 *
 * Locking: every function that touches shim state or the socket takes gp_lock
 * (GP_ENTER / GP_LEAVE). */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gp_funcs.h"
#include "gp_gen.h"
#include "gp_launch.h"
#include "gp_memcpy.h"
#include "gp_shim.h"
#include "gp_owner.h"

/* ----------------------------------------------------------------- init */

/* cuInit: query_cache.c */


CUresult gpo_cuDriverGetVersion(int *v)
{
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    /* the daemon's driver version arrives with HELLO; connect if needed */
    gp_lock();
    gp_session();
    *v = gp_driver_version();   /* hostmem.c reads it from the HELLO answer */
    gp_unlock();
    return CUDA_SUCCESS;
}

/* ----------------------------------------------------------------- errors */

/* Short descriptions of the errors programs most often print; our own words.
 * Other codes fall back to their enum name. */
static const struct { CUresult e; const char *s; } cu_err_text[] = {
    { CUDA_SUCCESS, "no error" },
    { CUDA_ERROR_INVALID_VALUE, "invalid argument" },
    { CUDA_ERROR_OUT_OF_MEMORY, "out of memory" },
    { CUDA_ERROR_NOT_INITIALIZED, "driver not initialized" },
    { CUDA_ERROR_DEINITIALIZED, "driver shutting down" },
    { CUDA_ERROR_DEVICE_UNAVAILABLE, "device unavailable (gpuproxy: proxyd not reachable)" },
    { CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected" },
    { CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal" },
    { CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid" },
    { CUDA_ERROR_INVALID_CONTEXT, "invalid device context" },
    { CUDA_ERROR_INVALID_HANDLE, "invalid resource handle" },
    { CUDA_ERROR_NOT_FOUND, "named symbol not found" },
    { CUDA_ERROR_NOT_READY, "device not ready" },
    { CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered" },
    { CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch" },
    { CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure" },
    { CUDA_ERROR_NOT_SUPPORTED, "operation not supported" },
    { CUDA_ERROR_UNKNOWN, "unknown error" },
};

CUresult gpo_cuGetErrorString(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof cu_err_text / sizeof cu_err_text[0]; i++)
        if (cu_err_text[i].e == error) {
            *pStr = cu_err_text[i].s;
            return CUDA_SUCCESS;
        }
    const char *n = gp_cu_error_name(error);
    *pStr = n;
    return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult gpo_cuGetErrorName(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    *pStr = gp_cu_error_name(error);
    return *pStr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---------------------------------------------------------- entry points */

/* cuGetProcAddress: proc_address.c */

/* -------------------------------------------------------------- contexts */

CUresult gpo_cuCtxGetCurrent(CUcontext *pctx)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = gp_ctx_current();
    return CUDA_SUCCESS;
}

CUresult gpo_cuCtxSetCurrent(CUcontext ctx)
{
    gp_ctx_set_current(ctx);
    return CUDA_SUCCESS;
}

CUresult gpo_cuCtxPushCurrent_v2(CUcontext ctx)
{
    if (!ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    return gp_ctx_push(ctx) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult gpo_cuCtxPopCurrent_v2(CUcontext *pctx)
{
    if (!gp_ctx_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = gp_ctx_pop();
    if (pctx)
        *pctx = c;
    return CUDA_SUCCESS;
}

CUresult gpo_cuCtxGetDevice(CUdevice *device)
{
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = gp_ctx_current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    return gp_ctx_device(c, device) ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

CUresult gpo_cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    GP_ENTER();
    CUresult rc = gpg_cuDevicePrimaryCtxRetain(pctx, dev);
    if (rc == CUDA_SUCCESS && pctx)
        gp_ctx_note_primary(*pctx, dev);
    GP_LEAVE(rc);
}

/* cuda.h maps cuDevicePrimaryCtxRelease/Reset to their _v2 forms; the
 * unversioned symbols (CUDA 7.0) have the same parameters and are what the
 * static CUDA runtime resolves through cuGetProcAddress. */
CUresult gpo_cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

CUresult gpo_cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

/* A reset destroys the primary context: values that the static runtime kept
 * in its context-local storage go with it (export_tables.c). */
CUresult gpo_cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    CUcontext primary = gp_ctx_primary_of(dev);
    GP_ENTER();
    CUresult rc = gpg_cuDevicePrimaryCtxReset_v2(dev);
    if (rc == CUDA_SUCCESS)
        gp_slab_device_gone(dev);   /* the worker freed the device's allocations, slabs included (under the lock: no block of them is handed out after) */
    gp_unlock();
    if (rc == CUDA_SUCCESS && primary)
        gp_ctx_gone(primary);
    return rc;
}

/* cuCtxGetDevice_v2 (CUDA 13): the device of ctx, or of the current context
 * when ctx is NULL (cuda.h). */
CUresult gpo_cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = ctx ? ctx : gp_ctx_current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    return gp_ctx_device(c, device) ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

/* cuCtxSynchronize_v2 (CUDA 13): waits for ctx, or for the current context
 * when ctx is NULL (cuda.h). Another context is made current for the call
 * and the thread's stack is put back afterwards. */
CUresult gpo_cuCtxSynchronize_v2(CUcontext ctx)
{
    CUcontext cur = gp_ctx_current();
    if (!ctx || ctx == cur)
        return cur ? cuCtxSynchronize() : CUDA_ERROR_INVALID_CONTEXT;
    if (gp_ctx_push(ctx) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = cuCtxSynchronize();
    gp_ctx_pop();
    return rc;
}

CUresult gpo_cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (params && (params->numExecAffinityParams || params->execAffinityParams || params->cigParams)) {
        gp_warn_unsupported("cuCtxCreate_v4 (execution affinity / CIG parameters)");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    GP_ENTER();
    gp_buf *b = gp_op_begin(GP_FID_cuCtxCreate_v4, 4);
    mp_bool(b, 1);
    mp_nil(b);
    mp_uint(b, flags);
    mp_int(b, dev);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    if (rc == CUDA_SUCCESS && r.have_outs && r.nouts >= 1) {
        gp_out_handle(&r, (void **)pctx);
        gp_ctx_note_device(*pctx, dev);
        gp_ctx_push(*pctx);   /* the new context becomes current (cuCtxCreate) */
    }
    gp_reply_done(&r);
    GP_LEAVE(rc);
}

CUresult gpo_cuCtxDestroy_v2(CUcontext ctx)
{
    GP_ENTER();
    CUresult rc = gpg_cuCtxDestroy_v2(ctx);
    if (rc == CUDA_SUCCESS) {
        gp_peer_forget(ctx);     /* its peer-access pairs go with it (owner.c) */
        gp_ctx_forget(ctx);
    }
    gp_unlock();
    if (rc == CUDA_SUCCESS)
        gp_ctx_gone(ctx);   /* outside the lock: destructors may call the driver */
    return rc;
}

/* --------------------------------------------------------------- modules */

/* Size of a module image as cuModuleLoadData receives it: a fatbinary (its
 * header states the size), the C wrapper around one, an ELF cubin (the end of
 * its last section or table), or NUL-terminated PTX text. */
size_t gp_image_size(const void *image, const void **start)
{
    const uint8_t *p = image;
    uint32_t magic;
    memcpy(&magic, p, 4);
    *start = image;
    if (magic == 0x466243b1u) {             /* __fatBinC_Wrapper_t */
        const void *data;
        memcpy(&data, p + 8, sizeof data);
        return gp_image_size(data, start);
    }
    if (magic == 0xba55ed50u) {             /* fatbinary: u16 version, u16 header size, u64 payload size */
        uint16_t hsize;
        uint64_t fsize;
        memcpy(&hsize, p + 6, 2);
        memcpy(&fsize, p + 8, 8);
        return (size_t)hsize + (size_t)fsize;
    }
    if (p[0] == 0x7f && p[1] == 'E' && p[2] == 'L' && p[3] == 'F' && p[4] == ELFCLASS64) {
        const Elf64_Ehdr *eh = image;
        size_t end = eh->e_shoff + (size_t)eh->e_shnum * eh->e_shentsize;
        size_t ph = eh->e_phoff + (size_t)eh->e_phnum * eh->e_phentsize;
        if (ph > end)
            end = ph;
        const Elf64_Shdr *sh = (const Elf64_Shdr *)(p + eh->e_shoff);
        for (int i = 0; i < eh->e_shnum; i++)
            if (sh[i].sh_type != SHT_NOBITS && sh[i].sh_offset + sh[i].sh_size > end)
                end = sh[i].sh_offset + sh[i].sh_size;
        return end;
    }
    return strlen((const char *)image) + 1;
}

/* Module images by content (docs/protocol.md, "Module images by content"):
 * the first request names the image by its SHA-256 digest and length
 * (GP_EXT_CONTENT in place of the bytes); the worker answers with the
 * module, or with no module and a second out of 1 when it has no copy of
 * those bytes (in its memory or its disk cache of earlier runs), and the
 * image is sent again whole. libtorch's modules are hundreds of KiB to MiB
 * each: a program that is run again sends none of them. Caller holds no
 * lock; the two requests are one GP_ENTER section, so no other thread's
 * call comes between them. */
static CUresult module_send(uint32_t fid, uint32_t nargs, CUmodule *module, const void *data, size_t n,
                            const uint8_t *digest, int *missing)
{
    gp_buf *b = gp_op_begin(fid, nargs);
    mp_bool(b, 1);
    if (digest) {
        uint8_t ref[40];
        memcpy(ref, digest, 32);
        for (int i = 0; i < 8; i++)
            ref[32 + i] = (uint8_t)((uint64_t)n >> (56 - 8 * i));
        mp_ext(b, GP_EXT_CONTENT, ref, sizeof ref);
    } else {
        gp_put_data(b, data, n, 0);
    }
    for (uint32_t i = 2; i < nargs; i++)
        mp_nil(b);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    *missing = 0;
    if (rc == CUDA_SUCCESS && r.have_outs && r.nouts >= 1) {
        gp_out_handle(&r, (void **)module);
        if (r.nouts >= 2)
            *missing = gp_out_int(&r) != 0;
    }
    gp_reply_done(&r);
    return rc;
}

CUresult gp_module_load_image(uint32_t fid, uint32_t nargs, CUmodule *module, const void *data, size_t n,
                              const uint8_t *digest)
{
    if (!module)
        return CUDA_ERROR_INVALID_VALUE;
    /* GPUPROXY_MODULES_BY_CONTENT=0: the bytes every time (to compare) */
    const char *env = getenv("GPUPROXY_MODULES_BY_CONTENT");
    uint8_t own[32];
    if (env && strcmp(env, "0") == 0) {
        digest = NULL;
    } else if (!digest) {
        gp_sha256(data, n, own);
        digest = own;
    }
    GP_ENTER();
    int missing = 0;
    CUresult rc = module_send(fid, nargs, module, data, n, digest, &missing);
    if (rc == CUDA_SUCCESS && missing) {
        if (gp_debug_enabled())
            gp_log("module image %02x%02x%02x%02x... (%zu bytes) sent whole: the worker had no copy", digest[0],
                   digest[1], digest[2], digest[3], n);
        rc = module_send(fid, nargs, module, data, n, NULL, &missing);
    }
    GP_LEAVE(rc);
}

static CUresult module_load(uint32_t fid, uint32_t nargs, CUmodule *module, const void *data, size_t n)
{
    return gp_module_load_image(fid, nargs, module, data, n, NULL);
}

CUresult gpo_cuModuleLoadData(CUmodule *module, const void *image)
{
    if (!image)
        return CUDA_ERROR_INVALID_VALUE;
    const void *start;
    size_t n = gp_image_size(image, &start);
    return module_load(GP_FID_cuModuleLoadData, 2, module, start, n);
}

CUresult gpo_cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                CUjit_option *options, void **optionValues)
{
    /* JIT options only tune or report on compilation in proxyd; they are not
     * forwarded (their log buffers point into this process). */
    (void)numOptions;
    (void)options;
    (void)optionValues;
    if (!image)
        return CUDA_ERROR_INVALID_VALUE;
    const void *start;
    size_t n = gp_image_size(image, &start);
    return module_load(GP_FID_cuModuleLoadDataEx, 5, module, start, n);
}

CUresult gpo_cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    if (!fatCubin)
        return CUDA_ERROR_INVALID_VALUE;
    const void *start;
    size_t n = gp_image_size(fatCubin, &start);
    return module_load(GP_FID_cuModuleLoadFatBinary, 2, module, start, n);
}

CUresult gpo_cuModuleLoad(CUmodule *module, const char *fname)
{
    if (!fname)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = open(fname, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_FILE_NOT_FOUND;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        close(fd);
        return CUDA_ERROR_FILE_NOT_FOUND;
    }
    size_t n = (size_t)st.st_size;
    uint8_t *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(fd);
    buf[got] = 0;   /* PTX files get their terminating NUL */
    CUresult rc = module_load(GP_FID_cuModuleLoad, 2, module, buf, got + 1);
    free(buf);
    return rc;
}

CUresult gpo_cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    gp_buf *b = gp_op_begin(GP_FID_cuModuleGetFunction, 3);
    mp_bool(b, 1);
    gp_put_handle(b, hmod);
    mp_bin(b, name, strlen(name) + 1);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    if (rc == CUDA_SUCCESS && r.have_outs && r.nouts >= 2) {
        gp_out_handle(&r, (void **)hfunc);
        gp_fninfo *fi = gp_fn_add(*hfunc, name, strlen(name));
        if (!fi || gp_fn_read_layout(fi, &r.rd) < 0)
            rc = CUDA_ERROR_INVALID_IMAGE;
    }
    gp_reply_done(&r);
    GP_LEAVE(rc);
}

/* cuModuleGetGlobal: remoted as generated (gpg_), and the variable's range
 * noted as device memory (hostmem.c), as the shim's own runtime does for
 * cudaMemcpy*Symbol: a runtime of its own in the app (NVIDIA's 12.x/11.x
 * libcudart, XLA's modules of constants) asks pointer attributes of the
 * address it got here (XLA: CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, fatal when
 * it fails), and after a restore that moved the variable the address it
 * kept must still be known (proxyd translates it, device_vars.py). cuda.h
 * allows NULL for either out-parameter. Locking: gp_lock around the note. */
CUresult gpo_cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod, const char *name)
{
    CUdeviceptr d = 0;
    size_t n = 0;
    CUresult rc = gpg_cuModuleGetGlobal_v2(&d, &n, hmod, name);
    if (rc == CUDA_SUCCESS) {
        gp_lock();
        gp_note_device_range((uint64_t)d, (uint64_t)(n ? n : 1));
        gp_unlock();
        if (dptr)
            *dptr = d;
        if (bytes)
            *bytes = n;
    }
    return rc;
}

CUresult gpo_cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset, size_t *paramSize)
{
    GP_RESOLVE_FUNCTION(func);
    gp_lock();
    gp_fninfo *fi = gp_fn_lookup(func);
    CUresult rc = CUDA_ERROR_INVALID_HANDLE;
    if (fi && fi->have_layout) {
        rc = CUDA_ERROR_INVALID_VALUE;
        if (paramIndex < fi->nparams) {
            if (paramOffset)
                *paramOffset = fi->off[paramIndex];
            if (paramSize)
                *paramSize = fi->size[paramIndex];
            rc = CUDA_SUCCESS;
        }
    }
    gp_unlock();
    return rc;
}

CUresult gpo_cuFuncGetName(const char **name, CUfunction hfunc)
{
    GP_RESOLVE_FUNCTION(hfunc);
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    gp_lock();
    gp_fninfo *fi = gp_fn_lookup(hfunc);
    *name = fi ? fi->name : NULL;
    gp_unlock();
    return fi ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* ---------------------------------------------------------------- launch */

/* gp_launch, gp_launch_args: launch.c */

static CUresult launch_kernel(uint32_t fid, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                              unsigned bx, unsigned by, unsigned bz, unsigned shmem, CUstream s,
                              void **kernelParams, void **extra)
{
    GP_RESOLVE_FUNCTION(f);
    GP_ENTER();
    const unsigned grid[3] = { gx, gy, gz }, block[3] = { bx, by, bz };
    uint8_t small[4096];
    const void *buf = NULL;
    size_t n = 0;
    CUresult rc = gp_launch_args(f, kernelParams, extra, small, sizeof small, &buf, &n);
    if (rc == CUDA_SUCCESS) {
        rc = gp_launch(fid, f, grid, block, shmem, s, buf, n);
        if (kernelParams || !extra)
            if (buf != small)
                free((void *)buf);
    }
    GP_LEAVE(rc);
}

CUresult gpo_cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                            unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                            unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    return launch_kernel(GP_FID_cuLaunchKernel, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                         sharedMemBytes, hStream, kernelParams, extra);
}

CUresult gpo_cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                 unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                 unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    return launch_kernel(GP_FID_cuLaunchKernel_ptsz, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                         blockDimZ, sharedMemBytes, hStream, kernelParams, extra);
}

/* ---------------------------------------------------------------- copies */

#define COPY_ENTRY(call) do { GP_ENTER(); GP_LEAVE(call); } while (0)

CUresult gpo_cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    COPY_ENTRY(gp_copy_htod(GP_FID_cuMemcpyHtoD_v2, dst, src, n, NULL, 0, 0));
}

CUresult gpo_cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n)
{
    COPY_ENTRY(gp_copy_htod(GP_FID_cuMemcpyHtoD_v2_ptds, dst, src, n, NULL, 0, 0));
}

CUresult gpo_cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    COPY_ENTRY(gp_copy_htod(GP_FID_cuMemcpyHtoDAsync_v2, dst, src, n, s, 1, 1));
}

CUresult gpo_cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    COPY_ENTRY(gp_copy_htod(GP_FID_cuMemcpyHtoDAsync_v2_ptsz, dst, src, n, s, 1, 1));
}

CUresult gpo_cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    COPY_ENTRY(gp_copy_dtoh(GP_FID_cuMemcpyDtoH_v2, dst, src, n, NULL, 0, 0));
}

CUresult gpo_cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n)
{
    COPY_ENTRY(gp_copy_dtoh(GP_FID_cuMemcpyDtoH_v2_ptds, dst, src, n, NULL, 0, 0));
}

CUresult gpo_cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    COPY_ENTRY(gp_copy_dtoh(GP_FID_cuMemcpyDtoHAsync_v2, dst, src, n, s, 1, 1));
}

CUresult gpo_cuMemcpyDtoHAsync_v2_ptsz(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    COPY_ENTRY(gp_copy_dtoh(GP_FID_cuMemcpyDtoHAsync_v2_ptsz, dst, src, n, s, 1, 1));
}

/* Whether [a, a+n) is mapped in this process: msync(2) fails with ENOMEM
 * on a range holding unmapped pages. */
static int host_mapped(uint64_t a, size_t n)
{
    uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t start = a & ~(pg - 1), end = (a + (n ? n : 1) + pg - 1) & ~(pg - 1);
    int saved = errno;          /* the app's errno is not the shim's to change */
    int mapped = msync((void *)(uintptr_t)start, (size_t)(end - start), MS_ASYNC) == 0 || errno != ENOMEM;
    errno = saved;
    return mapped;
}

/* Unified addressing: the direction follows from where the pointers point.
 * Device memory the shim has not seen allocated (a module's __device__
 * variable whose address NVIDIA's static runtime took with
 * cuModuleGetGlobal, and copies with cuMemcpyAsync) lies in the worker's
 * address space, not in this process's: an address that is neither known
 * device memory nor mapped here is taken as the device's, and the worker
 * checks it, rather than this process reading or writing it. */
CUresult gp_copy_any(int per_thread, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s, int async)
{
    int dd = gp_is_device_ptr((void *)(uintptr_t)dst), sd = gp_is_device_ptr((void *)(uintptr_t)src);
    if (!dd && !host_mapped(dst, n))
        dd = 1;
    if (!sd && !host_mapped(src, n))
        sd = 1;
    if (dd && sd) {
        uint32_t fid = async ? (per_thread ? GP_FID_cuMemcpyDtoDAsync_v2_ptsz : GP_FID_cuMemcpyDtoDAsync_v2)
                             : (per_thread ? GP_FID_cuMemcpyDtoD_v2_ptds : GP_FID_cuMemcpyDtoD_v2);
        gp_buf *b = gp_op_begin(fid, async ? 4 : 3);
        mp_uint(b, dst);
        mp_uint(b, src);
        mp_uint(b, n);
        if (async) {
            gp_put_handle(b, s);
            return gp_op_async();
        }
        gp_reply r;
        CUresult rc = gp_op_sync(&r);
        gp_reply_done(&r);
        return rc;
    }
    if (dd)
        return gp_copy_htod(async ? (per_thread ? GP_FID_cuMemcpyHtoDAsync_v2_ptsz : GP_FID_cuMemcpyHtoDAsync_v2)
                                  : (per_thread ? GP_FID_cuMemcpyHtoD_v2_ptds : GP_FID_cuMemcpyHtoD_v2),
                            dst, (const void *)(uintptr_t)src, n, s, async, async);
    if (sd)
        return gp_copy_dtoh(async ? (per_thread ? GP_FID_cuMemcpyDtoHAsync_v2_ptsz : GP_FID_cuMemcpyDtoHAsync_v2)
                                  : (per_thread ? GP_FID_cuMemcpyDtoH_v2_ptds : GP_FID_cuMemcpyDtoH_v2),
                            (void *)(uintptr_t)dst, src, n, s, async, async);
    /* host to host: ordered after work already queued, as CUDA orders it */
    CUresult rc = gp_flush();
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return rc;
}

CUresult gpo_cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) { COPY_ENTRY(gp_copy_any(0, dst, src, n, NULL, 0)); }
CUresult gpo_cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) { COPY_ENTRY(gp_copy_any(1, dst, src, n, NULL, 0)); }
CUresult gpo_cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) { COPY_ENTRY(gp_copy_any(0, dst, src, n, s, 1)); }
CUresult gpo_cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) { COPY_ENTRY(gp_copy_any(1, dst, src, n, s, 1)); }

/* ----------------------------------------------------------- host memory */

CUresult gp_hostmap_new(void **pp, size_t size, int kind, unsigned flags, const char *fn);   /* hostmap_api.c */
int gp_hostmap_free_host(void *p, CUresult *rc);

/* Page-locked host memory. With proxyd on this host it is a GPU-visible
 * segment at the same address in the worker (hostmap_api.c), which makes it
 * mapped as well, as unified addressing makes every page-locked allocation
 * (CUDA Driver API, "Unified Addressing"); otherwise ordinary memory whose
 * copies travel in the messages. */
static CUresult host_alloc(uint32_t fid, void **pp, size_t bytesize, unsigned int flags, int with_flags)
{
    (void)with_flags;
    if (!pp || (flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED)))
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    if (gp_shm_ok()) {
        void *p = NULL;
        CUresult rc = gp_hostmap_new(&p, bytesize, GP_HM_HOST, flags,
                                     fid == GP_FID_cuMemHostAlloc ? "cuMemHostAlloc" : "cuMemAllocHost");
        *pp = rc == CUDA_SUCCESS ? p : NULL;
        GP_LEAVE(rc);
    }
    if (flags & CU_MEMHOSTALLOC_DEVICEMAP) {
        fprintf(stderr, "gpuproxy: cuMemHostAlloc with CU_MEMHOSTALLOC_DEVICEMAP needs proxyd on the same host "
                        "(shared memory); not supported over this endpoint\n");
        GP_LEAVE(CUDA_ERROR_NOT_SUPPORTED);
    }
    void *p = gp_host_alloc(bytesize);
    *pp = p;
    GP_LEAVE(p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY);
}

CUresult gpo_cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    return host_alloc(GP_FID_cuMemAllocHost_v2, pp, bytesize, 0, 0);
}

CUresult gpo_cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    return host_alloc(GP_FID_cuMemHostAlloc, pp, bytesize, Flags, 1);
}

CUresult gpo_cuMemFreeHost(void *p)
{
    GP_ENTER();
    CUresult rc;
    if (gp_hostmap_free_host(p, &rc) == 0)
        GP_LEAVE(rc);
    /* memory of the socket-only path */
    GP_LEAVE(gp_host_free_plain(p) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
}
