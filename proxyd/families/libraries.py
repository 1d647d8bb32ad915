"""Library calls (cuBLAS, cuBLASLt, NVML, cuFFT, cuRAND, cuSPARSE, cuSOLVER)
in the worker (docs/libraries.md).

The shim's stand-ins (libcublas.so.13, libcublasLt.so.13, libnvidia-ml.so.1,
libcufft.so.12, libcurand.so.10, libcusparse.so.12, libcusolver.so.12,
generated from specs/<library>/) send each call as an op like a driver call;
its function id is in a library's id range and its spec says `handler:
library` in the dispatch table. Here the op is decoded by role, handles are
translated to the library's real objects, and NVIDIA's library (the cuda
backend: loaded from the worker's Python environment or a path given in the
environment, see RealLibrary) or the emulated one (proxyd/backends/emu/blas.py) runs
it on the session's current context.

Codes: an op's answer is the library's own status (cublasStatus_t,
nvmlReturn_t). An asynchronous call (gemm; spec `sync: false`) that fails
becomes the session's pending asynchronous error, CUDA_ERROR_LAUNCH_FAILED
with a message naming the function and its status, reported at the next
synchronising CUDA call, as a failed kernel launch is.

Objects: handles and descriptors are session objects (kinds K_CUBLAS_HANDLE..,
protocol.py) with the call that made them and their settings (calls whose
spec says `restore: {rule: object, key: [...]}`: the latest call per key).
A restore recreates each in a fresh worker under its old handle and replays
its settings in the order they were last made (rebuild()). NVML device
handles are values (the device's index), so they need no restore. A cuFFT
plan's handle is an int (cufft.h), so the application holds the plan's bare
session id (INT_HANDLE_KINDS). A cuRAND generator also records how many
numbers it generated since its offset was last set, and comes back at that
position (curand_position).

Locking: the worker's main loop only (like dispatch.py).
"""
from __future__ import annotations

import glob
import logging
import os
import sys

from ..core import protocol as P
from . import curand_host, sparse_generic
from .._generated import FUNCTIONS, LIBRARY, LIBRARY_CDEF
from ..core.kinds import Kind, Stage, register
from ..core.registry import LibraryUnavailable, norm_scalar  # noqa: F401  (tests import it here)
from ..core.ratelog import RATE
from .cudnn import SPECIAL as CUDNN_SPECIAL
from ..core.session import CudaError, Session

log = logging.getLogger("proxyd")

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_LAUNCH_FAILED = 719
CUDA_ERROR_NOT_SUPPORTED = 801

# object kinds of library handles -> protocol kind codes
LIB_KINDS = {"cublas_handle": P.K_CUBLAS_HANDLE, "cublaslt_handle": P.K_CUBLASLT_HANDLE,
             "cublaslt_matmul_desc": P.K_CUBLASLT_MATMUL_DESC, "cublaslt_layout": P.K_CUBLASLT_LAYOUT,
             "cublaslt_preference": P.K_CUBLASLT_PREFERENCE, "cudnn_handle": P.K_CUDNN_HANDLE,
             "cudnn_desc": P.K_CUDNN_DESC, "cufft_plan": P.K_CUFFT_PLAN,
             "curand_generator": P.K_CURAND_GENERATOR, "cusparse_handle": P.K_CUSPARSE_HANDLE,
             "cusparse_spmat": P.K_CUSPARSE_SPMAT, "cusparse_dnvec": P.K_CUSPARSE_DNVEC,
             "cusparse_dnmat": P.K_CUSPARSE_DNMAT, "cusparse_spvec": P.K_CUSPARSE_SPVEC,
             "cusolver_dn_handle": P.K_CUSOLVER_DN_HANDLE,
             "cusolver_dn_params": P.K_CUSOLVER_DN_PARAMS, "cusolver_syevj_info": P.K_CUSOLVER_SYEVJ_INFO,
             "cusolver_gesvdj_info": P.K_CUSOLVER_GESVDJ_INFO,
             # last: their settings (analysis, work estimation) replay after the
             # matrices' own (pointers) in rebuild(); proxyd/families/sparse_generic.py
             "cusparse_spgemm": P.K_CUSPARSE_SPGEMM, "cusparse_spsv": P.K_CUSPARSE_SPSV,
             "cusparse_spsm": P.K_CUSPARSE_SPSM}
# kinds a library call may name: the above and cuDNN's backend descriptors,
# which are restored through their own log (cudnn.py), not as objects here
DECODE_KINDS = {**LIB_KINDS, "cudnn_backend_desc": P.K_CUDNN_BACKEND_DESC}
# parameters that have a slot in an answer's outs (scalar_out: nil in
# device pointer mode)
OUT_ROLES = ("out_value", "out_buffer", "scalar_out", "inout_value")
# kinds whose C handle type is an int, not a pointer (cufft.h: typedef int
# cufftHandle): the application holds the object's id alone
INT_HANDLE_KINDS = {"cufft_plan"}


