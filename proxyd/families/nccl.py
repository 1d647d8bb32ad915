"""NCCL in the worker (issue 22, part 2; docs/multigpu.md).

The application's libnccl.so.2 is the shim's stand-in (generated from
specs/nccl, hand-written part interceptor/lib_nccl.c); each call comes here
as a library op (proxyd/families/libraries.py hands every `nccl` op to execute()).
NCCL itself runs in the worker, next to the session's CUDA context: NVIDIA's
libnccl.so.2 on the cuda backend (RealNccl), the numpy emulation with a
rendezvous between workers on the emulated one (proxyd/backends/emu/collectives.py).

Communicators are handles the shim chooses ((K_NCCL_COMM << 32) | id, bit
31 of the id set: interceptor/lib_ids.c), kept per session in
`sess.nccl_comms`, not among the session's checkpointed objects: a dump of
a session that holds one is refused (check_checkpointable) until the
consistent cut of docs/multigpu.md is built.

Calls that wait for the other ranks -- ncclCommInitRank(Config),
ncclCommSplit, ncclCommFinalize -- run on a helper thread of the worker (with
the session's context current there), so the worker keeps serving its other
messages and control commands meanwhile; the op answers ncclInProgress at
once and the stand-in polls ncclCommGetAsyncError until the communicator is
ready (or, for a communicator the application made nonblocking, returns
ncclInProgress to the application, which polls, as NCCL documents). On the
cuda backend NCCL_RUNTIME_CONNECT=0 (unless set) makes NCCL connect all its
transports during that init, so a collective never blocks the worker on a
first connection; NCCL_NVLS_ENABLE=0 is always set (no NVLink multicast on
shared machines, and never cuMulticastCreate).

Every communicator counts the collectives issued on it (`seq`, also for
each point-to-point call; one captured into a CUDA graph at each launch of
the graph, not at the capture: nccl_cut.py, "Graph launches"): the
per-communicator sequence numbers the consistent cut compares across ranks.

Locking: execute() runs on the worker's main loop. A communicator's helper
thread touches only that Comm's fields (real, code, busy), each one plain
assignment; the main loop reads them and never uses a communicator while its
thread runs (calls on a busy one answer ncclInvalidArgument, as NCCL's
ncclCommEnsureReady answers a communicator used before its nonblocking
init, split or finalize is done).
"""
from __future__ import annotations

import glob
import hashlib
import logging
import os
import struct
import sys
import threading

from ..core import protocol as P
from ..core.kinds import Kind, register
from ..core.session import CudaError

log = logging.getLogger("proxyd")

NCCL_SUCCESS, NCCL_SYSTEM_ERROR, NCCL_INTERNAL_ERROR = 0, 2, 3
NCCL_INVALID_ARGUMENT, NCCL_INVALID_USAGE, NCCL_IN_PROGRESS = 4, 5, 7
SHIM_ID_BIT = 0x80000000
NCCL_SPLIT_NOCOLOR = -1
CUDA_ERROR_LAUNCH_FAILED = 719

# ncclConfig_t (nccl.h, v23100): the int fields the worker passes on, by
# offset; fields past the application's `size` are left undefined
CONFIG_FIELDS = {"blocking": 16, "cgaClusterSize": 20, "minCTAs": 24, "maxCTAs": 28, "splitShare": 40,
                 "collnetEnable": 56, "CTAPolicy": 60}

COLLECTIVES = ("ncclAllReduce", "ncclBroadcast", "ncclBcast", "ncclReduce", "ncclAllGather", "ncclReduceScatter",
               "ncclSend", "ncclRecv")
# every op _execute runs (tests/test_libraries.py checks the spec's supported set against it)
HANDLED = frozenset(COLLECTIVES + (
    "ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommSplit",
    "ncclCommGetAsyncError", "ncclCommFinalize", "ncclCommDestroy", "ncclCommAbort", "ncclCommCount",
    "ncclCommCuDevice", "ncclCommUserRank", "ncclGroupStart", "ncclGroupEnd", "ncclRedOpCreatePreMulSum",
    "ncclRedOpDestroy"))
