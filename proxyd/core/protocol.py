"""Wire protocol between the shim, proxy-cli and proxyd (docs/protocol.md).

ZeroMQ: the daemon binds a ROUTER socket; every client process connects one
DEALER socket whose routing id is "c:<session token>"; proxy-cli uses
"ctl:<random>". A message is one msgpack frame, optionally followed by raw
data frames that the msgpack frame refers to with ext type FRAME.
"""
from __future__ import annotations

import os
import struct

import msgpack

PROTOCOL_VERSION = 1

# endpoint used when GPUPROXY_ENDPOINT is not set (the shim has the same default)
DEFAULT_ENDPOINT = "ipc:///tmp/gpuproxy.sock"


def endpoint_from_env() -> str:
    return os.environ.get("GPUPROXY_ENDPOINT") or DEFAULT_ENDPOINT


# client -> daemon message types: [type, seq, payload]
MSG_HELLO = 0
MSG_CALL = 1
MSG_BYE = 2
MSG_DOORBELL = 3  # [3, seq]: the request is in the fast channel (docs/protocol.md)
MSG_WHERE = 4    # shim -> supervisor: [4, 0, {pid, pidns}]: what became of my session? (docs/protocol.md)
MSG_QUIESCE = 5  # shim -> supervisor: [5, 0, {}]: before parking, wait until the worker's device work is done
MSG_CTL = 10     # proxy-cli: [10, seq, command, args]

# reply codes below zero are protocol-level (the shim's GP_REPLY_*)
REPLY_KEEPALIVE = -1
REPLY_PROTOCOL_ERROR = -2
REPLY_UNKNOWN_SESSION = -3
REPLY_QUIESCED = -4    # answer to MSG_QUIESCE

EXT_FRAME = 1    # payload: u32 index of a later frame of the same message
EXT_SHM = 2      # payload: u32 segment, u64 offset, u64 length
EXT_CONTENT = 3  # payload: 32-byte SHA-256 of a module image, u64 length (modstore.py)

# handle kinds (interceptor/gp_base.h); a handle value is (kind << 32) | id
K_CONTEXT = 1
K_MODULE = 2
K_FUNCTION = 3
K_STREAM = 4
K_EVENT = 5
K_MEM_POOL = 6      # proxyd-side objects (mempool.py); the shim never looks inside
K_MEM_HANDLE = 7    # the application's physical allocations (cuMemCreate, vmm.py)
K_GRAPH = 8         # graphs and executable graphs (graphs.py)
K_GRAPH_EXEC = 9
K_ARRAY = 10         # CUDA arrays (arrays.py); texture/surface objects are driver values, not handles
K_GRAPH_NODE = 11   # nodes of graphs built explicitly (graph_nodes.py)
K_MIPMAPPED_ARRAY = 28   # mipmapped CUDA arrays (arrays.py); their levels are K_ARRAY objects

# library objects (libraries.py); the shim's own kinds stop below 32
K_CUBLAS_HANDLE = 32
K_CUBLASLT_HANDLE = 33
K_CUBLASLT_MATMUL_DESC = 34
K_CUBLASLT_LAYOUT = 35
K_CUBLASLT_PREFERENCE = 36
K_NVML_DEVICE = 37      # a value (the device's index + 1), never a session object
K_CUDNN_HANDLE = 38
# cuDNN backend descriptors: the shim picks their ids (interceptor/lib_cudnn.c,
# GP_K_CUDNN_BACKEND_DESC), proxyd never allocates one (proxyd/families/cudnn.py)
K_CUDNN_BACKEND_DESC = 39
K_CUDNN_DESC = 40       # cuDNN's legacy descriptors (cudnnTensorDescriptor_t, ...)
K_CUFFT_PLAN = 41       # the app holds the bare id: cufftHandle is an int (cufft.h)
K_CURAND_GENERATOR = 42
K_CUSPARSE_HANDLE = 43
K_CUSPARSE_SPMAT = 44
K_CUSPARSE_DNVEC = 45
K_CUSPARSE_DNMAT = 46
K_CUSOLVER_DN_HANDLE = 47
K_CUSOLVER_DN_PARAMS = 48
K_CUSOLVER_SYEVJ_INFO = 49     # syevjInfo_t (cusolverDn.h): the Jacobi eigensolver's settings
K_CUSOLVER_GESVDJ_INFO = 50    # gesvdjInfo_t: the Jacobi SVD's settings
K_CUSPARSE_SPGEMM = 51         # cusparseSpGEMMDescr_t (cusparse.h, generic API)
K_CUSPARSE_SPSV = 52           # cusparseSpSVDescr_t
K_CUSPARSE_SPSM = 53           # cusparseSpSMDescr_t
K_NCCL_COMM = 54        # ncclComm_t: a communicator, named by the shim (proxyd/families/nccl.py)
K_CUSPARSE_SPVEC = 55   # cusparseSpVecDescr_t (cusparse.h, generic API: a sparse vector)