class Status:
    """A library's status codes (cublas_api.h cublasStatus_t; nvml.h nvmlReturn_t)."""

    def __init__(self, success, invalid, not_supported, internal, bad_handle):
        self.success, self.invalid, self.not_supported = success, invalid, not_supported
        self.internal, self.bad_handle = internal, bad_handle


_CUBLAS = Status(0, 7, 15, 14, 1)       # ..., CUBLAS_STATUS_NOT_INITIALIZED for an unknown handle
STATUS = {"cublas": _CUBLAS, "cublaslt": _CUBLAS,
          # NVML_SUCCESS, _ERROR_INVALID_ARGUMENT, _NOT_SUPPORTED, _UNKNOWN, _INVALID_ARGUMENT
          "nvml": Status(0, 2, 3, 999, 2),
          # cudnn_graph.h: CUDNN_STATUS_SUCCESS, _BAD_PARAM, _NOT_SUPPORTED, _INTERNAL_ERROR, _BAD_PARAM
          "cudnn": Status(0, 2000, 3000, 4000, 2000),
          # cufft.h: CUFFT_SUCCESS, _INVALID_VALUE 4, _NOT_SUPPORTED 16, _INTERNAL_ERROR 5, _INVALID_PLAN 1
          "cufft": Status(0, 4, 16, 5, 1),
          # curand.h: _OUT_OF_RANGE 104, _ARCH_MISMATCH 204 (no not-supported
          # code: the stand-in's choice, autogen/libbootstrap.py), _INTERNAL_ERROR 999, _NOT_INITIALIZED 101
          "curand": Status(0, 104, 204, 999, 101),
          # cusparse.h: _INVALID_VALUE 3, _NOT_SUPPORTED 10, _INTERNAL_ERROR 7, _NOT_INITIALIZED 1
          "cusparse": Status(0, 3, 10, 7, 1),
          # cusolver_common.h: _INVALID_VALUE 3, _NOT_SUPPORTED 9, _INTERNAL_ERROR 7, _NOT_INITIALIZED 1
          "cusolver": Status(0, 3, 9, 7, 1),
          # nccl.h: ncclInvalidArgument 4, ncclInvalidUsage 5 (no not-supported code), ncclInternalError 3
          "nccl": Status(0, 4, 5, 3, 4)}

# function id ranges (autogen/specload.py, ID_RANGES)
_RANGES = (("cublas", 20000, 24999), ("cublaslt", 25000, 26999), ("nvml", 27000, 29999), ("cudnn", 30000, 31999),
           ("cufft", 40000, 40999), ("curand", 41000, 41999), ("cusparse", 42000, 43999),
           ("cusolver", 44000, 46999), ("nccl", 47000, 47999))


def api_of(fid: int) -> str:
    """The library family of a function id (autogen/specload.py, ID_RANGES)."""
    for api, lo, hi in _RANGES:
        if lo <= fid <= hi:
            return api
    return "cublas"


def lib_object(sess: Session, kind: str, a: int):
    """The session object a library handle names (INT_HANDLE_KINDS: the bare id)."""
    kc = LIB_KINDS[kind]
    return sess.get(kc, P.make_handle(kc, int(a)) if kind in INT_HANDLE_KINDS else int(a))


# cuRAND calls that advance a generator by their count argument (args[2]);
# curandGenerateSeeds generates none
CURAND_GENERATE = {"curandGenerate", "curandGenerateLongLong", "curandGenerateUniform",
                   "curandGenerateUniformDouble", "curandGenerateNormal", "curandGenerateNormalDouble",
                   "curandGenerateLogNormal", "curandGenerateLogNormalDouble", "curandGeneratePoisson"}


def curand_position(obj) -> tuple[int, int]:
    """(offset last set, numbers generated since) of a cuRAND generator.

    curand.h, curandSetGeneratorOffset: "The offset position is absolute,
    not relative to the current position in the sequence"; a generator's
    results continue one ordered sequence, and each generate call of n
    results moves the position on by n (cuRAND library guide, "Generator
    Options", offset and ordering). So a generator is back where it was when
    it is recreated with its settings (type, seed, ordering, stream) and its
    offset set to the last offset plus the count generated since. Setting
    the seed keeps the position (only curandSetGeneratorOffset moves it).
    Counts are of results; whether a double-precision or Poisson result moves
    the position by one is checked on the GPU (tests/programs/mathlibs.cu
    checks single-precision uniform across a dump and restore)."""
    base = 0
    for sfid, sargs in obj.info.get("settings", {}).values():
        fn = FUNCTIONS.get(sfid)
        if fn is not None and fn.name == "curandSetGeneratorOffset":
            base = int(sargs[1])
    return base, int(obj.info.get("generated", 0))


