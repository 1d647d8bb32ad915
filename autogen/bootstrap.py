"""Write specs/driver/*.yaml and specs/runtime/*.yaml from the CUDA headers.

    python autogen/bootstrap.py [--cuda-home DIR] [--specs DIR] [--check]

Merge mode: entries already present in the YAML files are kept as they are
(id, status, params with their roles, objects, sync, proc, handler, shim and
any other key); only functions that are new in the headers are added, with
fresh ids (driver 1..9999, runtime 10000..19999) and with roles inferred by
the heuristics below or taken from the SUPPORTED tables. Functions that have
disappeared from the headers are reported and left in place. Running the
tool twice in a row changes nothing.

The file-level keys (api, family, library, soname, header, doc_group,
cuda_version) are regenerated on every run. Comments inside the YAML files
are not kept (the leading comment is rewritten).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple


try:
    from . import header as hdr
except ImportError:          # run as a script / autogen/ on sys.path
    import header as hdr


# --------------------------------------------------------------------------
# Families: doxygen group -> file stem
# --------------------------------------------------------------------------

DRIVER_FAMILIES = {
    "CUDA_ERROR": "error",
    "CUDA_INITIALIZE": "init",
    "CUDA_VERSION": "version",
    "CUDA_DEVICE": "device",
    "CUDA_PRIMARY_CTX": "primary_context",
    "CUDA_CTX": "context",
    "CUDA_MODULE": "module",
    "CUDA_LIBRARY": "library",
    "CUDA_MEM": "memory",
    "CUDA_VA": "virtual_memory",
    "CUDA_MALLOC_ASYNC": "memory_pool",
    "CUDA_MULTICAST": "multicast",
    "CUDA_UNIFIED": "unified",
    "CUDA_STREAM": "stream",
    "CUDA_EVENT": "event",
    "CUDA_EXTRES_INTEROP": "external_resource",
    "CUDA_MEMOP": "stream_memop",
    "CUDA_EXEC": "execution",
    "CUDA_GRAPH": "graph",
    "CUDA_OCCUPANCY": "occupancy",
    "CUDA_TEXREF": "texref",
    "CUDA_SURFREF": "surfref",
    "CUDA_TEXOBJECT": "texture_object",
    "CUDA_SURFOBJECT": "surface_object",
    "CUDA_TENSOR_MEMORY": "tensor_map",
    "CUDA_PEER_ACCESS": "peer",
    "CUDA_GRAPHICS": "graphics",
    "CUDA_DRIVER_ENTRY_POINT": "entry_point",
    "CUDA_COREDUMP": "coredump",
    "CUDA_GREEN_CONTEXTS": "green_context",
    "CUDA_LOGS": "logs",
    "CUDA_CHECKPOINT": "checkpoint",
    "CUDA_PROFILER": "profiler",
    "CUDA_GL": "interop_gl",
    "CUDA_EGL": "interop_egl",
    "CUDA_VDPAU": "interop_vdpau",
}

RUNTIME_FAMILIES = {
    "CUDART_DEVICE": "device",
    "CUDART_ERROR": "error",
    "CUDART_STREAM": "stream",
    "CUDART_EVENT": "event",
    "CUDART_EXTRES_INTEROP": "external_resource",
    "CUDART_EXECUTION": "execution",
    "CUDART_OCCUPANCY": "occupancy",
    "CUDART_MEMORY": "memory",
    "CUDART_MEMORY_POOLS": "memory_pool",
    "CUDART_UNIFIED": "unified",
    "CUDART_PEER": "peer",
    "CUDART_INTEROP": "graphics",
    "CUDART_TEXTURE_OBJECT": "texture_object",
    "CUDART_SURFACE_OBJECT": "surface_object",
    "CUDART__VERSION": "version",
    "CUDART_LOGS": "logs",
    "CUDART_GRAPH": "graph",
    "CUDART_DRIVER_ENTRY_POINT": "entry_point",
    "CUDART_LIBRARY": "library",
    "CUDART_DRIVER": "driver_interop",
    "CUDART_PROFILER": "profiler",
    "CUDART_OPENGL": "interop_gl",
    "CUDART_EGL": "interop_egl",
    "CUDART_VDPAU": "interop_vdpau",
    hdr.REGISTRATION_GROUP: "registration",
}

LIBRARIES = {"driver": "libcuda.so.1", "runtime": "libcudart.so.13"}
ID_RANGES = {"driver": (1, 9999), "runtime": (10000, 19999)}


def family_of(group: str, api: str) -> str:
    table = DRIVER_FAMILIES if api == "driver" else RUNTIME_FAMILIES
    g = group[:-len("_DEPRECATED")] if group.endswith("_DEPRECATED") else group
    if g in table:
        return table[g]
    # a group that a newer CUDA adds: derive a stem from its name
    stem = re.sub(r"^CUDA(RT)?_+", "", g).lower()
    return re.sub(r"[^a-z0-9]+", "_", stem).strip("_") or "misc"


# --------------------------------------------------------------------------
# Object kinds of handle types
# --------------------------------------------------------------------------

HANDLE_KINDS = {
    # driver
    "CUcontext": "context", "CUmodule": "module", "CUfunction": "function",
    "CUlibrary": "library", "CUkernel": "kernel", "CUstream": "stream",
    "CUevent": "event", "CUgraph": "graph", "CUgraphExec": "graph_exec",
    "CUgraphNode": "graph_node", "CUmemoryPool": "mem_pool", "CUarray": "array",
    "CUmipmappedArray": "mipmapped_array", "CUtexref": "texref",
    "CUsurfref": "surfref", "CUtexObject": "tex_object", "CUtexObject_v1": "tex_object",
    "CUsurfObject": "surf_object", "CUsurfObject_v1": "surf_object",
    "CUexternalMemory": "external_memory", "CUexternalSemaphore": "external_semaphore",
    "CUgraphicsResource": "graphics_resource", "CUlinkState": "link_state",
    "CUuserObject": "user_object", "CUgreenCtx": "green_ctx",
    "CUmemGenericAllocationHandle": "mem_handle",
    "CUmemGenericAllocationHandle_v1": "mem_handle",
    "CUlogsCallbackHandle": "log_callback", "CUdevice": "device", "CUdevice_v1": "device",
    "CUasyncCallbackHandle": "async_callback", "CUdevResourceDesc": "dev_resource_desc",
    "CUgraphConditionalHandle": "graph_conditional",
    # runtime
    "cudaStream_t": "stream", "cudaEvent_t": "event", "cudaGraph_t": "graph",
    "cudaGraphExec_t": "graph_exec", "cudaGraphNode_t": "graph_node",
    "cudaMemPool_t": "mem_pool", "cudaArray_t": "array", "cudaArray_const_t": "array",
    "cudaMipmappedArray_t": "mipmapped_array",
    "cudaMipmappedArray_const_t": "mipmapped_array",
    "cudaTextureObject_t": "tex_object", "cudaSurfaceObject_t": "surf_object",
    "cudaExternalMemory_t": "external_memory",
    "cudaExternalSemaphore_t": "external_semaphore",
    "cudaGraphicsResource_t": "graphics_resource", "cudaUserObject_t": "user_object",
    "cudaFunction_t": "function", "cudaKernel_t": "kernel", "cudaLibrary_t": "library",
    "cudaLogsCallbackHandle": "log_callback",
    "cudaAsyncCallbackHandle_t": "async_callback",
    "cudaGraphConditionalHandle": "graph_conditional",
}

DEVICE_PTR_TYPES = {"CUdeviceptr", "CUdeviceptr_v1", "CUdeviceptr_v2"}


class TypeIndex:
    """Type facts from the preprocessed headers (typedefs, function types)."""

    def __init__(self, home: str):
        self.home = home
        self.tmap = dict(hdr.typedef_map(home, "runtime"))
        self.tmap.update(hdr.typedef_map(home, "driver"))
        self.fn_types = hdr.function_typedefs(home, "driver") | hdr.function_typedefs(home, "runtime")
        # resolved pointer-to-struct form of each opaque handle typedef
        self.handle_by_resolved = {}
        for name, kind in HANDLE_KINDS.items():
            if name in self.tmap:
                r = self.strip_const(hdr.resolve_type(name, self.tmap))
                if r.startswith("struct ") and r.endswith("*"):
                    self.handle_by_resolved.setdefault(r, kind)

    @staticmethod
    def strip_const(t: str) -> str:
        return hdr.normalize_type([x for x in hdr.tokens(t) if x != "const"])

    def resolve(self, t: str) -> str:
        return hdr.resolve_type(t, self.tmap)

    def handle_kind(self, t: str) -> Optional[str]:
        """Kind when type t (by value) is an object handle."""
        toks = [x for x in hdr.tokens(t) if x != "const"]
        if len(toks) == 1 and toks[0] in HANDLE_KINDS:
            return HANDLE_KINDS[toks[0]]
        if "*" in toks:
            r = self.strip_const(self.resolve(t))
            return self.handle_by_resolved.get(r)
        return None

    def is_struct(self, t: str) -> bool:
        r = self.strip_const(self.resolve(t))
        return r.startswith(("struct ", "union ")) and "*" not in r

    def is_fn(self, t: str) -> bool:
        if "(*)" in t.replace(" ", ""):
            return True
        toks = [x for x in hdr.tokens(t) if x not in ("const", "*")]
        return len(toks) == 1 and toks[0] in self.fn_types


def split_ptr(t: str) -> Tuple[str, int, bool]:
    """'const char **' -> ('const char *', 2, pointee_const=False) where the
    first item is the pointee type (one level stripped), depth the number of
    '*' and pointee_const whether the immediate pointee is const."""
    toks = hdr.tokens(t)
    depth = toks.count("*")
    if depth == 0:
        return t, 0, False
    last = len(toks) - 1 - toks[::-1].index("*")
    before = toks[:last]
    if before and before[-1] == "const":
        pconst = True
        pointee = before[:-1]
    else:
        pconst = "*" not in before and "const" in before
        pointee = before
    return hdr.normalize_type(pointee), depth, pconst


# --------------------------------------------------------------------------
# Role heuristics (for functions that are not in the SUPPORTED tables):
#  * function pointer (or function-pointer typedef)         -> callback
#  * handle typedef by value (CUstream, cudaEvent_t, ...)    -> handle + kind
#  * CUdeviceptr by value                                    -> device_ptr
#  * other by-value types (ints, enums, structs)             -> scalar
#  * const char *                                            -> in_buffer, strlen(name) + 1
#  * char * with a len/length/size/bufferSize parameter      -> out_buffer of that size
#  * const void * / const T *                                -> in_buffer: the byte-size
#    parameter (ByteCount, bytesize, size, count, ...) or `n * sizeof(T)` for an array
#    with a count parameter, else sizeof(T), else '?'
#  * void * named like user data next to a callback          -> host_ptr
#  * void * in the runtime named like a device address       -> device_ptr
#  * void * named like host memory with a size (dstHost)     -> out_buffer of that size
#  * pointer to a non-const scalar / handle / struct         -> out_value (kind for handles);
#    a plural name with a count parameter makes it an array (out_buffer in getters,
#    in_buffer elsewhere)
#  * void ** named like a parameter array (kernelParams, extra, optionValues) -> in_buffer '?'
#  ROLE_FIXES below corrects the cases where these rules are plainly wrong.
# --------------------------------------------------------------------------

BYTE_SIZE_NAMES = ("ByteCount", "bytesize", "byteSize", "sizeBytes", "sizeInBytes", "numBytes",
                   "numbytes", "nbytes", "dataSize", "bufferSize", "size", "count", "length",
                   "len", "bytes", "N")
LEN_NAMES = ("len", "length", "bufferSize", "size", "bufSize", "logBufferSize",
             "nameSize", "count")
INPUT_PTR_NAMES = re.compile(r"(kernelParams|extra|args|OptionValues|optionValues|"
                             r"Options|options|paramsArray|Params$)")
USER_DATA_NAMES = re.compile(r"(user|User|^data$|^ctx$|^arg$|^userData$)")
FUNC_PTR_NAMES = re.compile(r"^(func|entry|symbol|hostFun|hostFunc|fn|pfn|symbolPtr|entryFuncAddr)$")
DEVICE_NAMES = re.compile(r"(^dev|Dev|^dptr$|^ptr$|^dst$|^src$|^ptr\d?$|Ptr$)")
COUNT_RE = re.compile(r"^(num[A-Z_]\w*|n[A-Z]\w*|nb[A-Z]\w*|count|\w*Count|\w*_count|numOps)$")
CREATE_MEMORY_FUNCS = re.compile(r"(Alloc|Malloc|IpcOpenMemHandle|ImportPointer|AddressReserve)")
DESTROY_FUNCS = re.compile(r"(Destroy|Unload|Free|Release|Unregister)")
# getters that return a handle of an object that exists already (its parent /
# owner), as opposed to lookups that hand out a new handle (GetFunction, ...)
NO_CREATE_FUNCS = re.compile(r"(Current|GetCtx|GetDevice|GetModule$|GetLibrary$|GetGreenCtx|"
                             r"GetCaptureInfo|GetContainingGraph|GetGraph$|GetOwningGraph|"
                             r"GetEvent$)")
SINGLE_STRUCT_NAMES = re.compile(r"(Desc|desc|Params|params|Prop|prop|[cC]onfig|Info|info)$")
OUT_ARRAY_FUNCS = re.compile(r"(Get|Query|Enumerate|Devices)")
IN_ARRAY_FUNCS = re.compile(r"(Update|Add|Set|Create|Launch|Batch|Copy|Remove|Instantiate|"
                            r"Memcpy|Wait|Signal|Prefetch|Discard|Decompress)")


def _singular(name: str) -> str:
    n = name[0].lower() + name[1:] if name else name
    return n[:-1] if n.endswith("s") and not n.endswith("ss") else n


def find_count(pname: str, params, self_index: int, strict: bool = False) -> Optional[Tuple[str, bool]]:
    """Element-count parameter for array parameter pname: (name, is_pointer).
    strict: only a count whose name matches the array's name, or `count`."""
    cands = []
    for j, q in enumerate(params):
        if j == self_index or not COUNT_RE.match(q.name):
            continue
        base, depth, _ = split_ptr(q.type)
        if depth > 1 or base.startswith(("struct", "CU", "cuda", "void", "char", "const")):
            continue
        cands.append((j, q.name, depth == 1))
    if not cands:
        return None
    n = pname[1:] if len(pname) > 1 and pname[0] == "p" and pname[1].isupper() else pname
    stem = _singular(n).lower()
    for j, n, isptr in cands:
        if stem and stem[:5] in n.lower():
            return n, isptr
    if strict:
        for j, n, isptr in cands:
            if n in ("count", "num", "n"):
                return n, isptr
        return None
    if len(cands) == 1:
        return cands[0][1], cands[0][2]
    after = [c for c in cands if c[0] > self_index]
    if after:
        return after[0][1], after[0][2]
    return None


def find_byte_size(params, self_index: int) -> Optional[str]:
    names = {q.name: q for q in params}
    for n in BYTE_SIZE_NAMES:
        q = names.get(n)
        if q is not None and params.index(q) != self_index:
            base, depth, _ = split_ptr(q.type)
            if depth == 0:
                return n
            if depth == 1:
                return "*" + n
    return None


def looks_plural(name: str) -> bool:
    return (name.endswith("s") and not name.endswith(("ss", "Status", "status", "Flags",
                                                      "flags", "Bytes", "bytes", "Address",
                                                      "Params", "params", "Elements")))\
        or bool(re.search(r"(List|list|[pP]arams?Array|SemArray)$", name))