# supported, made in the stand-in of the calls above (interceptor/lib_nccl.c)
SHIM_ONLY = frozenset({"ncclCommInitAll"})


class Comm:
    def __init__(self, handle: int, nranks: int, rank: int, device: int, blocking: bool):
        self.handle, self.nranks, self.rank, self.device = handle, nranks, rank, device
        self.blocking = blocking
        self.real = None
        self.code = NCCL_IN_PROGRESS      # until the helper thread is done
        self.message = ""
        self.busy = True
        self.seq = 0                       # collectives issued (the consistent cut compares these)
        self.nocolor = False
        # job-wide identity, the same in every rank: a digest of the unique
        # id, or for a split the parent's with its sequence number and color
        # (nccl_cut.py matches ranks by it)
        self.ident = ""
        self.ctx_id = 0                    # the session context it was made on (its device)
        self.pending = False               # restored; waits to be made again (nccl_cut.py)


def comms(sess) -> dict:
    c = getattr(sess, "nccl_comms", None)
    if c is None:
        c = sess.nccl_comms = {}
    return c


def check_checkpointable(sess):
    """A dump of a session that holds a communicator must be part of the
    job's consistent cut (nccl_cut.py, docs/multigpu.md): its peers live in
    other processes and must stop at the same collective. A dump of the
    session alone is refused."""
    live = [c for c in comms(sess).values() if not c.nocolor]
    if live and not getattr(sess, "nccl_cut", False):
        raise RuntimeError(f"the session holds {len(live)} NCCL communicator(s); a multi-process NCCL job is "
                           f"checkpointed as one consistent cut of all its ranks: proxy-cli dump --job ROOT_PID "
                           f"or --pids PID,PID,... (docs/multigpu.md)")


# a dump check (core/kinds.py): what a checkpoint cannot keep yet
register(Kind("nccl", check=check_checkpointable))


def status(sess) -> dict:
    """The session's communicators for `status` ({} without any): what the
    consistent cut compares across a job's ranks (docs/multigpu.md)."""
    cs = [c for c in comms(sess).values() if not c.nocolor]
    if not cs:
        return {}
    out = {"nccl": [{"comm": f"{c.handle:#x}", "nranks": c.nranks, "rank": c.rank, "device": c.device,
                     "seq": c.seq, "state": "busy" if c.busy else "ready" if c.code == NCCL_SUCCESS else
                     f"failed ({c.code})"} for c in cs]}
    hold = getattr(sess, "nccl_hold", None)
    if hold is not None:
        # a job's consistent cut holds it (nccl_cut.py): what it waits for
        out["nccl_hold"] = {"targets": dict(hold.targets), "waiting_on": hold.waiting_on,
                            "queued": len(sess.queued)}
    return out


def parse_config(raw) -> dict | None:
    if raw is None:
        return None
    raw = bytes(raw)
    if len(raw) < 16:
        raise CudaError(1, f"ncclConfig_t of {len(raw)} bytes")
    size = struct.unpack_from("<Q", raw, 0)[0]
    out = {}
    for name, off in CONFIG_FIELDS.items():
        if off + 4 <= min(size, len(raw)):
            out[name] = struct.unpack_from("<i", raw, off)[0]
    return out


def _new_handle(sess, h) -> int:
    h = int(h or 0)
    k, i = P.split_handle(h)
    if k != P.K_NCCL_COMM or not i & SHIM_ID_BIT:
        raise _Fail(NCCL_INVALID_ARGUMENT, f"{h:#x} is not a communicator handle the stand-in chose")
    if h in comms(sess):
        raise _Fail(NCCL_INVALID_ARGUMENT, f"communicator handle {h:#x} is already in use")
    return h