def _status_name(api: str, code: int) -> str:
    if api == "nvml":
        return f"nvmlReturn_t {code}"
    if api == "cudnn":
        return f"cudnnStatus_t {code}"
    if api in ("cufft", "curand", "cusparse", "cusolver", "nccl"):
        return {"cufft": "cufftResult", "curand": "curandStatus_t", "cusparse": "cusparseStatus_t",
                "cusolver": "cusolverStatus_t", "nccl": "ncclResult_t"}[api] + f" {code}"
    names = {0: "SUCCESS", 1: "NOT_INITIALIZED", 3: "ALLOC_FAILED", 7: "INVALID_VALUE", 8: "ARCH_MISMATCH",
             11: "MAPPING_ERROR", 13: "EXECUTION_FAILED", 14: "INTERNAL_ERROR", 15: "NOT_SUPPORTED"}
    return "CUBLAS_STATUS_" + names.get(code, str(code))


# ------------------------------------------------------------ real libraries

def _candidates(api: str, soname: str) -> list[str]:
    """Where the worker looks for NVIDIA's library: $GPUPROXY_<API>_LIBRARY
    (a file), $GPUPROXY_NVIDIA_LIB_DIR (a folder), nvidia/cu13/lib of this
    Python's site-packages (the nvidia-cublas wheel), the CUDA toolkit's
    lib64 ($CUDA_HOME, /usr/local/cuda), then the plain soname (the dynamic
    loader's search: the driver's libnvidia-ml.so.1)."""
    out = []
    env = os.environ.get(f"GPUPROXY_{api.upper()}_LIBRARY")
    if env:
        return [env]
    d = os.environ.get("GPUPROXY_NVIDIA_LIB_DIR")
    if d:
        out.append(os.path.join(d, soname))
    for sp in sys.path:
        out += glob.glob(os.path.join(sp, "nvidia", "cu13", "lib", soname))
        # cuDNN's wheel (nvidia-cudnn-cu13) has a folder of its own
        out += glob.glob(os.path.join(sp, "nvidia", "cudnn", "lib", soname))
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and os.path.exists(os.path.join(home, "lib64", soname)):
            out.append(os.path.join(home, "lib64", soname))
    out.append(soname)
    return out