def infer_param(fn: hdr.Prototype, i: int, ti: TypeIndex) -> Dict:
    params = fn.params
    p = params[i]
    t = p.type
    d: Dict = {"name": p.name, "type": t}
    runtime = fn.api == "runtime"

    def done(role, kind=None, size=None):
        d["role"] = role
        if kind:
            d["kind"] = kind
        if size is not None:
            d["size"] = size
        return d

    if t == "...":
        return done("scalar")
    if ti.is_fn(t):
        return done("callback")
    kind = ti.handle_kind(t)
    if kind:
        return done("handle", kind)
    pointee, depth, pconst = split_ptr(t)
    if depth == 0:
        if t in DEVICE_PTR_TYPES:
            return done("device_ptr")
        return done("scalar")

    pkind = ti.handle_kind(pointee)
    base_toks = [x for x in hdr.tokens(pointee) if x != "const"]
    is_void = base_toks == ["void"]
    is_char = base_toks == ["char"]

    # --- byte buffers: void * / char * ---
    if depth == 1 and (is_void or is_char):
        if pconst:
            if is_char:
                if p.name in ("hostFun",):
                    return done("host_ptr")
                return done("in_buffer", size=f"strlen({p.name}) + 1")
            if FUNC_PTR_NAMES.match(p.name):
                return done("host_ptr")
            if runtime and DEVICE_NAMES.search(p.name):
                return done("device_ptr")
            n = find_byte_size(params, i)
            return done("in_buffer", size=n or "?")
        # non-const
        if is_char:
            for n in LEN_NAMES:
                for j, q in enumerate(params):
                    if q.name == n and j != i:
                        _, qd, _ = split_ptr(q.type)
                        return done("out_buffer", size=n if qd == 0 else "*" + n)
            return done("out_buffer", size="?")
        if USER_DATA_NAMES.search(p.name) and any(ti.is_fn(q.type) for q in params):
            return done("host_ptr")
        if USER_DATA_NAMES.search(p.name) and "user" in p.name.lower():
            return done("host_ptr")
        if runtime and "Host" in fn.name and p.name in ("ptr", "pHost"):
            return done("host_ptr")
        if runtime and DEVICE_NAMES.search(p.name):
            return done("device_ptr")
        if re.search(r"Set", fn.name):
            n = find_byte_size(params, i)
            return done("in_buffer", size=n or "?")
        if "host" in p.name.lower() or "Host" in p.name:
            n = find_byte_size(params, i)
            return done("out_buffer", size=n) if n else done("host_ptr")
        if p.name in ("p", "ptr", "pHost", "hostPtr"):
            return done("host_ptr")
        n = find_byte_size(params, i)
        if n:
            return done("out_buffer", size=n)
        return done("out_buffer", size="?")

    # --- void ** / char ** (pointer to pointer) ---
    if depth == 2 and (is_void or pointee.endswith("*")) and pkind is None:
        if INPUT_PTR_NAMES.search(p.name):
            return done("in_buffer", size="?")
        if pconst:
            c = find_count(p.name, params, i)
            return done("in_buffer", size=f"{c[0]} * sizeof({pointee})" if c and not c[1] else "?")
        if runtime and CREATE_MEMORY_FUNCS.search(fn.name) and DEVICE_NAMES.search(p.name):
            return done("out_value", "memory")
        c = find_count(p.name, params, i) if looks_plural(p.name) else None
        if c and not OUT_ARRAY_FUNCS.search(fn.name):
            return done("in_buffer", size=(f"*{c[0]}" if c[1] else c[0]) + f" * sizeof({pointee})")
        return done("out_value")

    elem = TypeIndex.strip_const(pointee)        # element type for sizeof()

    def count_size(c):
        return (f"*{c[0]}" if c[1] else c[0]) + f" * sizeof({elem})"

    def array_role():
        # a non-const array is written by getters; other functions that take one
        # (cuMemMapArrayAsync, cuStreamUpdateCaptureDependencies) only read it
        if OUT_ARRAY_FUNCS.search(fn.name) and not IN_ARRAY_FUNCS.search(fn.name):
            return "out_buffer"
        return "in_buffer"

    # --- pointer to a handle ---
    if pkind is not None:
        # buffers of handles carry the kind of their elements
        if pconst:
            c = find_count(p.name, params, i)
            return done("in_buffer", pkind, size=count_size(c) if c else f"sizeof({elem})")
        c = find_count(p.name, params, i) if looks_plural(p.name) else None
        if c:
            return done(array_role(), pkind, size=count_size(c))
        return done("out_value", pkind)

    # --- pointer to a device pointer ---
    if elem in DEVICE_PTR_TYPES:
        if pconst:
            c = find_count(p.name, params, i)
            return done("in_buffer", size=count_size(c) if c else f"sizeof({elem})")
        c = find_count(p.name, params, i) if looks_plural(p.name) else None
        if c:
            return done(array_role(), size=count_size(c))
        if CREATE_MEMORY_FUNCS.search(fn.name):
            return done("out_value", "memory")
        return done("out_value")

    # --- pointer to struct / scalar ---
    struct = ti.is_struct(pointee)
    if pconst:
        c = None if SINGLE_STRUCT_NAMES.search(p.name) else find_count(p.name, params, i)
        return done("in_buffer", size=count_size(c) if c else f"sizeof({elem})")
    # non-const pointer
    if looks_plural(p.name):
        c = find_count(p.name, params, i, strict=not struct)
        if c:
            return done(array_role(), size=count_size(c))
    if struct and re.search(r"(param|Param|desc|Desc|config|Config|^args$|Args$|prop$|Prop$)", p.name) \
            and not re.search(r"Get", fn.name):
        return done("in_buffer", size=f"sizeof({elem})")
    return done("out_value")


def infer_objects(fn_name: str, params: List[Dict]) -> List[Dict]:
    objs: List[Dict] = []

    def add(kind, effect):
        e = {"kind": kind, "effect": effect}
        if e not in objs:
            objs.append(e)

    destroyed = None
    m = DESTROY_FUNCS.search(fn_name)
    if m and not re.search(r"(Get|Add|Set|Query)(?=[A-Z_]|$)", fn_name):
        # the kind named after the verb (cuGraphReleaseUserObject -> user_object),
        # else the first handle that is not a device
        after = re.sub(r"(_v\d+)?(_ptds|_ptsz)?$", "", fn_name[m.end():]).lower()
        handles = [q for q in params if q["role"] == "handle" and q.get("kind") not in (None, "device")]
        if "Free" in fn_name and any(q["role"] == "device_ptr" for q in params):
            destroyed = "memory"            # cuMemFree*, cuMemFreeAsync, cuMemAddressFree
        for q in handles if destroyed is None else []:
            k = q["kind"].replace("_", "")
            if after and (k in after or after in k):
                destroyed = q["kind"]
                break
        if destroyed is None and handles and "frame" not in after:
            destroyed = handles[0]["kind"]
    for q in params:
        if q["role"] in ("out_value", "out_buffer") and q.get("kind") and q["kind"] != "device" \
                and not NO_CREATE_FUNCS.search(fn_name):
            add(q["kind"], "create")
    if destroyed:
        add(destroyed, "destroy")
    for q in params:
        if q["role"] in ("handle", "in_buffer") and q.get("kind") and q["kind"] != destroyed:
            add(q["kind"], "use")
        elif q["role"] == "handle" and q.get("kind") == destroyed and \
                sum(1 for r in params if r.get("kind") == destroyed and r["role"] == "handle") > 1:
            add(q["kind"], "use")
    return objs


# --------------------------------------------------------------------------
# Supported functions: hand-checked roles (one table per API).
#
# params: "name=role[:kind][@size]; ..." in header order (names must match
# the header); objects: "kind:effect; ...". The same entry applies to the
# _ptds/_ptsz variants of the symbol.
# --------------------------------------------------------------------------

def P(params: str, objects: str = "") -> Dict[str, str]:
    return {"params": params, "objects": objects}


DEV = "dev=handle:device"
CAPTURE_INFO = ("hStream=handle:stream; captureStatus_out=out_value; id_out=out_value; graph_out=out_value:graph; "
                "dependencies_out=out_value")
