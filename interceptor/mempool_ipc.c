/* Exportable memory pools: the shareable handle (CUDA Driver API, "Stream
 * Ordered Memory Allocator", cuMemPoolExportToShareableHandle /
 * cuMemPoolImportFromShareableHandle with CU_MEM_HANDLE_TYPE_POSIX_FILE_
 * DESCRIPTOR). Natively the handle is a file descriptor that the
 * application passes to another process (over a Unix socket with
 * SCM_RIGHTS, or by fork). Here proxyd's worker answers a 64-byte token
 * naming the pool (proxyd/mempool_ipc.py); the shim stores the token in a
 * sealed memfd and gives the application that descriptor, so it is a real
 * file descriptor that travels like the driver's. Importing reads the token
 * back from the descriptor (pread at offset 0: the descriptor's file
 * position is not touched) and sends it to this process's worker. The
 * application keeps ownership of its descriptor and closes it, as natively.
 * Pointer export/import (cuMemPoolExportPointer/ImportPointer) are ordinary
 * generated ops. docs/ipc.md, "Exportable memory pools".
 *
 * Locking: GP_ENTER/GP_LEAVE take gp_lock around each exchange; the memfd
 * work needs no lock (it touches only the new descriptor). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gp_gen.h"
#include "gp_shim.h"

#define GP_POOL_TOKEN 64     /* proxyd/mempool_ipc.py DATA_SIZE */

static CUresult handle_type_ok(CUmemAllocationHandleType t, const char *api)
{
    if (t == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_SUCCESS;
    char msg[160];
    snprintf(msg, sizeof msg, "%s (handle type %d; POSIX file descriptors are supported)", api, (int)t);
    gp_warn_unsupported(msg);
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* A sealed memfd holding the token; -1 on failure (errno set). */
static int token_fd(const uint8_t *tok, size_t n)
{
    int fd = memfd_create("gpuproxy-mempool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    if (pwrite(fd, tok, n, 0) != (ssize_t)n ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* op: [want, pool, handleType, flags] -> [token] */
CUresult gpo_cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
                                              CUmemAllocationHandleType handleType, unsigned long long flags)
{
    if (!handle_out || flags)      /* cuda.h: flags "must be 0" */
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = handle_type_ok(handleType, "cuMemPoolExportToShareableHandle");
    if (rc != CUDA_SUCCESS)
        return rc;
    uint8_t tok[GP_POOL_TOKEN];
    memset(tok, 0, sizeof tok);
    GP_ENTER();
    gp_buf *b = gp_op_begin(GP_FID_cuMemPoolExportToShareableHandle, 4);
    mp_bool(b, 1);
    gp_put_handle(b, pool);
    mp_uint(b, (uint64_t)handleType);
    mp_uint(b, flags);
    gp_reply r;
    rc = gp_op_sync(&r);
    if (rc == CUDA_SUCCESS && r.have_outs && r.nouts >= 1)
        gp_out_buffer(&r, tok, sizeof tok);
    gp_reply_done(&r);
    if (rc == CUDA_SUCCESS) {
        int fd = token_fd(tok, sizeof tok);
        if (fd < 0) {
            fprintf(stderr, "gpuproxy: cuMemPoolExportToShareableHandle: memfd: %s\n", strerror(errno));
            rc = CUDA_ERROR_OPERATING_SYSTEM;
        } else {
            memcpy(handle_out, &fd, sizeof fd);   /* the shareable handle of this type is an int */
        }
    }
    GP_LEAVE(rc);
}

/* op: [want, token, handleType, flags] -> [pool handle] */
CUresult gpo_cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle,
                                                CUmemAllocationHandleType handleType, unsigned long long flags)
{
    if (!pool_out || flags)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = handle_type_ok(handleType, "cuMemPoolImportFromShareableHandle");
    if (rc != CUDA_SUCCESS)
        return rc;
    /* cuda.h: for a POSIX descriptor, "the handle" is the int cast to a pointer */
    int fd = (int)(intptr_t)handle;
    uint8_t tok[GP_POOL_TOKEN];
    if (fd < 0 || pread(fd, tok, sizeof tok, 0) != (ssize_t)sizeof tok)
        return CUDA_ERROR_INVALID_VALUE;       /* not a descriptor from cuMemPoolExportToShareableHandle */
    GP_ENTER();
    gp_buf *b = gp_op_begin(GP_FID_cuMemPoolImportFromShareableHandle, 4);
    mp_bool(b, 1);
    mp_bin(b, tok, sizeof tok);
    mp_uint(b, (uint64_t)handleType);
    mp_uint(b, flags);
    gp_reply r;
    rc = gp_op_sync(&r);
    if (rc == CUDA_SUCCESS && r.have_outs && r.nouts >= 1)
        gp_out_handle(&r, (void **)pool_out);
    gp_reply_done(&r);
    GP_LEAVE(rc);
}