class RealLibrary:
    """NVIDIA's library, called through cffi with the declarations the build
    generated from the spec (LIBRARY_CDEF)."""

    def __init__(self, api: str):
        import cffi
        soname, cdef = LIBRARY_CDEF[api]
        self.api = api
        self.ffi = cffi.FFI()
        self.ffi.cdef(cdef)
        errors = []
        self.lib = None
        for path in _candidates(api, soname):
            try:
                self.lib = self.ffi.dlopen(path)
                self.path = path
                break
            except OSError as e:
                errors.append(str(e).splitlines()[0])
        if self.lib is None:
            raise LibraryUnavailable(f"{soname} not found for the worker (tried {', '.join(_candidates(api, soname))}; "
                                     f"set GPUPROXY_{api.upper()}_LIBRARY or GPUPROXY_NVIDIA_LIB_DIR)")
        if api == "nvml":
            # the worker's own reference: NVML stays initialised for the
            # session's calls, also after a restore into a fresh worker
            self.lib.nvmlInit_v2()
        self._nvml_dev: dict[int, object] = {}

    def lt_of_cublas(self, real):
        """The cuBLASLt handle a cuBLAS handle stands for: the same pointer
        (cuBLAS documentation, "cuBLASLt API": a cublasHandle_t encapsulates
        a cublasLtHandle_t, and any valid one can be used in its place with a
        cast -- PyTorch passes its cuBLAS handle to every cublasLt call)."""
        return real

    def nvml_device(self, index: int):
        h = self._nvml_dev.get(index)
        if h is None:
            p = self.ffi.new("void *[1]")
            code = self.lib.nvmlDeviceGetHandleByIndex_v2(index, p)
            if code:
                raise CudaError(CUDA_ERROR_INVALID_VALUE, f"NVML device {index}: nvmlReturn_t {code}")
            h = self._nvml_dev[index] = p[0]
        return h

    def nvml_index(self, h) -> int:
        """NVML's index of a device handle the library gave (nvml.h,
        nvmlDeviceGetIndex), remembered for nvml_device. h as call()
        answers an out handle: an integer."""
        hp = h if isinstance(h, self.ffi.CData) else self.ffi.cast("void *", int(h))
        p = self.ffi.new("unsigned int[1]")
        code = self.lib.nvmlDeviceGetIndex(hp, p)
        if code:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"nvmlDeviceGetIndex: nvmlReturn_t {code}")
        self._nvml_dev.setdefault(int(p[0]), hp)
        return int(p[0])

    def call(self, fn, cargs):
        ffi = self.ffi
        f = getattr(self.lib, fn.name, None)
        if f is None:
            raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name} has no declaration for the library path")
        args, outs, keep = [], [], []
        for (name, role, kind, ctype, cls, size, _sz), a in zip(fn.params, cargs):
            if role == "handle" and cls in ("int", "uint"):
                args.append(int(a or 0))        # cufftHandle: the library's own int
            elif role == "handle":
                args.append(ffi.cast("void *", a or 0) if not isinstance(a, ffi.CData) else a)
            elif role == "device_ptr":
                args.append(ffi.cast("void *", a or 0))
            elif role == "scalar":
                args.append(a)
            elif role == "scalar_ptr":
                if a is None:
                    args.append(ffi.NULL)
                elif isinstance(a, int):
                    args.append(ffi.cast("void *", a))
                else:
                    b = ffi.new("char[]", bytes(a))
                    keep.append(b)
                    args.append(ffi.cast("void *", b))
            elif role == "scalar_out":
                # host pointer mode: room for the result (answered); device
                # mode: the address the library writes (gen_lib.py)
                if a is None:
                    args.append(ffi.NULL)
                    outs.append(None)
                elif isinstance(a, int):
                    args.append(ffi.cast("void *", a))
                    outs.append(None)
                else:
                    b = ffi.new("char[]", max(len(a), 1))
                    args.append(ffi.cast("void *", b))
                    outs.append(("buf", b, len(a)))
            elif role == "in_buffer" and isinstance(a, ffi.CData):
                args.append(a)      # an object of the library's own (sparse_generic.mat_descr)
            elif role == "in_buffer":
                if a is None:
                    args.append(ffi.NULL)
                else:
                    b = ffi.new("char[]", bytes(a))
                    keep.append(b)
                    args.append(ffi.cast("void *", b))
            elif role == "out_buffer":
                if a is None:
                    args.append(ffi.NULL)
                    outs.append(None)
                else:
                    b = ffi.new("char[]", max(int(a), 1))
                    args.append(ffi.cast("void *", b))
                    outs.append(("buf", b, int(a)))
            elif role == "inout_value":
                if a is None:
                    args.append(ffi.NULL)
                    outs.append(None)
                    continue
                b = ffi.new(f"{'' if cls == 'int' else 'u'}int{8 * (size or 8)}_t[1]", [int(a)])
                args.append(ffi.cast("void *", b))
                outs.append(("uint" if cls != "int" else "int", b, None))
            elif role == "out_value":
                if a is None:
                    args.append(ffi.NULL)
                    outs.append(None)
                    continue
                if cls == "handle":
                    b = ffi.new("void *[1]")
                elif cls == "float":
                    b = ffi.new("float[1]" if size == 4 else "double[1]")
                elif cls in ("int", "uint"):
                    b = ffi.new(f"{'' if cls == 'int' else 'u'}int{8 * size}_t[1]")
                else:
                    b = ffi.new("char[]", size or 8)
                args.append(ffi.cast("void *", b))
                outs.append((cls, b, None))
            else:
                raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name}: parameter {name} ({role}) cannot be passed")
        r = f(*args)
        if isinstance(r, ffi.CData):
            r = int(ffi.cast("uintptr_t", r))
        res = []
        for o in outs:
            if o is None:
                res.append(None)
            elif o[0] == "buf":
                res.append(bytes(ffi.buffer(o[1], o[2])))
            elif o[0] == "handle":
                res.append(int(ffi.cast("uintptr_t", o[1][0])))
            elif o[0] in ("int", "uint", "float"):
                res.append(o[1][0])
            else:
                res.append(bytes(ffi.buffer(o[1])))
        return int(r) if r is not None else 0, res     # a void function (cudnnGetLastErrorString): 0


class RealCudnn(RealLibrary):
    """NVIDIA's cuDNN: the backend calls that cudnn.py makes, with attribute
    arrays as bytes (element layout: cudnn_graph.h) and descriptors as
    integers (cuDNN's pointers)."""

    def _p(self, real):
        return self.ffi.cast("void *", int(real or 0))

    def bk_create(self, dtype: int):
        p = self.ffi.new("void *[1]")
        st = self.lib.cudnnBackendCreateDescriptor(dtype, self.ffi.cast("void *", p))
        return int(st), int(self.ffi.cast("uintptr_t", p[0]))

    def bk_destroy(self, real) -> int:
        return int(self.lib.cudnnBackendDestroyDescriptor(self._p(real)))

    def bk_finalize(self, real) -> int:
        return int(self.lib.cudnnBackendFinalize(self._p(real)))

    def bk_set(self, real, name: int, atype: int, count: int, data: bytes) -> int:
        buf = self.ffi.new("char[]", data) if data else self.ffi.NULL
        return int(self.lib.cudnnBackendSetAttribute(self._p(real), name, atype, count,
                                                     self.ffi.cast("void *", buf)))

    def bk_get(self, real, name: int, atype: int, requested: int, arr):
        """arr: None (count only), a size in bytes (values come back), or
        bytes (cuDNN's descriptors to fill). (status, count, bytes or None)."""
        ffi = self.ffi
        cnt = ffi.new("int64_t[1]")
        if arr is None:
            buf = ffi.NULL
        elif isinstance(arr, int):
            buf = ffi.new("char[]", max(arr, 1))
        else:
            buf = ffi.new("char[]", bytes(arr))
        st = self.lib.cudnnBackendGetAttribute(self._p(real), name, atype, requested, ffi.cast("void *", cnt),
                                               ffi.cast("void *", buf))
        out = bytes(ffi.buffer(buf, arr)) if isinstance(arr, int) else None
        return int(st), int(cnt[0]), out