DRIVER_SUPPORTED: Dict[str, Dict[str, str]] = {
    # pycuda (interceptor/legacy_launch.c, interceptor/copy2d.c)
    "cuFuncSetBlockShape": P("hfunc=handle:function; x=scalar; y=scalar; z=scalar", "function:use"),
    "cuFuncSetSharedSize": P("hfunc=handle:function; bytes=scalar", "function:use"),
    "cuParamSetSize": P("hfunc=handle:function; numbytes=scalar", "function:use"),
    "cuParamSeti": P("hfunc=handle:function; offset=scalar; value=scalar", "function:use"),
    "cuParamSetf": P("hfunc=handle:function; offset=scalar; value=scalar", "function:use"),
    "cuParamSetv": P("hfunc=handle:function; offset=scalar; ptr=in_buffer@numbytes; numbytes=scalar", "function:use"),
    "cuLaunch": P("f=handle:function", "function:use"),
    "cuLaunchGrid": P("f=handle:function; grid_width=scalar; grid_height=scalar", "function:use"),
    "cuLaunchGridAsync": P("f=handle:function; grid_width=scalar; grid_height=scalar; hStream=handle:stream",
                           "function:use; stream:use"),
    "cuCtxAttach": P("pctx=out_value:context; flags=scalar", "context:use"),   # the current one, counted
    "cuCtxDetach": P("ctx=handle:context", "context:use"),
    "cuMemAllocPitch_v2": P("dptr=out_value:memory; pPitch=out_value; WidthInBytes=scalar; Height=scalar; "
                            "ElementSizeBytes=scalar", "memory:create"),
    "cuMemcpy2D_v2": P("pCopy=in_buffer@sizeof(CUDA_MEMCPY2D)"),
    "cuMemcpy2DUnaligned_v2": P("pCopy=in_buffer@sizeof(CUDA_MEMCPY2D)"),
    "cuMemcpy2DAsync_v2": P("pCopy=in_buffer@sizeof(CUDA_MEMCPY2D); hStream=handle:stream", "stream:use"),
    "cuMemcpy3D_v2": P("pCopy=in_buffer@sizeof(CUDA_MEMCPY3D)"),
    "cuMemcpy3DAsync_v2": P("pCopy=in_buffer@sizeof(CUDA_MEMCPY3D); hStream=handle:stream", "stream:use"),
    "cuMemsetD2D8_v2": P("dstDevice=device_ptr; dstPitch=scalar; uc=scalar; Width=scalar; Height=scalar"),
    "cuMemsetD2D16_v2": P("dstDevice=device_ptr; dstPitch=scalar; us=scalar; Width=scalar; Height=scalar"),
    "cuMemsetD2D32_v2": P("dstDevice=device_ptr; dstPitch=scalar; ui=scalar; Width=scalar; Height=scalar"),
    "cuMemsetD2D8Async": P("dstDevice=device_ptr; dstPitch=scalar; uc=scalar; Width=scalar; Height=scalar; "
                           "hStream=handle:stream", "stream:use"),
    "cuMemsetD2D16Async": P("dstDevice=device_ptr; dstPitch=scalar; us=scalar; Width=scalar; Height=scalar; "
                            "hStream=handle:stream", "stream:use"),
    "cuMemsetD2D32Async": P("dstDevice=device_ptr; dstPitch=scalar; ui=scalar; Width=scalar; Height=scalar; "
                            "hStream=handle:stream", "stream:use"),
    "cuInit": P("Flags=scalar"),
    "cuDriverGetVersion": P("driverVersion=out_value"),
    "cuDeviceGet": P("device=out_value:device; ordinal=scalar"),
    "cuDeviceGetCount": P("count=out_value"),
    "cuDeviceGetName": P(f"name=out_buffer@len; len=scalar; {DEV}", "device:use"),
    "cuDeviceGetUuid": P(f"uuid=out_value; {DEV}", "device:use"),
    "cuDeviceGetUuid_v2": P(f"uuid=out_value; {DEV}", "device:use"),
    "cuDeviceTotalMem_v2": P(f"bytes=out_value; {DEV}", "device:use"),
    "cuDeviceGetAttribute": P(f"pi=out_value; attrib=scalar; {DEV}", "device:use"),
    "cuDeviceGetPCIBusId": P(f"pciBusId=out_buffer@len; len=scalar; {DEV}", "device:use"),
    "cuDeviceComputeCapability": P(f"major=out_value; minor=out_value; {DEV}", "device:use"),
    "cuDeviceGetProperties": P(f"prop=out_value; {DEV}", "device:use"),
    "cuDeviceCanAccessPeer": P(f"canAccessPeer=out_value; {DEV}; peerDev=handle:device",
                               "device:use"),
    # several GPUs in one process (interceptor/peer.c)
    "cuCtxEnablePeerAccess": P("peerContext=handle:context; Flags=scalar", "context:use"),
    "cuCtxDisablePeerAccess": P("peerContext=handle:context", "context:use"),
    "cuMemcpyPeer": P("dstDevice=device_ptr; dstContext=handle:context; srcDevice=device_ptr; "
                      "srcContext=handle:context; ByteCount=scalar", "context:use"),
    "cuMemcpyPeerAsync": P("dstDevice=device_ptr; dstContext=handle:context; srcDevice=device_ptr; "
                           "srcContext=handle:context; ByteCount=scalar; hStream=handle:stream",
                           "context:use; stream:use"),
    "cuMemcpy3DPeer": P("pCopy=in_buffer@sizeof(CUDA_MEMCPY3D_PEER)"),
    "cuMemcpy3DPeerAsync": P("pCopy=in_buffer@sizeof(CUDA_MEMCPY3D_PEER); hStream=handle:stream", "stream:use"),
    "cuDevicePrimaryCtxRetain": P(f"pctx=out_value:context; {DEV}",
                                  "context:create; device:use"),
    "cuDevicePrimaryCtxRelease_v2": P(DEV, "context:destroy; device:use"),
    "cuDevicePrimaryCtxReset_v2": P(DEV, "context:destroy; device:use"),
    "cuDevicePrimaryCtxGetState": P(f"{DEV}; flags=out_value; active=out_value", "device:use"),
    "cuDevicePrimaryCtxSetFlags_v2": P(f"{DEV}; flags=scalar", "device:use"),
    "cuCtxCreate_v4": P("pctx=out_value:context; ctxCreateParams=in_buffer@sizeof(CUctxCreateParams);"
                        f" flags=scalar; {DEV}", "context:create; device:use"),
    "cuCtxDestroy_v2": P("ctx=handle:context", "context:destroy"),
    "cuCtxPushCurrent_v2": P("ctx=handle:context", "context:use"),
    "cuCtxPopCurrent_v2": P("pctx=out_value:context", "context:use"),
    "cuCtxSetCurrent": P("ctx=handle:context", "context:use"),
    "cuCtxGetCurrent": P("pctx=out_value:context", "context:use"),
    "cuCtxGetDevice": P("device=out_value:device"),
    "cuCtxSynchronize": P(""),
    "cuCtxGetApiVersion": P("ctx=handle:context; version=out_value", "context:use"),
    "cuCtxGetFlags": P("flags=out_value"),
    "cuCtxSetLimit": P("limit=scalar; value=scalar"),
    "cuCtxGetLimit": P("pvalue=out_value; limit=scalar"),
    "cuCtxGetStreamPriorityRange": P("leastPriority=out_value; greatestPriority=out_value"),
    "cuCtxGetCacheConfig": P("pconfig=out_value"),
    "cuCtxSetCacheConfig": P("config=scalar"),
    "cuModuleLoad": P("module=out_value:module; fname=in_buffer@strlen(fname) + 1",
                      "module:create"),
    # image/fatCubin: the size is found by parsing the image (shim override)
    "cuModuleLoadData": P("module=out_value:module; image=in_buffer@?", "module:create"),
    "cuModuleLoadDataEx": P("module=out_value:module; image=in_buffer@?; numOptions=scalar; "
                            "options=in_buffer@numOptions * sizeof(CUjit_option); "
                            "optionValues=in_buffer@numOptions * sizeof(void *)",
                            "module:create"),
    "cuModuleLoadFatBinary": P("module=out_value:module; fatCubin=in_buffer@?", "module:create"),
    # the JIT linker (interceptor/link.c, proxyd/families/link.py)
    "cuLinkCreate": P("numOptions=scalar; options=in_buffer@numOptions * sizeof(CUjit_option); optionValues=in_buffer@?; stateOut=out_value:link_state", "link_state:create"),
    "cuLinkCreate_v2": P("numOptions=scalar; options=in_buffer@numOptions * sizeof(CUjit_option); optionValues=in_buffer@?; stateOut=out_value:link_state", "link_state:create"),
    "cuLinkAddData": P("state=handle:link_state; type=scalar; data=in_buffer@size; size=scalar; "
                       "name=in_buffer@strlen(name) + 1; numOptions=scalar; options=in_buffer@numOptions * sizeof(CUjit_option); optionValues=in_buffer@?", "link_state:use"),
    "cuLinkAddData_v2": P("state=handle:link_state; type=scalar; data=in_buffer@size; size=scalar; "
                          "name=in_buffer@strlen(name) + 1; numOptions=scalar; options=in_buffer@numOptions * sizeof(CUjit_option); optionValues=in_buffer@?", "link_state:use"),
    "cuLinkAddFile": P("state=handle:link_state; type=scalar; path=in_buffer@strlen(path) + 1; "
                       "numOptions=scalar; options=in_buffer@numOptions * sizeof(CUjit_option); optionValues=in_buffer@?", "link_state:use"),
    "cuLinkAddFile_v2": P("state=handle:link_state; type=scalar; path=in_buffer@strlen(path) + 1; "
                          "numOptions=scalar; options=in_buffer@numOptions * sizeof(CUjit_option); optionValues=in_buffer@?", "link_state:use"),
    "cuLinkComplete": P("state=handle:link_state; cubinOut=out_value; sizeOut=out_value", "link_state:use"),
    "cuLinkDestroy": P("state=handle:link_state", "link_state:destroy"),
    "cuModuleUnload": P("hmod=handle:module", "module:destroy"),
    "cuModuleGetFunction": P("hfunc=out_value:function; hmod=handle:module; "
                             "name=in_buffer@strlen(name) + 1", "function:create; module:use"),
    "cuModuleGetGlobal_v2": P("dptr=out_value; bytes=out_value; hmod=handle:module; "
                              "name=in_buffer@strlen(name) + 1", "module:use"),
    "cuModuleGetLoadingMode": P("mode=out_value"),
    "cuFuncGetAttribute": P("pi=out_value; attrib=scalar; hfunc=handle:function", "function:use"),
    "cuFuncSetAttribute": P("hfunc=handle:function; attrib=scalar; value=scalar", "function:use"),
    "cuFuncSetCacheConfig": P("hfunc=handle:function; config=scalar", "function:use"),
    "cuFuncGetParamInfo": P("func=handle:function; paramIndex=scalar; paramOffset=out_value; "
                            "paramSize=out_value", "function:use"),
    "cuFuncGetName": P("name=out_value; hfunc=handle:function", "function:use"),
    "cuMemAlloc_v2": P("dptr=out_value:memory; bytesize=scalar", "memory:create"),
    "cuMemFree_v2": P("dptr=device_ptr", "memory:destroy"),
    "cuMemGetInfo_v2": P("free=out_value; total=out_value"),
    "cuMemAllocHost_v2": P("pp=out_value; bytesize=scalar"),
    "cuMemFreeHost": P("p=host_ptr"),
    "cuMemHostAlloc": P("pp=out_value; bytesize=scalar; Flags=scalar"),
    "cuMemGetAddressRange_v2": P("pbase=out_value; psize=out_value; dptr=device_ptr"),
    # cuMemcpy/cuMemcpyAsync: unified addresses, either side may be host memory
    "cuMemcpy": P("dst=device_ptr; src=device_ptr; ByteCount=scalar"),
    "cuMemcpyAsync": P("dst=device_ptr; src=device_ptr; ByteCount=scalar; hStream=handle:stream",
                       "stream:use"),
    "cuMemcpyHtoD_v2": P("dstDevice=device_ptr; srcHost=in_buffer@ByteCount; ByteCount=scalar"),
    "cuMemcpyDtoH_v2": P("dstHost=out_buffer@ByteCount; srcDevice=device_ptr; ByteCount=scalar"),
    "cuMemcpyDtoD_v2": P("dstDevice=device_ptr; srcDevice=device_ptr; ByteCount=scalar"),
    "cuMemcpyHtoDAsync_v2": P("dstDevice=device_ptr; srcHost=in_buffer@ByteCount; "
                              "ByteCount=scalar; hStream=handle:stream", "stream:use"),
    "cuMemcpyDtoHAsync_v2": P("dstHost=out_buffer@ByteCount; srcDevice=device_ptr; "
                              "ByteCount=scalar; hStream=handle:stream", "stream:use"),
    "cuMemcpyDtoDAsync_v2": P("dstDevice=device_ptr; srcDevice=device_ptr; ByteCount=scalar; "
                              "hStream=handle:stream", "stream:use"),
    "cuMemsetD8_v2": P("dstDevice=device_ptr; uc=scalar; N=scalar"),
    "cuMemsetD16_v2": P("dstDevice=device_ptr; us=scalar; N=scalar"),
    "cuMemsetD32_v2": P("dstDevice=device_ptr; ui=scalar; N=scalar"),
    "cuMemsetD8Async": P("dstDevice=device_ptr; uc=scalar; N=scalar; hStream=handle:stream",
                         "stream:use"),
    "cuMemsetD16Async": P("dstDevice=device_ptr; us=scalar; N=scalar; hStream=handle:stream",
                          "stream:use"),
    "cuMemsetD32Async": P("dstDevice=device_ptr; ui=scalar; N=scalar; hStream=handle:stream",
                          "stream:use"),
    "cuStreamCreate": P("phStream=out_value:stream; Flags=scalar", "stream:create"),
    "cuStreamCreateWithPriority": P("phStream=out_value:stream; flags=scalar; priority=scalar",
                                    "stream:create"),
    "cuStreamDestroy_v2": P("hStream=handle:stream", "stream:destroy"),
    "cuStreamSynchronize": P("hStream=handle:stream", "stream:use"),
    "cuStreamQuery": P("hStream=handle:stream", "stream:use"),
    "cuStreamWaitEvent": P("hStream=handle:stream; hEvent=handle:event; Flags=scalar",
                           "stream:use; event:use"),
    "cuStreamGetPriority": P("hStream=handle:stream; priority=out_value", "stream:use"),
    "cuStreamGetFlags": P("hStream=handle:stream; flags=out_value", "stream:use"),
    "cuEventCreate": P("phEvent=out_value:event; Flags=scalar", "event:create"),
    "cuEventRecord": P("hEvent=handle:event; hStream=handle:stream", "event:use; stream:use"),
    "cuEventRecordWithFlags": P("hEvent=handle:event; hStream=handle:stream; flags=scalar",
                                "event:use; stream:use"),
    "cuEventQuery": P("hEvent=handle:event", "event:use"),
    "cuEventSynchronize": P("hEvent=handle:event", "event:use"),
    "cuEventElapsedTime": P("pMilliseconds=out_value; hStart=handle:event; hEnd=handle:event",
                            "event:use"),
    "cuEventElapsedTime_v2": P("pMilliseconds=out_value; hStart=handle:event; hEnd=handle:event",
                               "event:use"),
    "cuEventDestroy_v2": P("hEvent=handle:event", "event:destroy"),
    # kernelParams/extra: layout known only from the kernel's parameter info
    "cuLaunchKernel": P("f=handle:function; gridDimX=scalar; gridDimY=scalar; gridDimZ=scalar; "
                        "blockDimX=scalar; blockDimY=scalar; blockDimZ=scalar; "
                        "sharedMemBytes=scalar; hStream=handle:stream; kernelParams=in_buffer@?; "
                        "extra=in_buffer@?", "function:use; stream:use"),
    "cuOccupancyMaxActiveBlocksPerMultiprocessor": P(
        "numBlocks=out_value; func=handle:function; blockSize=scalar; dynamicSMemSize=scalar",
        "function:use"),
    "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags": P(
        "numBlocks=out_value; func=handle:function; blockSize=scalar; dynamicSMemSize=scalar; "
        "flags=scalar", "function:use"),
    "cuGetProcAddress": P("symbol=in_buffer@strlen(symbol) + 1; pfn=out_value; "
                          "cudaVersion=scalar; flags=scalar"),
    "cuGetProcAddress_v2": P("symbol=in_buffer@strlen(symbol) + 1; pfn=out_value; "
                             "cudaVersion=scalar; flags=scalar; symbolStatus=out_value"),
    "cuGetErrorString": P("error=scalar; pStr=out_value"),
    "cuGetErrorName": P("error=scalar; pStr=out_value"),
    # issue 10, group 6/7: launch variants, stream attributes, small things
    "cuStreamGetAttribute": P("hStream=handle:stream; attr=scalar; value_out=out_value", "stream:use"),
    "cuStreamSetAttribute": P("hStream=handle:stream; attr=scalar; value=in_buffer@sizeof(CUstreamAttrValue)", "stream:use"),
    "cuStreamCopyAttributes": P("dst=handle:stream; src=handle:stream", "stream:use"),
    "cuProfilerStart": P(""),
    "cuCtxResetPersistingL2Cache": P(""),
    "cuProfilerStop": P(""),
    "cuDeviceGetP2PAttribute": P("value=out_value; attrib=scalar; srcDevice=handle:device; dstDevice=handle:device", "device:use"),
    "cuLaunchKernelEx": P("config=in_buffer@sizeof(CUlaunchConfig); f=handle:function; kernelParams=in_buffer@?; extra=in_buffer@?", "function:use"),
    "cuLaunchCooperativeKernel": P("f=handle:function; gridDimX=scalar; gridDimY=scalar; gridDimZ=scalar; blockDimX=scalar; blockDimY=scalar; blockDimZ=scalar; sharedMemBytes=scalar; hStream=handle:stream; kernelParams=in_buffer@?", "function:use; stream:use"),
    "cuOccupancyMaxPotentialBlockSize": P("minGridSize=out_value; blockSize=out_value; func=handle:function; blockSizeToDynamicSMemSize=callback; dynamicSMemSize=scalar; blockSizeLimit=scalar", "function:use"),
    "cuOccupancyMaxPotentialBlockSizeWithFlags": P("minGridSize=out_value; blockSize=out_value; func=handle:function; blockSizeToDynamicSMemSize=callback; dynamicSMemSize=scalar; blockSizeLimit=scalar; flags=scalar", "function:use"),
    "cuOccupancyAvailableDynamicSMemPerBlock": P("dynamicSmemSize=out_value; func=handle:function; numBlocks=scalar; blockSize=scalar", "function:use"),
    # issue 10, group 1: host memory the GPU reaches (interceptor/hostmap_api.c)
    "cuMemHostRegister": P("p=host_ptr; bytesize=scalar; Flags=scalar"),
    "cuMemHostRegister_v2": P("p=host_ptr; bytesize=scalar; Flags=scalar"),
    "cuMemHostUnregister": P("p=host_ptr"),
    "cuMemHostGetDevicePointer_v2": P("pdptr=out_value; p=host_ptr; Flags=scalar"),
    "cuMemHostGetFlags": P("pFlags=out_value; p=host_ptr"),
    "cuMemAllocManaged": P("dptr=out_value:memory; bytesize=scalar; flags=scalar", "memory:create"),
    "cuMemPrefetchAsync_v2": P("devPtr=device_ptr; count=scalar; location=scalar; flags=scalar; hStream=handle:stream",
                               "stream:use"),
    "cuMemAdvise_v2": P("devPtr=device_ptr; count=scalar; advice=scalar; location=scalar"),
    # issue 26: accepted in the shim (managed memory is host memory; interceptor/hostmap_api.c)
    "cuStreamAttachMemAsync": P("hStream=handle:stream; dptr=device_ptr; length=scalar; flags=scalar", "stream:use"),
    # issue 10, group 8: IPC between clients of one proxyd (proxyd/families/ipc.py)
    "cuIpcGetMemHandle": P("pHandle=out_value; dptr=device_ptr"),
    "cuIpcGetEventHandle": P("pHandle=out_value; event=handle:event", "event:use"),
    "cuOccupancyMaxActiveClusters": P("numClusters=out_value; func=handle:function; "
                                      "config=in_buffer@sizeof(CUlaunchConfig)", "function:use"),
    "cuIpcOpenEventHandle": P("phEvent=out_value:event; handle=scalar", "event:create"),
    "cuIpcOpenMemHandle_v2": P("pdptr=out_value:memory; handle=scalar; Flags=scalar", "memory:create"),
    "cuIpcCloseMemHandle": P("dptr=device_ptr"),
    # static CUDA runtime (interceptor/export_tables.c, library.c, pointer_attrs.c, capture.c)
    "cuGetExportTable": P("ppExportTable=out_value; pExportTableId=in_buffer@sizeof(CUuuid)"),
    "cuCtxGetDevice_v2": P("device=out_value:device; ctx=handle:context", "context:use"),
    "cuCtxSynchronize_v2": P("ctx=handle:context", "context:use"),
    "cuDevicePrimaryCtxRelease": P(DEV, "context:destroy; device:use"),
    "cuDevicePrimaryCtxReset": P(DEV, "context:destroy; device:use"),
    "cuPointerGetAttributes": P("numAttributes=scalar; attributes=in_buffer@numAttributes * sizeof(CUpointer_attribute); "
                                "data=out_buffer@numAttributes * sizeof(void *); ptr=device_ptr"),
    # one attribute (interceptor/pointer_attrs.c): Triton's launcher asks it of every pointer argument
    "cuPointerGetAttribute": P("data=out_buffer@?; attribute=scalar; ptr=device_ptr"),
    "cuLibraryLoadData": P("library=out_value:library; code=in_buffer@?; "
                           "jitOptions=in_buffer@numJitOptions * sizeof(CUjit_option); jitOptionsValues=in_buffer@?; "
                           "numJitOptions=scalar; "
                           "libraryOptions=in_buffer@numLibraryOptions * sizeof(CUlibraryOption); "
                           "libraryOptionValues=in_buffer@?; numLibraryOptions=scalar", "library:create"),
    "cuLibraryUnload": P("library=handle:library", "library:destroy"),
    "cuLibraryGetKernel": P("pKernel=out_value:kernel; library=handle:library; name=in_buffer@strlen(name) + 1",
                            "kernel:create; library:use"),
    "cuLibraryGetModule": P("pMod=out_value:module; library=handle:library", "library:use"),
    "cuKernelGetFunction": P("pFunc=out_value:function; kernel=handle:kernel", "function:create; kernel:use"),
    "cuLibraryGetGlobal": P("dptr=out_value; bytes=out_value; library=handle:library; name=in_buffer@strlen(name) + 1",
                            "library:use"),
    "cuKernelGetAttribute": P("pi=out_value; attrib=scalar; kernel=handle:kernel; dev=handle:device",
                              "kernel:use; device:use"),
    "cuKernelSetAttribute": P("attrib=scalar; val=scalar; kernel=handle:kernel; dev=handle:device",
                              "kernel:use; device:use"),
    "cuKernelSetCacheConfig": P("kernel=handle:kernel; config=scalar; dev=handle:device", "kernel:use; device:use"),
    "cuKernelGetName": P("name=out_value; hfunc=handle:kernel", "kernel:use"),
    "cuKernelGetParamInfo": P("kernel=handle:kernel; paramIndex=scalar; paramOffset=out_value; paramSize=out_value",
                              "kernel:use"),
    # issue 10, group 2: host functions (interceptor/hostfn.c)
    "cuLaunchHostFunc": P("hStream=handle:stream; fn=callback; userData=host_ptr", "stream:use"),
    "cuStreamAddCallback": P("hStream=handle:stream; callback=callback; userData=host_ptr; flags=scalar", "stream:use"),
    # issue 10, group 4: stream-ordered allocator and pools (proxyd/families/mempool.py)
    "cuMemAllocAsync": P("dptr=out_value:memory; bytesize=scalar; hStream=handle:stream", "memory:create; stream:use"),
    "cuMemFreeAsync": P("dptr=device_ptr; hStream=handle:stream", "memory:destroy; stream:use"),
    "cuMemAllocFromPoolAsync": P("dptr=out_value:memory; bytesize=scalar; pool=handle:mem_pool; hStream=handle:stream",
                                 "memory:create; mem_pool:use; stream:use"),
    "cuMemPoolTrimTo": P("pool=handle:mem_pool; minBytesToKeep=scalar", "mem_pool:use"),
    "cuMemPoolSetAttribute": P("pool=handle:mem_pool; attr=scalar; value=in_buffer@?", "mem_pool:use"),
    "cuMemPoolGetAttribute": P("pool=handle:mem_pool; attr=scalar; value=out_buffer@?", "mem_pool:use"),
    "cuMemPoolSetAccess": P("pool=handle:mem_pool; map=in_buffer@count * sizeof(CUmemAccessDesc); count=scalar",
                            "mem_pool:use"),
    "cuMemPoolGetAccess": P("flags=out_value; memPool=handle:mem_pool; location=in_buffer@sizeof(CUmemLocation)",
                            "mem_pool:use"),
    "cuMemPoolCreate": P("pool=out_value:mem_pool; poolProps=in_buffer@sizeof(CUmemPoolProps)", "mem_pool:create"),
    # exportable pools between clients of one proxyd (proxyd/families/mempool_ipc.py, interceptor/mempool_ipc.c)
    "cuMemPoolExportToShareableHandle": P("handle_out=out_buffer@?; pool=handle:mem_pool; handleType=scalar; "
                                          "flags=scalar", "mem_pool:use"),
    "cuMemPoolImportFromShareableHandle": P("pool_out=out_value:mem_pool; handle=host_ptr; handleType=scalar; "
                                            "flags=scalar", "mem_pool:create"),
    "cuMemPoolExportPointer": P("shareData_out=out_value; ptr=device_ptr"),
    "cuMemPoolImportPointer": P("ptr_out=out_value:memory; pool=handle:mem_pool; "
                                "shareData=in_buffer@sizeof(CUmemPoolPtrExportData)", "memory:create; mem_pool:use"),
    "cuMemPoolDestroy": P("pool=handle:mem_pool", "mem_pool:destroy"),
    "cuDeviceSetMemPool": P(f"{DEV}; pool=handle:mem_pool", "device:use; mem_pool:use"),
    "cuDeviceGetMemPool": P(f"pool=out_value:mem_pool; {DEV}", "mem_pool:create; device:use"),
    "cuDeviceGetDefaultMemPool": P(f"pool_out=out_value:mem_pool; {DEV}", "mem_pool:create; device:use"),
    # issue 10, group 5: CUDA arrays, texture and surface objects (proxyd/families/arrays.py, interceptor/arrays.c)
    # mipmapped arrays (proxyd/families/arrays.py): levels are array objects
    "cuMipmappedArrayCreate": P("pHandle=out_value:mipmapped_array; "
                                "pMipmappedArrayDesc=in_buffer@sizeof(CUDA_ARRAY3D_DESCRIPTOR); numMipmapLevels=scalar",
                                "mipmapped_array:create"),
    "cuMipmappedArrayGetLevel": P("pLevelArray=out_value:array; hMipmappedArray=handle:mipmapped_array; level=scalar",
                                  "array:create; mipmapped_array:use"),
    "cuMipmappedArrayDestroy": P("hMipmappedArray=handle:mipmapped_array", "mipmapped_array:destroy"),
    "cuArrayCreate_v2": P("pHandle=out_value:array; pAllocateArray=in_buffer@sizeof(CUDA_ARRAY_DESCRIPTOR)",
                          "array:create"),
    "cuArray3DCreate_v2": P("pHandle=out_value:array; pAllocateArray=in_buffer@sizeof(CUDA_ARRAY3D_DESCRIPTOR)",
                            "array:create"),
    "cuArrayDestroy": P("hArray=handle:array", "array:destroy"),
    "cuArrayGetDescriptor_v2": P("pArrayDescriptor=out_value; hArray=handle:array", "array:use"),
    "cuArray3DGetDescriptor_v2": P("pArrayDescriptor=out_value; hArray=handle:array", "array:use"),
    "cuMemcpyHtoA_v2": P("dstArray=handle:array; dstOffset=scalar; srcHost=in_buffer@ByteCount; ByteCount=scalar",
                         "array:use"),
    "cuMemcpyAtoH_v2": P("dstHost=out_buffer@ByteCount; srcArray=handle:array; srcOffset=scalar; ByteCount=scalar",
                         "array:use"),
    "cuMemcpyDtoA_v2": P("dstArray=handle:array; dstOffset=scalar; srcDevice=device_ptr; ByteCount=scalar",
                         "array:use"),
    "cuMemcpyAtoD_v2": P("dstDevice=device_ptr; srcArray=handle:array; srcOffset=scalar; ByteCount=scalar",
                         "array:use"),
    "cuMemcpyAtoA_v2": P("dstArray=handle:array; dstOffset=scalar; srcArray=handle:array; srcOffset=scalar; "
                         "ByteCount=scalar", "array:use"),
    "cuMemcpyHtoAAsync_v2": P("dstArray=handle:array; dstOffset=scalar; srcHost=in_buffer@ByteCount; "
                              "ByteCount=scalar; hStream=handle:stream", "array:use; stream:use"),
    "cuMemcpyAtoHAsync_v2": P("dstHost=out_buffer@ByteCount; srcArray=handle:array; srcOffset=scalar; "
                              "ByteCount=scalar; hStream=handle:stream", "array:use; stream:use"),
    "cuTexObjectCreate": P("pTexObject=out_value:tex_object; pResDesc=in_buffer@sizeof(CUDA_RESOURCE_DESC); "
                           "pTexDesc=in_buffer@sizeof(CUDA_TEXTURE_DESC); "
                           "pResViewDesc=in_buffer@sizeof(CUDA_RESOURCE_VIEW_DESC)", "tex_object:create"),
    "cuTexObjectDestroy": P("texObject=handle:tex_object", "tex_object:destroy"),
    "cuTexObjectGetResourceDesc": P("pResDesc=out_value; texObject=handle:tex_object", "tex_object:use"),
    "cuTexObjectGetTextureDesc": P("pTexDesc=out_value; texObject=handle:tex_object", "tex_object:use"),
    "cuTexObjectGetResourceViewDesc": P("pResViewDesc=out_value; texObject=handle:tex_object", "tex_object:use"),
    "cuSurfObjectCreate": P("pSurfObject=out_value:surf_object; pResDesc=in_buffer@sizeof(CUDA_RESOURCE_DESC)",
                            "surf_object:create"),
    "cuSurfObjectDestroy": P("surfObject=handle:surf_object", "surf_object:destroy"),
    "cuSurfObjectGetResourceDesc": P("pResDesc=out_value; surfObject=handle:surf_object", "surf_object:use"),
    # issue 10, group 4: the application's VMM (proxyd/families/vmm.py)
    "cuMemAddressReserve": P("ptr=out_value:memory; size=scalar; alignment=scalar; addr=device_ptr; flags=scalar",
                             "memory:create"),
    "cuMemAddressFree": P("ptr=device_ptr; size=scalar", "memory:destroy"),
    "cuMemCreate": P("handle=out_value:mem_handle; size=scalar; prop=in_buffer@sizeof(CUmemAllocationProp); "
                     "flags=scalar", "mem_handle:create"),
    "cuMemRelease": P("handle=handle:mem_handle", "mem_handle:destroy"),
    "cuMemMap": P("ptr=device_ptr; size=scalar; offset=scalar; handle=handle:mem_handle; flags=scalar",
                  "mem_handle:use"),
    "cuMemUnmap": P("ptr=device_ptr; size=scalar"),
    "cuMemSetAccess": P("ptr=device_ptr; size=scalar; desc=in_buffer@count * sizeof(CUmemAccessDesc); count=scalar"),
    "cuMemGetAccess": P("flags=out_value; location=in_buffer@sizeof(CUmemLocation); ptr=device_ptr"),
    "cuMemGetAllocationGranularity": P("granularity=out_value; prop=in_buffer@sizeof(CUmemAllocationProp); "
                                       "option=scalar"),
    "cuMemGetAllocationPropertiesFromHandle": P("prop=out_value; handle=handle:mem_handle", "mem_handle:use"),
    # issue 10, group 3: graphs from stream capture (proxyd/families/graphs.py)
    "cuStreamBeginCapture_v2": P("hStream=handle:stream; mode=scalar", "stream:use"),
    "cuStreamBeginCaptureToGraph": P("hStream=handle:stream; hGraph=handle:graph; dependencies=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); dependencyData=in_buffer@numDependencies * sizeof(CUgraphEdgeData); numDependencies=scalar; mode=scalar", "stream:use; graph:use; graph_node:use"),
    "cuStreamEndCapture": P("hStream=handle:stream; phGraph=out_value:graph", "graph:create; stream:use"),
    "cuStreamIsCapturing": P("hStream=handle:stream; captureStatus=out_value", "stream:use"),
    # (interceptor/capture.c): status, id and graph from the worker; no dependency nodes
    "cuStreamGetCaptureInfo_v3": P(CAPTURE_INFO + "; edgeData_out=out_value; numDependencies_out=out_value",
                                   "stream:use"),
    "cuStreamGetCaptureInfo_v2": P(CAPTURE_INFO + "; numDependencies_out=out_value", "stream:use"),
    # conditional nodes added to a capture (proxyd/families/graph_cond_capture.py)
    "cuStreamUpdateCaptureDependencies": P("hStream=handle:stream; dependencies=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); numDependencies=scalar; flags=scalar", "stream:use; graph_node:use"),
    "cuStreamUpdateCaptureDependencies_v2": P("hStream=handle:stream; dependencies=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); dependencyData=in_buffer@numDependencies * sizeof(CUgraphEdgeData); numDependencies=scalar; flags=scalar", "stream:use; graph_node:use"),
    "cuThreadExchangeStreamCaptureMode": P("mode=out_value"),
    "cuGraphInstantiateWithFlags": P("phGraphExec=out_value:graph_exec; hGraph=handle:graph; flags=scalar",
                                     "graph_exec:create; graph:use"),
    "cuGraphInstantiate_v2": P("phGraphExec=out_value:graph_exec; hGraph=handle:graph; "
                               "phErrorNode=out_value:graph_node; logBuffer=out_buffer@bufferSize; bufferSize=scalar",
                               "graph_exec:create; graph_node:create; graph:use"),
    "cuGraphLaunch": P("hGraphExec=handle:graph_exec; hStream=handle:stream", "graph_exec:use; stream:use"),
    "cuGraphDestroy": P("hGraph=handle:graph", "graph:destroy"),
    "cuGraphExecDestroy": P("hGraphExec=handle:graph_exec", "graph_exec:destroy"),
    # issue 10, group 3: graphs built explicitly (proxyd/families/graph_nodes.py, interceptor/graph_build.c)
    "cuGraphDebugDotPrint": P("hGraph=handle:graph; path=in_buffer@strlen(path) + 1; flags=scalar", "graph:use"),
    "cuGraphCreate": P("phGraph=out_value:graph; flags=scalar", "graph:create"),
    "cuGraphConditionalHandleCreate": P("pHandle_out=out_value:graph_conditional; hGraph=handle:graph; ctx=handle:context; defaultLaunchValue=scalar; flags=scalar", "graph_conditional:create; graph:use; context:use"),
    "cuGraphAddKernelNode": P("phGraphNode=out_value:graph_node; hGraph=handle:graph; dependencies=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); numDependencies=scalar; nodeParams=in_buffer@sizeof(CUDA_KERNEL_NODE_PARAMS_v1)", "graph_node:create; graph:use; graph_node:use"),
    "cuGraphAddKernelNode_v2": P("phGraphNode=out_value:graph_node; hGraph=handle:graph; dependencies=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); numDependencies=scalar; nodeParams=in_buffer@sizeof(CUDA_KERNEL_NODE_PARAMS)", "graph_node:create; graph:use; graph_node:use"),
    "cuGraphKernelNodeSetParams_v2": P("hNode=handle:graph_node; nodeParams=in_buffer@sizeof(CUDA_KERNEL_NODE_PARAMS)", "graph_node:use"),
    "cuGraphAddMemcpyNode": P("phGraphNode=out_value:graph_node; hGraph=handle:graph; dependencies=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); numDependencies=scalar; copyParams=in_buffer@sizeof(CUDA_MEMCPY3D); ctx=handle:context", "graph_node:create; graph:use; graph_node:use; context:use"),
    "cuGraphMemcpyNodeSetParams": P("hNode=handle:graph_node; nodeParams=in_buffer@sizeof(CUDA_MEMCPY3D)", "graph_node:use"),
    "cuGraphAddMemsetNode": P("phGraphNode=out_value:graph_node; hGraph=handle:graph; dependencies=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); numDependencies=scalar; memsetParams=in_buffer@sizeof(CUDA_MEMSET_NODE_PARAMS); ctx=handle:context", "graph_node:create; graph:use; graph_node:use; context:use"),
    "cuGraphMemsetNodeSetParams": P("hNode=handle:graph_node; nodeParams=in_buffer@sizeof(CUDA_MEMSET_NODE_PARAMS)", "graph_node:use"),
    "cuGraphAddHostNode": P("phGraphNode=out_value:graph_node; hGraph=handle:graph; dependencies=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); numDependencies=scalar; nodeParams=in_buffer@sizeof(CUDA_HOST_NODE_PARAMS)", "graph_node:create; graph:use; graph_node:use"),
    "cuGraphHostNodeSetParams": P("hNode=handle:graph_node; nodeParams=in_buffer@sizeof(CUDA_HOST_NODE_PARAMS)", "graph_node:use"),
    "cuGraphAddChildGraphNode": P("phGraphNode=out_value:graph_node; hGraph=handle:graph; dependencies=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); numDependencies=scalar; childGraph=handle:graph", "graph_node:create; graph:use; graph_node:use"),
    "cuGraphAddEmptyNode": P("phGraphNode=out_value:graph_node; hGraph=handle:graph; dependencies=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); numDependencies=scalar", "graph_node:create; graph:use; graph_node:use"),
    "cuGraphAddEventRecordNode": P("phGraphNode=out_value:graph_node; hGraph=handle:graph; dependencies=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); numDependencies=scalar; event=handle:event", "graph_node:create; graph:use; graph_node:use; event:use"),
    "cuGraphAddEventWaitNode": P("phGraphNode=out_value:graph_node; hGraph=handle:graph; dependencies=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); numDependencies=scalar; event=handle:event", "graph_node:create; graph:use; graph_node:use; event:use"),
    "cuGraphClone": P("phGraphClone=out_value:graph; originalGraph=handle:graph", "graph:create; graph:use"),
    "cuGraphNodeGetType": P("hNode=handle:graph_node; type=out_value", "graph_node:use"),
    "cuGraphGetNodes": P("hGraph=handle:graph; nodes=out_buffer:graph_node@*numNodes * sizeof(CUgraphNode); numNodes=out_value", "graph:use; graph_node:use"),
    "cuGraphGetRootNodes": P("hGraph=handle:graph; rootNodes=out_buffer:graph_node@*numRootNodes * sizeof(CUgraphNode); numRootNodes=out_value", "graph:use; graph_node:use"),
    "cuGraphGetEdges": P("hGraph=handle:graph; from=out_buffer:graph_node@*numEdges * sizeof(CUgraphNode); to=out_buffer:graph_node@*numEdges * sizeof(CUgraphNode); numEdges=out_value", "graph:use; graph_node:use"),
    "cuGraphGetEdges_v2": P("hGraph=handle:graph; from=out_buffer:graph_node@*numEdges * sizeof(CUgraphNode); to=out_buffer:graph_node@*numEdges * sizeof(CUgraphNode); edgeData=out_buffer@*numEdges * sizeof(CUgraphEdgeData); numEdges=out_value", "graph:use; graph_node:use"),
    "cuGraphExecChildGraphNodeSetParams": P("hGraphExec=handle:graph_exec; hNode=handle:graph_node; childGraph=handle:graph", "graph_exec:use; graph_node:use; graph:use"),
    "cuGraphNodeSetEnabled": P("hGraphExec=handle:graph_exec; hNode=handle:graph_node; isEnabled=scalar", "graph_exec:use; graph_node:use"),
    "cuGraphNodeGetEnabled": P("hGraphExec=handle:graph_exec; hNode=handle:graph_node; isEnabled=out_value", "graph_exec:use; graph_node:use"),
    "cuGraphNodeGetDependencies": P("hNode=handle:graph_node; dependencies=out_buffer:graph_node@*numDependencies * sizeof(CUgraphNode); numDependencies=out_value", "graph_node:use"),
    "cuGraphNodeGetDependencies_v2": P("hNode=handle:graph_node; dependencies=out_buffer:graph_node@*numDependencies * sizeof(CUgraphNode); edgeData=out_buffer@*numDependencies * sizeof(CUgraphEdgeData); numDependencies=out_value", "graph_node:use"),
    "cuGraphNodeGetDependentNodes": P("hNode=handle:graph_node; dependentNodes=out_buffer:graph_node@*numDependentNodes * sizeof(CUgraphNode); numDependentNodes=out_value", "graph_node:use"),
    "cuGraphNodeGetDependentNodes_v2": P("hNode=handle:graph_node; dependentNodes=out_buffer:graph_node@*numDependentNodes * sizeof(CUgraphNode); edgeData=out_buffer@*numDependentNodes * sizeof(CUgraphEdgeData); numDependentNodes=out_value", "graph_node:use"),
    # TMA descriptors, encoded by the worker's driver (interceptor/tensor_map.c)
    "cuTensorMapEncodeTiled": P("tensorMap=out_value", ""),
    "cuTensorMapEncodeIm2col": P("tensorMap=out_value", ""),
    "cuGraphAddDependencies": P("hGraph=handle:graph; from=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); to=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); numDependencies=scalar", "graph:use; graph_node:use"),
    "cuGraphAddDependencies_v2": P("hGraph=handle:graph; from=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); to=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); edgeData=in_buffer@numDependencies * sizeof(CUgraphEdgeData); numDependencies=scalar", "graph:use; graph_node:use"),
    "cuGraphRemoveDependencies": P("hGraph=handle:graph; from=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); to=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); numDependencies=scalar", "graph:use; graph_node:use"),
    "cuGraphRemoveDependencies_v2": P("hGraph=handle:graph; from=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); to=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); edgeData=in_buffer@numDependencies * sizeof(CUgraphEdgeData); numDependencies=scalar", "graph:use; graph_node:use"),
    "cuGraphDestroyNode": P("hNode=handle:graph_node", "graph_node:destroy"),
    "cuGraphInstantiateWithParams": P("phGraphExec=out_value:graph_exec; hGraph=handle:graph; instantiateParams=in_buffer@sizeof(CUDA_GRAPH_INSTANTIATE_PARAMS)", "graph_exec:create; graph:use"),
    "cuGraphExecKernelNodeSetParams_v2": P("hGraphExec=handle:graph_exec; hNode=handle:graph_node; nodeParams=in_buffer@sizeof(CUDA_KERNEL_NODE_PARAMS)", "graph_exec:use; graph_node:use"),
    "cuGraphExecMemcpyNodeSetParams": P("hGraphExec=handle:graph_exec; hNode=handle:graph_node; copyParams=in_buffer@sizeof(CUDA_MEMCPY3D); ctx=handle:context", "graph_exec:use; graph_node:use; context:use"),
    "cuGraphExecMemsetNodeSetParams": P("hGraphExec=handle:graph_exec; hNode=handle:graph_node; memsetParams=in_buffer@sizeof(CUDA_MEMSET_NODE_PARAMS); ctx=handle:context", "graph_exec:use; graph_node:use; context:use"),
    "cuGraphExecHostNodeSetParams": P("hGraphExec=handle:graph_exec; hNode=handle:graph_node; nodeParams=in_buffer@sizeof(CUDA_HOST_NODE_PARAMS)", "graph_exec:use; graph_node:use"),
    "cuGraphExecUpdate_v2": P("hGraphExec=handle:graph_exec; hGraph=handle:graph; resultInfo=out_value", "graph_exec:use; graph:use"),
    "cuGraphAddNode": P("phGraphNode=out_value:graph_node; hGraph=handle:graph; dependencies=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); numDependencies=scalar; nodeParams=in_buffer@sizeof(CUgraphNodeParams)", "graph_node:create; graph:use; graph_node:use"),
    "cuGraphAddNode_v2": P("phGraphNode=out_value:graph_node; hGraph=handle:graph; dependencies=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); dependencyData=in_buffer@numDependencies * sizeof(CUgraphEdgeData); numDependencies=scalar; nodeParams=in_buffer@sizeof(CUgraphNodeParams)", "graph_node:create; graph:use; graph_node:use"),
    # graph memory nodes (proxyd/families/graph_mem.py, interceptor/graph_mem.c)
    "cuGraphAddMemAllocNode": P("phGraphNode=out_value:graph_node; hGraph=handle:graph; dependencies=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); numDependencies=scalar; nodeParams=in_buffer@sizeof(CUDA_MEM_ALLOC_NODE_PARAMS)", "graph_node:create; graph:use; graph_node:use"),
    "cuGraphMemAllocNodeGetParams": P("hNode=handle:graph_node; params_out=out_value", "graph_node:use"),
    "cuGraphAddMemFreeNode": P("phGraphNode=out_value:graph_node; hGraph=handle:graph; dependencies=in_buffer:graph_node@numDependencies * sizeof(CUgraphNode); numDependencies=scalar; dptr=device_ptr", "graph_node:create; graph:use; graph_node:use"),
    "cuGraphMemFreeNodeGetParams": P("hNode=handle:graph_node; dptr_out=out_value", "graph_node:use"),
    "cuDeviceGraphMemTrim": P("device=handle:device", "device:use"),
    "cuDeviceGetGraphMemAttribute": P("device=handle:device; attr=scalar; value=out_buffer@?", "device:use"),
    "cuDeviceSetGraphMemAttribute": P("device=handle:device; attr=scalar; value=in_buffer@?", "device:use"),
}

