"""The emulated backend's cuDNN (docs/libraries.md, "cuDNN").

What CI needs to run the cuDNN path end to end without a GPU: handles and
their stream, versions, legacy tensor descriptors and batch normalization
(spatial mode, fp32/fp64, forward training, forward inference, backward; as
PyTorch's BatchNorm2d calls them), and the backend (graph) API's descriptor plumbing
with one engine: a graph of a single convolution forward (fp32 tensors of
4 dimensions, any strides, padding, filter strides, dilation, groups,
convolution or cross-correlation, fp32 or fp64 alpha/beta) computed in
numpy (float64 accumulation). Descriptors keep their attributes as set
(type, count, raw bytes, layout as cudnn_graph.h's cudnnBackendAttributeType_t);
cudnnBackendFinalize checks what each supported descriptor type needs;
GetAttribute answers what was set, the heuristics' single engine config and
zero workspace sizes. Anything else answers CUDNN_STATUS_NOT_SUPPORTED with a
log line naming what is missing.

Descriptor "reals" are integers (ids in this object), as cuDNN's pointers
are in the real path (libraries.RealCudnn). Locking: the worker's main loop.
"""
from __future__ import annotations

import logging
import struct

import numpy as np

from . import versions
from .blas import EmuLibrary, Unsupported

log = logging.getLogger("proxyd")

OK, BAD_PARAM, NOT_FINALIZED, NOT_SUPPORTED = 0, 2000, 2004, 3000    # cudnnStatus_t
# cudnnBackendDescriptorType_t
D_CONV, D_ENGINE, D_ENGINECFG, D_ENGINEHEUR, D_PLAN = 1, 2, 3, 4, 5
D_OP_CONV_FWD, D_OPGRAPH, D_VARIANT_PACK, D_TENSOR = 10, 15, 16, 17
# cudnnBackendAttributeName_t
CONV_COMP_TYPE, CONV_MODE, CONV_DILATIONS, CONV_STRIDES, CONV_POST_PAD, CONV_PRE_PAD, CONV_DIMS = range(100, 107)
HEUR_MODE, HEUR_GRAPH, HEUR_RESULTS = 200, 201, 202
CFG_ENGINE, CFG_WORKSPACE = 300, 303
PLAN_HANDLE, PLAN_CFG, PLAN_WORKSPACE = 400, 401, 402
FWD_ALPHA, FWD_BETA, FWD_CONV, FWD_W, FWD_X, FWD_Y = range(700, 706)
GRAPH_HANDLE, GRAPH_OPS, GRAPH_COUNT = 800, 801, 802
T_ALIGN, T_DTYPE, T_DIMS, T_STRIDES, T_UID, T_VIRTUAL = 900, 901, 902, 903, 906, 907
VP_UIDS, VP_PTRS, VP_WORKSPACE = 1000, 1001, 1003
ENGINE_GRAPH, ENGINE_INDEX = 1300, 1301
# cudnnBackendAttributeType_t
A_HANDLE, A_DATA_TYPE, A_BOOLEAN, A_INT64, A_FLOAT, A_DOUBLE, A_VOID_PTR = range(7)
A_CONV_MODE, A_HEUR_MODE, A_DESC = 7, 8, 15
DATA_FLOAT, DATA_DOUBLE = 0, 1
CROSS_CORRELATION = 1

# what each supported descriptor type needs before it can be finalized
REQUIRED = {
    D_TENSOR: (T_DTYPE, T_DIMS, T_STRIDES, T_UID),
    D_CONV: (CONV_COMP_TYPE, CONV_MODE, CONV_DILATIONS, CONV_STRIDES, CONV_POST_PAD, CONV_PRE_PAD, CONV_DIMS),
    D_OP_CONV_FWD: (FWD_ALPHA, FWD_BETA, FWD_CONV, FWD_W, FWD_X, FWD_Y),
    D_OPGRAPH: (GRAPH_OPS,),
    D_ENGINEHEUR: (HEUR_MODE, HEUR_GRAPH),
    D_ENGINE: (ENGINE_GRAPH, ENGINE_INDEX),
    D_ENGINECFG: (CFG_ENGINE,),
    D_PLAN: (PLAN_CFG,),
    D_VARIANT_PACK: (VP_UIDS, VP_PTRS),
}
FMT = {A_HANDLE: "Q", A_DATA_TYPE: "i", A_BOOLEAN: "?", A_INT64: "q", A_FLOAT: "f", A_DOUBLE: "d",
       A_VOID_PTR: "Q", A_CONV_MODE: "i", A_HEUR_MODE: "i", A_DESC: "Q"}


