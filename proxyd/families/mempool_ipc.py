"""Exportable memory pools between clients of one proxyd (CUDA Driver API,
"Stream Ordered Memory Allocator": cuMemPoolExportToShareableHandle,
cuMemPoolImportFromShareableHandle, cuMemPoolExportPointer,
cuMemPoolImportPointer; docs/ipc.md, "Exportable memory pools").

The design is CUDA IPC's (proxyd/families/ipc.py): each allocation lives in a
shareable arena chunk, and a worker that imports one fetches the chunk's
file descriptor from the exporting worker's IPC server (abstract Unix
socket, SO_PEERCRED, a per-export secret) and maps it into its own arena.

* A pool created with handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
  gets a random 8-byte tag. Exporting it (cuMemPoolExportToShareableHandle)
  answers a 64-byte token (magic, exporting worker's pid, device, tag); the
  shim puts the token into a sealed memfd and gives the application that
  descriptor (interceptor/mempool_ipc.c): a real fd, which survives
  SCM_RIGHTS, fork and exec like the driver's.
* The importing shim reads the token back from the descriptor and sends it;
  the importing worker makes a pool object that remembers (pid, tag, device).
  Nothing is fetched yet: a pool handle natively gives no memory either.
* cuMemPoolExportPointer of an allocation of an exportable pool registers
  its chunk with the IPC server (ipc.export_allocation) and answers the
  64-byte CUmemPoolPtrExportData: magic, pid, export id, server suffix,
  secret, offset, size, pool tag.
* cuMemPoolImportPointer checks that the data belongs to the imported pool
  (same pid and tag: the cuda-samples' streamOrderedAllocationIPC tries every
  pointer with every pool and expects the wrong pairs to fail), then maps
  the chunk (ipc.open_allocation). The importer frees the pointer with
  cuMemFree/cuMemFreeAsync (mem_free/mem_free_async call release_pointer),
  which unmaps it; the exporter's memory lives until its own free.

Checkpoints: a session that exported or imported a pool, or a pointer of
one, is refused at dump (check_checkpointable), as for CUDA IPC: its pages
are shared with a process whose state would not be in the image. An
exportable pool that was never exported is checkpointed like any pool.

Locking: handlers run on the worker's main loop (dispatch.py); the IPC
server thread reads ipc.py's export table under its lock.
"""
from __future__ import annotations

import os
import struct

from . import ipc
from .frees import register_claim
from .mempool import _device_ok, forget_allocation, new_pool
from ..core import protocol as P
from ..core.registry import CUDA_SUCCESS, handler
from ..core.session import CudaError

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_SUPPORTED = 801
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1

# magic, exporting worker pid, device, pool tag
POOL_TOKEN = struct.Struct("<8sIi8s")
POOL_MAGIC = b"GPXPOOL1"
# magic, pid, export id, server suffix, secret, offset in chunk, size, pool tag
PTR_DATA = struct.Struct("<4sII8s16sQQ8s")
PTR_MAGIC = b"GPXP"
DATA_SIZE = 64      # sizeof(CUmemPoolPtrExportData) and of the token


def check_checkpointable(sess) -> None:
    if getattr(sess, "pool_shared", False):
        raise RuntimeError(f"session of pid {sess.pid} has exported or imported a memory pool "
                           f"(cudaMemPoolExportToShareableHandle/ImportFromShareableHandle): its memory is shared "
                           f"with another process whose state would not be in the image; checkpointing one side "
                           f"of such a pair is not supported")


def _pool(sess, handle):
    return sess.get(P.K_MEM_POOL, int(handle or 0))


def _bytes(d, sess, v) -> bytes:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    return bytes(d.data(sess, v) or b"")


@handler("mem_pool_export_shareable")
def h_export_shareable(d, sess, fn, ctx, args, **kw):
    """[want, pool, handleType, flags] -> [64-byte token]."""
    o, htype = _pool(sess, args[1]), int(args[2])
    tag = o.info.get("ipc_tag")
    if tag is None or htype != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the pool was not created exportable as handle "
                                                  f"type {htype}")
    if "imported" in o.info:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: an imported pool cannot be exported again")
    sess.pool_shared = True
    tok = POOL_TOKEN.pack(POOL_MAGIC, os.getpid(), o.info["device"], bytes.fromhex(tag))
    return CUDA_SUCCESS, [tok.ljust(DATA_SIZE, b"\0")]