DRIVER_ASYNC = {
    "cuLaunchKernel", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoDAsync_v2", "cuMemsetD8_v2",
    "cuMemsetD16_v2", "cuMemsetD32_v2", "cuMemsetD8Async", "cuMemsetD16Async",
    "cuMemsetD32Async", "cuEventRecord", "cuEventRecordWithFlags", "cuStreamWaitEvent",
    "cuMemsetD2D8_v2", "cuMemsetD2D16_v2", "cuMemsetD2D32_v2", "cuMemsetD2D8Async",
    "cuMemsetD2D16Async", "cuMemsetD2D32Async",
    "cuEventDestroy_v2", "cuStreamDestroy_v2", "cuFuncSetAttribute", "cuFuncSetCacheConfig",
    "cuCtxSetCacheConfig", "cuLaunchKernelEx", "cuLaunchCooperativeKernel",
    "cuLaunchHostFunc", "cuStreamAddCallback", "cuGraphLaunch",
    # the shim names the event (`ids: shim`, interceptor/ipc_event.c)
    "cuEventCreate",
}

DRIVER_SHIM_LOCAL = {
    # peer access bookkeeping and peer copies on the unified-address copies (interceptor/peer.c)
    "cuCtxEnablePeerAccess", "cuCtxDisablePeerAccess", "cuMemcpyPeer", "cuMemcpyPeerAsync",
    "cuMemcpy3DPeer", "cuMemcpy3DPeerAsync",
    "cuFuncSetBlockShape", "cuFuncSetSharedSize", "cuParamSetSize", "cuParamSeti", "cuParamSetf",
    "cuParamSetv", "cuLaunch", "cuLaunchGrid", "cuLaunchGridAsync", "cuCtxAttach", "cuCtxDetach",
    # built in the shim on the linear allocations, copies and memsets (interceptor/copy2d.c)
    "cuMemAllocPitch_v2", "cuMemcpy2D_v2", "cuMemcpy2DUnaligned_v2", "cuMemcpy2DAsync_v2",
    # array copies as cuMemcpy3D ops, host sides staged (interceptor/copy2d.c)
    "cuMemcpyHtoA_v2", "cuMemcpyAtoH_v2", "cuMemcpyDtoA_v2", "cuMemcpyAtoD_v2", "cuMemcpyAtoA_v2",
    "cuMemcpyHtoAAsync_v2", "cuMemcpyAtoHAsync_v2",
    "cuGetProcAddress", "cuGetProcAddress_v2", "cuGetErrorString", "cuGetErrorName",
    "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2", "cuCtxSetCurrent", "cuCtxGetCurrent",
    "cuCtxGetDevice", "cuDriverGetVersion", "cuFuncGetParamInfo", "cuFuncGetName",
    "cuProfilerStart", "cuProfilerStop", "cuOccupancyMaxPotentialBlockSize",
    "cuOccupancyMaxPotentialBlockSizeWithFlags", "cuThreadExchangeStreamCaptureMode",
    # answered in the shim, or sent as cuMemHostRegister_v2's op (interceptor/hostmap_api.c)
    "cuMemHostRegister", "cuMemHostGetDevicePointer_v2", "cuMemHostGetFlags", "cuMemAllocManaged",
    "cuMemPrefetchAsync_v2", "cuMemPrefetchAsync_v2_ptsz", "cuMemAdvise_v2",
    "cuStreamAttachMemAsync", "cuStreamAttachMemAsync_ptsz",
    # static CUDA runtime: answered in the shim, on other (remoted) driver calls
    "cuGetExportTable", "cuCtxGetDevice_v2", "cuPointerGetAttributes", "cuPointerGetAttribute", "cuLibraryLoadData",
    "cuCtxSynchronize_v2", "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxReset",
    "cuLibraryUnload", "cuLibraryGetKernel", "cuLibraryGetModule", "cuKernelGetFunction", "cuLibraryGetGlobal",
    "cuKernelGetAttribute", "cuKernelSetAttribute", "cuKernelSetCacheConfig", "cuKernelGetName",
    "cuKernelGetParamInfo",
    # the JIT linker: on cuLinkCreate_v2 / cuLinkAddData_v2 (interceptor/link.c)
    "cuLinkCreate", "cuLinkAddData", "cuLinkAddFile", "cuLinkAddFile_v2",
    "cuStreamGetCaptureInfo_v2",   # on cuStreamGetCaptureInfo_v3 (interceptor/capture.c)
    # on the other graph calls (interceptor/graph_build.c)
    "cuGraphDebugDotPrint", "cuGraphAddKernelNode", "cuGraphGetEdges", "cuGraphAddDependencies", "cuGraphRemoveDependencies", "cuGraphInstantiateWithParams", "cuGraphAddNode_v2",
    "cuGraphNodeGetDependencies", "cuGraphNodeGetDependentNodes",
}

