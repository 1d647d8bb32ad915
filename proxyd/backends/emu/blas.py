"""The emulated backend's cuBLAS, cuBLASLt and NVML (docs/libraries.md).

What CI needs to run the library path end to end without a GPU: handles and
their settings, single-precision gemm (cublasSgemm_v2, cublasGemmEx with
fp32 data and compute, cublasSgemmStridedBatched, cublasLtMatmul with fp32
column-major layouts) in numpy, and the NVML queries PyTorch makes. Matrices
are column-major with leading dimensions (cuBLAS docs, "Data layout"); each
call reads device memory through the backend's resolve(). Anything else
answers the library's not-supported status with a message.

Locking: the worker's main loop only.
"""
from __future__ import annotations

import struct

import numpy as np

from gpuproxy.proxyd.core.session import CudaError

from . import versions
from .blas_levels import BlasLevels

OK, NOT_INIT, INVALID, NOT_SUPPORTED = 0, 1, 7, 15        # cublasStatus_t (cublas_api.h)
NVML_OK, NVML_INVALID, NVML_NOT_FOUND, NVML_INSUFFICIENT = 0, 2, 6, 7      # nvmlReturn_t (nvml.h)
OP_N, OP_T, OP_C = 0, 1, 2                                # cublasOperation_t
R_32F = 0                                                 # cudaDataType_t (library_types.h)
COMPUTE_32F = (68, 69, 74, 75, 77)                        # cublasComputeType_t: the fp32 ones
# cublasLt.h attribute ids
DESC_COMPUTE, DESC_SCALE, DESC_POINTER_MODE, DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE = 0, 1, 2, 3, 4, 7
LAYOUT_TYPE, LAYOUT_ORDER, LAYOUT_ROWS, LAYOUT_COLS, LAYOUT_LD, LAYOUT_BATCH, LAYOUT_STRIDE = 0, 1, 2, 3, 4, 5, 6


class Unsupported(Exception):
    pass