@handler("mem_pool_import_shareable")
def h_import_shareable(d, sess, fn, ctx, args, **kw):
    """[want, token (read by the shim from the descriptor), handleType, flags] -> [pool handle]."""
    raw, htype = _bytes(d, sess, args[1]), int(args[2])
    if htype != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR:
        raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name}: handle type {htype} is not supported")
    if len(raw) < POOL_TOKEN.size or raw[:8] != POOL_MAGIC:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: not a pool handle of this proxyd")
    _m, pid, dev, tag = POOL_TOKEN.unpack_from(raw)
    _device_ok(d, dev)
    o = new_pool(sess, dev, False)
    o.info["imported"] = {"pid": pid, "tag": tag.hex()}
    sess.pool_shared = True
    return CUDA_SUCCESS, [o.handle]


@handler("mem_pool_export_pointer")
def h_export_pointer(d, sess, fn, ctx, args, **kw):
    """[want, ptr] -> [CUmemPoolPtrExportData]."""
    ptr = sess.translate(int(args[1]))
    pid = sess.pool_allocs.get(ptr)
    o = sess.objects.get((P.K_MEM_POOL, pid)) if pid is not None else None
    if o is None:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {ptr:#x} is not the start of an allocation from a "
                                                  f"memory pool")
    tag = o.info.get("ipc_tag")
    if tag is None:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {ptr:#x} comes from a pool that is not exportable")
    eid, suffix, secret, off, size = ipc.export_allocation(d, sess, fn, ptr)
    sess.pool_shared = True
    data = PTR_DATA.pack(PTR_MAGIC, os.getpid(), eid, suffix, secret, off, size, bytes.fromhex(tag))
    return CUDA_SUCCESS, [data.ljust(DATA_SIZE, b"\0")]


@handler("mem_pool_import_pointer")
def h_import_pointer(d, sess, fn, ctx, args, **kw):
    """[want, pool, CUmemPoolPtrExportData] -> [address in this session]."""
    o, raw = _pool(sess, args[1]), _bytes(d, sess, args[2])
    imp = o.info.get("imported")
    if imp is None:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the pool was not imported from another process")
    if len(raw) < PTR_DATA.size or raw[:4] != PTR_MAGIC:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: not pointer export data of this proxyd")
    _m, pid, eid, suffix, secret, off, size, tag = PTR_DATA.unpack_from(raw)
    if pid != imp["pid"] or tag.hex() != imp["tag"]:
        # natively too: export data of another pool does not import through this one
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the pointer was exported from another pool")
    addr = ipc.open_allocation(d, sess, fn, ctx, pid, suffix, eid, secret, off, size)
    o.info["allocs"][addr] = size
    sess.pool_allocs[addr] = o.id
    if not hasattr(sess, "pool_imported"):
        sess.pool_imported = set()
    sess.pool_imported.add(addr)
    return CUDA_SUCCESS, [addr]


def release_pointer(d, sess, fn, ctx, addr: int, stream=None, name=None) -> bool:
    """cuMemFree/cuMemFreeAsync of an imported pool pointer: unmaps it after
    the free's stream and the context's work (ipc.close_allocation). False
    when addr is not one."""
    imported = getattr(sess, "pool_imported", None)
    if not imported or addr not in imported:
        return False
    if stream is not None:
        d.backend.stream_sync(stream)
    ipc.close_allocation(d, sess, fn, ctx, addr)
    imported.discard(addr)
    forget_allocation(sess, addr)
    return True


register_claim(20, release_pointer)     # cuMemFree/cuMemFreeAsync ask it (frees.py)
ipc.register_sharing_check(check_checkpointable)    # the ipc kind's dump check asks it (ipc.py)