DRIVER_SHIM_OVERRIDE = {
    # the phGraph_out arrays of conditional nodes go with them (interceptor/graph_cond.c)
    "cuGraphDestroy", "cuGraphDestroyNode",
    "cuTensorMapEncodeTiled", "cuTensorMapEncodeIm2col",
    "cuModuleLoad", "cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary",
    "cuModuleGetFunction", "cuLaunchKernel", "cuMemcpy", "cuMemcpyAsync", "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuCtxCreate_v4",
    "cuCtxDestroy_v2", "cuDevicePrimaryCtxRetain", "cuInit",
    "cuMemAllocHost_v2", "cuMemFreeHost", "cuMemHostAlloc",
    "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuLaunchHostFunc", "cuStreamAddCallback",
    "cuMemPoolSetAttribute", "cuMemPoolGetAttribute",
    # the pool's descriptor is a memfd holding proxyd's token (interceptor/mempool_ipc.c)
    "cuMemPoolExportToShareableHandle", "cuMemPoolImportFromShareableHandle",
    "cuMemHostRegister_v2", "cuMemHostUnregister", "cuMemFree_v2",
    "cuDevicePrimaryCtxReset_v2",
    # capture queries answered locally until this process has begun a capture (interceptor/capture.c)
    "cuStreamIsCapturing", "cuStreamBeginCapture_v2", "cuStreamBeginCaptureToGraph",
    "cuStreamGetCaptureInfo_v3",
    # the JIT linker keeps log buffers and the linked image in the shim (interceptor/link.c)
    "cuLinkCreate_v2", "cuLinkAddData_v2", "cuLinkComplete", "cuLinkDestroy",
    # IPC events: records of a shared event are flushed at once (interceptor/ipc_event.c)
    "cuIpcGetEventHandle", "cuIpcOpenEventHandle", "cuEventRecord", "cuEventRecordWithFlags",
    # creates named by the shim, their ids reused after the destroy (interceptor/ipc_event.c)
    "cuEventCreate", "cuEventDestroy_v2",
    # function attributes answered from the shim's cache (interceptor/query_cache.c)
    "cuFuncGetAttribute",
    # the launch configuration travels as cuLaunchKernelEx's (interceptor/launch_ex.c)
    "cuOccupancyMaxActiveClusters",
    # linear copies in the shim (copy2d.c); with a CUDA array, a cuMemcpy3D op to proxyd (also copy2d.c)
    "cuMemcpy3D_v2", "cuMemcpy3DAsync_v2",
    # 2D memsets: one op each; the shim checks the pitch first (copy2d.c)
    "cuMemsetD2D8_v2", "cuMemsetD2D16_v2", "cuMemsetD2D32_v2",
    "cuMemsetD2D8Async", "cuMemsetD2D16Async", "cuMemsetD2D32Async",
    # explicit graph construction: nodes carry their stream op (interceptor/graph_build.c)
    "cuGraphAddKernelNode_v2", "cuGraphKernelNodeSetParams_v2", "cuGraphAddMemcpyNode", "cuGraphMemcpyNodeSetParams", "cuGraphAddMemsetNode", "cuGraphMemsetNodeSetParams", "cuGraphAddHostNode", "cuGraphHostNodeSetParams", "cuGraphAddChildGraphNode", "cuGraphAddEmptyNode", "cuGraphAddEventRecordNode", "cuGraphAddEventWaitNode", "cuGraphGetNodes", "cuGraphGetRootNodes", "cuGraphGetEdges_v2", "cuGraphNodeGetDependencies_v2", "cuGraphNodeGetDependentNodes_v2", "cuGraphAddDependencies_v2", "cuGraphRemoveDependencies_v2", "cuGraphExecKernelNodeSetParams_v2", "cuGraphExecMemcpyNodeSetParams", "cuGraphExecMemsetNodeSetParams", "cuGraphExecHostNodeSetParams", "cuGraphExecUpdate_v2",
    # graph memory nodes (interceptor/graph_mem.c)
    "cuGraphAddMemAllocNode", "cuGraphMemAllocNodeGetParams", "cuGraphAddMemFreeNode", "cuGraphMemFreeNodeGetParams",
    "cuDeviceGetGraphMemAttribute", "cuDeviceSetGraphMemAttribute",
}

DRIVER_HANDLERS = {
    "cuMemAlloc_v2": "mem_alloc", "cuMemFree_v2": "mem_free",
    "cuMemGetAddressRange_v2": "mem_get_address_range",
    "cuModuleLoadData": "module_load", "cuModuleLoadDataEx": "module_load",
    "cuModuleLoadFatBinary": "module_load", "cuModuleLoad": "module_load",
    "cuLinkCreate_v2": "link_create", "cuLinkAddData_v2": "link_add_data",
    "cuLinkComplete": "link_complete", "cuLinkDestroy": "link_destroy",
    "cuModuleUnload": "module_unload", "cuModuleGetFunction": "module_get_function",
    "cuModuleGetGlobal_v2": "module_get_global", "cuLaunchKernel": "launch_kernel",
    "cuMemcpyHtoD_v2": "memcpy_htod", "cuMemcpyHtoDAsync_v2": "memcpy_htod",
    "cuMemcpyDtoH_v2": "memcpy_dtoh", "cuMemcpyDtoHAsync_v2": "memcpy_dtoh",
    "cuMemcpyDtoD_v2": "memcpy_dtod", "cuMemcpyDtoDAsync_v2": "memcpy_dtod",
    "cuMemcpy": "memcpy_dtod", "cuMemcpyAsync": "memcpy_dtod",
    "cuMemsetD8_v2": "memset", "cuMemsetD16_v2": "memset", "cuMemsetD32_v2": "memset",
    "cuMemsetD8Async": "memset", "cuMemsetD16Async": "memset", "cuMemsetD32Async": "memset",
    "cuMemsetD2D8_v2": "memset2d", "cuMemsetD2D16_v2": "memset2d", "cuMemsetD2D32_v2": "memset2d",
    "cuMemsetD2D8Async": "memset2d", "cuMemsetD2D16Async": "memset2d", "cuMemsetD2D32Async": "memset2d",
    "cuStreamSynchronize": "stream_sync", "cuEventSynchronize": "event_sync",
    "cuCtxSynchronize": "ctx_sync", "cuCtxCreate_v4": "ctx_create",
    "cuCtxDestroy_v2": "ctx_destroy", "cuDevicePrimaryCtxRetain": "primary_ctx_retain",
    "cuDevicePrimaryCtxRelease_v2": "primary_ctx_release",
    "cuDevicePrimaryCtxReset_v2": "primary_ctx_reset",
    "cuDevicePrimaryCtxSetFlags_v2": "primary_ctx_set_flags",
    "cuDevicePrimaryCtxGetState": "primary_ctx_get_state",
    "cuMemAllocHost_v2": "host_alloc", "cuMemHostAlloc": "host_alloc", "cuMemFreeHost": "host_free",
    "cuInit": "init",
    "cuLaunchKernelEx": "launch_kernel_ex", "cuLaunchCooperativeKernel": "launch_cooperative",
    "cuStreamSetAttribute": "stream_set_attribute", "cuStreamCopyAttributes": "stream_copy_attributes",
    "cuCtxSetLimit": "ctx_set_limit", "cuEventRecord": "event_record", "cuEventRecordWithFlags": "event_record",
    "cuMemHostRegister_v2": "host_map", "cuMemHostUnregister": "host_unmap",
    "cuIpcGetMemHandle": "ipc_get_mem_handle", "cuIpcOpenMemHandle_v2": "ipc_open_mem_handle",
    "cuIpcGetEventHandle": "ipc_get_event_handle", "cuIpcOpenEventHandle": "ipc_open_event_handle",
    "cuOccupancyMaxActiveClusters": "occupancy_max_active_clusters",
    "cuIpcCloseMemHandle": "ipc_close_mem_handle",
    "cuLaunchHostFunc": "host_func", "cuStreamAddCallback": "host_func",
    "cuMemAllocAsync": "mem_alloc_async", "cuMemFreeAsync": "mem_free_async",
    "cuMemAllocFromPoolAsync": "mem_alloc_from_pool_async", "cuMemPoolTrimTo": "mem_pool_trim_to",
    "cuMemPoolSetAttribute": "mem_pool_set_attribute", "cuMemPoolGetAttribute": "mem_pool_get_attribute",
    "cuMemPoolSetAccess": "mem_pool_set_access", "cuMemPoolGetAccess": "mem_pool_get_access",
    "cuMemPoolCreate": "mem_pool_create", "cuMemPoolDestroy": "mem_pool_destroy",
    "cuMemPoolExportToShareableHandle": "mem_pool_export_shareable",
    "cuMemPoolImportFromShareableHandle": "mem_pool_import_shareable",
    "cuMemPoolExportPointer": "mem_pool_export_pointer", "cuMemPoolImportPointer": "mem_pool_import_pointer",
    "cuDeviceSetMemPool": "device_set_mem_pool", "cuDeviceGetMemPool": "device_get_mem_pool",
    "cuDeviceGetDefaultMemPool": "device_get_default_mem_pool",
    "cuArrayCreate_v2": "array_create", "cuArray3DCreate_v2": "array_create", "cuArrayDestroy": "array_destroy",
    "cuMipmappedArrayCreate": "mipmap_create", "cuMipmappedArrayGetLevel": "mipmap_get_level",
    "cuMipmappedArrayDestroy": "mipmap_destroy",
    "cuArrayGetDescriptor_v2": "array_get_descriptor", "cuArray3DGetDescriptor_v2": "array_get_descriptor",
    "cuMemcpy3D_v2": "memcpy_3d", "cuMemcpy3DAsync_v2": "memcpy_3d",
    "cuTexObjectCreate": "tex_object_create", "cuTexObjectDestroy": "tex_object_destroy",
    "cuTexObjectGetResourceDesc": "tex_object_get", "cuTexObjectGetTextureDesc": "tex_object_get",
    "cuTexObjectGetResourceViewDesc": "tex_object_get", "cuSurfObjectCreate": "surf_object_create",
    "cuSurfObjectDestroy": "tex_object_destroy", "cuSurfObjectGetResourceDesc": "tex_object_get",
    "cuMemAddressReserve": "vmm_reserve", "cuMemAddressFree": "vmm_address_free", "cuMemCreate": "vmm_create",
    "cuMemRelease": "vmm_release", "cuMemMap": "vmm_map", "cuMemUnmap": "vmm_unmap",
    "cuMemSetAccess": "vmm_set_access", "cuMemGetAccess": "vmm_get_access",
    "cuMemGetAllocationGranularity": "vmm_granularity", "cuMemGetAllocationPropertiesFromHandle": "vmm_get_prop",
    "cuStreamBeginCapture_v2": "graph_begin_capture", "cuStreamEndCapture": "graph_end_capture",
    "cuStreamBeginCaptureToGraph": "graph_begin_capture_to_graph",
    # the conditional node type (interceptor/graph_cond.c); other types go to their own add calls
    "cuGraphAddNode": "graph_add_conditional",
    "cuGraphExecChildGraphNodeSetParams": "graph_exec_child_set_params",
    "cuGraphNodeSetEnabled": "graph_node_enabled", "cuGraphNodeGetEnabled": "graph_node_enabled",
    "cuStreamIsCapturing": "graph_is_capturing", "cuStreamGetCaptureInfo_v3": "graph_capture_info",
    "cuStreamUpdateCaptureDependencies": "graph_capture_deps", "cuStreamUpdateCaptureDependencies_v2": "graph_capture_deps", "cuGraphInstantiateWithFlags": "graph_instantiate",
    "cuGraphInstantiate_v2": "graph_instantiate", "cuGraphLaunch": "graph_launch", "cuGraphDestroy": "graph_destroy",
    "cuGraphExecDestroy": "graph_exec_destroy",
    "cuGraphCreate": "graph_create",
    "cuGraphConditionalHandleCreate": "graph_cond_handle",
    "cuGraphAddKernelNode_v2": "graph_add_node",
    "cuGraphKernelNodeSetParams_v2": "graph_node_set_params",
    "cuGraphAddMemcpyNode": "graph_add_node",
    "cuGraphMemcpyNodeSetParams": "graph_node_set_params",
    "cuGraphAddMemsetNode": "graph_add_node",
    "cuGraphMemsetNodeSetParams": "graph_node_set_params",
    "cuGraphAddHostNode": "graph_add_node",
    "cuGraphHostNodeSetParams": "graph_node_set_params",
    "cuGraphAddChildGraphNode": "graph_add_node",
    "cuGraphAddEmptyNode": "graph_add_node",
    "cuGraphAddEventRecordNode": "graph_add_node",
    "cuGraphAddEventWaitNode": "graph_add_node",
    "cuGraphClone": "graph_clone",
    "cuGraphNodeGetType": "graph_node_type",
    "cuGraphGetNodes": "graph_get_nodes",
    "cuGraphGetRootNodes": "graph_get_nodes",
    "cuGraphGetEdges_v2": "graph_get_edges",
    "cuGraphNodeGetDependencies_v2": "graph_node_neighbours",
    "cuGraphNodeGetDependentNodes_v2": "graph_node_neighbours",
    "cuGraphAddDependencies_v2": "graph_dependencies",
    "cuGraphRemoveDependencies_v2": "graph_dependencies",
    "cuGraphDestroyNode": "graph_destroy_node",
    "cuGraphExecKernelNodeSetParams_v2": "graph_exec_set_params",
    "cuGraphExecMemcpyNodeSetParams": "graph_exec_set_params",
    "cuGraphExecMemsetNodeSetParams": "graph_exec_set_params",
    "cuGraphExecHostNodeSetParams": "graph_exec_set_params",
    "cuGraphAddMemAllocNode": "graph_mem_alloc_node",
    "cuGraphMemAllocNodeGetParams": "graph_mem_node_params",
    "cuGraphAddMemFreeNode": "graph_add_node",
    "cuGraphMemFreeNodeGetParams": "graph_mem_node_params",
    "cuDeviceGraphMemTrim": "graph_mem_trim",
    "cuDeviceGetGraphMemAttribute": "graph_mem_attribute",
    "cuDeviceSetGraphMemAttribute": "graph_mem_attribute",
    "cuGraphExecUpdate_v2": "graph_exec_update",
}