KIND_CODES = {"context": K_CONTEXT, "module": K_MODULE, "function": K_FUNCTION,
              "stream": K_STREAM, "event": K_EVENT, "mem_pool": K_MEM_POOL,
              "mem_handle": K_MEM_HANDLE, "graph": K_GRAPH, "graph_exec": K_GRAPH_EXEC, "array": K_ARRAY,
              "graph_node": K_GRAPH_NODE, "mipmapped_array": K_MIPMAPPED_ARRAY,
              "cublas_handle": K_CUBLAS_HANDLE, "cublaslt_handle": K_CUBLASLT_HANDLE,
              "cublaslt_matmul_desc": K_CUBLASLT_MATMUL_DESC, "cublaslt_layout": K_CUBLASLT_LAYOUT,
              "cublaslt_preference": K_CUBLASLT_PREFERENCE, "cudnn_handle": K_CUDNN_HANDLE,
              "cudnn_backend_desc": K_CUDNN_BACKEND_DESC, "cudnn_desc": K_CUDNN_DESC,
              "cufft_plan": K_CUFFT_PLAN,
              "curand_generator": K_CURAND_GENERATOR, "cusparse_handle": K_CUSPARSE_HANDLE,
              "cusparse_spmat": K_CUSPARSE_SPMAT, "cusparse_dnvec": K_CUSPARSE_DNVEC,
              "cusparse_dnmat": K_CUSPARSE_DNMAT, "cusolver_dn_handle": K_CUSOLVER_DN_HANDLE,
              "cusolver_dn_params": K_CUSOLVER_DN_PARAMS, "cusolver_syevj_info": K_CUSOLVER_SYEVJ_INFO,
              "cusolver_gesvdj_info": K_CUSOLVER_GESVDJ_INFO, "cusparse_spgemm": K_CUSPARSE_SPGEMM,
              "cusparse_spsv": K_CUSPARSE_SPSV, "cusparse_spsm": K_CUSPARSE_SPSM, "nccl_comm": K_NCCL_COMM,
              "cusparse_spvec": K_CUSPARSE_SPVEC}
KIND_NAMES = {v: k for k, v in KIND_CODES.items()}

# special stream handle values (cuda.h)
STREAM_LEGACY = 0x1
STREAM_PER_THREAD = 0x2


# ids with this bit were chosen by the shim (library creates with spec
# `ids: shim`, interceptor/lib_ids.c); proxyd's own ids count up from 1
SHIM_ID_BIT = 0x80000000


def make_handle(kind: int, ident: int) -> int:
    return (kind << 32) | ident


def split_handle(h: int) -> tuple[int, int]:
    return h >> 32, h & 0xFFFFFFFF


class ShmRef:
    __slots__ = ("seg", "offset", "length")

    def __init__(self, seg: int, offset: int, length: int):
        self.seg, self.offset, self.length = seg, offset, length

    def __repr__(self):
        return f"ShmRef(seg={self.seg}, off={self.offset}, len={self.length})"


class ContentRef:
    """A module image named by its SHA-256 instead of sent (modstore.py)."""
    __slots__ = ("digest", "length")

    def __init__(self, digest: bytes, length: int):
        self.digest, self.length = digest, length

    def __repr__(self):
        return f"ContentRef({self.digest.hex()[:16]}..., len={self.length})"


