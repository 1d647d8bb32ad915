/* The JIT linker: cuLinkCreate, cuLinkAddData, cuLinkAddFile, cuLinkComplete,
 * cuLinkDestroy (cuda.h, "Module Management"). pycuda's DynamicModule and
 * numba-cuda link PTX and libraries through it.
 *
 * The link runs in the session's worker (it needs a context, and the
 * driver's JIT lives there); the shim keeps a small state per link:
 * - options are forwarded by value where they are values; the log buffers
 *   (CU_JIT_INFO_LOG_BUFFER / CU_JIT_ERROR_LOG_BUFFER) point into this
 *   process, so only their sizes travel: the worker links with buffers of its
 *   own and answers their contents after every call, which the shim copies
 *   into the application's buffers (NUL-terminated, truncated to the size)
 *   and whose length it stores in the matching *_SIZE_BYTES value, as the
 *   driver does ("OUT: amount of log buffer filled"). Options whose values
 *   are arrays of host pointers (global symbol tables, referenced
 *   kernel/variable names) are refused: not supported, with one line.
 *   CU_JIT_WALL_TIME is answered 0 (no timing crosses the wire).
 * - cuLinkComplete's image belongs to the link state until cuLinkDestroy
 *   (cuda.h: "the linker owns it"); here the shim keeps a copy.
 * - cuLinkAddFile reads the file here (it is the application's file) and
 *   sends it as cuLinkAddData_v2 under the file's path as its name.
 * A link state is not a checkpoint object: it lives inside one compilation,
 * and its result (the image) is what the application loads as a module. A
 * dump while a link is open is refused by proxyd (proxyd/link.py).
 *
 * Locking: gp_lock around each call (GP_ENTER/GP_LEAVE); a link state is
 * used by one thread at a time, as the driver requires. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gp_gen.h"
#include "gp_shim.h"


#define LINK_MAGIC 0x4b4e494cu   /* "LINK" */

typedef struct gp_link {
    uint32_t magic;
    uint64_t remote;            /* the worker's id of this link */
    char *log[2];               /* application's info and error log buffers */
    size_t log_size[2];
    void **size_slot[2];        /* optionValues entries of the *_SIZE_BYTES options */
    void *image;                /* cuLinkComplete's answer, owned here */
    size_t image_size;
} gp_link;

/* Options forwarded, as [option, value] pairs packed into two byte arrays
 * (u32 options, u64 values: the driver's own encodings, cuda.h CUjit_option). */
typedef struct fwd_opts {
    unsigned n;
    uint32_t opt[64];
    uint64_t val[64];
} fwd_opts;

static int value_option(CUjit_option o)
{
    switch (o) {
    case CU_JIT_MAX_REGISTERS: case CU_JIT_THREADS_PER_BLOCK: case CU_JIT_OPTIMIZATION_LEVEL:
    case CU_JIT_TARGET_FROM_CUCONTEXT: case CU_JIT_TARGET: case CU_JIT_FALLBACK_STRATEGY:
    case CU_JIT_GENERATE_DEBUG_INFO: case CU_JIT_LOG_VERBOSE: case CU_JIT_GENERATE_LINE_INFO:
    case CU_JIT_CACHE_MODE: case CU_JIT_NEW_SM3X_OPT: case CU_JIT_FAST_COMPILE: case CU_JIT_LTO:
    case CU_JIT_FTZ: case CU_JIT_PREC_DIV: case CU_JIT_PREC_SQRT: case CU_JIT_FMA:
    case CU_JIT_OPTIMIZE_UNUSED_DEVICE_VARIABLES: case CU_JIT_POSITION_INDEPENDENT_CODE:
    case CU_JIT_MIN_CTA_PER_SM: case CU_JIT_MAX_THREADS_PER_BLOCK: case CU_JIT_OVERRIDE_DIRECTIVE_VALUES:
    case CU_JIT_SPLIT_COMPILE:
        return 1;
    default:
        return 0;
    }
}

/* Sorts the application's options into forwarded values and, when lk is
 * given (cuLinkCreate), the log buffers kept here. */