class _Fail(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def _comm(sess, h, ready: bool = True) -> Comm:
    c = comms(sess).get(int(h or 0))
    if c is None:
        raise _Fail(NCCL_INVALID_ARGUMENT, f"{int(h or 0):#x} is not a communicator of this process")
    if ready and c.busy:
        # src/init.cc ncclCommEnsureReady: a communicator used before its
        # previous operation (a nonblocking init, split or finalize) is done
        raise _Fail(NCCL_INVALID_ARGUMENT, "the communicator is used before its previous operation (init, split or "
                                           "finalize) returned ncclSuccess")
    if ready and c.code != NCCL_SUCCESS:
        raise _Fail(NCCL_INVALID_USAGE, f"the communicator failed: {c.message or c.code}")
    return c


def _in_thread(backend, ctx, comm: Comm, work, name: str):
    """Runs work() on a helper thread with the session's context current;
    its result (a real communicator, or None) and status land in comm."""
    def run():
        try:
            if ctx is not None:
                if hasattr(backend, "forget_current"):
                    backend.forget_current()
                backend.make_current(ctx.real)
            r = work()
            if r is not None:
                comm.real = r
            comm.code = NCCL_SUCCESS
        except Exception as e:     # NcclFailure, CudaError, or a bug: the status says it
            comm.code = int(getattr(e, "code", NCCL_INTERNAL_ERROR))
            comm.message = f"{name}: {e}"
            log.info("%s failed: %s", name, e)
        finally:
            comm.busy = False
    threading.Thread(target=run, name=f"nccl-{name}", daemon=True).start()


def execute(calls, sess, fn, ctx, args, lib):
    """One NCCL op (proxyd/families/libraries.py LibraryCalls.execute): (status, outs)."""
    try:
        return _execute(calls, sess, fn, ctx, args, lib)
    except _Fail as e:
        raise _as_cuda(e) from None
    except Exception as e:
        if hasattr(e, "code") and e.__class__.__name__ == "NcclFailure":
            raise _as_cuda(e) from None
        raise
    finally:
        # NCCL calls cudaSetDevice, which makes the device's primary context
        # current on this thread (CUDA Runtime API, "Interactions with the
        # CUDA Driver API"); the session's context comes back before any
        # other op of the worker runs
        forget = getattr(calls.backend, "forget_current", None)
        if forget is not None and isinstance(lib, RealNccl):
            forget()
            if ctx is not None:
                calls.backend.make_current(ctx.real)


def _as_cuda(e) -> CudaError:
    # libraries.run_op turns CudaError codes into the library's status:
    # 400 -> bad handle (ncclInvalidArgument), 801 -> not supported
    # (ncclInvalidUsage), anything else -> invalid (ncclInvalidArgument);
    # the status itself travels in the message's prefix for the log
    code = int(getattr(e, "code", NCCL_INTERNAL_ERROR))
    err = CudaError(801 if code == NCCL_INVALID_USAGE else 1, f"ncclResult_t {code}: {e}")
    err.nccl_code = code
    return err


def _execute(calls, sess, fn, ctx, args, lib):
    name = fn.name
    backend = calls.backend
    if name == "ncclGetVersion":
        return NCCL_SUCCESS, [lib.version()]
    if name == "ncclGetUniqueId":
        return NCCL_SUCCESS, [lib.unique_id()]
    if name in ("ncclCommInitRank", "ncclCommInitRankConfig"):
        h = _new_handle(sess, args[0])
        nranks, uid, rank = int(args[1]), args[2], int(args[3])
        cfg = parse_config(args[4]) if name == "ncclCommInitRankConfig" else None
        if not isinstance(uid, (bytes, bytearray)) or len(uid) != 128:
            raise _Fail(NCCL_INVALID_ARGUMENT, "the unique id must be 128 bytes")
        if nranks < 1 or not 0 <= rank < nranks:
            raise _Fail(NCCL_INVALID_ARGUMENT, f"rank {rank} of {nranks}")
        if ctx is None:
            raise _Fail(NCCL_INVALID_USAGE, "no current CUDA context (call cudaSetDevice first)")
        c = comms(sess)[h] = Comm(h, nranks, rank, ctx.device, not cfg or cfg.get("blocking", 1) != 0)
        c.ident, c.ctx_id = hashlib.sha256(bytes(uid)).hexdigest()[:32], ctx.id
        _in_thread(backend, ctx, c, lambda: lib.init_rank(nranks, bytes(uid), rank, cfg, ctx.device), name)
        return NCCL_IN_PROGRESS, []
    if name == "ncclCommSplit":
        parent = _comm(sess, args[0])
        color, key = int(args[1]), int(args[2])
        h = _new_handle(sess, args[3])
        cfg = parse_config(args[4]) if args[4] is not None else None
        c = comms(sess)[h] = Comm(h, 0, 0, parent.device, not cfg or cfg.get("blocking", 1) != 0)
        parent.seq += 1
        c.ident = hashlib.sha256(f"{parent.ident}/{parent.seq}/{color}".encode()).hexdigest()[:32]
        c.ctx_id = parent.ctx_id
        parent.busy = True      # the split is a collective of the parent: nothing else runs on it meanwhile

        def split():
            try:
                new = lib.split(parent.real, color, key, cfg)
            except Exception as e:
                if not parent.blocking:
                    # src/group.cc: a nonblocking group's failure becomes the
                    # parent's asynchronous error
                    parent.code = int(getattr(e, "code", NCCL_INTERNAL_ERROR))
                    parent.message = f"ncclCommSplit: {e}"
                raise
            finally:
                parent.busy = False
            if new is None:
                c.nocolor = True
            else:
                c.nranks, c.rank = lib.count(new), lib.user_rank(new)
            return new
        _in_thread(backend, ctx, c, split, name)
        return NCCL_IN_PROGRESS, []
    if name == "ncclCommGetAsyncError":
        c = _comm(sess, args[0], ready=False)
        if c.busy:
            return NCCL_SUCCESS, [NCCL_IN_PROGRESS]
        if c.code != NCCL_SUCCESS or c.real is None:
            return NCCL_SUCCESS, [c.code]
        return NCCL_SUCCESS, [lib.async_error(c.real)]
    if name == "ncclCommFinalize":
        c = _comm(sess, args[0])
        c.busy, c.code = True, NCCL_IN_PROGRESS
        _in_thread(backend, ctx, c, lambda: lib.finalize(c.real), name)
        return NCCL_IN_PROGRESS, []
    if name in ("ncclCommDestroy", "ncclCommAbort"):
        c = _comm(sess, args[0], ready=False)
        if c.busy and name == "ncclCommDestroy":
            # src/init.cc ncclCommDestroy -> ncclCommEnsureReady
            raise _Fail(NCCL_INVALID_ARGUMENT, "the communicator is destroyed before its previous operation (init, "
                                               "split or finalize) returned ncclSuccess (poll ncclCommGetAsyncError, "
                                               "or use ncclCommAbort)")
        if c.real is not None and not c.busy:
            (lib.destroy if name == "ncclCommDestroy" else lib.abort)(c.real)
        # an abort of a communicator whose init still waits for its peers:
        # the helper thread's result is dropped when it comes (the handle is gone)
        del comms(sess)[c.handle]
        return NCCL_SUCCESS, []
    if name == "ncclCommCount":
        return NCCL_SUCCESS, [_comm(sess, args[0]).nranks]
    if name == "ncclCommCuDevice":
        from .devnum import app_device       # the application's number of the device (a remapping restore)
        return NCCL_SUCCESS, [app_device(sess, _comm(sess, args[0]).device)]
    if name == "ncclCommUserRank":
        return NCCL_SUCCESS, [_comm(sess, args[0]).rank]
    if name == "ncclRedOpCreatePreMulSum":
        # args: the out flag, the scalar (bytes: its value from host memory;
        # an int: a device address), datatype, residence, comm
        scalar, dtype, comm = args[1], int(args[2]), _comm(sess, args[4])
        if isinstance(scalar, int):
            scalar = sess.translate(scalar) if sess.addr_map else scalar
        elif not isinstance(scalar, (bytes, bytearray)):
            raise _Fail(NCCL_INVALID_ARGUMENT, "the scalar must be a value or an address")
        return NCCL_SUCCESS, [lib.premul_create(comm.real, scalar, dtype)]
    if name == "ncclRedOpDestroy":
        lib.premul_destroy(_comm(sess, args[1]).real, int(args[0]))
        return NCCL_SUCCESS, []
    if name == "ncclGroupStart":
        lib.group_start()
        return NCCL_SUCCESS, []
    if name == "ncclGroupEnd":
        lib.group_end()
        return NCCL_SUCCESS, []
    if name in COLLECTIVES:
        return _collective(calls, sess, fn, args, lib)
    raise _Fail(NCCL_INVALID_USAGE, f"{name} is not supported under gpuproxy")


def _collective(calls, sess, fn, args, lib):
    out = []
    comm = None
    for (pname, role, kind, *_), a in zip(fn.params, args):
        if role == "device_ptr":
            if a is not None and type(a) is not int:
                raise _Fail(NCCL_INVALID_ARGUMENT, f"{pname} must be an address")
            a = int(a or 0)
            out.append(sess.translate(a) if sess.addr_map else a)
        elif role == "handle" and kind == "stream":
            out.append(calls.d.resolve_handle(sess, "stream", a))
        elif role == "handle":
            comm = _comm(sess, a)
            out.append(comm.real)
        else:
            out.append(int(a or 0))
    if not getattr(sess, "lib_capturing", False):
        comm.seq += 1       # captured into a graph: counted at each launch instead (nccl_cut.py)
    lib.run(fn.name, tuple(out))
    return NCCL_SUCCESS, []


# ------------------------------------------------------- NVIDIA's NCCL

NCCL_CDEF = """
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct {
  size_t size; unsigned int magic; unsigned int version;
  int blocking; int cgaClusterSize; int minCTAs; int maxCTAs; const char *netName; int splitShare;
  int trafficClass; const char *commName; int collnetEnable; int CTAPolicy; int shrinkShare; int nvlsCTAs;
  int nChannelsPerNetPeer; int nvlinkCentricSched; int graphUsageMode; int numRmaCtx; int maxP2pPeers;
  int graphStreamOrdering; int launchOrderImplicit; int numRmaSig; int rmaEagerInit; int hostCftMode;
  int nvlsHostMode;
} ncclConfig_t;
int ncclGetVersion(int *version);
int ncclGetUniqueId(ncclUniqueId *uniqueId);
int ncclCommInitRankConfig(void **comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config);
int ncclCommSplit(void *comm, int color, int key, void **newcomm, ncclConfig_t *config);
int ncclCommFinalize(void *comm);
int ncclCommDestroy(void *comm);
int ncclCommAbort(void *comm);
int ncclCommGetAsyncError(void *comm, int *asyncError);
int ncclCommCount(void *comm, int *count);
int ncclCommUserRank(void *comm, int *rank);
const char *ncclGetLastError(void *comm);
int ncclAllReduce(const void *s, void *r, size_t count, int datatype, int op, void *comm, void *stream);
int ncclReduce(const void *s, void *r, size_t count, int datatype, int op, int root, void *comm, void *stream);
int ncclBcast(void *buff, size_t count, int datatype, int root, void *comm, void *stream);
int ncclBroadcast(const void *s, void *r, size_t count, int datatype, int root, void *comm, void *stream);
int ncclAllGather(const void *s, void *r, size_t sendcount, int datatype, void *comm, void *stream);
int ncclReduceScatter(const void *s, void *r, size_t recvcount, int datatype, int op, void *comm, void *stream);
int ncclSend(const void *s, size_t count, int datatype, int peer, void *comm, void *stream);
int ncclRecv(void *r, size_t count, int datatype, int peer, void *comm, void *stream);
int ncclGroupStart(void);
int ncclGroupEnd(void);
int ncclRedOpCreatePreMulSum(int *op, void *scalar, int datatype, int residence, void *comm);
int ncclRedOpDestroy(int op, void *comm);
"""
# nccl.h: NCCL_API_MAGIC, NCCL_CONFIG_UNDEF_INT
NCCL_API_MAGIC = 0xCAFEBEEF
UNDEF_INT = -(1 << 31)


def _nccl_candidates() -> list[str]:
    """$GPUPROXY_NCCL_LIBRARY, $GPUPROXY_NVIDIA_LIB_DIR, nvidia/nccl/lib of
    this Python (the nvidia-nccl-cu13 wheel PyTorch installs), the plain soname."""
    env = os.environ.get("GPUPROXY_NCCL_LIBRARY")
    if env:
        return [env]
    out = []
    d = os.environ.get("GPUPROXY_NVIDIA_LIB_DIR")
    if d:
        out.append(os.path.join(d, "libnccl.so.2"))
    for sp in sys.path:
        out += glob.glob(os.path.join(sp, "nvidia", "nccl", "lib", "libnccl.so.2"))
    return out + ["libnccl.so.2"]


class RealNccl:
    """NVIDIA's libnccl.so.2 in the worker (cuda backend)."""

    def __init__(self):
        import cffi
        from ..core.registry import LibraryUnavailable
        # before NCCL reads its environment: no NVLink multicast, ever, and
        # every connection made during init (module docstring)
        os.environ["NCCL_NVLS_ENABLE"] = "0"
        os.environ.setdefault("NCCL_RUNTIME_CONNECT", "0")
        self.ffi = cffi.FFI()
        self.ffi.cdef(NCCL_CDEF)
        self.lib = None
        errors = []
        for path in _nccl_candidates():
            try:
                self.lib = self.ffi.dlopen(path)
                self.path = path
                break
            except OSError as e:
                errors.append(str(e).splitlines()[0])
        if self.lib is None:
            raise LibraryUnavailable(f"libnccl.so.2 not found for the worker (tried {', '.join(_nccl_candidates())}; "
                                     f"set GPUPROXY_NCCL_LIBRARY or install nvidia-nccl-cu13)")
        self.api = "nccl"
        from ..backends.cuda import SESSION_PRIMARY
        if not SESSION_PRIMARY:
            log.warning("NCCL in this worker: its cudaSetDevice makes the device's primary context current, while "
                        "the session runs on a context of its own; start proxyd with GPUPROXY_SESSION_PRIMARY=1 "
                        "(docs/multigpu.md)")

    def _check(self, r: int, what: str, comm=None):
        if r != NCCL_SUCCESS:
            msg = ""
            if comm is not None:
                msg = self.ffi.string(self.lib.ncclGetLastError(comm)).decode(errors="replace")
            raise _Fail(int(r), f"{what}: ncclResult_t {int(r)} {msg}".rstrip())

    def version(self) -> int:
        v = self.ffi.new("int *")
        self._check(self.lib.ncclGetVersion(v), "ncclGetVersion")
        return v[0]

    def unique_id(self) -> bytes:
        uid = self.ffi.new("ncclUniqueId *")
        self._check(self.lib.ncclGetUniqueId(uid), "ncclGetUniqueId")
        return bytes(self.ffi.buffer(uid))

    def _config(self, cfg: dict | None):
        c = self.ffi.new("ncclConfig_t *")
        c.size = self.ffi.sizeof("ncclConfig_t")
        c.magic = NCCL_API_MAGIC
        c.version = self.version()
        for f in ("blocking", "cgaClusterSize", "minCTAs", "maxCTAs", "splitShare", "trafficClass",
                  "collnetEnable", "CTAPolicy", "shrinkShare", "nvlsCTAs", "nChannelsPerNetPeer",
                  "nvlinkCentricSched", "graphUsageMode", "numRmaCtx", "maxP2pPeers", "graphStreamOrdering",
                  "launchOrderImplicit", "numRmaSig", "rmaEagerInit", "hostCftMode", "nvlsHostMode"):
            setattr(c, f, UNDEF_INT)
        for k, v in (cfg or {}).items():
            if k != "blocking":
                setattr(c, k, v)
        # the worker's helper thread waits; the stand-in keeps the
        # application's (non)blocking view. `version` is the loaded library's,
        # so NCCL reads only the fields it knows (nccl.h: fields are appended
        # version by version, the prefix keeps its layout)
        c.blocking = 1
        return c

    def init_rank(self, nranks, uid, rank, cfg, device):
        p = self.ffi.new("void **")
        u = self.ffi.new("ncclUniqueId *")
        self.ffi.memmove(u, uid, 128)
        self._check(self.lib.ncclCommInitRankConfig(p, nranks, u[0], rank, self._config(cfg)), "ncclCommInitRank")
        return p[0]

    def split(self, comm, color, key, cfg):
        p = self.ffi.new("void **")
        self._check(self.lib.ncclCommSplit(comm, color, key, p, self._config(cfg)), "ncclCommSplit", comm)
        return p[0] if p[0] != self.ffi.NULL else None

    def count(self, comm) -> int:
        v = self.ffi.new("int *")
        self._check(self.lib.ncclCommCount(comm, v), "ncclCommCount", comm)
        return v[0]

    def user_rank(self, comm) -> int:
        v = self.ffi.new("int *")
        self._check(self.lib.ncclCommUserRank(comm, v), "ncclCommUserRank", comm)
        return v[0]

    def finalize(self, comm):
        self._check(self.lib.ncclCommFinalize(comm), "ncclCommFinalize", comm)

    def destroy(self, comm):
        self._check(self.lib.ncclCommDestroy(comm), "ncclCommDestroy")

    def abort(self, comm):
        self._check(self.lib.ncclCommAbort(comm), "ncclCommAbort")

    def async_error(self, comm) -> int:
        v = self.ffi.new("int *")
        self._check(self.lib.ncclCommGetAsyncError(comm, v), "ncclCommGetAsyncError", comm)
        return v[0]

    def premul_create(self, comm, scalar, dtype) -> int:
        op = self.ffi.new("int *")
        if isinstance(scalar, int):         # nccl.h ncclScalarDevice (0): read on the device at each use
            r = self.lib.ncclRedOpCreatePreMulSum(op, self.ffi.cast("void *", scalar), dtype, 0, comm)
        else:                               # ncclScalarHostImmediate (1): the value, read now
            buf = self.ffi.new("char[]", bytes(scalar))
            r = self.lib.ncclRedOpCreatePreMulSum(op, buf, dtype, 1, comm)
        self._check(r, "ncclRedOpCreatePreMulSum", comm)
        return op[0]

    def premul_destroy(self, comm, op: int):
        self._check(self.lib.ncclRedOpDestroy(op, comm), "ncclRedOpDestroy", comm)

    def group_start(self):
        self._check(self.lib.ncclGroupStart(), "ncclGroupStart")

    def group_end(self):
        self._check(self.lib.ncclGroupEnd(), "ncclGroupEnd")

    def run(self, name: str, args: tuple):
        ffi = self.ffi
        conv = [ffi.cast("void *", a) if isinstance(a, int) and i in _PTR_ARGS[name] else a
                for i, a in enumerate(args)]
        stream = args[-1]
        conv[-1] = ffi.cast("void *", int(stream or 0)) if not isinstance(stream, ffi.CData) else stream
        comm_i = _COMM_ARG[name]
        self._check(getattr(self.lib, name)(*conv), name, conv[comm_i])


# argument positions holding buffer addresses, and the communicator's, per collective
_PTR_ARGS = {"ncclAllReduce": (0, 1), "ncclReduce": (0, 1), "ncclBcast": (0,), "ncclBroadcast": (0, 1),
             "ncclAllGather": (0, 1), "ncclReduceScatter": (0, 1), "ncclSend": (0,), "ncclRecv": (0,)}
_COMM_ARG = {"ncclAllReduce": 5, "ncclReduce": 6, "ncclBcast": 4, "ncclBroadcast": 5, "ncclAllGather": 4,
             "ncclReduceScatter": 5, "ncclSend": 4, "ncclRecv": 4}