STREAM = "stream=handle:stream"
RUNTIME_SUPPORTED: Dict[str, Dict[str, str]] = {
    "cudaGetDeviceCount": P("count=out_value"),
    "cudaSetDevice": P("device=scalar"),
    "cudaGetDevice": P("device=out_value"),
    "cudaInitDevice": P("device=scalar; deviceFlags=scalar; flags=scalar"),
    "cudaGetDeviceProperties": P("prop=out_value; device=scalar"),
    "cudaDeviceGetAttribute": P("value=out_value; attr=scalar; device=scalar"),
    "cudaDeviceSynchronize": P(""),
    "cudaDeviceReset": P(""),
    "cudaSetDeviceFlags": P("flags=scalar"),
    "cudaGetDeviceFlags": P("flags=out_value"),
    "cudaChooseDevice": P("device=out_value; prop=in_buffer@sizeof(struct cudaDeviceProp)"),
    "cudaDeviceGetPCIBusId": P("pciBusId=out_buffer@len; len=scalar; device=scalar"),
    "cudaDeviceCanAccessPeer": P("canAccessPeer=out_value; device=scalar; peerDevice=scalar"),
    # interceptor/rt_peer.c
    "cudaDeviceEnablePeerAccess": P("peerDevice=scalar; flags=scalar"),
    "cudaDeviceDisablePeerAccess": P("peerDevice=scalar"),
    "cudaMemcpyPeer": P("dst=device_ptr; dstDevice=scalar; src=device_ptr; srcDevice=scalar; count=scalar"),
    "cudaMemcpyPeerAsync": P("dst=device_ptr; dstDevice=scalar; src=device_ptr; srcDevice=scalar; count=scalar; "
                             "stream=handle:stream", "stream:use"),
    "cudaMemcpy3DPeer": P("p=in_buffer@sizeof(struct cudaMemcpy3DPeerParms)"),
    "cudaMemcpy3DPeerAsync": P("p=in_buffer@sizeof(struct cudaMemcpy3DPeerParms); stream=handle:stream",
                               "stream:use"),
    "cudaDeviceGetLimit": P("pValue=out_value; limit=scalar"),
    "cudaDeviceSetLimit": P("limit=scalar; value=scalar"),
    "cudaDeviceGetStreamPriorityRange": P("leastPriority=out_value; greatestPriority=out_value"),
    "cudaDeviceGetCacheConfig": P("pCacheConfig=out_value"),
    "cudaDeviceSetCacheConfig": P("cacheConfig=scalar"),
    "cudaDriverGetVersion": P("driverVersion=out_value"),
    "cudaRuntimeGetVersion": P("runtimeVersion=out_value"),
    "cudaMemGetInfo": P("free=out_value; total=out_value"),
    "cudaMalloc": P("devPtr=out_value:memory; size=scalar", "memory:create"),
    "cudaFree": P("devPtr=device_ptr", "memory:destroy"),
    "cudaMallocHost": P("ptr=out_value; size=scalar"),
    "cudaHostAlloc": P("pHost=out_value; size=scalar; flags=scalar"),
    "cudaFreeHost": P("ptr=host_ptr"),
    # dst/src are unified addresses (host or device, per `kind`)
    "cudaMemcpy": P("dst=device_ptr; src=device_ptr; count=scalar; kind=scalar"),
    "cudaMemcpy2D": P("dst=device_ptr; dpitch=scalar; src=device_ptr; spitch=scalar; width=scalar; height=scalar; "
                      "kind=scalar"),
    "cudaMemcpyAsync": P(f"dst=device_ptr; src=device_ptr; count=scalar; kind=scalar; {STREAM}",
                         "stream:use"),
    "cudaMemcpy2DAsync": P("dst=device_ptr; dpitch=scalar; src=device_ptr; spitch=scalar; width=scalar; "
                           f"height=scalar; kind=scalar; {STREAM}", "stream:use"),
    "cudaMemset": P("devPtr=device_ptr; value=scalar; count=scalar"),
    "cudaMemsetAsync": P(f"devPtr=device_ptr; value=scalar; count=scalar; {STREAM}", "stream:use"),
    "cudaMemset2D": P("devPtr=device_ptr; pitch=scalar; value=scalar; width=scalar; height=scalar"),
    "cudaMemset2DAsync": P("devPtr=device_ptr; pitch=scalar; value=scalar; width=scalar; height=scalar; "
                           f"{STREAM}", "stream:use"),
    "cudaMemset3D": P("pitchedDevPtr=scalar; value=scalar; extent=scalar"),
    "cudaMemset3DAsync": P(f"pitchedDevPtr=scalar; value=scalar; extent=scalar; {STREAM}", "stream:use"),
    # symbol: address of the host shadow of a __device__ variable (a lookup key)
    "cudaMemcpyToSymbol": P("symbol=host_ptr; src=device_ptr; count=scalar; offset=scalar; "
                            "kind=scalar"),
    "cudaMemcpyFromSymbol": P("dst=device_ptr; symbol=host_ptr; count=scalar; offset=scalar; "
                              "kind=scalar"),
    "cudaMemcpyToSymbolAsync": P("symbol=host_ptr; src=device_ptr; count=scalar; offset=scalar; "
                                 f"kind=scalar; {STREAM}", "stream:use"),
    "cudaMemcpyFromSymbolAsync": P("dst=device_ptr; symbol=host_ptr; count=scalar; offset=scalar; "
                                   f"kind=scalar; {STREAM}", "stream:use"),
    "cudaGetSymbolAddress": P("devPtr=out_value; symbol=host_ptr"),
    "cudaGetSymbolSize": P("size=out_value; symbol=host_ptr"),
    "cudaPointerGetAttributes": P("attributes=out_value; ptr=device_ptr"),
    "cudaStreamCreate": P("pStream=out_value:stream", "stream:create"),
    "cudaStreamCreateWithFlags": P("pStream=out_value:stream; flags=scalar", "stream:create"),
    "cudaStreamCreateWithPriority": P("pStream=out_value:stream; flags=scalar; priority=scalar",
                                      "stream:create"),
    "cudaStreamDestroy": P(STREAM, "stream:destroy"),
    "cudaStreamSynchronize": P(STREAM, "stream:use"),
    "cudaStreamQuery": P(STREAM, "stream:use"),
    "cudaStreamWaitEvent": P(f"{STREAM}; event=handle:event; flags=scalar",
                             "stream:use; event:use"),
    "cudaStreamGetFlags": P("hStream=handle:stream; flags=out_value", "stream:use"),
    "cudaStreamGetPriority": P("hStream=handle:stream; priority=out_value", "stream:use"),
    "cudaEventCreate": P("event=out_value:event", "event:create"),
    "cudaEventCreateWithFlags": P("event=out_value:event; flags=scalar", "event:create"),
    "cudaEventRecord": P(f"event=handle:event; {STREAM}", "event:use; stream:use"),
    "cudaEventRecordWithFlags": P(f"event=handle:event; {STREAM}; flags=scalar",
                                  "event:use; stream:use"),
    "cudaEventQuery": P("event=handle:event", "event:use"),
    "cudaEventSynchronize": P("event=handle:event", "event:use"),
    "cudaEventElapsedTime": P("ms=out_value; start=handle:event; end=handle:event", "event:use"),
    "cudaEventDestroy": P("event=handle:event", "event:destroy"),
    "cudaGetLastError": P(""),
    "cudaPeekAtLastError": P(""),
    "cudaGetErrorString": P("error=scalar"),
    "cudaGetErrorName": P("error=scalar"),
    # func: host stub address of the kernel (a lookup key)
    "cudaLaunchKernel": P(f"func=host_ptr; gridDim=scalar; blockDim=scalar; args=in_buffer@?; "
                          f"sharedMem=scalar; {STREAM}", "stream:use"),
    "cudaFuncGetAttributes": P("attr=out_value; func=host_ptr"),
    "cudaFuncSetAttribute": P("func=host_ptr; attr=scalar; value=scalar"),
    "cudaFuncSetCacheConfig": P("func=host_ptr; cacheConfig=scalar"),
    "cudaOccupancyMaxActiveBlocksPerMultiprocessor": P(
        "numBlocks=out_value; func=host_ptr; blockSize=scalar; dynamicSMemSize=scalar"),
    "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags": P(
        "numBlocks=out_value; func=host_ptr; blockSize=scalar; dynamicSMemSize=scalar; "
        "flags=scalar"),
    "cudaGetDriverEntryPoint": P("symbol=in_buffer@strlen(symbol) + 1; funcPtr=out_value; "
                                 "flags=scalar; driverStatus=out_value"),
    "cudaGetDriverEntryPointByVersion": P("symbol=in_buffer@strlen(symbol) + 1; "
                                          "funcPtr=out_value; cudaVersion=scalar; flags=scalar; "
                                          "driverStatus=out_value"),
    # registration: fatCubinHandle is the opaque value __cudaRegisterFatBinary returned;
    # hostFun/hostVar are host addresses used as keys; deviceFun/deviceAddress are
    # the device-side names (C strings).
    "__cudaRegisterFatBinary": P("fatCubin=in_buffer@?"),
    "__cudaRegisterFatBinaryEnd": P("fatCubinHandle=host_ptr"),
    "__cudaUnregisterFatBinary": P("fatCubinHandle=host_ptr"),
    "__cudaRegisterFunction": P("fatCubinHandle=host_ptr; hostFun=host_ptr; "
                                "deviceFun=in_buffer@strlen(deviceFun) + 1; "
                                "deviceName=in_buffer@strlen(deviceName) + 1; thread_limit=scalar; "
                                "tid=out_value; bid=out_value; bDim=out_value; gDim=out_value; "
                                "wSize=out_value"),
    "__cudaRegisterVar": P("fatCubinHandle=host_ptr; hostVar=host_ptr; "
                           "deviceAddress=in_buffer@strlen(deviceAddress) + 1; "
                           "deviceName=in_buffer@strlen(deviceName) + 1; ext=scalar; size=scalar; "
                           "constant=scalar; global=scalar"),
    "__cudaPushCallConfiguration": P(f"gridDim=scalar; blockDim=scalar; sharedMem=scalar; {STREAM}",
                                     "stream:use"),
    # stream: points to the cudaStream_t to fill in
    "__cudaPopCallConfiguration": P("gridDim=out_value; blockDim=out_value; sharedMem=out_value; "
                                    "stream=out_value:stream", "stream:use"),
    "__cudaGetKernel": P("kernel=out_value:kernel; func=host_ptr", "kernel:create"),
    "__cudaLaunchKernel": P(f"kernel=handle:kernel; gridDim=scalar; blockDim=scalar; "
                            f"args=in_buffer@?; sharedMem=scalar; {STREAM}",
                            "kernel:use; stream:use"),
    "__cudaLaunchKernel_ptsz": P(f"kernel=handle:kernel; gridDim=scalar; blockDim=scalar; "
                                 f"args=in_buffer@?; sharedMem=scalar; {STREAM}",
                                 "kernel:use; stream:use"),
    "__cudaInitModule": P("fatCubinHandle=host_ptr"),
    # issue 10, group 6/7
    "cudaStreamGetAttribute": P("hStream=handle:stream; attr=scalar; value_out=out_value", "stream:use"),
    "cudaStreamSetAttribute": P("hStream=handle:stream; attr=scalar; value=in_buffer@sizeof(cudaLaunchAttributeValue)", "stream:use"),
    "cudaStreamCopyAttributes": P("dst=handle:stream; src=handle:stream", "stream:use"),
    "cudaProfilerStart": P(""),
    "cudaCtxResetPersistingL2Cache": P(""),
    "cudaMallocPitch": P("devPtr=out_value:memory; pitch=out_value; width=scalar; height=scalar", "memory:create"),
    "cudaMalloc3D": P("pitchedDevPtr=out_value; extent=scalar"),
    "cudaProfilerStop": P(""),
    "cudaDeviceGetP2PAttribute": P("value=out_value; attr=scalar; srcDevice=scalar; dstDevice=scalar"),
    "cudaLaunchKernelExC": P("config=in_buffer@sizeof(cudaLaunchConfig_t); func=host_ptr; args=in_buffer@?"),
    "cudaLaunchCooperativeKernel": P("func=host_ptr; gridDim=scalar; blockDim=scalar; args=in_buffer@?; sharedMem=scalar; stream=handle:stream", "stream:use"),
    "cudaOccupancyAvailableDynamicSMemPerBlock": P("dynamicSmemSize=out_value; func=host_ptr; numBlocks=scalar; blockSize=scalar"),
    "cudaGetFuncBySymbol": P("functionPtr=out_value:function; symbolPtr=host_ptr", "function:create"),
    # issue 10, group 1 (interceptor/rt_hostmap.c)
    "cudaHostRegister": P("ptr=host_ptr; size=scalar; flags=scalar"),
    "cudaHostUnregister": P("ptr=host_ptr"),
    "cudaHostGetDevicePointer": P("pDevice=out_value; pHost=host_ptr; flags=scalar"),
    "cudaHostGetFlags": P("pFlags=out_value; pHost=host_ptr"),
    "cudaMallocManaged": P("devPtr=out_value:memory; size=scalar; flags=scalar", "memory:create"),
    "cudaMemPrefetchAsync": P(f"devPtr=device_ptr; count=scalar; location=scalar; flags=scalar; {STREAM}",
                              "stream:use"),
    "cudaMemAdvise": P("devPtr=device_ptr; count=scalar; advice=scalar; location=scalar"),
    "cudaStreamAttachMemAsync": P(f"devPtr=device_ptr; length=scalar; flags=scalar; {STREAM}", "stream:use"),
    # issue 10, group 8 (interceptor/rt_ipc.c)
    "cudaIpcGetMemHandle": P("handle=out_value; devPtr=device_ptr"),
    "cudaIpcGetEventHandle": P("handle=out_value; event=handle:event", "event:use"),
    "cudaIpcOpenEventHandle": P("event=out_value:event; handle=scalar", "event:create"),
    "cudaIpcOpenMemHandle": P("devPtr=out_value:memory; handle=scalar; flags=scalar", "memory:create"),
    "cudaIpcCloseMemHandle": P("devPtr=device_ptr"),
    # issue 10, group 2
    "cudaLaunchHostFunc": P(f"{STREAM}; fn=callback; userData=host_ptr", "stream:use"),
    "cudaStreamAddCallback": P(f"{STREAM}; callback=callback; userData=host_ptr; flags=scalar", "stream:use"),
    # issue 10, group 4
    "cudaMallocAsync": P("devPtr=out_value:memory; size=scalar; hStream=handle:stream", "memory:create; stream:use"),
    "cudaFreeAsync": P("devPtr=device_ptr; hStream=handle:stream", "memory:destroy; stream:use"),
    "cudaMallocFromPoolAsync": P("ptr=out_value:memory; size=scalar; memPool=handle:mem_pool; stream=handle:stream",
                                 "memory:create; mem_pool:use; stream:use"),
    "cudaMemPoolTrimTo": P("memPool=handle:mem_pool; minBytesToKeep=scalar", "mem_pool:use"),
    "cudaMemPoolSetAttribute": P("memPool=handle:mem_pool; attr=scalar; value=in_buffer@?", "mem_pool:use"),
    "cudaMemPoolGetAttribute": P("memPool=handle:mem_pool; attr=scalar; value=out_buffer@?", "mem_pool:use"),
    "cudaMemPoolSetAccess": P("memPool=handle:mem_pool; descList=in_buffer@count * sizeof(struct cudaMemAccessDesc); "
                              "count=scalar", "mem_pool:use"),
    "cudaMemPoolGetAccess": P("flags=out_value; memPool=handle:mem_pool; "
                              "location=in_buffer@sizeof(struct cudaMemLocation)", "mem_pool:use"),
    "cudaMemPoolExportToShareableHandle": P("shareableHandle=out_buffer@?; memPool=handle:mem_pool; "
                                            "handleType=scalar; flags=scalar", "mem_pool:use"),
    "cudaMemPoolImportFromShareableHandle": P("memPool=out_value:mem_pool; shareableHandle=host_ptr; "
                                              "handleType=scalar; flags=scalar", "mem_pool:create"),
    "cudaMemPoolExportPointer": P("exportData=out_value; ptr=device_ptr"),
    "cudaMemPoolImportPointer": P("ptr=out_value:memory; memPool=handle:mem_pool; "
                                  "exportData=in_buffer@sizeof(struct cudaMemPoolPtrExportData)",
                                  "memory:create; mem_pool:use"),
    "cudaMemPoolCreate": P("memPool=out_value:mem_pool; poolProps=in_buffer@sizeof(struct cudaMemPoolProps)",
                           "mem_pool:create"),
    "cudaMemPoolDestroy": P("memPool=handle:mem_pool", "mem_pool:destroy"),
    "cudaDeviceGetDefaultMemPool": P("memPool=out_value:mem_pool; device=scalar", "mem_pool:create"),
    "cudaDeviceSetMemPool": P("device=scalar; memPool=handle:mem_pool", "mem_pool:use"),
    "cudaDeviceGetMemPool": P("memPool=out_value:mem_pool; device=scalar", "mem_pool:create"),
    # issue 10, group 5: CUDA arrays, texture and surface objects (interceptor/rt_arrays.c)
    "cudaCreateChannelDesc": P("x=scalar; y=scalar; z=scalar; w=scalar; f=scalar"),
    "cudaMallocArray": P("array=out_value:array; desc=in_buffer@sizeof(struct cudaChannelFormatDesc); width=scalar; "
                         "height=scalar; flags=scalar", "array:create"),
    "cudaMalloc3DArray": P("array=out_value:array; desc=in_buffer@sizeof(struct cudaChannelFormatDesc); "
                           "extent=scalar; flags=scalar", "array:create"),
    "cudaMallocMipmappedArray": P("mipmappedArray=out_value:mipmapped_array; "
                                  "desc=in_buffer@sizeof(struct cudaChannelFormatDesc); extent=scalar; numLevels=scalar; "
                                  "flags=scalar", "mipmapped_array:create"),
    "cudaGetMipmappedArrayLevel": P("levelArray=out_value:array; mipmappedArray=handle:mipmapped_array; level=scalar",
                                    "array:create; mipmapped_array:use"),
    "cudaFreeMipmappedArray": P("mipmappedArray=handle:mipmapped_array", "mipmapped_array:destroy"),
    "cudaFreeArray": P("array=handle:array", "array:destroy"),
    "cudaArrayGetInfo": P("desc=out_value; extent=out_value; flags=out_value; array=handle:array", "array:use"),
    "cudaGetChannelDesc": P("desc=out_value; array=handle:array", "array:use"),
    "cudaMemcpy2DToArray": P("dst=handle:array; wOffset=scalar; hOffset=scalar; src=device_ptr; spitch=scalar; "
                             "width=scalar; height=scalar; kind=scalar", "array:use"),
    "cudaMemcpy2DFromArray": P("dst=device_ptr; dpitch=scalar; src=handle:array; wOffset=scalar; hOffset=scalar; "
                               "width=scalar; height=scalar; kind=scalar", "array:use"),
    "cudaMemcpy2DArrayToArray": P("dst=handle:array; wOffsetDst=scalar; hOffsetDst=scalar; src=handle:array; "
                                  "wOffsetSrc=scalar; hOffsetSrc=scalar; width=scalar; height=scalar; kind=scalar",
                                  "array:use"),
    "cudaMemcpy2DToArrayAsync": P("dst=handle:array; wOffset=scalar; hOffset=scalar; src=device_ptr; spitch=scalar; "
                                  "width=scalar; height=scalar; kind=scalar; stream=handle:stream",
                                  "array:use; stream:use"),
    "cudaMemcpy2DFromArrayAsync": P("dst=device_ptr; dpitch=scalar; src=handle:array; wOffset=scalar; "
                                    "hOffset=scalar; width=scalar; height=scalar; kind=scalar; stream=handle:stream",
                                    "array:use; stream:use"),
    "cudaMemcpy3D": P("p=in_buffer@sizeof(struct cudaMemcpy3DParms)"),
    "cudaMemcpy3DAsync": P("p=in_buffer@sizeof(struct cudaMemcpy3DParms); stream=handle:stream", "stream:use"),
    "cudaMemcpyToArray": P("dst=handle:array; wOffset=scalar; hOffset=scalar; src=device_ptr; count=scalar; "
                           "kind=scalar", "array:use"),
    "cudaMemcpyFromArray": P("dst=device_ptr; src=handle:array; wOffset=scalar; hOffset=scalar; count=scalar; "
                             "kind=scalar", "array:use"),
    "cudaMemcpyArrayToArray": P("dst=handle:array; wOffsetDst=scalar; hOffsetDst=scalar; src=handle:array; "
                                "wOffsetSrc=scalar; hOffsetSrc=scalar; count=scalar; kind=scalar", "array:use"),
    "cudaMemcpyToArrayAsync": P("dst=handle:array; wOffset=scalar; hOffset=scalar; src=device_ptr; count=scalar; "
                                "kind=scalar; stream=handle:stream", "array:use; stream:use"),
    "cudaMemcpyFromArrayAsync": P("dst=device_ptr; src=handle:array; wOffset=scalar; hOffset=scalar; count=scalar; "
                                  "kind=scalar; stream=handle:stream", "array:use; stream:use"),
    "cudaGetTextureObjectTextureDesc": P("pTexDesc=out_value; texObject=handle:tex_object", "tex_object:use"),
    "cudaGetTextureObjectResourceViewDesc": P("pResViewDesc=out_value; texObject=handle:tex_object",
                                              "tex_object:use"),
    "cudaCreateTextureObject": P("pTexObject=out_value:tex_object; pResDesc=in_buffer@sizeof(struct cudaResourceDesc); "
                                 "pTexDesc=in_buffer@sizeof(struct cudaTextureDesc); "
                                 "pResViewDesc=in_buffer@sizeof(struct cudaResourceViewDesc)", "tex_object:create"),
    "cudaDestroyTextureObject": P("texObject=handle:tex_object", "tex_object:destroy"),
    "cudaGetTextureObjectResourceDesc": P("pResDesc=out_value; texObject=handle:tex_object", "tex_object:use"),
    "cudaCreateSurfaceObject": P("pSurfObject=out_value:surf_object; "
                                 "pResDesc=in_buffer@sizeof(struct cudaResourceDesc)", "surf_object:create"),
    "cudaDestroySurfaceObject": P("surfObject=handle:surf_object", "surf_object:destroy"),
    "cudaGetSurfaceObjectResourceDesc": P("pResDesc=out_value; surfObject=handle:surf_object", "surf_object:use"),
    # issue 10, group 3
    "cudaStreamBeginCapture": P(f"{STREAM}; mode=scalar", "stream:use"),
    "cudaStreamEndCapture": P(f"{STREAM}; pGraph=out_value:graph", "graph:create; stream:use"),
    "cudaStreamIsCapturing": P(f"{STREAM}; pCaptureStatus=out_value", "stream:use"),
    "cudaStreamGetCaptureInfo": P(f"{STREAM}; " + CAPTURE_INFO.split("; ", 1)[1]
                                  + "; edgeData_out=out_value; numDependencies_out=out_value", "stream:use"),
    "cudaStreamUpdateCaptureDependencies": P(f"{STREAM}; dependencies=in_buffer:graph_node@numDependencies * sizeof(cudaGraphNode_t); dependencyData=in_buffer@numDependencies * sizeof(cudaGraphEdgeData); numDependencies=scalar; flags=scalar", "stream:use; graph_node:use"),
    "cudaThreadExchangeStreamCaptureMode": P("mode=out_value"),
    "cudaGraphInstantiate": P("pGraphExec=out_value:graph_exec; graph=handle:graph; flags=scalar",
                              "graph_exec:create; graph:use"),
    "cudaGraphInstantiateWithFlags": P("pGraphExec=out_value:graph_exec; graph=handle:graph; flags=scalar",
                                       "graph_exec:create; graph:use"),
    "cudaGraphLaunch": P(f"graphExec=handle:graph_exec; {STREAM}", "graph_exec:use; stream:use"),
    "cudaGraphDestroy": P("graph=handle:graph", "graph:destroy"),
    "cudaGraphExecDestroy": P("graphExec=handle:graph_exec", "graph_exec:destroy"),
    # graphs built explicitly (interceptor/rt_graph.c)
    "cudaGraphDebugDotPrint": P("graph=handle:graph; path=in_buffer@strlen(path) + 1; flags=scalar", "graph:use"),
    "cudaGraphCreate": P("pGraph=out_value:graph; flags=scalar", "graph:create"),
    "cudaGraphConditionalHandleCreate": P("pHandle_out=out_value:graph_conditional; graph=handle:graph; defaultLaunchValue=scalar; flags=scalar", "graph_conditional:create; graph:use"),
    "cudaGraphAddKernelNode": P("pGraphNode=out_value:graph_node; graph=handle:graph; pDependencies=in_buffer:graph_node@numDependencies * sizeof(cudaGraphNode_t); numDependencies=scalar; pNodeParams=in_buffer@sizeof(struct cudaKernelNodeParams)", "graph_node:create; graph:use; graph_node:use"),
    "cudaGraphKernelNodeSetParams": P("node=handle:graph_node; pNodeParams=in_buffer@sizeof(struct cudaKernelNodeParams)", "graph_node:use"),
    "cudaGraphAddMemcpyNode": P("pGraphNode=out_value:graph_node; graph=handle:graph; pDependencies=in_buffer:graph_node@numDependencies * sizeof(cudaGraphNode_t); numDependencies=scalar; pCopyParams=in_buffer@sizeof(struct cudaMemcpy3DParms)", "graph_node:create; graph:use; graph_node:use"),
    "cudaGraphAddMemcpyNode1D": P("pGraphNode=out_value:graph_node; graph=handle:graph; pDependencies=in_buffer:graph_node@numDependencies * sizeof(cudaGraphNode_t); numDependencies=scalar; dst=device_ptr; src=device_ptr; count=scalar; kind=scalar", "graph_node:create; graph:use; graph_node:use"),
    "cudaGraphMemcpyNodeSetParams": P("node=handle:graph_node; pNodeParams=in_buffer@sizeof(struct cudaMemcpy3DParms)", "graph_node:use"),
    "cudaGraphMemcpyNodeSetParams1D": P("node=handle:graph_node; dst=device_ptr; src=device_ptr; count=scalar; kind=scalar", "graph_node:use"),
    "cudaGraphAddMemsetNode": P("pGraphNode=out_value:graph_node; graph=handle:graph; pDependencies=in_buffer:graph_node@numDependencies * sizeof(cudaGraphNode_t); numDependencies=scalar; pMemsetParams=in_buffer@sizeof(struct cudaMemsetParams)", "graph_node:create; graph:use; graph_node:use"),
    "cudaGraphMemsetNodeSetParams": P("node=handle:graph_node; pNodeParams=in_buffer@sizeof(struct cudaMemsetParams)", "graph_node:use"),
    "cudaGraphAddHostNode": P("pGraphNode=out_value:graph_node; graph=handle:graph; pDependencies=in_buffer:graph_node@numDependencies * sizeof(cudaGraphNode_t); numDependencies=scalar; pNodeParams=in_buffer@sizeof(struct cudaHostNodeParams)", "graph_node:create; graph:use; graph_node:use"),
    "cudaGraphHostNodeSetParams": P("node=handle:graph_node; pNodeParams=in_buffer@sizeof(struct cudaHostNodeParams)", "graph_node:use"),
    "cudaGraphAddChildGraphNode": P("pGraphNode=out_value:graph_node; graph=handle:graph; pDependencies=in_buffer:graph_node@numDependencies * sizeof(cudaGraphNode_t); numDependencies=scalar; childGraph=handle:graph", "graph_node:create; graph:use; graph_node:use"),
    "cudaGraphAddEmptyNode": P("pGraphNode=out_value:graph_node; graph=handle:graph; pDependencies=in_buffer:graph_node@numDependencies * sizeof(cudaGraphNode_t); numDependencies=scalar", "graph_node:create; graph:use; graph_node:use"),
    "cudaGraphAddEventRecordNode": P("pGraphNode=out_value:graph_node; graph=handle:graph; pDependencies=in_buffer:graph_node@numDependencies * sizeof(cudaGraphNode_t); numDependencies=scalar; event=handle:event", "graph_node:create; graph:use; graph_node:use; event:use"),
    "cudaGraphAddEventWaitNode": P("pGraphNode=out_value:graph_node; graph=handle:graph; pDependencies=in_buffer:graph_node@numDependencies * sizeof(cudaGraphNode_t); numDependencies=scalar; event=handle:event", "graph_node:create; graph:use; graph_node:use; event:use"),
    "cudaGraphClone": P("pGraphClone=out_value:graph; originalGraph=handle:graph", "graph:create; graph:use"),
    "cudaGraphNodeGetType": P("node=handle:graph_node; pType=out_value", "graph_node:use"),
    "cudaGraphGetNodes": P("graph=handle:graph; nodes=out_buffer:graph_node@*numNodes * sizeof(cudaGraphNode_t); numNodes=out_value", "graph:use; graph_node:use"),
    "cudaGraphGetRootNodes": P("graph=handle:graph; pRootNodes=out_value:graph_node; pNumRootNodes=out_value", "graph:use; graph_node:use"),
    "cudaGraphGetEdges": P("graph=handle:graph; from=out_value:graph_node; to=out_value:graph_node; edgeData=out_value; numEdges=out_value", "graph:use; graph_node:use"),
    "cudaGraphAddDependencies": P("graph=handle:graph; from=in_buffer:graph_node@numDependencies * sizeof(cudaGraphNode_t); to=in_buffer:graph_node@numDependencies * sizeof(cudaGraphNode_t); edgeData=in_buffer@numDependencies * sizeof(cudaGraphEdgeData); numDependencies=scalar", "graph:use; graph_node:use"),
    "cudaGraphRemoveDependencies": P("graph=handle:graph; from=in_buffer:graph_node@numDependencies * sizeof(cudaGraphNode_t); to=in_buffer:graph_node@numDependencies * sizeof(cudaGraphNode_t); edgeData=in_buffer@numDependencies * sizeof(cudaGraphEdgeData); numDependencies=scalar", "graph:use; graph_node:use"),
    "cudaGraphDestroyNode": P("node=handle:graph_node", "graph_node:destroy"),
    "cudaGraphNodeGetDependencies": P("node=handle:graph_node; pDependencies=out_value:graph_node; edgeData=out_value; pNumDependencies=out_value", "graph_node:use"),
    "cudaGraphNodeGetDependentNodes": P("node=handle:graph_node; pDependentNodes=out_value:graph_node; edgeData=out_value; pNumDependentNodes=out_value", "graph_node:use"),
    "cudaGraphExecChildGraphNodeSetParams": P("hGraphExec=handle:graph_exec; node=handle:graph_node; childGraph=handle:graph", "graph_exec:use; graph_node:use; graph:use"),
    "cudaGraphNodeSetEnabled": P("hGraphExec=handle:graph_exec; hNode=handle:graph_node; isEnabled=scalar", "graph_exec:use; graph_node:use"),
    "cudaGraphNodeGetEnabled": P("hGraphExec=handle:graph_exec; hNode=handle:graph_node; isEnabled=out_value", "graph_exec:use; graph_node:use"),
    "cudaStreamBeginCaptureToGraph": P("stream=handle:stream; graph=handle:graph; dependencies=in_buffer:graph_node@numDependencies * sizeof(cudaGraphNode_t); dependencyData=in_buffer@numDependencies * sizeof(cudaGraphEdgeData); numDependencies=scalar; mode=scalar", "stream:use; graph:use; graph_node:use"),
    "cudaGraphInstantiateWithParams": P("pGraphExec=out_value:graph_exec; graph=handle:graph; instantiateParams=in_buffer@sizeof(cudaGraphInstantiateParams)", "graph_exec:create; graph:use"),
    "cudaGraphExecKernelNodeSetParams": P("hGraphExec=handle:graph_exec; node=handle:graph_node; pNodeParams=in_buffer@sizeof(struct cudaKernelNodeParams)", "graph_exec:use; graph_node:use"),
    "cudaGraphExecMemcpyNodeSetParams": P("hGraphExec=handle:graph_exec; node=handle:graph_node; pNodeParams=in_buffer@sizeof(struct cudaMemcpy3DParms)", "graph_exec:use; graph_node:use"),
    "cudaGraphExecMemcpyNodeSetParams1D": P("hGraphExec=handle:graph_exec; node=handle:graph_node; dst=device_ptr; src=device_ptr; count=scalar; kind=scalar", "graph_exec:use; graph_node:use"),
    "cudaGraphExecMemsetNodeSetParams": P("hGraphExec=handle:graph_exec; node=handle:graph_node; pNodeParams=in_buffer@sizeof(struct cudaMemsetParams)", "graph_exec:use; graph_node:use"),
    "cudaGraphExecHostNodeSetParams": P("hGraphExec=handle:graph_exec; node=handle:graph_node; pNodeParams=in_buffer@sizeof(struct cudaHostNodeParams)", "graph_exec:use; graph_node:use"),
    "cudaGraphExecUpdate": P("hGraphExec=handle:graph_exec; hGraph=handle:graph; resultInfo=out_value", "graph_exec:use; graph:use"),
    "cudaGraphAddNode": P("pGraphNode=out_value:graph_node; graph=handle:graph; pDependencies=in_buffer:graph_node@numDependencies * sizeof(cudaGraphNode_t); dependencyData=in_buffer@numDependencies * sizeof(cudaGraphEdgeData); numDependencies=scalar; nodeParams=in_buffer@sizeof(struct cudaGraphNodeParams)", "graph_node:create; graph:use; graph_node:use"),
    # graph memory nodes (interceptor/rt_graph.c)
    "cudaGraphAddMemAllocNode": P("pGraphNode=out_value:graph_node; graph=handle:graph; pDependencies=in_buffer:graph_node@numDependencies * sizeof(cudaGraphNode_t); numDependencies=scalar; nodeParams=in_buffer@sizeof(struct cudaMemAllocNodeParams)", "graph_node:create; graph:use; graph_node:use"),
    "cudaGraphMemAllocNodeGetParams": P("node=handle:graph_node; params_out=out_value", "graph_node:use"),
    "cudaGraphAddMemFreeNode": P("pGraphNode=out_value:graph_node; graph=handle:graph; pDependencies=in_buffer:graph_node@numDependencies * sizeof(cudaGraphNode_t); numDependencies=scalar; dptr=device_ptr", "graph_node:create; graph:use; graph_node:use"),
    "cudaGraphMemFreeNodeGetParams": P("node=handle:graph_node; dptr_out=out_buffer@?", "graph_node:use"),
    "cudaDeviceGraphMemTrim": P("device=scalar"),
    "cudaDeviceGetGraphMemAttribute": P("device=scalar; attr=scalar; value=out_buffer@?"),
    "cudaDeviceSetGraphMemAttribute": P("device=scalar; attr=scalar; value=in_buffer@?"),
}