class FrameRef:
    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def _ext_hook(code: int, data: bytes):
    if code == EXT_FRAME:
        return FrameRef(struct.unpack(">I", data)[0])
    if code == EXT_SHM:
        return ShmRef(*struct.unpack(">IQQ", data))
    if code == EXT_CONTENT:
        if len(data) != 40:
            raise ValueError(f"content reference of {len(data)} bytes (expected 40)")
        return ContentRef(bytes(data[:32]), struct.unpack(">Q", data[32:])[0])
    return msgpack.ExtType(code, data)


def header(msg) -> tuple[int, int]:
    """(type, sequence number) of a decoded message; ValueError when they
    are not integers or the sequence number could not be echoed in an answer."""
    mtype, seq = msg[0], msg[1]
    if type(mtype) is not int or type(seq) is not int or not 0 <= seq < 1 << 63:
        raise ValueError(f"bad message type or sequence number {str(msg[:2])[:60]}")
    return mtype, seq


def decode(frames: list) -> list:
    """Decodes frame 0 and replaces frame references by the frames' bytes."""
    msg = msgpack.unpackb(frames[0], ext_hook=_ext_hook, raw=False, strict_map_key=False)
    if len(frames) > 1:
        msg = _resolve(msg, frames)
    return msg


def _resolve(x, frames):
    if isinstance(x, FrameRef):
        if not 0 < x.index < len(frames):
            raise ValueError(f"frame reference {x.index} out of range")
        return frames[x.index]
    if isinstance(x, list):
        return [_resolve(v, frames) for v in x]
    return x


class Packer:
    """Encodes replies; large byte strings go as separate frames."""

    INLINE_MAX = 128 * 1024   # larger byte strings go as separate frames

    def pack(self, obj) -> list:
        # most replies hold no large bytes: one msgpack call, no walk
        if not _has_big(obj, 2):
            return [_packb(obj, use_bin_type=True)]
        frames: list = [None]

        def enc(x):
            if isinstance(x, (bytes, bytearray, memoryview)) and len(x) >= self.INLINE_MAX:
                frames.append(x)
                return msgpack.ExtType(EXT_FRAME, struct.pack(">I", len(frames) - 1))
            if isinstance(x, (list, tuple)):
                return [enc(v) for v in x]
            return x

        frames[0] = msgpack.packb(enc(obj), use_bin_type=True)
        return frames


_packb = msgpack.packb
_BYTES = (bytes, bytearray, memoryview)
_SEQ = (list, tuple)


def small_values(outs) -> bool:
    """Whether a reply's out-values (None or a flat list) hold nothing that
    Packer.pack would send as a frame of its own: no byte string of
    INLINE_MAX or more, no nested list (checked by the general walk)."""
    if outs is None:
        return True
    if type(outs) is not list:
        return False
    for v in outs:
        t = type(v)
        if t is int or v is None:
            continue
        if t is bytes or t is bytearray or t is memoryview:
            if len(v) >= Packer.INLINE_MAX:
                return False
        elif t is not str and t is not float and t is not bool:
            return False
    return True


def _has_big(x, depth: int) -> bool:
    """Whether x holds a byte string of Packer.INLINE_MAX or more (within
    depth levels of lists; deeper lists count as yes: the general path).
    A plain loop: this runs for every reply (the round-trip path)."""
    if isinstance(x, _BYTES):
        return len(x) >= Packer.INLINE_MAX
    if not isinstance(x, _SEQ):
        return False
    if depth == 0:
        return True
    for v in x:
        t = type(v)
        if t is int or t is str or v is None:
            continue      # what replies are mostly made of
        if isinstance(v, _BYTES):
            if len(v) >= Packer.INLINE_MAX:
                return True
        elif isinstance(v, _SEQ) and _has_big(v, depth - 1):
            return True
    return False


def endpoint_problem(ep: str) -> str | None:
    """Why ep cannot be a proxyd endpoint, or None."""
    if ep.startswith("ipc://"):
        path = ep[len("ipc://"):]
        if not path:
            return f"bad endpoint {ep!r}: ipc:// needs a socket path"
        if len(path.encode()) > 107:
            return f"bad endpoint {ep!r}: a Unix socket path holds at most 107 bytes"
        return None
    if ep.startswith("tcp://"):
        host, _, port = ep[len("tcp://"):].rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            return f"bad endpoint {ep!r}: expected tcp://HOST:PORT"
        return None
    return f"bad endpoint {ep!r}: expected ipc://PATH or tcp://HOST:PORT"