# ------------------------------------------------------------------ calls

class LibraryCalls:
    """Runs library ops for the dispatcher (dispatch.py hands them over)."""

    def __init__(self, dispatcher):
        self.d = dispatcher
        self.backend = dispatcher.backend
        self._libs: dict[str, object] = {}
        self._missing: dict[str, str] = {}
        from .cudnn import CudnnBackendCalls
        self.cudnn = CudnnBackendCalls(self)

    def library(self, api: str):
        lib = self._libs.get(api)
        if lib is not None:
            return lib
        if api in self._missing:
            raise LibraryUnavailable(self._missing[api])
        try:
            make = getattr(self.backend, "library", None)
            if api == "nccl" and make is None:
                from .nccl import RealNccl      # NVIDIA's NCCL, declared by hand (proxyd/families/nccl.py)
                lib = RealNccl()
            else:
                lib = make(api) if make is not None else RealCudnn(api) if api == "cudnn" else RealLibrary(api)
        except LibraryUnavailable as e:
            self._missing[api] = str(e)
            log.warning("%s: every %s call answers not-supported", e, api)
            raise
        self._libs[api] = lib
        return lib

    # -------------------------------------------------------------- decode
    def _decode(self, sess: Session, fn, args: list, lib) -> list:
        out = []
        for (name, role, kind, ctype, cls, size, _sz), a in zip(fn.params, args):
            if role == "scalar":
                if cls == "struct":
                    if not isinstance(a, (bytes, bytearray, memoryview)):
                        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {name} must be bytes")
                    out.append(bytes(a))
                elif not isinstance(a, (int, float)) and a is not None:
                    raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {name} must be a number")
                else:
                    out.append(norm_scalar(a, cls, size))
            elif role == "device_ptr":
                if a is not None and type(a) is not int:
                    raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {name} must be an address")
                a = int(a or 0)
                out.append(sess.translate(a) if sess.addr_map else a)
            elif role == "handle":
                if a is not None and type(a) is not int:
                    raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {name} must be a handle")
                if kind == "stream":
                    out.append(self.d.resolve_handle(sess, "stream", a))
                elif kind == "nvml_device":
                    k, i = P.split_handle(int(a or 0))
                    if k != P.K_NVML_DEVICE or i == 0:
                        raise CudaError(CUDA_ERROR_INVALID_HANDLE, f"{fn.name}: invalid nvmlDevice_t {a or 0:#x}")
                    out.append(lib.nvml_device(i - 1))
                elif kind == "cublaslt_handle" and a and P.split_handle(int(a))[0] == P.K_CUBLAS_HANDLE:
                    # a cuBLAS handle cast to a cuBLASLt one (lt_of_cublas)
                    out.append(lib.lt_of_cublas(sess.get(P.K_CUBLAS_HANDLE, int(a)).real))
                elif kind in DECODE_KINDS:
                    if not a:
                        o = None
                    elif kind in LIB_KINDS:
                        o = lib_object(sess, kind, a)
                    else:
                        o = sess.get(DECODE_KINDS[kind], int(a))
                    if o is not None and "deferred" in o.info:
                        # a cuDNN descriptor whose creation, a setting or (a
                        # variant pack's) finalize failed (cudnn.py)
                        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {name} was not created "
                                                                  f"(cudnnStatus_t {o.info['deferred']})")
                    out.append(o.real if o is not None else None)
                else:
                    raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name}: handles of kind {kind} are not supported")
            elif role == "scalar_ptr":
                if a is not None and type(a) is not int and not isinstance(a, (bytes, bytearray, memoryview)):
                    raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {name} must be a value or an address")
                if type(a) is int:
                    out.append(sess.translate(a) if sess.addr_map else a)
                else:
                    out.append(bytes(a) if a is not None else None)
            elif role == "scalar_out":
                # bytes: host pointer mode (the result's room); an int: a
                # device address (device pointer mode)
                if a is not None and type(a) is not int and not isinstance(a, (bytes, bytearray, memoryview)):
                    raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {name} must be room for a value or an address")
                if type(a) is int:
                    out.append(sess.translate(a) if sess.addr_map else a)
                elif a is not None:
                    if not 0 < len(a) <= 64:
                        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {name} of {len(a)} bytes")
                    out.append(bytes(a))
                else:
                    out.append(None)
            elif role == "in_buffer":
                raw = bytes(self.d.data(sess, a)) if a is not None else None
                if raw is not None and "cusparseMatDescr_t" in ctype:
                    # the legacy matrix descriptor's fields (sparse_generic.mat_descr)
                    raw = sparse_generic.mat_descr(lib, fn.name, raw)
                out.append(raw)
            elif role == "inout_value":
                # the value the call reads (nil: a NULL pointer), answered back
                if a is not None and type(a) is not int:
                    raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {name} must be an integer")
                out.append(a)
            elif role in ("out_buffer", "out_value"):
                if a is not None and type(a) not in (int, bool):
                    raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {name} must be a size or a flag")
                out.append(int(a) if a else None)
            else:
                raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name}: parameter {name} ({role}) cannot be remoted")
        return out

    # ---------------------------------------------------------------- run
    def run_op(self, sess: Session, fn, fid: int, ctxh: int, args: list) -> tuple[int, list | None, str]:
        api = LIBRARY[fid]
        st = STATUS[api]
        if len(args) != len(fn.params):
            return st.invalid, None, f"{fn.name}: {len(args)} arguments for {len(fn.params)} parameters"
        try:
            code, outs = self.execute(sess, fn, fid, ctxh, args)
            msg = ""
        except LibraryUnavailable as e:
            code, outs, msg = st.not_supported, None, f"{fn.name}: {e}"
        except CudaError as e:
            code = st.bad_handle if e.code == CUDA_ERROR_INVALID_HANDLE else \
                st.not_supported if e.code == CUDA_ERROR_NOT_SUPPORTED else st.invalid
            code = getattr(e, "nccl_code", code)       # NCCL's own status (proxyd/families/nccl.py)
            outs, msg = None, e.message
        except Exception as e:  # a bug in proxyd must not take the worker down
            RATE.internal_error("internal error in a library call", f"{fn.name} failed inside proxyd", e)
            code, outs, msg = st.internal, None, f"{fn.name}: internal error in proxyd: {e}"
        if msg and not msg.startswith(fn.name):
            msg = f"{fn.name}: {msg}"
        # a cuRAND host generator's generate call is answered at once, its
        # status the library's (curand_host.py; dispatch.answered)
        answered = api == "curand" and sess is not None and \
            curand_host.is_host(sess, fn, args, lambda h: _maybe(sess, h))
        if sess is not None:
            sess.lib_answered = answered
        if not fn.sync and code != st.success and not answered:
            # reported like a failed kernel launch: at the next synchronising call
            return CUDA_ERROR_LAUNCH_FAILED, None, msg or f"{fn.name} failed with {_status_name(api, code)}"
        return code, outs, msg

    def execute(self, sess: Session, fn, fid: int, ctxh: int, args: list, ident: int | None = None):
        api = LIBRARY[fid]
        st = STATUS[api]
        lib = self.library(api)
        ctx = sess.context(ctxh) if ctxh else None
        if ctx is not None:
            self.backend.make_current(ctx.real)
        if api == "cudnn" and fn.name in CUDNN_SPECIAL:
            return self.cudnn.execute(sess, fn, fid, ctxh, args, lib)
        if api == "nccl":
            from .nccl import execute as nccl_execute      # communicators and collectives (proxyd/families/nccl.py)
            return nccl_execute(self, sess, fn, ctx, args, lib)
        cargs = self._decode(sess, fn, args, lib)
        if api == "curand" and curand_host.is_host(sess, fn, args, lambda h: lib_object(sess, "curand_generator", h)):
            # a host generator: results answered, not written to device memory (curand_host.py)
            code, outs = curand_host.generate(lib, fn, cargs, int(args[2]))
            if code == st.success:
                g = lib_object(sess, "curand_generator", args[0])
                g.info["generated"] = g.info.get("generated", 0) + int(args[2])
            return code, outs
        code, outs = lib.call(fn, cargs)
        if code == st.success and api == "cusparse":
            # a sparse descriptor's nnz set by the call goes into its create (sparse_generic.py)
            sparse_generic.after_call(sess, lib, fn, args, lambda h: lib_object(sess, "cusparse_spmat", h))
        if code == st.success and fn.name in CURAND_GENERATE:
            g = lib_object(sess, "curand_generator", args[0])
            g.info["generated"] = g.info.get("generated", 0) + int(args[2])
        if code != st.success:
            return code, None
        enc = []
        creates = {k for k, e in fn.objects if e == "create"}
        outs = list(outs or [])
        out_args = [a for p, a in zip(fn.params, args) if p[1] in OUT_ROLES]
        for (name, role, kind, ctype, cls, size, _sz), v, a in zip([p for p in fn.params
                                                                    if p[1] in OUT_ROLES],
                                                                   outs, out_args):
            if v is None:
                enc.append(None)
            elif role == "out_value" and kind in LIB_KINDS and kind in creates and fn.ids == "shim":
                # spec `ids: shim`: the shim named the object (interceptor/lib_ids.c)
                k = LIB_KINDS[kind]
                try:
                    i = sess.shim_ident(k, a, fn.name)
                except CudaError:
                    lib_destroy(lib, kind, v)
                    raise
                o = sess.add(k, v, ctx.id if ctx else 0, info={"api": api, "settings": {}},
                             create=(fid, ctxh, list(args)), ident=i)
                enc.append(o.handle)
            elif role == "out_value" and kind == "nvml_device":
                # the handle the app gets names NVML's index of the device
                # (by index, PCI bus id or UUID alike), so that it means the
                # same device in a restored worker
                enc.append(P.make_handle(P.K_NVML_DEVICE, lib.nvml_index(v) + 1))
            elif role == "out_value" and kind in LIB_KINDS and kind in creates:
                o = sess.add(LIB_KINDS[kind], v, ctx.id if ctx else 0, info={"api": api, "settings": {}},
                             create=(fid, ctxh, list(args)), ident=ident)
                enc.append(o.id if kind in INT_HANDLE_KINDS else o.handle)
            elif role == "out_value" and kind == "stream":
                enc.append(self._stream_handle(sess, v))
            elif role == "out_value" and kind:
                raise CudaError(CUDA_ERROR_NOT_SUPPORTED, f"{fn.name}: cannot return a {kind}")
            else:
                enc.append(v)
        for (name, role, kind, *_), a in zip(fn.params, args):
            if role == "handle" and kind in LIB_KINDS and (kind, "destroy") in fn.objects and a:
                sess.drop(lib_object(sess, kind, a))
        if fn.restore == "object" and fn.key:
            self._record_setting(sess, fn, fid, args)
        return code, enc if fn.sync else []

    def _stream_handle(self, sess: Session, real):
        if real in (0, None) or (isinstance(real, int) and real in (P.STREAM_LEGACY, P.STREAM_PER_THREAD)):
            return int(real or 0)
        for (k, _), o in sess.objects.items():
            if k == P.K_STREAM and (o.real == real or (hasattr(real, "__eq__") and _same(o.real, real))):
                return o.handle
        return 0

    def _record_setting(self, sess: Session, fn, fid: int, args: list):
        """Keeps the call as a setting of the object its first key names; a
        later call with the same key replaces it and moves to the end."""
        i0 = fn.key[0]
        kind = fn.params[i0][2]
        obj = lib_object(sess, kind, args[i0])
        if fn.name == "curandSetGeneratorOffset":
            obj.info["generated"] = 0       # the position is the new offset (curand_position)
        key = (fid,) + tuple(_key(args[i]) for i in fn.key)
        settings = obj.info.setdefault("settings", {})
        settings.pop(key, None)
        settings[key] = (fid, [bytes(a) if isinstance(a, (bytearray, memoryview)) else
                               bytes(self.d.data(sess, a)) if isinstance(a, (P.ShmRef, P.FrameRef)) else a
                               for a in args])


