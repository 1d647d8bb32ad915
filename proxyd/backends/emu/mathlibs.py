"""The emulated backend's cuFFT, cuRAND, cuSPARSE and cuSOLVER
(docs/libraries.md, "Emulated backend").

What CI needs to run these libraries' remoting path end to end without a
GPU, in numpy: cuFFT plans (1-3 dimensional, batched, basic and advanced
data layouts) executed with numpy.fft; cuRAND generators (emulated numbers,
see EmuCurand); cuSPARSE CSR SpMV/SpMM with the generic API's descriptors;
cuSOLVER dense Cholesky (potrf/potrs) and LU (getrf/getrs). Device memory is
read and written through the backend's resolve(). Anything else answers the
library's not-supported status with a message (blas.EmuLibrary.call).

Locking: the worker's main loop only.
"""
from __future__ import annotations

import numpy as np

from gpuproxy.proxyd.core.session import CudaError

from . import versions
from .blas import EmuLibrary
from .blas_levels import _sym, lu_factor, lu_solve

# library_types.h, cudaDataType_t
R_32F, R_64F, C_32F, C_64F = 0, 1, 4, 5
_REAL = {R_32F: np.float32, R_64F: np.float64, C_32F: np.complex64, C_64F: np.complex128}


def _dtype(t: int):
    d = _REAL.get(int(t))
    if d is None:
        raise CudaError(801, f"cudaDataType {t} is not emulated (fp32/fp64 real and complex are)")
    return d


# ------------------------------------------------------------------ cuFFT

# cufft.h: cufftType and directions; CUFFT_INVALID_VALUE 4, CUFFT_INVALID_TYPE 3
R2C, C2R, C2C, D2Z, Z2D, Z2Z = 0x2A, 0x2C, 0x29, 0x6A, 0x6C, 0x69
FORWARD, INVERSE = -1, 1
CUFFT_OK, CUFFT_INVALID_TYPE, CUFFT_INVALID_VALUE = 0, 3, 4
# type -> (input dtype, output dtype)
_FFT_TYPES = {R2C: (np.float32, np.complex64), C2R: (np.complex64, np.float32), C2C: (np.complex64, np.complex64),
              D2Z: (np.float64, np.complex128), Z2D: (np.complex128, np.float64),
              Z2Z: (np.complex128, np.complex128)}
# cufftXtMakePlanMany: (input, output cudaDataType) -> cufftType
_XT_TYPES = {(R_32F, C_32F): R2C, (C_32F, R_32F): C2R, (C_32F, C_32F): C2C,
             (R_64F, C_64F): D2Z, (C_64F, R_64F): Z2D, (C_64F, C_64F): Z2Z}


def _ints(raw, rank: int, size: int):
    if raw is None:
        return None
    a = np.frombuffer(bytes(raw), dtype=np.int32 if size == 4 else np.int64)
    if a.size < rank:
        raise CudaError(1, f"dimension array of {a.size} values for rank {rank}")
    return [int(x) for x in a[:rank]]