class EmuCudnn(EmuLibrary):
    def __init__(self, backend, api: str = "cudnn"):
        super().__init__(backend, api)
        self.descs: dict[int, dict] = {}
        self.next_desc = 1

    # ----------------------------------------------------------- handles
    def f_cudnnCreate(self, out):
        return OK, [self._new(kind="cudnn", stream=0)]

    def f_cudnnDestroy(self, h):
        self._obj(h)
        del self.objs[h]
        return OK, []

    def f_cudnnSetStream(self, h, stream):
        self._obj(h)["stream"] = stream
        return OK, []

    def f_cudnnGetStream(self, h, out):
        return OK, [self._obj(h)["stream"]]

    def f_cudnnGetVersion(self):
        return versions.version("cudnn"), []       # CUDNN_VERSION of the headers the spec was made from

    # cudnn_graph.h / cudnn_ops.h / cudnn_adv.h / cudnn_cnn.h: each
    # sub-library checks that its version is the core's; one library here
    def f_cudnnGraphVersionCheck(self):
        return 0, []

    def f_cudnnOpsVersionCheck(self):
        return 0, []

    def f_cudnnAdvVersionCheck(self):
        return 0, []

    def f_cudnnCnnVersionCheck(self):
        return 0, []

    def f_cudnnGetMaxDeviceVersion(self):
        return 1200, []

    def f_cudnnGetCudartVersion(self):
        return versions.CUDART_VERSION, []

    def f_cudnnGetProperty(self, typ, out):
        v = versions.prop("cudnn", typ)
        return (OK, [v]) if v is not None else (BAD_PARAM, None)

    def f_cudnnGetLastErrorString(self, message, max_size):
        return 0, [b"\0" * max(int(max_size or 0), 0) if message else None]

    # ------------------------------------------ legacy tensors, batch norm
    def f_cudnnCreateTensorDescriptor(self, out):
        return OK, [self._new(kind="tensor", dtype=None)]

    def f_cudnnSetTensorNdDescriptor(self, t, dtype, nb, dims, strides):
        o = self._obj(t)
        if dtype not in (DATA_FLOAT, DATA_DOUBLE) or not 0 < nb <= 8:
            return NOT_SUPPORTED if dtype not in (DATA_FLOAT, DATA_DOUBLE) else BAD_PARAM, []
        o.update(dtype=dtype, dims=list(struct.unpack(f"<{nb}i", dims)),
                 strides=list(struct.unpack(f"<{nb}i", strides)))
        return OK, []

    def f_cudnnDestroyTensorDescriptor(self, t):
        self._obj(t)
        del self.objs[t]
        return OK, []

    def f_cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(self, h, mode, ops, *descs_and_out):
        return OK, [0]

    def f_cudnnGetBatchNormalizationBackwardExWorkspaceSize(self, h, mode, ops, *descs_and_out):
        return OK, [0]

    def f_cudnnGetBatchNormalizationTrainingExReserveSpaceSize(self, h, mode, ops, act, x, out):
        return OK, [0]

    def _lt(self, desc, addr):
        """A legacy tensor (its descriptor and device address) as a numpy view."""
        o = self._obj(desc)
        if o.get("dtype") is None:
            raise Unsupported("tensor descriptor was not set")
        dt = np.float32 if o["dtype"] == DATA_FLOAT else np.float64
        item = np.dtype(dt).itemsize
        n = 1 + sum((d - 1) * s for d, s in zip(o["dims"], o["strides"]))
        flat = self.b.resolve(int(addr), item * n).view(dt)
        return np.lib.stride_tricks.as_strided(flat, shape=o["dims"], strides=[item * s for s in o["strides"]])

    @staticmethod
    def _bn_check(mode, ops=0):
        # cudnn_ops.h: CUDNN_BATCHNORM_SPATIAL 1, _SPATIAL_PERSISTENT 2; CUDNN_BATCHNORM_OPS_BN 0
        if mode not in (1, 2) or ops != 0:
            raise Unsupported(f"batch normalization mode {mode} / ops {ops} (only spatial, BN alone)")

    def _scal(self, v, desc):
        return self._scalar(v, "d" if self._obj(desc)["dtype"] == DATA_DOUBLE else "f")

    def f_cudnnBatchNormalizationForwardTrainingEx(self, h, mode, ops, alpha, beta, xd, x, zd, z, yd, y, pd, scale,
                                                   bias, factor, rmean, rvar, eps, smean, sinv, act, ws, wss, rs, rss):
        self._bn_check(mode, ops)
        X, Y = self._lt(xd, x), self._lt(yd, y)
        g, b = self._lt(pd, scale).reshape(-1), self._lt(pd, bias).reshape(-1)
        axes = (0,) + tuple(range(2, X.ndim))
        xf = X.astype(np.float64)
        mean = xf.mean(axis=axes)
        var = xf.var(axis=axes)
        m = xf.size // xf.shape[1]
        shape = (1, -1) + (1,) * (X.ndim - 2)
        inv = 1.0 / np.sqrt(var + eps)
        res = (xf - mean.reshape(shape)) * inv.reshape(shape) * g.reshape(shape) + b.reshape(shape)
        a, bt = self._scal(alpha, xd), self._scal(beta, xd)
        Y[...] = a * res + (bt * Y.astype(np.float64) if bt != 0 else 0.0)
        if rmean:
            rm = self._lt(pd, rmean).reshape(-1)
            rm[...] = (1 - factor) * rm + factor * mean
        if rvar:
            rv = self._lt(pd, rvar).reshape(-1)
            rv[...] = (1 - factor) * rv + factor * var * m / max(m - 1, 1)     # unbiased, as cuDNN keeps it
        if smean:
            self._lt(pd, smean).reshape(-1)[...] = mean
        if sinv:
            self._lt(pd, sinv).reshape(-1)[...] = inv
        return OK, []

    def f_cudnnBatchNormalizationForwardInference(self, h, mode, alpha, beta, xd, x, yd, y, pd, scale, bias, emean,
                                                  evar, eps):
        self._bn_check(mode)
        X, Y = self._lt(xd, x), self._lt(yd, y)
        shape = (1, -1) + (1,) * (X.ndim - 2)
        g, b, em, ev = (self._lt(pd, p).reshape(shape).astype(np.float64) for p in (scale, bias, emean, evar))
        res = (X.astype(np.float64) - em) / np.sqrt(ev + eps) * g + b
        a, bt = self._scal(alpha, xd), self._scal(beta, xd)
        Y[...] = a * res + (bt * Y.astype(np.float64) if bt != 0 else 0.0)
        return OK, []

    def f_cudnnBatchNormalizationBackwardEx(self, h, mode, ops, ad, bd, ap, bp, xd, x, yd, y, dyd, dy, dzd, dz, dxd,
                                            dx, pd, scale, bias, dscale, dbias, eps, smean, sinv, act, ws, wss,
                                            rs, rss):
        self._bn_check(mode, ops)
        X = self._lt(xd, x).astype(np.float64)
        DY = self._lt(dyd, dy).astype(np.float64)
        DXv = self._lt(dxd, dx)
        axes = (0,) + tuple(range(2, X.ndim))
        shape = (1, -1) + (1,) * (X.ndim - 2)
        m = X.size // X.shape[1]
        if smean and sinv:
            # what the forward pass saved (cudnnBatchNormalizationForwardTrainingEx)
            mean = self._lt(pd, smean).reshape(-1).astype(np.float64)
            inv = self._lt(pd, sinv).reshape(-1).astype(np.float64)
        else:
            mean = X.mean(axis=axes)
            inv = 1.0 / np.sqrt(X.var(axis=axes) + eps)
        g = self._lt(pd, scale).reshape(-1).astype(np.float64)
        xhat = (X - mean.reshape(shape)) * inv.reshape(shape)
        dbeta = DY.sum(axis=axes)
        dgamma = (DY * xhat).sum(axis=axes)
        dxr = (g * inv).reshape(shape) / m * (m * DY - dbeta.reshape(shape) - xhat * dgamma.reshape(shape))
        a, bt = self._scal(ad, xd), self._scal(bd, xd)
        DXv[...] = a * dxr + (bt * DXv.astype(np.float64) if bt != 0 else 0.0)
        pa, pb = self._scal(ap, xd), self._scal(bp, xd)
        for out, val in ((dscale, dgamma), (dbias, dbeta)):
            v = self._lt(pd, out).reshape(-1)
            v[...] = pa * val + (pb * v.astype(np.float64) if pb != 0 else 0.0)
        return OK, []

    # ------------------------------------------------------- descriptors
    def _d(self, real) -> dict:
        d = self.descs.get(int(real or 0))
        if d is None:
            raise Unsupported(f"unknown descriptor {real}")
        return d

    def bk_create(self, dtype: int):
        if dtype not in REQUIRED:
            log.warning("emulated cuDNN: backend descriptor type %d is not emulated", dtype)
            return NOT_SUPPORTED, 0
        r = self.next_desc
        self.next_desc += 1
        self.descs[r] = {"type": dtype, "attrs": {}, "final": False}
        return OK, r

    def bk_destroy(self, real) -> int:
        return OK if self.descs.pop(int(real or 0), None) is not None else BAD_PARAM

    def bk_set(self, real, name, atype, count, data) -> int:
        d = self.descs.get(int(real or 0))
        if d is None or d["final"]:
            return BAD_PARAM
        d["attrs"][name] = (atype, count, bytes(data))
        return OK

    def _vals(self, d, name):
        atype, count, data = d["attrs"][name]
        f = FMT.get(atype, "i")
        return list(struct.unpack(f"<{count}{f}", data))

    def bk_finalize(self, real) -> int:
        d = self.descs.get(int(real or 0))
        if d is None:
            return BAD_PARAM
        missing = [a for a in REQUIRED[d["type"]] if a not in d["attrs"]]
        if missing:
            return BAD_PARAM
        for a in d["attrs"].values():
            if a[0] == A_DESC:
                for r in struct.unpack(f"<{a[1]}Q", a[2]):
                    if r not in self.descs or not self.descs[r]["final"]:
                        return NOT_FINALIZED
        if d["type"] == D_OPGRAPH:
            ops = self._vals(d, GRAPH_OPS)
            d["supported"] = len(ops) == 1 and self.descs[ops[0]]["type"] == D_OP_CONV_FWD and \
                self._conv_ok(self.descs[ops[0]])
        if d["type"] == D_ENGINE and (self._vals(d, ENGINE_INDEX)[0] != 0 or
                                      not self._d(self._vals(d, ENGINE_GRAPH)[0]).get("supported")):
            return NOT_SUPPORTED
        d["final"] = True
        return OK

    def _conv_ok(self, op) -> bool:
        for t in (FWD_X, FWD_W, FWD_Y):
            td = self._d(self._vals(op, t)[0])
            if self._vals(td, T_DTYPE)[0] != DATA_FLOAT or len(self._vals(td, T_DIMS)) != 4:
                log.warning("emulated cuDNN: only fp32 4-d convolutions are emulated")
                return False
        return self._vals(self._d(self._vals(op, FWD_CONV)[0]), CONV_DIMS)[0] == 2

    def bk_get(self, real, name, atype, requested, arr):
        d = self.descs.get(int(real or 0))
        if d is None:
            return BAD_PARAM, 0, None
        if name == HEUR_RESULTS and atype == A_DESC:
            if not d["final"]:
                return NOT_FINALIZED, 0, None
            graph = self._vals(d, HEUR_GRAPH)[0]
            n = 1 if self._d(graph).get("supported") else 0
            if isinstance(arr, (bytes, bytearray)) and n and requested:
                # the one engine, as a finalized config of the caller's
                cfg = self._d(struct.unpack("<Q", bytes(arr)[:8])[0])
                if cfg["type"] != D_ENGINECFG:
                    return BAD_PARAM, 0, None
                st, eng = self.bk_create(D_ENGINE)
                self.bk_set(eng, ENGINE_GRAPH, A_DESC, 1, struct.pack("<Q", graph))
                self.bk_set(eng, ENGINE_INDEX, A_INT64, 1, struct.pack("<q", 0))
                self.bk_finalize(eng)
                cfg["attrs"] = {CFG_ENGINE: (A_DESC, 1, struct.pack("<Q", eng))}
                cfg["final"] = True
            return OK, n, None
        if name in (PLAN_WORKSPACE, CFG_WORKSPACE) and atype == A_INT64:
            return self._answer(OK, [0], "q", requested, arr)
        if name == GRAPH_COUNT and atype == A_INT64:
            return self._answer(OK, [1 if d.get("supported") else 0], "q", requested, arr)
        if name in d["attrs"] and d["attrs"][name][0] == atype and atype != A_DESC:
            vals = self._vals(d, name)
            return self._answer(OK, vals, FMT.get(atype, "i"), requested, arr)
        log.warning("emulated cuDNN: attribute %d of descriptor type %d cannot be read", name, d["type"])
        return NOT_SUPPORTED, 0, None

    @staticmethod
    def _answer(st, vals, f, requested, arr):
        out = struct.pack(f"<{min(len(vals), requested)}{f}", *vals[:requested]) if arr is not None else None
        if isinstance(arr, int) and out is not None:
            out = out + b"\0" * max(arr - len(out), 0)
        return st, len(vals), out

    # ----------------------------------------------------------- execute
    def f_cudnnBackendExecute(self, handle, plan, pack):
        self._obj(handle)
        p, vp = self._d(plan), self._d(pack)
        if not p["final"] or not vp["final"]:
            return NOT_FINALIZED, []
        cfg = self._d(self._vals(p, PLAN_CFG)[0])
        eng = self._d(self._vals(cfg, CFG_ENGINE)[0])
        graph = self._d(self._vals(eng, ENGINE_GRAPH)[0])
        op = self._d(self._vals(graph, GRAPH_OPS)[0])
        ptrs = dict(zip(self._vals(vp, VP_UIDS), self._vals(vp, VP_PTRS)))
        x, w, y = (self._tensor(self._d(self._vals(op, t)[0]), ptrs) for t in (FWD_X, FWD_W, FWD_Y))
        conv = self._d(self._vals(op, FWD_CONV)[0])
        alpha = self._vals(op, FWD_ALPHA)[0]
        beta = self._vals(op, FWD_BETA)[0]
        y[...] = self._conv2d(x, w, y, conv, alpha, beta)
        return OK, []

    def _tensor(self, td, ptrs):
        dims, strides, uid = self._vals(td, T_DIMS), self._vals(td, T_STRIDES), self._vals(td, T_UID)[0]
        if uid not in ptrs:
            raise Unsupported(f"the variant pack has no pointer for tensor {uid}")
        n = 1 + sum((d - 1) * s for d, s in zip(dims, strides))
        flat = self.b.resolve(int(ptrs[uid]), 4 * n).view(np.float32)
        return np.lib.stride_tricks.as_strided(flat, shape=dims, strides=[4 * s for s in strides])

    def _conv2d(self, x, w, y, conv, alpha, beta):
        """cudnn_graph.h convolution semantics: y = alpha * conv(x, w) + beta * y,
        NCHW / KCRS by dimension order, groups = C / w's C."""
        pre, post = self._vals(conv, CONV_PRE_PAD), self._vals(conv, CONV_POST_PAD)
        st, dil = self._vals(conv, CONV_STRIDES), self._vals(conv, CONV_DILATIONS)
        N, C, H, W = x.shape
        K, Cg, R, S = w.shape
        _, _, P_, Q = y.shape
        if C % Cg or K % (C // Cg):
            raise Unsupported(f"channels {C} and filter channels {Cg} do not make groups")
        groups = C // Cg
        wf = w.astype(np.float64)
        if self._vals(conv, CONV_MODE)[0] != CROSS_CORRELATION:
            wf = wf[:, :, ::-1, ::-1]       # CUDNN_CONVOLUTION flips the filter
        xp = np.zeros((N, C, H + pre[0] + post[0], W + pre[1] + post[1]))
        xp[:, :, pre[0]:pre[0] + H, pre[1]:pre[1] + W] = x
        acc = np.zeros((N, K, P_, Q))
        kg = K // groups
        for g in range(groups):
            xs = xp[:, g * Cg:(g + 1) * Cg]
            for r in range(R):
                for s in range(S):
                    h0, w0 = r * dil[0], s * dil[1]
                    patch = xs[:, :, h0:h0 + (P_ - 1) * st[0] + 1:st[0], w0:w0 + (Q - 1) * st[1] + 1:st[1]]
                    if patch.shape[2:] != (P_, Q):
                        raise Unsupported(f"output {P_}x{Q} does not match the input, padding and strides")
                    acc[:, g * kg:(g + 1) * kg] += np.einsum("ncpq,kc->nkpq", patch, wf[g * kg:(g + 1) * kg, :, r, s])
        res = alpha * acc
        if beta != 0:
            res = res + beta * y.astype(np.float64)
        return res.astype(np.float32)