RUNTIME_ASYNC = {
    "cudaLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync", "cudaMemset", "cudaEventRecord",
    "cudaMemset2D", "cudaMemset2DAsync", "cudaMemset3D", "cudaMemset3DAsync",
    "cudaEventRecordWithFlags", "cudaStreamWaitEvent", "__cudaLaunchKernel",
    "__cudaLaunchKernel_ptsz", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel",
}

# Corrections to the heuristics for unsupported functions whose roles they get
# wrong in an obvious way (name -> {param: "role[:kind][@size]"}).
_TENSOR_MAP = {
    "globalAddress": "device_ptr",
    "globalDim": "in_buffer@tensorRank * sizeof(cuuint64_t)",
    "globalStrides": "in_buffer@(tensorRank - 1) * sizeof(cuuint64_t)",
    "elementStrides": "in_buffer@tensorRank * sizeof(cuuint32_t)",
}
ROLE_FIXES: Dict[str, Dict[str, str]] = {
    # inputs declared without const
    "cuLinkAddData": {"data": "in_buffer@size"},
    "cuLinkAddData_v2": {"data": "in_buffer@size"},
    "cuLinkComplete": {"cubinOut": "out_value", "sizeOut": "out_value"},
    "cuDeviceGetLuid": {"luid": "out_buffer@8"},
    "cudaDeviceGetLuid": {"luid": "out_buffer@8"},
    "cuPointerGetAttribute": {"data": "out_buffer@?"},
    "cuPointerGetAttributes": {"data": "in_buffer@numAttributes * sizeof(void *)",
                               "attributes": "in_buffer@numAttributes * sizeof(CUpointer_attribute)"},
    "cuParamSetv": {"ptr": "in_buffer@numbytes"},
    "cuTexRefSetBorderColor": {"pBorderColor": "in_buffer@4 * sizeof(float)"},
    # tensor maps: arrays sized by the tensor rank; globalAddress is device memory
    "cuTensorMapEncodeTiled": dict(_TENSOR_MAP, boxDim="in_buffer@tensorRank * sizeof(cuuint32_t)"),
    "cuTensorMapEncodeIm2col": dict(
        _TENSOR_MAP, pixelBoxLowerCorner="in_buffer@(tensorRank - 2) * sizeof(int)",
        pixelBoxUpperCorner="in_buffer@(tensorRank - 2) * sizeof(int)"),
    "cuTensorMapEncodeIm2colWide": dict(_TENSOR_MAP),
    "cuTensorMapReplaceAddress": {"globalAddress": "device_ptr"},
    "cuDevSmResourceSplitByCount": {"result": "out_buffer@*nbGroups * sizeof(CUdevResource)",
                                    "input": "in_buffer@sizeof(CUdevResource)"},
    # the stream is passed by pointer but only read
    "cuEGLStreamConsumerAcquireFrame": {"pStream": "in_buffer:stream@sizeof(CUstream)"},
    "cuEGLStreamConsumerReleaseFrame": {"pStream": "in_buffer:stream@sizeof(CUstream)"},
    "cuEGLStreamProducerPresentFrame": {"pStream": "in_buffer:stream@sizeof(CUstream)"},
    "cuEGLStreamProducerReturnFrame": {"pStream": "in_buffer:stream@sizeof(CUstream)"},
    "cuGLGetDevices": {"pCudaDevices": "out_buffer:device@cudaDeviceCount * sizeof(CUdevice)"},
    "cudaGLGetDevices": {"pCudaDevices": "out_buffer@cudaDeviceCount * sizeof(int)"},
    "cudaEGLStreamConsumerAcquireFrame": {"pStream": "in_buffer:stream@sizeof(cudaStream_t)"},
    "cudaEGLStreamConsumerReleaseFrame": {"pStream": "in_buffer:stream@sizeof(cudaStream_t)"},
    "cudaEGLStreamProducerPresentFrame": {"pStream": "in_buffer:stream@sizeof(cudaStream_t)"},
    "cudaEGLStreamProducerReturnFrame": {"pStream": "in_buffer:stream@sizeof(cudaStream_t)"},
    "cudaMemPoolGetAccess": {"location": "in_buffer@sizeof(struct cudaMemLocation)"},
    "cudaMemGetDefaultMemPool": {"location": "in_buffer@sizeof(struct cudaMemLocation)"},
    "cudaMemGetMemPool": {"location": "in_buffer@sizeof(struct cudaMemLocation)"},
    "cudaMemSetMemPool": {"location": "in_buffer@sizeof(struct cudaMemLocation)"},
    "cudaMemPoolImportFromShareableHandle": {"shareableHandle": "host_ptr"},
    "cudaMemPoolImportPointer": {"exportData": "in_buffer@sizeof(struct cudaMemPoolPtrExportData)"},
    "cudaMemRangeGetAttributes": {
        "data": "in_buffer@numAttributes * sizeof(void *)",
        "dataSizes": "in_buffer@numAttributes * sizeof(size_t)",
        "attributes": "in_buffer@numAttributes * sizeof(enum cudaMemRangeAttribute)"},
    "cudaSetValidDevices": {"device_arr": "in_buffer@len * sizeof(int)"},
    # registration entry points that are not supported: opaque handles and host keys
    "__cudaRegisterManagedVar": {"fatCubinHandle": "host_ptr", "hostVarPtrAddress": "host_ptr",
                                 "deviceAddress": "in_buffer@strlen(deviceAddress) + 1"},
    "__cudaRegisterHostVar": {"fatCubinHandle": "host_ptr", "hostVar": "host_ptr"},
    "__cudaRegisterUnifiedTable": {"fatCubinHandle": "host_ptr", "functionTable": "host_ptr",
                                   "dataTable": "host_ptr"},
    "cuGLGetDevices_v2": {"pCudaDevices": "out_buffer:device@cudaDeviceCount * sizeof(CUdevice)"},
    # CUmemLocation *location is read, not written
    "cuMemPoolGetAccess": {"location": "in_buffer@sizeof(CUmemLocation)"},
    "cuMemGetDefaultMemPool": {"location": "in_buffer@sizeof(CUmemLocation)"},
    "cuMemGetMemPool": {"location": "in_buffer@sizeof(CUmemLocation)"},
    "cuMemSetMemPool": {"location": "in_buffer@sizeof(CUmemLocation)"},
    # OS handles (fds) passed as void *
    "cuMemPoolImportFromShareableHandle": {"handle": "host_ptr"},
    "cuMemImportFromShareableHandle": {"osHandle": "host_ptr"},
    "cuMemPoolImportPointer": {"shareData": "in_buffer@sizeof(CUmemPoolPtrExportData)"},
    "cuMemRetainAllocationHandle": {"addr": "device_ptr"},
    "cuMemSetAccess": {"desc": "in_buffer@count * sizeof(CUmemAccessDesc)"},
    "cuMemRangeGetAttributes": {"data": "in_buffer@numAttributes * sizeof(void *)",
                                "dataSizes": "in_buffer@numAttributes * sizeof(size_t)",
                                "attributes": "in_buffer@numAttributes * sizeof(CUmem_range_attribute)"},
    "cuMemRangeGetAttribute": {"data": "out_buffer@dataSize"},
    "cuGraphGetEdges": {"from": "out_buffer:graph_node@*numEdges * sizeof(CUgraphNode)",
                        "to": "out_buffer:graph_node@*numEdges * sizeof(CUgraphNode)"},
    "cuGraphGetEdges_v2": {"from": "out_buffer:graph_node@*numEdges * sizeof(CUgraphNode)",
                           "to": "out_buffer:graph_node@*numEdges * sizeof(CUgraphNode)",
                           "edgeData": "out_buffer@*numEdges * sizeof(CUgraphEdgeData)"},
    "cuGraphNodeGetDependencies_v2": {
        "edgeData": "out_buffer@*numDependencies * sizeof(CUgraphEdgeData)"},
    "cuGraphNodeGetDependentNodes_v2": {
        "edgeData": "out_buffer@*numDependentNodes * sizeof(CUgraphEdgeData)"},
    "cuMemGetHandleForAddressRange": {"handle": "out_buffer@?"},
}