class EmuCufft(EmuLibrary):
    """Plans hold the layout (cuFFT docs, "Advanced Data Layout"): element x
    (a multi-index into n) of batch b is at b * dist + stride *
    ravel(x, embed); without embed, the data is packed (embed = the logical
    shape, stride 1, dist = its product). R2C output and C2R input have
    n[-1] // 2 + 1 elements in the last dimension. The inverse transform is
    not normalised, as cuFFT's."""

    def _plan(self, h):
        o = self._obj(h)
        if o.get("type") is None:
            raise CudaError(1, "cuFFT plan has no layout yet (cufftMakePlan* not called)")
        return o

    def _set(self, o, rank, n, inembed, istride, idist, onembed, ostride, odist, typ, batch):
        if typ not in _FFT_TYPES:
            return CUFFT_INVALID_TYPE
        if not 1 <= rank <= 3 or any(x <= 0 for x in n) or batch <= 0:
            return CUFFT_INVALID_VALUE
        o.update(type=typ, n=list(n), batch=int(batch),
                 inl=(inembed, int(istride), int(idist)), outl=(onembed, int(ostride), int(odist)))
        return CUFFT_OK

    def _new_plan(self):
        return self._new(type=None, stream=0, work=0, auto=1)

    def f_cufftCreate(self, out):
        return CUFFT_OK, [self._new_plan()]

    def f_cufftDestroy(self, h):
        self._obj(h)
        del self.objs[h]
        return CUFFT_OK, []

    def f_cufftPlan1d(self, out, nx, typ, batch):
        h = self._new_plan()
        code = self._set(self.objs[h], 1, [nx], None, 1, 0, None, 1, 0, typ, batch)
        return (code, [h]) if code == CUFFT_OK else (code, None)

    def f_cufftPlan2d(self, out, nx, ny, typ):
        h = self._new_plan()
        code = self._set(self.objs[h], 2, [nx, ny], None, 1, 0, None, 1, 0, typ, 1)
        return (code, [h]) if code == CUFFT_OK else (code, None)

    def f_cufftPlanMany(self, out, rank, n, inembed, istride, idist, onembed, ostride, odist, typ, batch):
        h = self._new_plan()
        code = self._set(self.objs[h], rank, _ints(n, rank, 4), _ints(inembed, rank, 4), istride, idist,
                         _ints(onembed, rank, 4), ostride, odist, typ, batch)
        return (code, [h]) if code == CUFFT_OK else (code, None)

    def f_cufftMakePlan1d(self, h, nx, typ, batch, ws):
        code = self._set(self._obj(h), 1, [nx], None, 1, 0, None, 1, 0, typ, batch)
        return (code, [0]) if code == CUFFT_OK else (code, None)     # numpy needs no work area

    def f_cufftMakePlanMany(self, h, rank, n, inembed, istride, idist, onembed, ostride, odist, typ, batch, ws):
        code = self._set(self._obj(h), rank, _ints(n, rank, 4), _ints(inembed, rank, 4), istride, idist,
                         _ints(onembed, rank, 4), ostride, odist, typ, batch)
        return (code, [0]) if code == CUFFT_OK else (code, None)

    def f_cufftMakePlanMany64(self, h, rank, n, inembed, istride, idist, onembed, ostride, odist, typ, batch, ws):
        code = self._set(self._obj(h), rank, _ints(n, rank, 8), _ints(inembed, rank, 8), istride, idist,
                         _ints(onembed, rank, 8), ostride, odist, typ, batch)
        return (code, [0]) if code == CUFFT_OK else (code, None)

    def f_cufftXtMakePlanMany(self, h, rank, n, inembed, istride, idist, itype, onembed, ostride, odist, otype,
                              batch, ws, etype):
        typ = _XT_TYPES.get((int(itype), int(otype)))
        if typ is None:
            raise CudaError(801, f"cufftXtMakePlanMany with data types {itype} -> {otype}")
        code = self._set(self._obj(h), rank, _ints(n, rank, 8), _ints(inembed, rank, 8), istride, idist,
                         _ints(onembed, rank, 8), ostride, odist, typ, batch)
        return (code, [0]) if code == CUFFT_OK else (code, None)

    def f_cufftGetSize(self, h, ws):
        self._obj(h)
        return CUFFT_OK, [0]

    def f_cufftSetWorkArea(self, h, area):
        self._obj(h)["work"] = area
        return CUFFT_OK, []

    def f_cufftSetAutoAllocation(self, h, auto):
        self._obj(h)["auto"] = auto
        return CUFFT_OK, []

    def f_cufftSetStream(self, h, stream):
        self._obj(h)["stream"] = stream
        return CUFFT_OK, []

    def f_cufftGetVersion(self, out):
        return CUFFT_OK, [versions.version("cufft")]

    def f_cufftGetProperty(self, typ, out):
        v = versions.prop("cufft", typ)
        return (CUFFT_OK, [v]) if v is not None else (CUFFT_INVALID_VALUE, None)

    def _view(self, addr, layout, shape, batch, dtype):
        """(flat view of device memory, index array [batch, *shape])."""
        embed, stride, dist = layout
        if embed is None:
            embed, stride, dist = list(shape), 1, int(np.prod(shape))
        idx = np.ravel_multi_index(np.indices(shape), embed, mode="raise") if len(shape) else np.zeros(())
        full = np.arange(batch).reshape((batch,) + (1,) * len(shape)) * dist + stride * idx[None]
        item = np.dtype(dtype).itemsize
        flat = self.b.resolve(int(addr), (int(full.max()) + 1) * item).view(dtype)
        return flat, full

    def _exec(self, h, idata, odata, direction, want):
        o = self._plan(h)
        typ = o["type"]
        if want is not None and typ not in want:
            return CUFFT_INVALID_TYPE, None
        n, batch = o["n"], o["batch"]
        half = n[:-1] + [n[-1] // 2 + 1]
        idt, odt = _FFT_TYPES[typ]
        ishape = half if typ in (C2R, Z2D) else n
        oshape = half if typ in (R2C, D2Z) else n
        iflat, iidx = self._view(idata, o["inl"], ishape, batch, idt)
        x = iflat[iidx].astype(np.complex128 if np.iscomplexobj(iflat) else np.float64)
        axes = tuple(range(1, len(n) + 1))
        if typ in (R2C, D2Z):
            y = np.fft.rfftn(x, axes=axes)
        elif typ in (C2R, Z2D):
            # unnormalised, as cuFFT: numpy's inverse divides by the size
            y = np.fft.irfftn(x, s=n, axes=axes) * float(np.prod(n))
        elif direction == FORWARD:
            y = np.fft.fftn(x, axes=axes)
        elif direction == INVERSE:
            y = np.fft.ifftn(x, axes=axes) * float(np.prod(n))
        else:
            return CUFFT_INVALID_VALUE, None
        oflat, oidx = self._view(odata, o["outl"], oshape, batch, odt)
        oflat[oidx] = y.astype(odt)
        return CUFFT_OK, []

    def f_cufftExecC2C(self, h, i, o, d):
        return self._exec(h, i, o, d, (C2C,))

    def f_cufftExecZ2Z(self, h, i, o, d):
        return self._exec(h, i, o, d, (Z2Z,))

    def f_cufftExecR2C(self, h, i, o):
        return self._exec(h, i, o, FORWARD, (R2C,))

    def f_cufftExecD2Z(self, h, i, o):
        return self._exec(h, i, o, FORWARD, (D2Z,))

    def f_cufftExecC2R(self, h, i, o):
        return self._exec(h, i, o, INVERSE, (C2R,))

    def f_cufftExecZ2D(self, h, i, o):
        return self._exec(h, i, o, INVERSE, (Z2D,))

    def f_cufftXtExec(self, h, i, o, d):
        return self._exec(h, i, o, d, None)


# ------------------------------------------------------------------ cuRAND

CURAND_OK, CURAND_TYPE_ERROR, CURAND_OUT_OF_RANGE, CURAND_LENGTH_NOT_MULTIPLE = 0, 103, 104, 105
# curand.h, curandRngType_t: the pseudorandom generators (100..)
PSEUDO_TYPES = (100, 101, 121, 141, 142, 161)
_M64 = (1 << 64) - 1


def _mix(seed: int, pos: np.ndarray) -> np.ndarray:
    """64 random bits per position: the splitmix64 finaliser of seed and
    position (a counter-based generator: the value at a position depends on
    the seed and the position only)."""
    z = (pos.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ np.uint64(seed & _M64)
    z = z + np.uint64(0x632BE59BD9B4E5F5)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class EmuCurand(EmuLibrary):
    """Emulated generators. NVIDIA's sequences cannot be reproduced without
    NVIDIA's library; what is emulated is the plumbing and the properties a
    program may check: ranges (uniform in (0, 1], as curand.h documents),
    the same numbers for the same seed, and one sequence that each generate
    call continues and that curandSetGeneratorOffset positions absolutely
    (the result at position p depends on the seed and p alone, _mix) -- so
    a restored generator (libraries.curand_position) continues it exactly."""

    def _gen(self, h):
        return self._obj(h)

    def f_curandCreateGenerator(self, out, typ):
        if typ not in PSEUDO_TYPES:
            raise CudaError(801, f"rng type {typ} (quasirandom generators are not emulated)")
        return CURAND_OK, [self._new(type=typ, seed=0, pos=0, order=100, stream=0)]

    def f_curandDestroyGenerator(self, h):
        self._gen(h)
        del self.objs[h]
        return CURAND_OK, []

    def f_curandGetVersion(self, out):
        return CURAND_OK, [versions.version("curand")]

    def f_curandGetProperty(self, typ, out):
        v = versions.prop("curand", typ)
        return (CURAND_OK, [v]) if v is not None else (CURAND_OUT_OF_RANGE, None)

    def f_curandSetStream(self, h, stream):
        self._gen(h)["stream"] = stream
        return CURAND_OK, []

    def f_curandSetPseudoRandomGeneratorSeed(self, h, seed):
        self._gen(h)["seed"] = int(seed)        # the position stays (libraries.curand_position)
        return CURAND_OK, []

    def f_curandSetGeneratorOffset(self, h, offset):
        self._gen(h)["pos"] = int(offset)
        return CURAND_OK, []

    def f_curandSetGeneratorOrdering(self, h, order):
        self._gen(h)["order"] = order
        return CURAND_OK, []

    def f_curandSetQuasiRandomGeneratorDimensions(self, h, dims):
        self._gen(h)
        return CURAND_TYPE_ERROR, None      # curand.h: "not a quasirandom number generator"

    def f_curandGeneratePoisson(self, h, out, n, lam):
        if not lam > 0:
            return CURAND_OUT_OF_RANGE, None
        _, _, z = self._bits(h, n)
        u = self._uniform(z, True)
        # the inverse of the Poisson distribution function at u, term by term
        k = np.zeros(int(n), np.uint32)
        term = np.full(int(n), np.exp(-lam))
        cdf = term.copy()
        top = int(lam + 12 * np.sqrt(lam) + 30)
        for i in range(1, top):
            below = cdf < u
            if not below.any():
                break
            k[below] = i
            term = term * lam / i
            cdf = cdf + term
        self._out(out, n, np.uint32)[:] = k
        return CURAND_OK, []

    def _bits(self, h, n):
        g = self._gen(h)
        pos = np.arange(g["pos"], g["pos"] + int(n), dtype=np.uint64)
        g["pos"] += int(n)
        return g, pos, _mix(g["seed"], pos)

    def _out(self, addr, n, dtype):
        return self.b.resolve(int(addr), int(n) * np.dtype(dtype).itemsize).view(dtype)

    def f_curandGenerate(self, h, out, n):
        _, _, z = self._bits(h, n)
        self._out(out, n, np.uint32)[:] = (z >> np.uint64(32)).astype(np.uint32)
        return CURAND_OK, []

    def f_curandGenerateLongLong(self, h, out, n):
        raise CudaError(801, "64-bit results come from quasirandom generators, which are not emulated")

    @staticmethod
    def _uniform(z, double=False):
        # (0, 1]: (k + 1) / 2^bits
        if double:
            return ((z >> np.uint64(11)).astype(np.float64) + 1.0) / float(1 << 53)
        return ((z >> np.uint64(40)).astype(np.float64) + 1.0) / float(1 << 24)

    def f_curandGenerateUniform(self, h, out, n):
        _, _, z = self._bits(h, n)
        self._out(out, n, np.float32)[:] = self._uniform(z).astype(np.float32)
        return CURAND_OK, []

    def f_curandGenerateUniformDouble(self, h, out, n):
        _, _, z = self._bits(h, n)
        self._out(out, n, np.float64)[:] = self._uniform(z, True)
        return CURAND_OK, []

    def _normal(self, h, n, mean, std):
        if n % 2:
            # curand.h, curandGenerateNormal: n must be even for pseudorandom generators
            return None
        g, pos, z = self._bits(h, n)
        # Box-Muller on the pair of positions (2k, 2k + 1) each result belongs to
        base = pos & ~np.uint64(1)
        u1 = self._uniform(_mix(g["seed"], base), True)
        u2 = self._uniform(_mix(g["seed"], base + np.uint64(1)), True)
        r = np.sqrt(-2.0 * np.log(u1))
        ang = 2.0 * np.pi * u2
        v = np.where((pos & np.uint64(1)) == 0, r * np.cos(ang), r * np.sin(ang))
        return mean + std * v

    def _gen_normal(self, h, out, n, mean, std, dtype, log):
        v = self._normal(h, n, mean, std)
        if v is None:
            return CURAND_LENGTH_NOT_MULTIPLE, None
        self._out(out, n, dtype)[:] = (np.exp(v) if log else v).astype(dtype)
        return CURAND_OK, []

    def f_curandGenerateNormal(self, h, out, n, mean, std):
        return self._gen_normal(h, out, n, mean, std, np.float32, False)

    def f_curandGenerateNormalDouble(self, h, out, n, mean, std):
        return self._gen_normal(h, out, n, mean, std, np.float64, False)

    def f_curandGenerateLogNormal(self, h, out, n, mean, std):
        return self._gen_normal(h, out, n, mean, std, np.float32, True)

    def f_curandGenerateLogNormalDouble(self, h, out, n, mean, std):
        return self._gen_normal(h, out, n, mean, std, np.float64, True)


# ---------------------------------------------------------------- cuSPARSE

SP_OK, SP_INVALID, SP_NOT_SUPPORTED = 0, 3, 10
# cusparse.h: cusparseIndexType_t (_32I 2, _64I 3), cusparseOrder_t (_COL 1, _ROW 2), operations
_INDEX = {2: np.int32, 3: np.int64}
ORDER_COL, ORDER_ROW = 1, 2
OP_N, OP_T, OP_C = 0, 1, 2


class EmuCusparse(EmuLibrary):
    """CSR matrices with dense vectors and matrices (cuSPARSE docs,
    "Generic API"): y = alpha op(A) x + beta y, C = alpha op(A) op(B) + beta C,
    computed in float64 from the stored precision and rounded once."""

    def f_cusparseCreate(self, out):
        return SP_OK, [self._new(kind="handle", stream=0, pointer_mode=0)]

    def f_cusparseDestroy(self, h):
        self._obj(h)
        del self.objs[h]
        return SP_OK, []

    def f_cusparseGetVersion(self, h, out):
        self._obj(h)
        return SP_OK, [versions.version("cusparse")]

    def f_cusparseGetProperty(self, typ, out):
        v = versions.prop("cusparse", typ)
        return (SP_OK, [v]) if v is not None else (SP_INVALID, None)

    def f_cusparseSetStream(self, h, stream):
        self._obj(h)["stream"] = stream
        return SP_OK, []

    def f_cusparseGetStream(self, h, out):
        return SP_OK, [self._obj(h)["stream"]]

    def f_cusparseSetPointerMode(self, h, mode):
        if mode not in (0, 1):
            return SP_INVALID, None
        self._obj(h)["pointer_mode"] = mode
        return SP_OK, []

    def f_cusparseGetPointerMode(self, h, out):
        return SP_OK, [self._obj(h)["pointer_mode"]]

    def f_cusparseCreateCsr(self, out, rows, cols, nnz, rp, ci, vals, rpt, cit, base, vt):
        if rpt not in _INDEX or cit not in _INDEX or base not in (0, 1) or min(rows, cols, nnz) < 0:
            return SP_INVALID, None
        _dtype(vt)
        return SP_OK, [self._new(kind="csr", rows=rows, cols=cols, nnz=nnz, rp=rp, ci=ci, vals=vals, rpt=rpt,
                                 cit=cit, base=base, vt=vt)]

    def f_cusparseCsrSetPointers(self, m, rp, ci, vals):
        self._obj(m).update(rp=rp, ci=ci, vals=vals)
        return SP_OK, []

    def f_cusparseCreateDnVec(self, out, size, vals, vt):
        _dtype(vt)
        return SP_OK, [self._new(kind="dnvec", size=size, vals=vals, vt=vt)]

    def f_cusparseDnVecSetValues(self, v, vals):
        self._obj(v)["vals"] = vals
        return SP_OK, []

    def f_cusparseCreateDnMat(self, out, rows, cols, ld, vals, vt, order):
        if order not in (ORDER_COL, ORDER_ROW):
            return SP_INVALID, None
        _dtype(vt)
        return SP_OK, [self._new(kind="dnmat", rows=rows, cols=cols, ld=ld, vals=vals, vt=vt, order=order)]

    def _destroy(self, h):
        self._obj(h)
        del self.objs[h]
        return SP_OK, []

    f_cusparseDestroySpMat = f_cusparseDestroyDnVec = f_cusparseDestroyDnMat = _destroy

    def _csr(self, m):
        o = self._obj(m)
        if o.get("kind") != "csr":
            raise CudaError(801, "only CSR sparse matrices are emulated")
        it, jt, vt = _INDEX[o["rpt"]], _INDEX[o["cit"]], _dtype(o["vt"])
        rp = self.b.resolve(int(o["rp"]), (o["rows"] + 1) * np.dtype(it).itemsize).view(it).astype(np.int64)
        nnz = o["nnz"]
        ci = self.b.resolve(int(o["ci"]), max(nnz, 1) * np.dtype(jt).itemsize).view(jt)[:nnz].astype(np.int64)
        v = self.b.resolve(int(o["vals"]), max(nnz, 1) * np.dtype(vt).itemsize).view(vt)[:nnz]
        rp, ci = rp - o["base"], ci - o["base"]
        if rp[0] != 0 or rp[-1] != nnz or np.any(np.diff(rp) < 0) or (nnz and (ci.min() < 0 or ci.max() >= o["cols"])):
            raise CudaError(1, "CSR arrays are inconsistent with the descriptor's sizes")
        dense = np.zeros((o["rows"], o["cols"]), np.complex128 if np.iscomplexobj(v) else np.float64)
        rows = np.repeat(np.arange(o["rows"]), np.diff(rp))
        np.add.at(dense, (rows, ci), v)
        return dense

    def _op(self, a, op):
        return a if op == OP_N else a.T if op == OP_T else a.conj().T

    def _scalars(self, h, alpha, beta, ct):
        self._check_mode(self._obj(h)["pointer_mode"] == 1, alpha, beta)
        dt = np.dtype(_dtype(ct))
        def val(v):
            raw = bytes(v) if not isinstance(v, int) else bytes(self.b.resolve(v, dt.itemsize))
            return np.frombuffer(raw[:dt.itemsize], dt)[0]
        return val(alpha), val(beta)

    def f_cusparseSpMV_bufferSize(self, h, op, alpha, A, x, beta, y, ct, alg, out):
        self._obj(h), self._csr(A)
        return SP_OK, [0]

    def f_cusparseSpMV(self, h, op, alpha, A, x, beta, y, ct, alg, buf):
        al, be = self._scalars(h, alpha, beta, ct)
        a = self._op(self._csr(A), op)
        xo, yo = self._obj(x), self._obj(y)
        if xo["size"] != a.shape[1] or yo["size"] != a.shape[0]:
            return SP_INVALID, []
        xt, yt = _dtype(xo["vt"]), _dtype(yo["vt"])
        xv = self.b.resolve(int(xo["vals"]), xo["size"] * np.dtype(xt).itemsize).view(xt)
        yv = self.b.resolve(int(yo["vals"]), yo["size"] * np.dtype(yt).itemsize).view(yt)
        res = al * (a @ xv.astype(a.dtype)) + (be * yv if be != 0 else 0)
        yv[:] = res.astype(yt)
        return SP_OK, []

    def _dnmat(self, m):
        o = self._obj(m)
        dt = _dtype(o["vt"])
        r, c, ld = o["rows"], o["cols"], o["ld"]
        if o["order"] == ORDER_COL:
            return self._mat(o["vals"], r, c, ld, dt)
        return self._mat(o["vals"], c, r, ld, dt).T          # row-major: the transpose of a column-major one

    def f_cusparseSpMM_bufferSize(self, h, opa, opb, alpha, A, B, beta, C, ct, alg, out):
        self._obj(h), self._csr(A)
        return SP_OK, [0]

    def f_cusparseSpMM(self, h, opa, opb, alpha, A, B, beta, C, ct, alg, buf):
        al, be = self._scalars(h, alpha, beta, ct)
        a = self._op(self._csr(A), opa)
        b = self._op(self._dnmat(B), opb)
        c = self._dnmat(C)
        if a.shape[1] != b.shape[0] or c.shape != (a.shape[0], b.shape[1]):
            return SP_INVALID, []
        res = al * (a @ b.astype(a.dtype)) + (be * c if be != 0 else 0)
        c[...] = res.astype(c.dtype)
        return SP_OK, []


# ---------------------------------------------------------------- cuSOLVER

SO_OK, SO_INVALID = 0, 3
FILL_LOWER, FILL_UPPER = 0, 1          # cublasFillMode_t (cublas_api.h)


class EmuCusolver(EmuLibrary):
    """Dense factorisations as LAPACK defines them (column-major; a factor
    written over the referenced triangle; info: 0, or the order of the first
    leading minor that is not positive definite, or the first zero pivot,
    1-based; ipiv 1-based row interchanges; geqrf's Householder vectors
    below the diagonal with tau; eigenvalues ascending; singular values
    descending), for S, D, C and Z, in float64/complex128 loops and numpy's
    LAPACK (qr 'raw', eigh, svd). Eigenvector and singular vector signs may
    differ from NVIDIA's: callers check reconstructions, as with any LAPACK.
    Workspace sizes are small positive counts (numpy needs no workspace)."""

    def f_cusolverGetVersion(self, out):
        return SO_OK, [versions.version("cusolver")]

    def f_cusolverGetProperty(self, typ, out):
        v = versions.prop("cusolver", typ)
        return (SO_OK, [v]) if v is not None else (SO_INVALID, None)

    def f_cusolverDnCreate(self, out):
        return SO_OK, [self._new(kind="dn", stream=0)]

    def f_cusolverDnDestroy(self, h):
        self._obj(h)
        del self.objs[h]
        return SO_OK, []

    def f_cusolverDnSetStream(self, h, stream):
        self._obj(h)["stream"] = stream
        return SO_OK, []

    def f_cusolverDnGetStream(self, h, out):
        return SO_OK, [self._obj(h)["stream"]]

    def f_cusolverDnCreateParams(self, out):
        return SO_OK, [self._new(kind="params")]

    def f_cusolverDnDestroyParams(self, p):
        self._obj(p)
        del self.objs[p]
        return SO_OK, []

    # syevjInfo_t / gesvdjInfo_t (cusolverDn.h): the Jacobi methods'
    # settings, with cuSOLVER's documented defaults (tolerance: machine
    # accuracy, 100 sweeps, sorted results)
    def _jacobi_info(self, out):
        return SO_OK, [self._new(kind="jacobi", tol=0.0, max_sweeps=100, sort=1, residual=0.0, sweeps=0)]

    f_cusolverDnCreateSyevjInfo = f_cusolverDnCreateGesvdjInfo = _jacobi_info

    def _jacobi_destroy(self, info):
        self._jinfo(info)
        del self.objs[info]
        return SO_OK, []

    f_cusolverDnDestroySyevjInfo = f_cusolverDnDestroyGesvdjInfo = _jacobi_destroy

    def _jinfo(self, info):
        o = self._obj(info)
        if o.get("kind") != "jacobi":
            raise CudaError(400, f"{info} is not a syevjInfo_t/gesvdjInfo_t")
        return o

    def _jset(key):
        def f(self, info, v):
            self._jinfo(info)[key] = v
            return SO_OK, []
        return f

    f_cusolverDnXsyevjSetTolerance = f_cusolverDnXgesvdjSetTolerance = _jset("tol")
    f_cusolverDnXsyevjSetMaxSweeps = f_cusolverDnXgesvdjSetMaxSweeps = _jset("max_sweeps")
    f_cusolverDnXsyevjSetSortEig = f_cusolverDnXgesvdjSetSortEig = _jset("sort")
    del _jset

    def _jresidual(self, h, info, out):
        self._obj(h)
        return SO_OK, [float(self._jinfo(info)["residual"])]

    def _jsweeps(self, h, info, out):
        self._obj(h)
        return SO_OK, [int(self._jinfo(info)["sweeps"])]

    f_cusolverDnXsyevjGetResidual = f_cusolverDnXgesvdjGetResidual = _jresidual
    f_cusolverDnXsyevjGetSweeps = f_cusolverDnXgesvdjGetSweeps = _jsweeps

    def _info(self, addr, v):
        self.b.resolve(int(addr), 4).view(np.int32)[0] = v

    def _potrf(self, uplo, n, A, lda, info, dt):
        if n < 0 or lda < max(1, n) or uplo not in (FILL_LOWER, FILL_UPPER):
            return SO_INVALID, []
        a = self._mat(A, n, n, lda, dt)
        wide = _wide(dt)
        s = _sym(a.astype(wide), uplo, True)
        L = np.zeros_like(s)
        for j in range(n):
            d = s[j, j] - L[j, :j] @ L[j, :j].conj()
            if not d.real > 0:
                if info:
                    self._info(info, j + 1)
                return SO_OK, []
            L[j, j] = np.sqrt(d.real)
            L[j + 1:, j] = (s[j + 1:, j] - L[j + 1:, :j] @ L[j, :j].conj()) / L[j, j]
        if uplo == FILL_LOWER:
            a[np.tril_indices(n)] = L[np.tril_indices(n)].astype(dt)
        else:                       # A = U^H U with U = L^H
            a[np.triu_indices(n)] = L.conj().T[np.triu_indices(n)].astype(dt)
        if info:
            self._info(info, 0)
        return SO_OK, []

    def _potrs(self, uplo, n, nrhs, A, lda, B, ldb, info, dt):
        if n < 0 or nrhs < 0 or uplo not in (FILL_LOWER, FILL_UPPER):
            return SO_INVALID, []
        a = self._mat(A, n, n, lda, dt).astype(_wide(dt))
        L = np.tril(a) if uplo == FILL_LOWER else np.triu(a).conj().T
        b = self._mat(B, n, nrhs, ldb, dt)
        y = np.linalg.solve(L, b.astype(_wide(dt)))
        b[...] = np.linalg.solve(L.conj().T, y).astype(dt)
        if info:
            self._info(info, 0)
        return SO_OK, []

    def _getrf(self, m, n, A, lda, ipiv, info, dt, piv_t=np.int32):
        """piv_t: the pivots' type (int in cusolverDn<t>getrf, int64_t in
        the 64-bit API's cusolverDnXgetrf)."""
        if min(m, n) < 0 or lda < max(1, m):
            return SO_INVALID, []
        a = self._mat(A, m, n, lda, dt)
        w = a.astype(_wide(dt))
        # cusolverDn<t>getrf: devIpiv NULL factors without pivoting
        piv, first_zero = lu_factor(w, pivot=bool(ipiv))
        a[...] = w.astype(dt)
        if ipiv:
            pt = np.dtype(piv_t)
            self.b.resolve(int(ipiv), pt.itemsize * max(piv.size, 1)).view(pt)[:piv.size] = piv
        if info:
            self._info(info, first_zero)
        return SO_OK, []

    def _getrs(self, trans, n, nrhs, A, lda, ipiv, B, ldb, info, dt, piv_t=np.int32):
        if n < 0 or nrhs < 0 or trans not in (0, 1, 2):
            return SO_INVALID, []
        lu = self._mat(A, n, n, lda, dt).astype(_wide(dt))
        pt = np.dtype(piv_t)
        piv = self.b.resolve(int(ipiv), pt.itemsize * max(n, 1)).view(pt)[:n].astype(np.int32) if ipiv else \
            np.arange(1, n + 1, dtype=np.int32)
        b = self._mat(B, n, nrhs, ldb, dt)
        b[...] = lu_solve(lu, piv, b.astype(_wide(dt)), trans).astype(dt)
        if info:
            self._info(info, 0)
        return SO_OK, []

    def _householder(self, a, tau, k, size):
        """Q = H(1) ... H(k), H(i) = I - tau_i v_i v_i^H, v_i(i) = 1 and
        v_i below it from column i of a (LAPACK's geqrf representation)."""
        q = np.eye(size, dtype=a.dtype)
        for i in range(k):
            v = np.zeros(size, a.dtype)
            v[i] = 1
            v[i + 1:] = a[i + 1:size, i]
            q = q - tau[i] * np.outer(q @ v, v.conj())
        return q

    def _geqrf(self, m, n, A, lda, tau, info, dt):
        if min(m, n) < 0 or lda < max(1, m):
            return SO_INVALID, []
        a = self._mat(A, m, n, lda, dt)
        h, t = np.linalg.qr(a.astype(_wide(dt)), mode="raw")
        a[...] = h.T.astype(dt)             # numpy answers LAPACK's array transposed
        k = min(m, n)
        self._mat(tau, k, 1, max(k, 1), dt)[:, 0] = t[:k].astype(dt)
        if info:
            self._info(info, 0)
        return SO_OK, []

    def _orgqr(self, m, n, k, A, lda, tau, info, dt):
        if m < 0 or n < 0 or n > m or k < 0 or k > n or lda < max(1, m):
            return SO_INVALID, []
        a = self._mat(A, m, n, lda, dt)
        w = a.astype(_wide(dt))
        t = self._mat(tau, k, 1, max(k, 1), dt)[:, 0].astype(_wide(dt)) if k else np.zeros(0, _wide(dt))
        a[...] = self._householder(w, t, k, m)[:, :n].astype(dt)
        if info:
            self._info(info, 0)
        return SO_OK, []

    def _ormqr(self, side, trans, m, n, k, A, lda, tau, C, ldc, info, dt):
        nq = m if side == 0 else n      # CUBLAS_SIDE_LEFT 0: Q is m x m
        if min(m, n, k) < 0 or k > nq or trans not in (0, 1, 2):
            return SO_INVALID, []
        w = self._mat(A, nq, k, lda, dt).astype(_wide(dt))
        t = self._mat(tau, k, 1, max(k, 1), dt)[:, 0].astype(_wide(dt)) if k else np.zeros(0, _wide(dt))
        q = self._householder(w, t, k, nq)
        q = q if trans == 0 else q.T if trans == 1 else q.conj().T
        c = self._mat(C, m, n, ldc, dt)
        c[...] = (q @ c.astype(_wide(dt)) if side == 0 else c.astype(_wide(dt)) @ q).astype(dt)
        if info:
            self._info(info, 0)
        return SO_OK, []

    def _syevd(self, jobz, uplo, n, A, lda, W, info, dt, params=None):
        if n < 0 or lda < max(1, n) or uplo not in (FILL_LOWER, FILL_UPPER) or jobz not in (0, 1):
            return SO_INVALID, []
        a = self._mat(A, n, n, lda, dt)
        full = _sym(a.astype(_wide(dt)), uplo, True)
        ev, vec = np.linalg.eigh(full)
        self._mat(W, n, 1, max(n, 1), _real(dt))[:, 0] = ev.astype(_real(dt))
        if jobz == 1:                   # CUSOLVER_EIG_MODE_VECTOR
            a[...] = vec.astype(dt)
        if params is not None:
            o = self._jinfo(params)
            o["residual"] = float(np.linalg.norm(full @ vec - vec * ev)) if n else 0.0
            o["sweeps"] = 1
        if info:
            self._info(info, 0)
        return SO_OK, []

    def _svd_parts(self, m, n, A, lda, dt, full):
        a = self._mat(A, m, n, lda, dt).astype(_wide(dt))
        return np.linalg.svd(a, full_matrices=full)

    def _gesvd(self, jobu, jobvt, m, n, A, lda, S, U, ldu, VT, ldvt, info, dt):
        ju, jv = chr(jobu & 0xFF).upper(), chr(jobvt & 0xFF).upper()
        # cusolverDn<t>gesvd: m >= n; jobu/jobvt 'A', 'S', 'O', 'N'
        if m < n or min(m, n) < 0 or ju not in "ASON" or jv not in "ASON" or lda < max(1, m):
            return SO_INVALID, []
        if ju == "O" and jv == "O":
            return SO_INVALID, []       # LAPACK: jobu and jobvt cannot both be 'O'
        k = min(m, n)
        u, s, vh = self._svd_parts(m, n, A, lda, dt, ju == "A" or jv == "A")
        if ju == "O":                   # U's first k columns over A (CuPy's svd asks this)
            self._mat(A, m, k, lda, dt)[...] = u[:, :k].astype(dt)
        if jv == "O":                   # V^T's first k rows over A
            self._mat(A, k, n, lda, dt)[...] = vh[:k, :].astype(dt)
        self._mat(S, k, 1, max(k, 1), _real(dt))[:, 0] = s.astype(_real(dt))
        if ju in "AS":
            cols = m if ju == "A" else k
            self._mat(U, m, cols, ldu, dt)[...] = u[:, :cols].astype(dt)
        if jv in "AS":
            rows = n if jv == "A" else k
            self._mat(VT, rows, n, ldvt, dt)[...] = vh[:rows, :].astype(dt)
        if info:
            self._info(info, 0)
        return SO_OK, []

    def _gesvdj(self, jobz, econ, m, n, A, lda, S, U, ldu, V, ldv, info, params, dt):
        if min(m, n) < 0 or jobz not in (0, 1) or lda < max(1, m):
            return SO_INVALID, []
        k = min(m, n)
        u, s, vh = self._svd_parts(m, n, A, lda, dt, not econ)
        self._mat(S, k, 1, max(k, 1), _real(dt))[:, 0] = s.astype(_real(dt))
        if jobz == 1:
            ucols, vcols = (k, k) if econ else (m, n)
            self._mat(U, m, ucols, ldu, dt)[...] = u[:, :ucols].astype(dt)
            self._mat(V, n, vcols, ldv, dt)[...] = vh.conj().T[:, :vcols].astype(dt)
        o = self._jinfo(params)
        o["residual"], o["sweeps"] = 0.0, 1
        if info:
            self._info(info, 0)
        return SO_OK, []

    # the 64-bit API (cusolverDnX*): types by cudaDataType, ipiv int64_t,
    # workspaces in bytes (numpy needs none: sizes answered as 0)
    def f_cusolverDnXsyevd_bufferSize(self, h, p, jobz, uplo, n, ta, A, lda, tw, W, ct, od, oh):
        self._obj(h), _dtype(ta)
        return SO_OK, [0, 0]

    def f_cusolverDnXsyevd(self, h, p, jobz, uplo, n, ta, A, lda, tw, W, ct, bd, wd, bh, wh, info):
        self._obj(h)
        if _real(_dtype(ta)) != _dtype(tw):
            raise CudaError(801, f"cusolverDnXsyevd with A of type {ta} and W of type {tw}")
        return self._syevd(jobz, uplo, n, A, lda, W, info, _dtype(ta))

    def f_cusolverDnXsyevBatched_bufferSize(self, h, p, jobz, uplo, n, ta, A, lda, tw, W, ct, od, oh, batch):
        self._obj(h), _dtype(ta)
        return SO_OK, [0, 0]

    def f_cusolverDnXsyevBatched(self, h, p, jobz, uplo, n, ta, A, lda, tw, W, ct, bd, wd, bh, wh, info, batch):
        """batchSize matrices of n x n, lda apart by n columns (A + k * lda * n),
        their eigenvalues n apart in W, one info per matrix (cusolverDn.h,
        cusolverDnXsyevBatched)."""
        self._obj(h)
        dt = _dtype(ta)
        if _real(dt) != _dtype(tw):
            raise CudaError(801, f"cusolverDnXsyevBatched with A of type {ta} and W of type {tw}")
        if batch < 0 or n < 0 or lda < max(1, n):
            return SO_INVALID, []
        esz, wsz = np.dtype(dt).itemsize, np.dtype(_real(dt)).itemsize
        for k in range(batch):
            code, _ = self._syevd(jobz, uplo, n, int(A) + k * lda * n * esz, lda, int(W) + k * n * wsz,
                                  int(info) + 4 * k if info else 0, dt)
            if code != SO_OK:
                return code, []
        return SO_OK, []

    def f_cusolverDnXgesvdp_bufferSize(self, h, p, jobz, econ, m, n, ta, A, lda, ts, S, tu, U, ldu, tv, V, ldv, ct,
                                       od, oh):
        self._obj(h), _dtype(ta)
        return SO_OK, [0, 0]

    def f_cusolverDnXgesvdp(self, h, p, jobz, econ, m, n, ta, A, lda, ts, S, tu, U, ldu, tv, V, ldv, ct, bd, wd, bh,
                            wh, info, err):
        """A = U diag(S) V^H by the polar decomposition (cusolverDn.h,
        cusolverDnXgesvdp): V, not V^H; economy sizes with econ; the host
        h_err_sigma (the method's error bound) answered 0 (numpy's SVD is exact
        to rounding)."""
        self._obj(h)
        dt = _dtype(ta)
        if min(m, n) < 0 or jobz not in (0, 1) or econ not in (0, 1) or lda < max(1, m):
            return SO_INVALID, [None]
        k = min(m, n)
        u, sv, vh = self._svd_parts(m, n, A, lda, dt, not econ)
        self._mat(S, k, 1, max(k, 1), _real(dt))[:, 0] = sv.astype(_real(dt))
        if jobz == 1:
            ucols, vcols = (k, k) if econ else (m, n)
            self._mat(U, m, ucols, ldu, dt)[...] = u[:, :ucols].astype(dt)
            self._mat(V, n, vcols, ldv, dt)[...] = vh.conj().T[:, :vcols].astype(dt)
        if info:
            self._info(info, 0)
        return SO_OK, [0.0]

    def f_cusolverDnXgeev_bufferSize(self, h, p, jobvl, jobvr, n, ta, A, lda, tw, W, tvl, VL, ldvl, tvr, VR, ldvr, ct,
                                     od, oh):
        self._obj(h), _dtype(ta)
        return SO_OK, [0, 0]

    def f_cusolverDnXgeev(self, h, p, jobvl, jobvr, n, ta, A, lda, tw, W, tvl, VL, ldvl, tvr, VR, ldvr, ct, bd, wd,
                          bh, wh, info):
        """Eigenvalues and left/right eigenvectors of a general matrix
        (cusolverDn.h, cusolverDnXgeev; LAPACK's geev): W complex; for a real
        A the eigenvectors are real in LAPACK's layout (a complex pair j, j+1
        keeps the real part in column j and the imaginary part in column
        j+1); A is overwritten (its contents afterwards are not specified)."""
        self._obj(h)
        dt = _dtype(ta)
        wt = _dtype(tw)
        if n < 0 or lda < max(1, n) or jobvl not in (0, 1) or jobvr not in (0, 1) or not np.iscomplexobj(wt(0)):
            return SO_INVALID, []
        a = self._mat(A, n, n, lda, dt).astype(np.complex128 if np.iscomplexobj(dt(0)) else np.float64)
        ev, right = np.linalg.eig(a)
        self._mat(W, n, 1, max(n, 1), wt)[:, 0] = ev.astype(wt)
        for want, out, ld, t, vecs in ((jobvr, VR, ldvr, tvr, right),
                                       (jobvl, VL, ldvl, tvl, self._left(a, ev) if jobvl else None)):
            if want != 1:
                continue
            vt = _dtype(t)
            if np.iscomplexobj(vt(0)):
                self._mat(out, n, n, ld, vt)[...] = vecs.astype(vt)
            else:
                self._mat(out, n, n, ld, vt)[...] = _lapack_real_vectors(ev, vecs).astype(vt)
        if info:
            self._info(info, 0)
        return SO_OK, []

    @staticmethod
    def _left(a, ev):
        """Left eigenvectors u_j (u_j^H A = w_j u_j^H) in the eigenvalues'
        order, each of unit norm, as LAPACK's geev returns them."""
        w2, vl = np.linalg.eig(a.conj().T)
        order = [int(np.argmin(np.abs(w2.conj() - w))) for w in ev]
        vl = vl[:, order]
        return vl / np.linalg.norm(vl, axis=0)

    def f_cusolverDnXgetrf_bufferSize(self, h, p, m, n, ta, A, lda, ct, od, oh):
        self._obj(h), _dtype(ta)
        return SO_OK, [0, 0]

    def f_cusolverDnXgetrf(self, h, p, m, n, ta, A, lda, ipiv, ct, bd, wd, bh, wh, info):
        self._obj(h)
        return self._getrf(m, n, A, lda, ipiv, info, _dtype(ta), np.int64)

    def f_cusolverDnXgetrs(self, h, p, trans, n, nrhs, ta, A, lda, ipiv, tb, B, ldb, info):
        self._obj(h)
        if ta != tb:
            raise CudaError(801, "cusolverDnXgetrs with different types of A and B")
        return self._getrs(trans, n, nrhs, A, lda, ipiv, B, ldb, info, _dtype(ta), np.int64)

    def f_cusolverDnXgeqrf_bufferSize(self, h, p, m, n, ta, A, lda, tt, tau, ct, od, oh):
        self._obj(h), _dtype(ta)
        return SO_OK, [0, 0]

    def f_cusolverDnXgeqrf(self, h, p, m, n, ta, A, lda, tt, tau, ct, bd, wd, bh, wh, info):
        self._obj(h)
        return self._geqrf(m, n, A, lda, tau, info, _dtype(ta))

    def f_cusolverDnXgesvd_bufferSize(self, h, p, jobu, jobvt, m, n, ta, A, lda, ts, S, tu, U, ldu, tv, VT, ldvt,
                                      ct, od, oh):
        self._obj(h), _dtype(ta)
        return SO_OK, [0, 0]

    def f_cusolverDnXgesvd(self, h, p, jobu, jobvt, m, n, ta, A, lda, ts, S, tu, U, ldu, tv, VT, ldvt, ct, bd, wd,
                           bh, wh, info):
        self._obj(h)
        return self._gesvd(jobu, jobvt, m, n, A, lda, S, U, ldu, VT, ldvt, info, _dtype(ta))

    def f_cusolverDnXpotrf_bufferSize(self, h, p, uplo, n, ta, A, lda, ct, od, oh):
        _dtype(ta)
        return SO_OK, [0, 0]

    def f_cusolverDnXpotrf(self, h, p, uplo, n, ta, A, lda, ct, bd, wd, bh, wh, info):
        return self._potrf(uplo, n, A, lda, info, _dtype(ta))

    def f_cusolverDnXpotrs(self, h, p, uplo, n, nrhs, ta, A, lda, tb, B, ldb, info):
        if ta != tb:
            raise CudaError(801, "cusolverDnXpotrs with different types of A and B")
        return self._potrs(uplo, n, nrhs, A, lda, B, ldb, info, _dtype(ta))


def _lapack_real_vectors(ev, vecs):
    """Complex eigenvectors of a real matrix in LAPACK's real layout: a
    conjugate pair (positive imaginary part first) keeps Re in column j and
    Im in column j + 1."""
    out = np.real(vecs).copy()
    j, n = 0, len(ev)
    while j < n:
        if ev[j].imag != 0 and j + 1 < n:
            out[:, j], out[:, j + 1] = vecs[:, j].real, vecs[:, j].imag
            j += 2
        else:
            j += 1
    return out


def _wide(dt):
    return np.complex128 if np.issubdtype(dt, np.complexfloating) else np.float64


def _real(dt):
    """The type of eigenvalues and singular values of a dt matrix (W, S)."""
    return {np.complex64: np.float32, np.complex128: np.float64}.get(dt, dt)


def _typed(dt):
    """cusolverDn<t>... of one type, legacy API (cusolverDn.h): every
    pointer is device memory, Lwork answers are element counts."""
    def size(self, h, *rest):
        self._obj(h)
        return SO_OK, [64]

    def potrf(self, h, uplo, n, A, lda, work, lwork, info):
        self._obj(h)
        return self._potrf(uplo, n, A, lda, info, dt)

    def potrs(self, h, uplo, n, nrhs, A, lda, B, ldb, info):
        self._obj(h)
        return self._potrs(uplo, n, nrhs, A, lda, B, ldb, info, dt)

    def potrf_batched(self, h, uplo, n, Aa, lda, info, count):
        self._obj(h)
        for i, a in enumerate(self._ptrs(Aa, count)):
            code, _ = self._potrf(uplo, n, a, lda, info + 4 * i if info else 0, dt)
            if code:
                return code, []
        return SO_OK, []

    def potrs_batched(self, h, uplo, n, nrhs, Aa, lda, Ba, ldb, info, count):
        # cusolverDn<t>potrsBatched: nrhs must be 1
        self._obj(h)
        if nrhs != 1:
            return SO_INVALID, []
        for a, b in zip(self._ptrs(Aa, count), self._ptrs(Ba, count)):
            code, _ = self._potrs(uplo, n, nrhs, a, lda, b, ldb, 0, dt)
            if code:
                return code, []
        if info:
            self._info(info, 0)
        return SO_OK, []

    def getrf(self, h, m, n, A, lda, work, ipiv, info):
        self._obj(h)
        return self._getrf(m, n, A, lda, ipiv, info, dt)

    def getrs(self, h, trans, n, nrhs, A, lda, ipiv, B, ldb, info):
        self._obj(h)
        return self._getrs(trans, n, nrhs, A, lda, ipiv, B, ldb, info, dt)

    def geqrf(self, h, m, n, A, lda, tau, work, lwork, info):
        self._obj(h)
        return self._geqrf(m, n, A, lda, tau, info, dt)

    def orgqr(self, h, m, n, k, A, lda, tau, work, lwork, info):
        self._obj(h)
        return self._orgqr(m, n, k, A, lda, tau, info, dt)

    def ormqr(self, h, side, trans, m, n, k, A, lda, tau, C, ldc, work, lwork, info):
        self._obj(h)
        return self._ormqr(side, trans, m, n, k, A, lda, tau, C, ldc, info, dt)

    def syevd(self, h, jobz, uplo, n, A, lda, W, work, lwork, info):
        self._obj(h)
        return self._syevd(jobz, uplo, n, A, lda, W, info, dt)

    def syevj(self, h, jobz, uplo, n, A, lda, W, work, lwork, info, params):
        self._obj(h)
        return self._syevd(jobz, uplo, n, A, lda, W, info, dt, params)

    def syevj_size(self, h, jobz, uplo, n, A, lda, W, out, params):
        self._obj(h), self._jinfo(params)
        return SO_OK, [64]

    def syevj_batched(self, h, jobz, uplo, n, A, lda, W, work, lwork, info, params, count):
        self._obj(h)
        item, ritem = np.dtype(dt).itemsize, np.dtype(_real(dt)).itemsize
        for i in range(count):
            code, _ = self._syevd(jobz, uplo, n, A + item * lda * n * i, lda, W + ritem * n * i,
                                  info + 4 * i if info else 0, dt, params)
            if code:
                return code, []
        return SO_OK, []

    def syevj_batched_size(self, h, jobz, uplo, n, A, lda, W, out, params, count):
        self._obj(h), self._jinfo(params)
        return SO_OK, [64]

    def gesvd(self, h, jobu, jobvt, m, n, A, lda, S, U, ldu, VT, ldvt, work, lwork, rwork, info):
        self._obj(h)
        return self._gesvd(jobu, jobvt, m, n, A, lda, S, U, ldu, VT, ldvt, info, dt)

    def gesvdj(self, h, jobz, econ, m, n, A, lda, S, U, ldu, V, ldv, work, lwork, info, params):
        self._obj(h)
        return self._gesvdj(jobz, econ, m, n, A, lda, S, U, ldu, V, ldv, info, params, dt)

    def gesvdj_size(self, h, jobz, econ, m, n, A, lda, S, U, ldu, V, ldv, out, params):
        self._obj(h), self._jinfo(params)
        return SO_OK, [64]

    def gesvdj_batched(self, h, jobz, m, n, A, lda, S, U, ldu, V, ldv, work, lwork, info, params, count):
        # gesvdjBatched: m, n <= 32, full U (m x m) and V (n x n) per matrix
        self._obj(h)
        item, ritem, k = np.dtype(dt).itemsize, np.dtype(_real(dt)).itemsize, min(m, n)
        for i in range(count):
            code, _ = self._gesvdj(jobz, 0, m, n, A + item * lda * n * i, lda, S + ritem * k * i,
                                   U + item * ldu * m * i, ldu, V + item * ldv * n * i, ldv,
                                   info + 4 * i if info else 0, params, dt)
            if code:
                return code, []
        return SO_OK, []

    def gesvdj_batched_size(self, h, jobz, m, n, A, lda, S, U, ldu, V, ldv, out, params, count):
        self._obj(h), self._jinfo(params)
        return SO_OK, [64]

    return locals()


for _t, _dt in (("S", np.float32), ("D", np.float64), ("C", np.complex64), ("Z", np.complex128)):
    _f = _typed(_dt)
    _real_t = _t in "SD"
    _names = {"potrf_bufferSize": "size", "potrf": "potrf", "potrs": "potrs", "potrfBatched": "potrf_batched",
              "potrsBatched": "potrs_batched", "getrf_bufferSize": "size", "getrf": "getrf", "getrs": "getrs",
              "geqrf_bufferSize": "size", "geqrf": "geqrf",
              ("orgqr" if _real_t else "ungqr") + "_bufferSize": "size", ("orgqr" if _real_t else "ungqr"): "orgqr",
              ("ormqr" if _real_t else "unmqr") + "_bufferSize": "size", ("ormqr" if _real_t else "unmqr"): "ormqr",
              ("syevd" if _real_t else "heevd") + "_bufferSize": "size", ("syevd" if _real_t else "heevd"): "syevd",
              ("syevj" if _real_t else "heevj") + "_bufferSize": "syevj_size",
              ("syevj" if _real_t else "heevj"): "syevj",
              ("syevjBatched" if _real_t else "heevjBatched") + "_bufferSize": "syevj_batched_size",
              ("syevjBatched" if _real_t else "heevjBatched"): "syevj_batched",
              "gesvd_bufferSize": "size", "gesvd": "gesvd", "gesvdj_bufferSize": "gesvdj_size", "gesvdj": "gesvdj",
              "gesvdjBatched_bufferSize": "gesvdj_batched_size", "gesvdjBatched": "gesvdj_batched"}
    for _name, _impl in _names.items():
        setattr(EmuCusolver, f"f_cusolverDn{_t}{_name}", _f[_impl])


CLASSES = {"cufft": EmuCufft, "curand": EmuCurand, "cusparse": EmuCusparse, "cusolver": EmuCusolver}