class EmuLibrary(BlasLevels):
    """One emulated library (api: cublas, cublaslt, nvml); call() has the
    signature of libraries.RealLibrary.call. cuBLAS beyond gemm/gemv/axpy/
    scal/copy: blas_levels.py."""

    def __init__(self, backend, api: str):
        self.b = backend
        self.api = api
        self.objs: dict[int, dict] = {}
        self.next = 1

    # ---------------------------------------------------------- plumbing
    def call(self, fn, args):
        impl = getattr(self, "f_" + fn.name, None)
        if impl is None:
            raise CudaError(801, f"{fn.name} is not implemented by the emulated backend")
        try:
            return impl(*args)
        except Unsupported as e:
            raise CudaError(801, f"{fn.name}: {e} (emulated backend)") from e

    def _new(self, **state) -> int:
        h = self.next
        self.next += 1
        self.objs[h] = state
        return h

    def _obj(self, h):
        o = self.objs.get(h)
        if o is None:
            raise CudaError(400, f"unknown library handle {h}")
        return o

    def lt_of_cublas(self, h):
        """A cuBLAS handle used as a cuBLASLt handle (libraries.lt_of_cublas):
        on the emulated backend, an Lt object of this library tied to it."""
        key = ("cublas", h)
        for lh, o in self.objs.items():
            if o.get("of") == key:
                return lh
        return self._new(kind="lt", of=key)

    def nvml_device(self, index: int):
        if not 0 <= index < self.b.device_count():
            raise CudaError(1, f"NVML device {index} does not exist")
        return index

    def nvml_index(self, h) -> int:
        return int(h)       # the emulated NVML's handles are the indices

    def _scalar(self, v, fmt="f"):
        """alpha/beta: bytes (host pointer mode) or a device address."""
        n = struct.calcsize(fmt)
        if v is None:
            raise CudaError(1, "alpha/beta is NULL")
        raw = bytes(v) if not isinstance(v, int) else bytes(self.b.resolve(v, n))
        return struct.unpack(fmt, raw[:n])[0]

    def _check_mode(self, device_mode: bool, *scalars):
        """The real library reads alpha/beta as its handle's pointer mode
        says: a value sent for a device-mode handle (or an address for a
        host-mode one) means the shim and the worker disagree about the
        mode, e.g. a restore that lost the setting. Fail as cuBLAS would
        misbehave, loudly."""
        for v in scalars:
            if v is not None and isinstance(v, int) != device_mode:
                raise CudaError(1, f"alpha/beta sent as a {'device address' if isinstance(v, int) else 'value'} "
                                   f"for a handle in {'device' if device_mode else 'host'} pointer mode")

    def _mat(self, addr, rows, cols, ld, dtype=np.float32):
        """A column-major rows x cols matrix with leading dimension ld, as a
        writable numpy view of device memory."""
        if rows <= 0 or cols <= 0:
            return np.zeros((max(rows, 0), max(cols, 0)), dtype)
        if ld < rows:
            raise CudaError(1, f"leading dimension {ld} < rows {rows}")
        item = np.dtype(dtype).itemsize
        n = ((cols - 1) * ld + rows) * item
        flat = self.b.resolve(int(addr), n).view(dtype)
        return np.lib.stride_tricks.as_strided(flat, shape=(rows, cols), strides=(item, ld * item))

    def _gemm(self, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, dtype=np.float32):
        if min(m, n) < 0 or k < 0 or ta not in (OP_N, OP_T, OP_C) or tb not in (OP_N, OP_T, OP_C):
            return INVALID
        a = self._mat(A, m if ta == OP_N else k, k if ta == OP_N else m, lda, dtype)
        bm = self._mat(B, k if tb == OP_N else n, n if tb == OP_N else k, ldb, dtype)
        c = self._mat(C, m, n, ldc, dtype)
        opa = a if ta == OP_N else a.T
        opb = bm if tb == OP_N else bm.T
        # fp32 products accumulated in fp64, rounded once: close to what
        # the GPU's fp32 FMAs give; callers compare with a tolerance
        prod = opa.astype(np.float64) @ opb.astype(np.float64)
        res = alpha * prod + (beta * c.astype(np.float64) if beta != 0 else 0.0)
        c[...] = res.astype(dtype)
        return OK

    # ------------------------------------------------------------- cuBLAS
    def f_cublasCreate_v2(self, out):
        return OK, [self._new(stream=0, pointer_mode=0, math_mode=0, atomics=0, workspace=(0, 0))]

    def f_cublasDestroy_v2(self, h):
        self._obj(h)
        del self.objs[h]
        return OK, []

    def f_cublasGetVersion_v2(self, h, out):
        # the handle may be NULL (JAX's plugin asks so; NVIDIA allows it)
        return OK, [versions.version("cublas")]

    def f_cublasGetVersion(self, out):
        return OK, [versions.version("cublas")]

    def f_cublasGetProperty(self, typ, out):
        v = versions.prop("cublas", typ)
        return (OK, [v]) if v is not None else (INVALID, None)

    def f_cublasGetCudartVersion(self):
        return versions.CUDART_VERSION, []

    def f_cublasSetStream_v2(self, h, stream):
        self._obj(h)["stream"] = stream
        return OK, []

    def f_cublasGetStream_v2(self, h, out):
        return OK, [self._obj(h)["stream"]]

    def f_cublasSetWorkspace_v2(self, h, ws, size):
        self._obj(h)["workspace"] = (ws, size)
        return OK, []

    def f_cublasSetMathMode(self, h, mode):
        self._obj(h)["math_mode"] = mode
        return OK, []

    def f_cublasGetMathMode(self, h, out):
        return OK, [self._obj(h)["math_mode"]]

    def f_cublasSetPointerMode_v2(self, h, mode):
        if mode not in (0, 1):
            return INVALID, None
        self._obj(h)["pointer_mode"] = mode
        return OK, []

    def f_cublasGetPointerMode_v2(self, h, out):
        return OK, [self._obj(h)["pointer_mode"]]

    def f_cublasSetAtomicsMode(self, h, mode):
        self._obj(h)["atomics"] = mode
        return OK, []

    def f_cublasGetAtomicsMode(self, h, out):
        return OK, [self._obj(h)["atomics"]]

    def f_cublasSgemm_v2(self, h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc):
        self._check_mode(self._obj(h)["pointer_mode"] == 1, alpha, beta)
        return self._gemm(ta, tb, m, n, k, self._scalar(alpha), A, lda, B, ldb, self._scalar(beta), C, ldc), []

    def f_cublasDgemm_v2(self, h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc):
        self._check_mode(self._obj(h)["pointer_mode"] == 1, alpha, beta)
        return self._gemm(ta, tb, m, n, k, self._scalar(alpha, "d"), A, lda, B, ldb, self._scalar(beta, "d"), C, ldc,
                          np.float64), []

    def _batched(self, h, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, count, dtype):
        self._check_mode(self._obj(h)["pointer_mode"] == 1, alpha, beta)
        fmt = "f" if dtype == np.float32 else "d"
        al, be = self._scalar(alpha, fmt), self._scalar(beta, fmt)
        item = np.dtype(dtype).itemsize
        for i in range(count):
            code = self._gemm(ta, tb, m, n, k, al, A + item * i * sa, lda, B + item * i * sb, ldb, be,
                              C + item * i * sc, ldc, dtype)
            if code:
                return code, None
        return OK, []

    def f_cublasDgemmStridedBatched(self, h, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc,
                                    count):
        return self._batched(h, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, count,
                             np.float64)

    def f_cublasGemmStridedBatchedEx(self, h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct,
                                     ldc, sc, count, compute, algo):
        if (at, bt, ct) != (R_32F, R_32F, R_32F) or compute not in COMPUTE_32F:
            raise Unsupported(f"data types {(at, bt, ct)} with compute type {compute} (fp32 only)")
        return self._batched(h, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, count,
                             np.float32)

    def f_cublasGemmEx(self, h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, compute, algo):
        self._check_mode(self._obj(h)["pointer_mode"] == 1, alpha, beta)
        if (at, bt, ct) != (R_32F, R_32F, R_32F) or compute not in COMPUTE_32F:
            raise Unsupported(f"data types {(at, bt, ct)} with compute type {compute} (fp32 only)")
        return self._gemm(ta, tb, m, n, k, self._scalar(alpha), A, lda, B, ldb, self._scalar(beta), C, ldc), []

    def f_cublasSgemmStridedBatched(self, h, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc,
                                    count):
        return self._batched(h, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, count,
                             np.float32)

    # ------------------------------------------------ level 1/2 and complex gemm
    def _vec(self, addr, n, inc, dtype):
        """n elements of a vector with stride inc (> 0) as a writable view."""
        if n <= 0:
            return np.zeros(0, dtype)
        if inc <= 0:
            raise Unsupported(f"increment {inc} (only positive increments are emulated)")
        item = np.dtype(dtype).itemsize
        flat = self.b.resolve(int(addr), ((n - 1) * inc + 1) * item).view(dtype)
        return np.lib.stride_tricks.as_strided(flat, shape=(n,), strides=(inc * item,))

    def _cscalar(self, v, fmt):
        re_, im = struct.unpack(fmt * 2, bytes(v) if not isinstance(v, int)
                                else bytes(self.b.resolve(v, 2 * struct.calcsize(fmt))))
        return complex(re_, im)

    def _gemv(self, h, trans, m, n, alpha, A, lda, x, incx, beta, y, incy, dtype, fmt):
        self._check_mode(self._obj(h)["pointer_mode"] == 1, alpha, beta)
        if m < 0 or n < 0 or trans not in (OP_N, OP_T, OP_C):
            return INVALID, None
        a = self._mat(A, m, n, lda, dtype)
        op = a if trans == OP_N else a.T
        xv = self._vec(x, op.shape[1], incx, dtype)
        yv = self._vec(y, op.shape[0], incy, dtype)
        al, be = self._scalar(alpha, fmt), self._scalar(beta, fmt)
        res = al * (op.astype(np.float64) @ xv.astype(np.float64))
        yv[...] = (res + (be * yv.astype(np.float64) if be != 0 else 0.0)).astype(dtype)
        return OK, []

    def f_cublasSgemv_v2(self, h, trans, m, n, alpha, A, lda, x, incx, beta, y, incy):
        return self._gemv(h, trans, m, n, alpha, A, lda, x, incx, beta, y, incy, np.float32, "f")

    def f_cublasDgemv_v2(self, h, trans, m, n, alpha, A, lda, x, incx, beta, y, incy):
        return self._gemv(h, trans, m, n, alpha, A, lda, x, incx, beta, y, incy, np.float64, "d")

    def _axpy(self, h, n, alpha, x, incx, y, incy, dtype, fmt):
        self._check_mode(self._obj(h)["pointer_mode"] == 1, alpha)
        yv = self._vec(y, n, incy, dtype)
        yv[...] = (self._scalar(alpha, fmt) * self._vec(x, n, incx, dtype).astype(np.float64)
                   + yv.astype(np.float64)).astype(dtype)
        return OK, []

    def f_cublasSaxpy_v2(self, h, n, alpha, x, incx, y, incy):
        return self._axpy(h, n, alpha, x, incx, y, incy, np.float32, "f")

    def f_cublasDaxpy_v2(self, h, n, alpha, x, incx, y, incy):
        return self._axpy(h, n, alpha, x, incx, y, incy, np.float64, "d")

    def _scal(self, h, n, alpha, x, incx, dtype, fmt):
        self._check_mode(self._obj(h)["pointer_mode"] == 1, alpha)
        xv = self._vec(x, n, incx, dtype)
        xv[...] = (self._scalar(alpha, fmt) * xv.astype(np.float64)).astype(dtype)
        return OK, []

    def f_cublasSscal_v2(self, h, n, alpha, x, incx):
        return self._scal(h, n, alpha, x, incx, np.float32, "f")

    def f_cublasDscal_v2(self, h, n, alpha, x, incx):
        return self._scal(h, n, alpha, x, incx, np.float64, "d")

    def f_cublasScopy_v2(self, h, n, x, incx, y, incy):
        self._obj(h)
        self._vec(y, n, incy, np.float32)[...] = self._vec(x, n, incx, np.float32)
        return OK, []

    def f_cublasDcopy_v2(self, h, n, x, incx, y, incy):
        self._obj(h)
        self._vec(y, n, incy, np.float64)[...] = self._vec(x, n, incx, np.float64)
        return OK, []

    def f_cublasSgemmEx(self, h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc):
        self._check_mode(self._obj(h)["pointer_mode"] == 1, alpha, beta)
        if (at, bt, ct) != (R_32F, R_32F, R_32F):
            raise Unsupported(f"data types {(at, bt, ct)} (fp32 only)")
        return self._gemm(ta, tb, m, n, k, self._scalar(alpha), A, lda, B, ldb, self._scalar(beta), C, ldc), []

    def _cgemm(self, h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, dtype, fmt):
        self._check_mode(self._obj(h)["pointer_mode"] == 1, alpha, beta)
        if min(m, n) < 0 or k < 0 or ta not in (OP_N, OP_T, OP_C) or tb not in (OP_N, OP_T, OP_C):
            return INVALID, None
        a = self._mat(A, m if ta == OP_N else k, k if ta == OP_N else m, lda, dtype)
        bm = self._mat(B, k if tb == OP_N else n, n if tb == OP_N else k, ldb, dtype)
        c = self._mat(C, m, n, ldc, dtype)
        op = lambda x, t: x if t == OP_N else x.T if t == OP_T else x.conj().T  # noqa: E731
        al, be = self._cscalar(alpha, fmt), self._cscalar(beta, fmt)
        res = al * (op(a, ta).astype(np.complex128) @ op(bm, tb).astype(np.complex128))
        c[...] = (res + (be * c.astype(np.complex128) if be != 0 else 0.0)).astype(dtype)
        return OK, []

    def f_cublasCgemm_v2(self, h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc):
        return self._cgemm(h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, np.complex64, "f")

    def f_cublasZgemm_v2(self, h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc):
        return self._cgemm(h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, np.complex128, "d")

    # ----------------------------------------------------------- cuBLASLt
    def f_cublasLtCreate(self, out):
        return OK, [self._new(kind="lt")]

    def f_cublasLtDestroy(self, h):
        self._obj(h)
        del self.objs[h]
        return OK, []

    def f_cublasLtGetVersion(self):
        return versions.version("cublaslt"), []

    def f_cublasLtGetCudartVersion(self):
        return versions.CUDART_VERSION, []

    def f_cublasLtGetProperty(self, typ, out):
        v = versions.prop("cublaslt", typ)
        return (OK, [v]) if v is not None else (INVALID, None)

    def f_cublasLtMatmulDescCreate(self, out, compute, scale):
        return OK, [self._new(kind="desc", attrs={DESC_COMPUTE: struct.pack("i", compute),
                                                   DESC_SCALE: struct.pack("i", scale)})]

    def f_cublasLtMatrixLayoutCreate(self, out, typ, rows, cols, ld):
        attrs = {LAYOUT_TYPE: struct.pack("i", typ), LAYOUT_ROWS: struct.pack("Q", rows),
                 LAYOUT_COLS: struct.pack("Q", cols), LAYOUT_LD: struct.pack("q", ld)}
        return OK, [self._new(kind="layout", attrs=attrs)]

    def f_cublasLtMatmulPreferenceCreate(self, out):
        return OK, [self._new(kind="pref", attrs={})]

    def _destroy(self, h):
        self._obj(h)
        del self.objs[h]
        return OK, []

    f_cublasLtMatmulDescDestroy = f_cublasLtMatrixLayoutDestroy = f_cublasLtMatmulPreferenceDestroy = _destroy

    # the largest attribute id of each descriptor kind in cublasLt.h (CUDA 13.0):
    # CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR, _MATRIX_LAYOUT_BATCH_MODE,
    # _MATMUL_PREF_IMPL_MASK; NVIDIA's library refuses ids it does not know
    _MAX_ATTR = {"desc": 38, "layout": 8, "pref": 12}

    def _set_attr(self, h, attr, buf, size):
        o = self._obj(h)
        if buf is None or len(buf) != size or not 0 <= attr <= self._MAX_ATTR.get(o.get("kind"), 1 << 30):
            return INVALID, None
        o["attrs"][attr] = bytes(buf)
        return OK, []

    f_cublasLtMatmulDescSetAttribute = f_cublasLtMatrixLayoutSetAttribute = _set_attr
    f_cublasLtMatmulPreferenceSetAttribute = _set_attr

    def _get_attr(self, h, attr, buf, size, written):
        v = self._obj(h)["attrs"].get(attr)
        if v is None:
            raise Unsupported(f"attribute {attr} has no recorded value")
        if buf is None:         # a size query (buf NULL): sizeWritten only
            return OK, [None, len(v)]
        if size < len(v):
            return INVALID, None
        return OK, [v + bytes(buf - len(v)), len(v)]

    f_cublasLtMatmulDescGetAttribute = f_cublasLtMatrixLayoutGetAttribute = _get_attr

    def _layout(self, h):
        a = self._obj(h)["attrs"]
        get = lambda k, f, d=0: struct.unpack(f, a[k][:struct.calcsize(f)])[0] if k in a else d
        return {"type": get(LAYOUT_TYPE, "i"), "order": get(LAYOUT_ORDER, "i"), "rows": get(LAYOUT_ROWS, "Q"),
                "cols": get(LAYOUT_COLS, "Q"), "ld": get(LAYOUT_LD, "q"), "batch": get(LAYOUT_BATCH, "i", 1),
                "stride": get(LAYOUT_STRIDE, "q")}

    def f_cublasLtMatmulAlgoGetHeuristic(self, lt, desc, a, b, c, d, pref, count, results, returned):
        self._obj(lt)
        for h in (desc, a, b, c, d, pref):
            self._obj(h)
        if count < 1:
            return INVALID, None
        # one algorithm: algo bytes (64) zero, workspaceSize 0, state
        # CUBLAS_STATUS_SUCCESS, wavesCount 1.0 (cublasLt.h,
        # cublasLtMatmulHeuristicResult_t, 96 bytes)
        one = bytes(64) + struct.pack("<QIf", 0, OK, 1.0) + bytes(16)
        out = one + bytes(96 * (count - 1))
        return OK, [out[:results] if results is not None else None, 1]

    def f_cublasLtMatmul(self, lt, desc, alpha, A, ad, B, bd, beta, C, cd, D, dd, algo, ws, wsize, stream):
        self._obj(lt)
        da = self._obj(desc)["attrs"]
        dget = lambda k: struct.unpack("i", da[k][:4])[0] if k in da else 0
        if dget(DESC_COMPUTE) not in COMPUTE_32F or dget(DESC_SCALE) != R_32F or dget(DESC_EPILOGUE) > 1:
            raise Unsupported("only fp32 compute and scale types without an epilogue")
        # CUBLASLT_POINTER_MODE_HOST 0, DEVICE 1 (the others: not emulated)
        pm = dget(DESC_POINTER_MODE)
        if pm not in (0, 1):
            raise Unsupported(f"pointer mode {pm}")
        self._check_mode(pm == 1, alpha, beta)
        la, lb, lc, ld_ = (self._layout(h) for h in (ad, bd, cd, dd))
        for lay in (la, lb, lc, ld_):
            if lay["type"] != R_32F or lay["order"] != 0 or lay["batch"] != 1:
                raise Unsupported("only single fp32 column-major matrices")
        ta, tb = dget(DESC_TRANSA), dget(DESC_TRANSB)
        m, n = ld_["rows"], ld_["cols"]
        k = la["cols"] if ta == OP_N else la["rows"]
        if (lc["rows"], lc["cols"]) != (m, n):
            return INVALID, None
        al, be = self._scalar(alpha), self._scalar(beta)
        if int(C) != int(D):
            # D = alpha op(A) op(B) + beta C: start D from C
            self._mat(D, m, n, ld_["ld"])[...] = self._mat(C, m, n, lc["ld"])
        code = self._gemm(ta, tb, m, n, k, al, A, la["ld"], B, lb["ld"], be, D, ld_["ld"])
        return code, []

    # --------------------------------------------------------------- NVML
    def f_nvmlInit_v2(self):
        return NVML_OK, []

    f_nvmlInit = f_nvmlInit_v2

    def f_nvmlInitWithFlags(self, flags):
        return NVML_OK, []

    def f_nvmlShutdown(self):
        return NVML_OK, []

    def f_nvmlDeviceGetCount_v2(self, out):
        return NVML_OK, [self.b.device_count()]

    f_nvmlDeviceGetCount = f_nvmlDeviceGetCount_v2

    def f_nvmlDeviceGetHandleByIndex_v2(self, index, out):
        if not 0 <= index < self.b.device_count():
            return NVML_INVALID, None
        return NVML_OK, [index]

    f_nvmlDeviceGetHandleByIndex = f_nvmlDeviceGetHandleByIndex_v2

    def f_nvmlDeviceGetHandleByPciBusId_v2(self, bus_id, out):
        # nvml.h: "domain:bus:device.function", "domain:bus:device" or
        # "bus:device.function", in hexadecimal; the emulated devices sit on
        # domain 0, bus <index>, device 0 (drv_cuDeviceGetPCIBusId)
        text = bytes(bus_id or b"").split(b"\0")[0].decode("ascii", "replace").strip()
        parts = text.replace(".", ":").split(":")
        try:
            nums = [int(x, 16) for x in parts]
        except ValueError:
            return NVML_INVALID, None
        if len(nums) == 3 and "." in text:
            nums = [0] + nums
        elif len(nums) == 3:
            nums = nums + [0]
        if len(nums) != 4:
            return NVML_INVALID, None
        domain, bus, device, function = nums
        if domain or device or function or not 0 <= bus < self.b.device_count():
            return NVML_NOT_FOUND, None
        return NVML_OK, [bus]

    f_nvmlDeviceGetHandleByPciBusId = f_nvmlDeviceGetHandleByPciBusId_v2

    def f_nvmlDeviceGetHandleByUUID(self, uuid, out):
        want = bytes(uuid or b"").split(b"\0")[0]
        for dev in range(self.b.device_count()):
            code, got = self.f_nvmlDeviceGetUUID(dev, 96, None)
            if code == NVML_OK and got[0].split(b"\0")[0] == want:
                return NVML_OK, [dev]
        return NVML_NOT_FOUND, None

    def f_nvmlDeviceGetIndex(self, dev, out):
        return NVML_OK, [dev]

    def _string(self, s: str, size):
        raw = s.encode() + b"\0"
        if size is None:
            return NVML_INVALID, None
        if size < len(raw):
            return NVML_INSUFFICIENT, None
        return NVML_OK, [raw + bytes(size - len(raw))]

    def f_nvmlDeviceGetName(self, dev, size, length):
        return self._string(self.b.device_name(dev), size)

    def f_nvmlDeviceGetUUID(self, dev, size, length):
        # the emulated device's CUuuid (drv_cuDeviceGetUuid), in NVML's
        # "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" form
        u = bytes([0x67, 0x70, dev] + [0] * 13).hex()
        return self._string(f"GPU-{u[:8]}-{u[8:12]}-{u[12:16]}-{u[16:20]}-{u[20:]}", size)

    def f_nvmlDeviceGetMemoryInfo(self, dev, out):
        total = self.b.device_total_mem(dev)
        used = self.b.device_used_mem(dev) if hasattr(self.b, "device_used_mem") else 0
        # nvmlMemory_t: unsigned long long total, free, used (nvml.h)
        return NVML_OK, [struct.pack("<QQQ", total, total - used, used)]

    def f_nvmlDeviceGetCudaComputeCapability(self, dev, major, minor):
        cc = self.b.drv_cuDeviceComputeCapability(None, None, dev)[1]     # the emulated devices' (9, 0)
        return NVML_OK, [cc[0], cc[1]]

    def f_nvmlSystemGetDriverVersion(self, size, length):
        v = self.b.driver_version()
        return self._string(f"{v // 1000}.{(v % 1000) // 10}.emu", size)

    def f_nvmlSystemGetNVMLVersion(self, size, length):
        return self._string("13.0.emu", size)

    def f_nvmlSystemGetCudaDriverVersion(self, out):
        return NVML_OK, [self.b.driver_version()]

    f_nvmlSystemGetCudaDriverVersion_v2 = f_nvmlSystemGetCudaDriverVersion


# the _64 entry points take the same arguments as 64-bit integers (cublas_api.h):
# the same emulation
for _n in ("cublasSgemmEx", "cublasGemmEx", "cublasGemmStridedBatchedEx"):
    setattr(EmuLibrary, f"f_{_n}_64", getattr(EmuLibrary, f"f_{_n}"))