# destroy functions by object kind, to undo a create whose handle is refused
_DESTROY = {"cublaslt_matmul_desc": "cublasLtMatmulDescDestroy", "cublaslt_layout": "cublasLtMatrixLayoutDestroy",
            "cublaslt_preference": "cublasLtMatmulPreferenceDestroy"}


def lib_destroy(lib, kind: str, real):
    name = _DESTROY.get(kind)
    f = getattr(getattr(lib, "lib", None), name or "", None)
    if f is not None:
        try:
            f(lib.ffi.cast("void *", real) if hasattr(lib, "ffi") else real)
        except Exception:       # best effort: the create is refused anyway
            pass


def _maybe(sess: Session, h):
    """The cuRAND generator a handle names, or None (a bad handle: the call
    has failed already)."""
    try:
        return lib_object(sess, "curand_generator", h)
    except CudaError:
        return None


def _key(v):
    return bytes(v) if isinstance(v, (bytes, bytearray, memoryview)) else v


def _same(a, b) -> bool:
    try:
        return int(a) == int(b)
    except (TypeError, ValueError):
        return a is b


# ------------------------------------------------------------- checkpoint

def describe(sess: Session) -> list:
    """The session's library objects for the image (manifest 'libraries'):
    kind, id, context, the creating call and the settings, in id order."""
    from ..core.kinds import jsonable as _jsonable
    out = []
    for kind, kc in LIB_KINDS.items():
        for o in sess.of_kind(kc):
            if o.info.get("graph_temp"):
                continue        # a captured call's private copy (graph_libcapture.py): kept with its graph
            fid, ctxh, args = o.create
            d = {"kind": kind, "id": o.id, "ctx": o.ctx,
                 "create": [fid, ctxh, [_jsonable(a) for a in args]],
                 "settings": [[sfid, [_jsonable(a) for a in sargs]]
                              for sfid, sargs in o.info.get("settings", {}).values()]}
            if kind == "curand_generator":
                d["generated"] = int(o.info.get("generated", 0))
            out.append(d)
    return out