static CUresult take_options(const char *fname, unsigned n, CUjit_option *options, void **values,
                             gp_link *lk, fwd_opts *f)
{
    f->n = 0;
    if (n && (!options || !values))
        return CUDA_ERROR_INVALID_VALUE;
    if (n > 64)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++) {
        CUjit_option o = options[i];
        int which = -1;
        if (o == CU_JIT_INFO_LOG_BUFFER || o == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES)
            which = 0;
        else if (o == CU_JIT_ERROR_LOG_BUFFER || o == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
            which = 1;
        if (which >= 0 && lk) {
            if (o == CU_JIT_INFO_LOG_BUFFER || o == CU_JIT_ERROR_LOG_BUFFER) {
                lk->log[which] = values[i];
                continue;
            }
            lk->log_size[which] = (size_t)(uintptr_t)values[i];
            lk->size_slot[which] = &values[i];
        } else if (o == CU_JIT_WALL_TIME) {
            float zero = 0.0f;
            memcpy(&values[i], &zero, sizeof zero);
            continue;
        } else if (!value_option(o)) {
            fprintf(stderr, "gpuproxy: %s: JIT option %d is not supported by gpuproxy (its value points "
                    "into this process); returning not-supported\n", fname, (int)o);
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        f->opt[f->n] = (uint32_t)o;
        f->val[f->n] = (uint64_t)(uintptr_t)values[i];
        f->n++;
    }
    return CUDA_SUCCESS;
}

static void put_options(gp_buf *b, const fwd_opts *f)
{
    mp_uint(b, f->n);
    mp_bin(b, f->opt, f->n * sizeof f->opt[0]);
    mp_bin(b, f->val, f->n * sizeof f->val[0]);
}

/* Copies the worker's two logs (the next two outs) into the application's buffers. */
static void take_logs(gp_link *lk, gp_reply *r, uint32_t first)
{
    for (int w = 0; w < 2; w++) {
        if (!r->have_outs || r->nouts < first + 2)
            return;
        size_t n = 0;
        const uint8_t *s = gp_out_bytes(r, &n);
        if (!lk->log[w] || !lk->log_size[w])
            continue;
        if (n > lk->log_size[w] - 1)
            n = lk->log_size[w] - 1;
        memcpy(lk->log[w], s, n);
        lk->log[w][n] = '\0';
        if (lk->size_slot[w])
            *lk->size_slot[w] = (void *)(uintptr_t)n;
    }
}

static gp_link *link_of(CUlinkState state)
{
    gp_link *lk = (gp_link *)state;
    return lk && lk->magic == LINK_MAGIC ? lk : NULL;
}

CUresult gpo_cuLinkCreate_v2(unsigned int numOptions, CUjit_option *options, void **optionValues,
                             CUlinkState *stateOut)
{
    if (!stateOut)
        return CUDA_ERROR_INVALID_VALUE;
    gp_link *lk = calloc(1, sizeof *lk);
    if (!lk)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fwd_opts f;
    CUresult rc = take_options("cuLinkCreate", numOptions, options, optionValues, lk, &f);
    if (rc != CUDA_SUCCESS) {
        free(lk);
        return rc;
    }
    gp_lock();
    rc = gp_session();
    if (rc == CUDA_SUCCESS) {
        gp_buf *b = gp_op_begin(GP_FID_cuLinkCreate_v2, 4);
        put_options(b, &f);
        mp_bool(b, 1);
        gp_reply r;
        rc = gp_op_sync(&r);
        if (rc == CUDA_SUCCESS && r.have_outs && r.nouts >= 1)
            lk->remote = (uint64_t)gp_out_int(&r);
        else if (rc == CUDA_SUCCESS)
            rc = CUDA_ERROR_UNKNOWN;
        gp_reply_done(&r);
    }
    gp_unlock();
    if (rc != CUDA_SUCCESS) {
        free(lk);
        return rc;
    }
    lk->magic = LINK_MAGIC;
    *stateOut = (CUlinkState)lk;
    return CUDA_SUCCESS;
}

CUresult gpo_cuLinkCreate(unsigned int numOptions, CUjit_option *options, void **optionValues,
                          CUlinkState *stateOut)
{
    return gpo_cuLinkCreate_v2(numOptions, options, optionValues, stateOut);
}

CUresult gpo_cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void *data, size_t size,
                              const char *name, unsigned int numOptions, CUjit_option *options,
                              void **optionValues)
{
    gp_link *lk = link_of(state);
    if (!lk)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!data || !size)
        return CUDA_ERROR_INVALID_VALUE;
    fwd_opts f;
    CUresult rc = take_options("cuLinkAddData", numOptions, options, optionValues, NULL, &f);
    if (rc != CUDA_SUCCESS)
        return rc;
    const char *nm = name ? name : "";
    GP_ENTER();
    gp_buf *b = gp_op_begin(GP_FID_cuLinkAddData_v2, 8);
    mp_uint(b, lk->remote);
    mp_uint(b, (uint64_t)type);
    gp_put_data(b, data, size, 0);
    mp_uint(b, size);
    mp_bin(b, nm, strlen(nm) + 1);
    put_options(b, &f);
    gp_reply r;
    rc = gp_op_sync(&r);
    take_logs(lk, &r, 0);
    gp_reply_done(&r);
    GP_LEAVE(rc);
}