def _parse_role(spec: str) -> Dict:
    d: Dict = {}
    if "@" in spec:
        spec, d["size"] = spec.split("@", 1)
        d["size"] = d["size"].strip()
    if ":" in spec:
        spec, d["kind"] = spec.split(":", 1)
    d["role"] = spec.strip()
    return d


def table_params(fn: hdr.Prototype, spec: str) -> List[Dict]:
    items = [s.strip() for s in spec.split(";") if s.strip()]
    if len(items) != len(fn.params):
        raise SystemExit(f"bootstrap: table entry for {fn.name}: {len(items)} params given, "
                         f"header has {len(fn.params)}")
    out = []
    for item, p in zip(items, fn.params):
        name, role = item.split("=", 1)
        if name.strip() != p.name:
            raise SystemExit(f"bootstrap: table entry for {fn.name}: param {name.strip()!r} "
                             f"but the header says {p.name!r}")
        d = {"name": p.name, "type": p.type}
        r = _parse_role(role)
        d["role"] = r["role"]
        if "kind" in r:
            d["kind"] = r["kind"]
        if "size" in r:
            d["size"] = r["size"]
        out.append(d)
    return out


def table_objects(spec: str) -> List[Dict]:
    out = []
    for item in [s.strip() for s in spec.split(";") if s.strip()]:
        k, e = item.split(":")
        out.append({"kind": k.strip(), "effect": e.strip()})
    return out


def _table_name(name: str, table) -> Optional[str]:
    """Table key that applies to symbol `name` (itself or its non-_ptds/_ptsz form)."""
    if name in table:
        return name
    for suf in ("_ptds", "_ptsz"):
        if name.endswith(suf) and name[:-len(suf)] in table:
            return name[:-len(suf)]
    return None


def new_entry(fn: hdr.Prototype, ti: TypeIndex, procs) -> Dict:
    """Spec entry (without id) for a function that the YAML does not have yet."""
    supported = DRIVER_SUPPORTED if fn.api == "driver" else RUNTIME_SUPPORTED
    key = _table_name(fn.name, supported)
    if key is not None:
        params = table_params(fn, supported[key]["params"])
        objects = table_objects(supported[key]["objects"])
    else:
        params = [infer_param(fn, i, ti) for i in range(len(fn.params))]
        fixes = ROLE_FIXES.get(fn.name, {})
        for q in params:
            if q["name"] in fixes:
                for k in ("kind", "size"):
                    q.pop(k, None)
                q.update(_parse_role(fixes[q["name"]]))
        objects = infer_objects(fn.name, params)
    e: Dict = {"name": fn.name, "returns": fn.returns, "params": params, "objects": objects}
    if fn.api == "driver":
        e["sync"] = _table_name(fn.name, DRIVER_ASYNC) is None
        e["status"] = "supported" if key else "unsupported"
        pf = procs.get(fn.name)
        if pf is not None:
            e["proc"] = {"base": pf.base, "version": pf.version}
            if pf.stream:
                e["proc"]["stream"] = pf.stream
        if key:
            hkey = _table_name(fn.name, DRIVER_HANDLERS)
            if hkey:
                e["handler"] = DRIVER_HANDLERS[hkey]
            if _table_name(fn.name, DRIVER_SHIM_LOCAL):
                e["shim"] = "local"
            elif _table_name(fn.name, DRIVER_SHIM_OVERRIDE):
                e["shim"] = "override"
    else:
        e["sync"] = _table_name(fn.name, RUNTIME_ASYNC) is None
        e["status"] = "supported" if key else "unsupported"
        if key:
            e["shim"] = "override"
    for q in e["params"]:
        if q["role"] in ("in_buffer", "out_buffer") and "size" not in q:
            q["size"] = "?"
    return e


# --------------------------------------------------------------------------
# YAML writing (compact, deterministic)
# --------------------------------------------------------------------------

try:
    from .specyaml import (ENTRY_KEYS, FILE_KEYS, OBJ_KEYS, PARAM_KEYS, PROC_KEYS, RESTORE_KEYS,  # noqa: F401
                           _sub_order, entry_lines, flow, ordered_keys, scalar, yaml_load)
except ImportError:          # run as a script / autogen/ on sys.path
    from specyaml import (ENTRY_KEYS, FILE_KEYS, OBJ_KEYS, PARAM_KEYS, PROC_KEYS, RESTORE_KEYS,  # noqa: F401
                          _sub_order, entry_lines, flow, ordered_keys, scalar, yaml_load)
def emit_entry(e: Dict) -> str:
    return "\n".join(entry_lines(e, ordered_keys(e, ENTRY_KEYS), PARAM_KEYS, _sub_order))


def emit_file(meta: Dict, entries: List[Dict], comments: Dict[str, str]) -> str:
    out = []
    gen_from = meta["header"]
    out.append(f"# Generated from {gen_from} (CUDA {meta['_cuda_version']}) by "
               f"autogen/bootstrap.py; see docs/spec-format.md.")
    out.append("# Hand annotations (ids, status, roles, objects, sync, proc, handler, shim) are")
    out.append("# kept when the tool is run again; it only adds new functions.")
    for k in FILE_KEYS:
        if k == "functions":
            continue
        out.append(f"{k}: {flow(meta[k], _sub_order(k))}")
    if not entries:
        out.append("functions: []")
    else:
        out.append("functions:")
        for e in entries:
            c = comments.get(e["name"])
            if c:
                for line in c.splitlines():
                    out.append(f"# {line}")
            out.append(emit_entry(e))
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------
# Merge
# --------------------------------------------------------------------------

class Report:
    def __init__(self):
        self.lines: List[str] = []

    def add(self, s: str):
        self.lines.append(s)


def load_existing(spec_dir: Path, api: str) -> Dict[str, Tuple[str, Dict, List[Dict]]]:
    """family -> (path, file dict, [entries])."""
    out = {}
    d = spec_dir / api
    if not d.is_dir():
        return out
    for p in sorted(d.glob("*.yaml")):
        with open(p) as f:
            data = yaml_load(f) or {}
        out[p.stem] = (str(p), data, list(data.get("functions") or []))
    return out


def runtime_symbols(home: str, runtime: Dict[str, hdr.Prototype], report: Report) -> Dict[str, hdr.Prototype]:
    """Runtime functions the shim must export: those the real library exports."""
    lib = hdr.runtime_library(home)
    if os.path.exists(lib):
        exported = set(hdr.runtime_exports(home))
        skipped = sorted(n for n in runtime if n not in exported)
    else:
        skipped = sorted(n for n in ("__cudaRegisterTexture", "__cudaRegisterSurface") if n in runtime)
        report.add(f"note: {lib} not found; leaving out {' '.join(skipped)}")
    if skipped:
        report.add(f"runtime: declared but not exported by libcudart.so.13, left out: {' '.join(skipped)}")
    return {n: p for n, p in runtime.items() if n not in skipped}


def build(home: str, spec_dir: Path, report: Report) -> Dict[Path, str]:
    """Compute the new content of every spec file."""
    ti = TypeIndex(home)
    driver = hdr.parse_driver(home)
    runtime = runtime_symbols(home, hdr.parse_runtime(home), report)
    procs, unmatched = hdr.match_pfns(driver, home)
    no_proc = sorted(n for n in driver if n not in procs)
    if no_proc:
        report.add(f"driver: symbols without a PFN typedef (no proc): {' '.join(no_proc)}")
    if unmatched:
        report.add(f"driver: PFN typedefs without a symbol: {' '.join(f.typedef for f in unmatched)}")
    version = hdr.cuda_version(home)
    vmin = version // 1000 * 1000
    outputs: Dict[Path, str] = {}
    for api, protos in (("driver", driver), ("runtime", runtime)):
        existing = load_existing(spec_dir, api)
        # where each existing entry lives
        where: Dict[str, str] = {}
        used_ids = []
        for fam, (_, _, entries) in existing.items():
            for e in entries:
                where[e["name"]] = fam
                if isinstance(e.get("id"), int):
                    used_ids.append(e["id"])
        lo, hi = ID_RANGES[api]
        next_id = max([i for i in used_ids if lo <= i <= hi] + [lo - 1]) + 1
        # family of every header function, ordered by header then position
        hdr_order = [h for h, _, _ in (hdr.DRIVER_HEADERS if api == "driver" else hdr.RUNTIME_HEADERS)]
        hdr_order += sorted({h for h, _, _ in hdr.REGISTRATION_PROTOTYPES.values()}, reverse=True)

        def fkey(p: hdr.Prototype):
            hi_ = hdr_order.index(p.header) if p.header in hdr_order else len(hdr_order)
            return (hi_, not p.declared, p.header) + hdr.sort_key(p)

        ordered = sorted(protos.values(), key=fkey)
        fam_of = {p.name: where.get(p.name, family_of(p.group, api)) for p in ordered}
        families: List[str] = []
        for p in ordered:
            if fam_of[p.name] not in families:
                families.append(fam_of[p.name])
        for fam in existing:
            if fam not in families:
                families.append(fam)
        rank = {p.name: k for k, p in enumerate(ordered)}
        for fam in families:
            path = spec_dir / api / f"{fam}.yaml"
            old_entries = existing.get(fam, (None, {}, []))[2]
            old_data = existing.get(fam, (None, {}, []))[1]
            by_name = {e["name"]: e for e in old_entries}
            members = [p for p in ordered if fam_of[p.name] == fam]
            entries: List[Tuple[Tuple, Dict]] = []
            for p in members:
                if p.name in by_name:
                    e = by_name[p.name]
                    check_prototype(e, p, report)
                else:
                    e = new_entry(p, ti, procs)
                    if next_id > hi:
                        raise SystemExit(f"bootstrap: {api} id range {lo}..{hi} exhausted")
                    e = dict(e)
                    e = {"name": e["name"], "id": next_id, **{k: v for k, v in e.items() if k != "name"}}
                    next_id += 1
                    report.add(f"{api}/{fam}: added {p.name} (id {e['id']})")
                entries.append(((0, rank[p.name]), e))
            for k, e in enumerate(old_entries):
                if e["name"] not in protos:
                    report.add(f"{api}/{fam}: {e['name']} is no longer in the headers (kept)")
                    entries.append(((1, k), e))
            entries.sort(key=lambda x: x[0])
            entries_only = [e for _, e in entries]
            groups = []
            headers = []
            for p in members:
                g = p.group
                if g not in groups:
                    groups.append(g)
                if p.header:
                    headers.append(p.header)
            header_name = max(set(headers), key=lambda h: (headers.count(h), -headers.index(h))) \
                if headers else old_data.get("header", "")
            meta = {
                "api": api, "family": fam, "library": LIBRARIES[api], "soname": LIBRARIES[api],
                "header": header_name,
                "doc_group": groups or old_data.get("doc_group", []),
                "cuda_version": {"min": vmin, "max": vmin + 999},
                "_cuda_version": version,
            }
            comments = {}
            for p in members:
                if not p.declared:
                    comments[p.name] = ("not declared in any CUDA header; prototype inferred "
                                        "(autogen/header.py UNDECLARED_RUNTIME_EXPORTS)")
                elif p.header != header_name:
                    comments[p.name] = f"declared in {p.header}"
            outputs[path] = emit_file(meta, entries_only, comments)
    return outputs


def check_prototype(e: Dict, p: hdr.Prototype, report: Report) -> None:
    types = [q.get("type") for q in e.get("params") or []]
    if e.get("returns") != p.returns or types != list(p.param_types):
        report.add(f"WARNING: {p.name}: spec prototype differs from the header: "
                   f"{e.get('returns')} ({', '.join(map(str, types))}) vs {p.c_decl()}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Write the spec YAML files from the CUDA headers.")
    ap.add_argument("--cuda-home", default=None, help="CUDA install (default $CUDA_HOME or /usr/local/cuda)")
    ap.add_argument("--specs", default=None, help="spec directory (default: <repo>/specs)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if files would change")
    ap.add_argument("-q", "--quiet", action="store_true")
    ap.add_argument("--libraries", action="store_true",
                    help="write the library families (specs/cublas, cublaslt, nvml) instead (libbootstrap.py)")
    ap.add_argument("--lib-include", action="append", default=None,
                    help="folder with cublas*.h / nvml.h (NVIDIA's wheels: nvidia/cu13/include); repeatable")
    ap.add_argument("--lib-dir", action="append", default=None,
                    help="folder with the real libcublas.so.13 etc., for their exports; repeatable")
    a = ap.parse_args(argv)
    home = hdr.cuda_home(a.cuda_home)
    spec_dir = Path(a.specs) if a.specs else Path(__file__).resolve().parents[1] / "specs"
    report = Report()
    if a.libraries:
        try:
            from . import libbootstrap
        except ImportError:
            import libbootstrap  # type: ignore
        outputs = libbootstrap.build(spec_dir, a.lib_include or libbootstrap.default_includes(),
                                     a.lib_dir or libbootstrap.default_lib_dirs(), os.path.join(home, "include"), report)
    else:
        outputs = build(home, spec_dir, report)
    changed = []
    for path, text in sorted(outputs.items()):
        old = path.read_text() if path.exists() else None
        if old != text:
            changed.append(path)
            if not a.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    if not a.quiet:
        for line in report.lines:
            print(line)
        verb = "would change" if a.check else "changed"
        print(f"{len(outputs)} spec files, {len(changed)} {verb}")
        for p in changed:
            print(f"  {p}")
    return 1 if (a.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