def rebuild(d, sess: Session, desc: list):
    """Recreates the library objects under their old handles, then replays
    their settings (streams, workspaces and memory exist again by now)."""
    from ..core.kinds import CheckpointError, unjson as _unjson
    calls = d.libs
    for od in desc:
        kind = od["kind"]
        if kind not in LIB_KINDS:
            raise CheckpointError(f"image has a library object of unknown kind {kind}")
        fid, ctxh, args = od["create"]
        fn = FUNCTIONS.get(fid)
        if fn is None or fid not in LIBRARY:
            raise CheckpointError(f"image recreates {kind} with function id {fid}, which this proxyd does not have")
        code, _ = calls.execute(sess, fn, fid, ctxh, [_unjson(a) for a in args], ident=od["id"])
        if code != STATUS[LIBRARY[fid]].success or (LIB_KINDS[kind], od["id"]) not in sess.objects:
            raise CheckpointError(f"recreating {kind} {od['id']} with {fn.name} failed "
                                  f"({_status_name(LIBRARY[fid], code)})")
    for od in desc:
        for sfid, sargs in od["settings"]:
            fn = FUNCTIONS.get(sfid)
            if fn is None or sfid not in LIBRARY:
                raise CheckpointError(f"image replays library function id {sfid}, which this proxyd does not have")
            ctxh = od["create"][1]
            args = [_unjson(a) for a in sargs]
            if fn.name in sparse_generic.AFTER_MEMORY:
                # reads device memory, restored later (sparse_generic.replay_after_memory)
                sparse_generic.defer(sess, od["kind"], od["id"], fn, sfid, ctxh, args)
                continue
            try:
                code, _ = calls.execute(sess, fn, sfid, ctxh, args)
            except CudaError as e:
                streams = [i for i, p in enumerate(fn.params) if p[1] == "handle" and p[2] == "stream"]
                if e.code != CUDA_ERROR_INVALID_HANDLE or not streams:
                    raise CheckpointError(f"replaying {fn.name} on {od['kind']} {od['id']} failed: {e.message}") from e
                # the handle was last set to a stream the app has destroyed
                # since (natively it keeps a dangling stream): the restored
                # handle gets the default stream, as after cublasCreate
                log.warning("session %s: %s on %s %s named a destroyed stream; restored with the default stream",
                            sess.token, fn.name, od["kind"], od["id"])
                for i in streams:
                    args[i] = 0
                code, _ = calls.execute(sess, fn, sfid, ctxh, args)
            if code != STATUS[LIBRARY[sfid]].success:
                raise CheckpointError(f"replaying {fn.name} on {od['kind']} {od['id']} failed "
                                      f"({_status_name(LIBRARY[sfid], code)})")
        if od["kind"] == "curand_generator" and od.get("generated"):
            _restore_curand_position(calls, sess, od)