CUresult gpo_cuLinkAddData(CUlinkState state, CUjitInputType type, void *data, size_t size, const char *name,
                           unsigned int numOptions, CUjit_option *options, void **optionValues)
{
    return gpo_cuLinkAddData_v2(state, type, data, size, name, numOptions, options, optionValues);
}

CUresult gpo_cuLinkAddFile_v2(CUlinkState state, CUjitInputType type, const char *path, unsigned int numOptions,
                              CUjit_option *options, void **optionValues)
{
    if (!link_of(state))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!path)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_FILE_NOT_FOUND;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size <= 0) {
        close(fd);
        return CUDA_ERROR_INVALID_VALUE;
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    size_t got = 0;
    while (buf && got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(fd);
    if (!buf)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (got != n) {
        free(buf);
        return CUDA_ERROR_FILE_NOT_FOUND;
    }
    buf[n] = '\0';   /* PTX text read from a file is not NUL-terminated on disk */
    CUresult rc = gpo_cuLinkAddData_v2(state, type, buf, type == CU_JIT_INPUT_PTX ? n + 1 : n, path,
                                       numOptions, options, optionValues);
    free(buf);
    return rc;
}

CUresult gpo_cuLinkAddFile(CUlinkState state, CUjitInputType type, const char *path, unsigned int numOptions,
                           CUjit_option *options, void **optionValues)
{
    return gpo_cuLinkAddFile_v2(state, type, path, numOptions, options, optionValues);
}

CUresult gpo_cuLinkComplete(CUlinkState state, void **cubinOut, size_t *sizeOut)
{
    gp_link *lk = link_of(state);
    if (!lk)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!cubinOut || !sizeOut)
        return CUDA_ERROR_INVALID_VALUE;
    GP_ENTER();
    gp_buf *b = gp_op_begin(GP_FID_cuLinkComplete, 3);
    mp_uint(b, lk->remote);
    mp_bool(b, 1);
    mp_bool(b, 1);
    gp_reply r;
    CUresult rc = gp_op_sync(&r);
    if (r.have_outs && r.nouts >= 3) {
        size_t n = 0;
        const uint8_t *img = gp_out_bytes(&r, &n);
        if (rc == CUDA_SUCCESS) {
            void *copy = n ? malloc(n) : NULL;
            if (n && !copy) {
                rc = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                if (n)
                    memcpy(copy, img, n);
                free(lk->image);
                lk->image = copy;
                lk->image_size = n;
                *cubinOut = copy;
                *sizeOut = n;
            }
        }
        take_logs(lk, &r, 1);
    } else if (rc == CUDA_SUCCESS) {
        rc = CUDA_ERROR_UNKNOWN;
    }
    gp_reply_done(&r);
    GP_LEAVE(rc);
}

CUresult gpo_cuLinkDestroy(CUlinkState state)
{
    gp_link *lk = link_of(state);
    if (!lk)
        return CUDA_ERROR_INVALID_HANDLE;
    gp_lock();
    CUresult rc = gp_session();
    if (rc == CUDA_SUCCESS) {
        gp_buf *b = gp_op_begin(GP_FID_cuLinkDestroy, 1);
        mp_uint(b, lk->remote);
        gp_reply r;
        rc = gp_op_sync(&r);
        gp_reply_done(&r);
    }
    gp_unlock();
    /* the shim's state goes whatever the worker answers (a restored session
     * no longer knows the link): the application is done with it */
    lk->magic = 0;
    free(lk->image);
    free(lk);
    return rc == CUDA_ERROR_INVALID_HANDLE ? CUDA_SUCCESS : rc;
}
