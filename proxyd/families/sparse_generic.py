"""cuSPARSE's generic API in the worker (issue 26; docs/libraries.md): what
a restore needs beyond the generic library path (libraries.py).

A sparse matrix descriptor's nnz is an argument of the call that made it
(cusparseCreateCsr(..., rows, cols, nnz, ...)), and two calls change it
afterwards: cusparseDenseToSparse_analysis (the dense matrix's non-zeros)
and cusparseSpGEMM_compute (the product's). The image recreates each
descriptor with its recorded create call, so after either call succeeds the
descriptor's nnz is read back (cusparseSpMatGetSize) and written into that
call's nnz argument: a restored descriptor has the nnz the live one had,
without replaying a conversion whose dense input may be gone by then.

The SpGEMM and SpSV descriptors (kinds cusparse_spgemm, cusparse_spsv) are
session objects like the others; their state after work estimation and
compute (SpGEMM) or analysis (SpSV) comes back by replaying those calls,
recorded as the descriptor's settings (spec `restore: {rule: object, key:
[descr]}`), after the matrices' own settings (libraries.LIB_KINDS order).
These calls read the matrices' arrays in device memory, which a restore
copies in only after the library objects exist: libraries.rebuild leaves
them here (defer), and the engine replays them once the memory is back and
checked (replay_after_memory). Limit: such a replay names the matrices and
buffers of the recorded call; a restore fails, naming the call, if the app
destroyed one of them before the dump while keeping the SpGEMM/SpSV
descriptor.

Locking: the worker's main loop only (like libraries.py). This module does
not import libraries.py (which calls it); the lookups come as arguments.
"""
from __future__ import annotations

import logging
import struct

from .._generated import FUNCTIONS
from ..core.kinds import Kind, Stage, register

log = logging.getLogger("proxyd")

# function -> index of the sparse descriptor whose nnz the call sets
NNZ_SETTERS = {"cusparseDenseToSparse_analysis": 2, "cusparseSpGEMM_compute": 7}
# create functions of sparse descriptors: (spMatDescr, rows, cols, nnz, ...)
NNZ_ARG = 3
_GET_SIZE = next((fid for fid, f in FUNCTIONS.items() if f.name == "cusparseSpMatGetSize"), None)


def after_call(sess, lib, fn, args, spmat_of) -> None:
    """Called by libraries.Calls.execute after a successful cuSPARSE call;
    spmat_of(handle) is the session object of a sparse descriptor."""
    i = NNZ_SETTERS.get(fn.name)
    if i is None or _GET_SIZE is None or not args[i]:
        return
    obj = spmat_of(args[i])
    code, outs = lib.call(FUNCTIONS[_GET_SIZE], [obj.real, True, True, True])
    if code != 0 or not outs or outs[2] is None:
        log.warning("session %s: %s: the descriptor's nnz could not be read back (status %s); a restore "
                    "recreates it with its nnz at creation", sess.token, fn.name, code)
        return
    fid, ctxh, cargs = obj.create
    cargs = list(cargs)
    if len(cargs) > NNZ_ARG:
        cargs[NNZ_ARG] = int(outs[2])
        obj.create = (fid, ctxh, cargs)


# settings whose replay reads device memory: after the memory is restored
AFTER_MEMORY = {"cusparseSpSV_analysis", "cusparseSpSM_analysis", "cusparseSpGEMM_workEstimation",
                "cusparseSpGEMM_compute"}


def defer(sess, kind: str, ident: int, fn, fid: int, ctxh: int, args: list) -> None:
    """Keeps a setting for replay_after_memory (libraries.rebuild)."""
    pending = getattr(sess, "lib_after_memory", None)
    if pending is None:
        pending = sess.lib_after_memory = []
    pending.append((kind, ident, fn, fid, ctxh, args))


def replay_after_memory(d, sess) -> None:
    """Replays the deferred settings in their order, now that device memory
    holds the image's contents (checkpoint engine, after the upload); a
    failure fails the restore with the call named."""
    from ..core.kinds import CheckpointError
    pending = getattr(sess, "lib_after_memory", None) or []
    sess.lib_after_memory = []
    for kind, ident, fn, fid, ctxh, args in pending:
        code, _ = d.libs.execute(sess, fn, fid, ctxh, args)
        if code != 0:
            raise CheckpointError(f"replaying {fn.name} on {kind} {ident} failed (status {code})")


# The legacy matrix descriptor (cusparseMatDescr_t) lives in the application
# (interceptor/lib_cusparse.c, gp_mat_descr: int magic, type, fill mode,
# diagonal type, index base); a call that takes one (the CSR/CSC sorts) sends
# those 20 bytes, and the library gets a descriptor of its own with the same
# fields (one per distinct set of fields, kept for the worker's life).
MAT_DESCR_MAGIC = 0x6d617464
MAT_DESCR = struct.Struct("<iiiii")


def mat_descr(lib, fname: str, raw: bytes):
    from ..core.session import CudaError
    if len(raw) < MAT_DESCR.size:
        raise CudaError(1, f"{fname}: a matrix descriptor of {len(raw)} bytes")
    magic, typ, fill, diag, base = MAT_DESCR.unpack_from(raw)
    if magic != MAT_DESCR_MAGIC:
        raise CudaError(1, f"{fname}: not a matrix descriptor made by cusparseCreateMatDescr")
    fields = (typ, fill, diag, base)
    ffi = getattr(lib, "ffi", None)
    if ffi is None:
        return fields               # the emulated library reads the fields
    cache = lib.__dict__.setdefault("_mat_descrs", {})
    d = cache.get(fields)
    if d is None:
        p = ffi.new("void *[1]")
        if lib.lib.cusparseCreateMatDescr(p):
            raise CudaError(1, f"{fname}: cusparseCreateMatDescr failed in the worker")
        d = p[0]
        for setter, v in (("cusparseSetMatType", typ), ("cusparseSetMatFillMode", fill),
                          ("cusparseSetMatDiagType", diag), ("cusparseSetMatIndexBase", base)):
            if getattr(lib.lib, setter)(d, v):
                raise CudaError(1, f"{fname}: {setter}({v}) failed in the worker")
        cache[fields] = d
    return d


# Restore: the settings deferred while the library objects were rebuilt
# (their replays read matrices in device memory) run once the engine has
# uploaded the arena's contents (core/kinds.py, Stage.AFTER_MEMORY).
register(Kind("sparse_after_memory", Stage.AFTER_MEMORY,
              rebuild=lambda r: replay_after_memory(r.dispatcher, r.sess)))
