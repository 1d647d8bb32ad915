"""Conditional graph nodes on the GPU (cuda.h, CUDA 12.3+): the driver calls
that proxyd/families/graph_cond.py builds a real driver graph with.

A kernel's cudaGraphSetConditional writes storage that only the driver's
conditional node reads, and only inside a launch of a driver graph; so a
graph with conditional nodes runs on the GPU as a driver graph: its handles
are made on a driver graph (cuGraphConditionalHandleCreate), and at its
first launch the worker records the graph's operations into that driver
graph by stream capture (cuStreamBeginCaptureToGraph, the same driver calls
a live launch makes), adds each conditional node with cuGraphAddNode_v2
after what the capture recorded so far (cuStreamGetCaptureInfo_v3's
dependency set), and captures each body's operations into the body graphs
the driver returns (phGraph_out). Then it instantiates and launches that.

Layout of CUgraphNodeParams (cuda.h): type at 0, reserved0[3], the union
at 16 (CUDA_CONDITIONAL_NODE_PARAMS: handle u64, type u32, size u32,
phGraph_out, ctx), reserved2; 256 bytes in all.

Locking: the worker's main loop only.
"""
from __future__ import annotations

import struct

CUDA_SUCCESS = 0
CU_GRAPH_NODE_TYPE_CONDITIONAL = 13
CAPTURE_RELAXED = 2             # CU_STREAM_CAPTURE_MODE_RELAXED: proxyd's other threads are not the capture's
CU_STREAM_NON_BLOCKING = 1
NODE_PARAMS_SIZE = 256


class DriverConds:
    def __init__(self, be):
        self.be = be
        self.ffi, self.lib = be.ffi, be.lib

    def _chk(self, r, what):
        self.be.check(r, what)

    def graph_create(self) -> int:
        p = self.ffi.new("void **")
        self._chk(self.lib.cuGraphCreate(p, 0), "cuGraphCreate")
        return self.be.ptr(p[0])

    def graph_destroy(self, g: int):
        self.lib.cuGraphDestroy(self.be.vp(g))

    def handle_create(self, graph: int, ctx, default: int, flags: int) -> int:
        h = self.ffi.new("unsigned long long *")
        self._chk(self.lib.cuGraphConditionalHandleCreate(h, self.be.vp(graph), self.be.vp(ctx), default, flags),
                  "cuGraphConditionalHandleCreate")
        return int(h[0])

    def clear(self, graph: int):
        """Removes every node of graph (a rebuild records them again)."""
        n = self.ffi.new("size_t *")
        self._chk(self.lib.cuGraphGetNodes(self.be.vp(graph), self.ffi.NULL, n), "cuGraphGetNodes")
        if not n[0]:
            return
        nodes = self.ffi.new("void *[]", n[0])
        self._chk(self.lib.cuGraphGetNodes(self.be.vp(graph), nodes, n), "cuGraphGetNodes")
        for i in range(n[0]):
            self._chk(self.lib.cuGraphDestroyNode(nodes[i]), "cuGraphDestroyNode")

    def stream_create(self) -> int:
        p = self.ffi.new("void **")
        self._chk(self.lib.cuStreamCreate(p, CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        return self.be.ptr(p[0])

    def stream_destroy(self, s: int):
        self.lib.cuStreamDestroy_v2(self.be.vp(s))

    def begin(self, stream: int, graph: int, deps: list[int]):
        arr = self.ffi.new("void *[]", [self.be.vp(x) for x in deps]) if deps else self.ffi.NULL
        self._chk(self.lib.cuStreamBeginCaptureToGraph(self.be.vp(stream), self.be.vp(graph), arr, self.ffi.NULL,
                                                       len(deps), CAPTURE_RELAXED), "cuStreamBeginCaptureToGraph")

    def deps(self, stream: int) -> list[int]:
        """The capture's current dependency set: the nodes recorded last."""
        status = self.ffi.new("int *")
        cid = self.ffi.new("unsigned long long *")
        graph = self.ffi.new("void **")
        deps = self.ffi.new("void ***")
        edata = self.ffi.new("void **")
        n = self.ffi.new("size_t *")
        self._chk(self.lib.cuStreamGetCaptureInfo_v3(self.be.vp(stream), status, cid, graph, deps, edata, n),
                  "cuStreamGetCaptureInfo_v3")
        return [self.be.ptr(deps[0][i]) for i in range(n[0])]

    def end(self, stream: int):
        g = self.ffi.new("void **")
        self._chk(self.lib.cuStreamEndCapture(self.be.vp(stream), g), "cuStreamEndCapture")

    def add_conditional(self, graph: int, deps: list[int], handle: int, ctype: int, size: int, ctx) -> tuple:
        """cuGraphAddNode_v2 of a conditional node: (node, [body graphs])."""
        buf = self.ffi.new("unsigned char[]", NODE_PARAMS_SIZE)
        raw = self.ffi.buffer(buf)
        raw[0:4] = struct.pack("<i", CU_GRAPH_NODE_TYPE_CONDITIONAL)
        raw[16:32] = struct.pack("<QII", handle, ctype, size)
        raw[40:48] = struct.pack("<Q", self.be.ptr(ctx) if not isinstance(ctx, int) else ctx)
        node = self.ffi.new("void **")
        arr = self.ffi.new("void *[]", [self.be.vp(x) for x in deps]) if deps else self.ffi.NULL
        self._chk(self.lib.cuGraphAddNode_v2(node, self.be.vp(graph), arr, self.ffi.NULL, len(deps), buf),
                  "cuGraphAddNode_v2 (conditional)")
        (out,) = struct.unpack_from("<Q", raw, 32)
        bodies = self.ffi.cast("void **", out)
        return self.be.ptr(node[0]), [self.be.ptr(bodies[i]) for i in range(size)]

    def instantiate(self, graph: int) -> int:
        e = self.ffi.new("void **")
        self._chk(self.lib.cuGraphInstantiateWithFlags(e, self.be.vp(graph), 0), "cuGraphInstantiateWithFlags")
        return self.be.ptr(e[0])

    def launch(self, exec_: int, stream):
        self._chk(self.lib.cuGraphLaunch(self.be.vp(exec_), self.be.vp(stream)), "cuGraphLaunch")

    def exec_destroy(self, exec_: int):
        self.lib.cuGraphExecDestroy(self.be.vp(exec_))