def _restore_curand_position(calls, sess: Session, od: dict):
    """A restored generator continues its sequence: its offset is set to
    the last offset plus the numbers generated since (curand_position); the
    call is recorded as its offset setting, as if the app had made it."""
    from ..core.kinds import CheckpointError
    obj = sess.get(P.K_CURAND_GENERATOR, P.make_handle(P.K_CURAND_GENERATOR, od["id"]))
    obj.info["generated"] = int(od["generated"])
    base, generated = curand_position(obj)
    fid = next((i for i, f in FUNCTIONS.items() if f.name == "curandSetGeneratorOffset"), None)
    if fid is None:
        raise CheckpointError("this proxyd has no curandSetGeneratorOffset to restore a cuRAND generator with")
    code, _ = calls.execute(sess, FUNCTIONS[fid], fid, od["create"][1], [obj.handle, base + generated])
    if code != STATUS["curand"].success:
        raise CheckpointError(f"setting cuRAND generator {od['id']} to offset {base + generated} failed "
                              f"({_status_name('curand', code)})")


# cuBLAS/cuBLASLt handles and descriptors with their settings (streams,
# workspaces in the arena and contexts exist again by then)
register(Kind("libraries", Stage.LIBRARIES, ("libraries",), describe=lambda sess: {"libraries": describe(sess)},
              rebuild=lambda r: rebuild(r.dispatcher, r.sess, r.desc.get("libraries", [])), owner=__name__))
