"""Graph memory nodes (CUDA Programming Guide, "Graph Memory Nodes"; cuda.h,
cuGraphAddMemAllocNode, cuGraphAddMemFreeNode, cuDeviceGraphMemTrim,
cuDeviceGet/SetGraphMemAttribute), and cuMemAllocAsync / cuMemFreeAsync
captured into a graph.

Natively the virtual address of a graph allocation is fixed when its node
is created (cuGraphAddMemAllocNode returns it in dptr; a captured
cuMemAllocAsync returns it at capture), and physical memory backs it from
the alloc node's run to the free node's run, or, when the graph does not
free it, until the application frees it (cuMemFreeAsync, cuMemFree, or a
free node of another graph).

Model (the "simple" one the issue allows): each alloc node gets an arena
allocation of its own when the node is created. It stays mapped while any
graph or executable graph that holds the alloc node exists, or while the
allocation is live (launched and not freed yet); then it goes back to the
arena. So the address is in the session's arena, a checkpoint stores the
bytes like any device memory and a restore maps them back at the same
address, and nothing is mapped or unmapped at launch. What the launches do
is bookkeeping: an alloc node marks its allocation live, a free node marks
it free. The costs: graph memory is held for the graphs' life rather than
from alloc to free (no physical reuse between graphs or between two
allocations of one graph: cuDeviceGraphMemTrim has nothing to release), and
the footprint attributes count every graph allocation that exists.

The rules of cuda.h that the model keeps, each answered as the driver does:
launching an executable graph whose allocation is still live from an
earlier launch fails with CUDA_ERROR_INVALID_VALUE unless it was
instantiated with CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH (then the
launch frees it first); a free node may only free a graph allocation; an
allocation is freed once; graphs with memory nodes cannot be cloned or used
as child graphs, and their memory nodes cannot be destroyed.

Where the state is: sess.graph_mem, address -> {"size", "device", "live"};
the graph keeps the addresses of its alloc nodes in info["mem"] (explicit
and captured alike), and so does each executable graph instantiated from
it. The image records sess.graph_mem (`graph_mem`); graphs and executable
graphs carry their "mem" lists.

In a graph's op list an alloc node is the op [fid of cuGraphAddMemAllocNode,
ctx, [address, size]] and a free node [fid of cuGraphAddMemFreeNode, ctx,
[address]]: graphs.h_launch runs them here (run_marker) instead of
dispatching them.

Locking: the worker's main loop only (dispatch.py).
"""
from __future__ import annotations

from ..core import protocol as P
from ..core.kinds import Kind, Stage, register
from ..core.arena import ArenaError
from ..core.registry import CUDA_SUCCESS, handler
from ..core.session import CudaError
from .devnum import app_device, physical
from .frees import register_claim
# the memory nodes' markers live with the other nodes (graph_nodes.py); by these names here too
from .graph_nodes import T_MEM_ALLOC, T_MEM_FREE, add_node_info, alloc_marker, commit_node, free_marker, is_marker, node  # noqa: F401
from .mempool import _pool, current_pool

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_INVALID_DEVICE = 101
CUDA_ERROR_NOT_SUPPORTED = 801

# CUgraphMem_attribute (cuda.h)
ATTR_USED_MEM_CURRENT, ATTR_USED_MEM_HIGH, ATTR_RESERVED_MEM_CURRENT, ATTR_RESERVED_MEM_HIGH = 0, 1, 2, 3
# CUgraphInstantiate_flags (cuda.h)
CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH = 1
# CUmemPoolProps (cuda.h) values an alloc node may use
CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_HANDLE_TYPE_NONE = 0


def _high(sess) -> dict:
    return sess.graph_mem_high


def _used(sess, device: int) -> int:
    return sum(r["size"] for r in sess.graph_mem.values() if r["device"] == device)


def _note_high(sess, device: int):
    h = _high(sess)
    h[device] = max(h.get(device, 0), _used(sess, device))


def new_allocation(d, sess, fn_name: str, size: int, device: int) -> int:
    """An alloc node's memory: an arena allocation of its own, not live."""
    if size <= 0:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn_name}: size {size}")
    if not 0 <= device < d.backend.device_count():
        raise CudaError(CUDA_ERROR_INVALID_DEVICE, f"{fn_name}: invalid device ordinal {device}")
    total = d.backend.device_total_mem(device)
    if size > total:
        raise CudaError(CUDA_ERROR_OUT_OF_MEMORY, f"{fn_name} of {size} bytes: out of memory (device {device} "
                                                  f"has {total} bytes)")
    try:
        addr = sess.arena.alloc(size, device)
    except ArenaError as e:
        raise CudaError(e.code, f"{fn_name} of {size} bytes: {e}") from e
    sess.graph_mem[addr] = {"size": size, "device": device, "live": False}
    _note_high(sess, device)
    return addr


def _held(sess, addr: int) -> bool:
    for kind in (P.K_GRAPH, P.K_GRAPH_EXEC):
        for o in sess.of_kind(kind):
            if addr in o.info.get("mem", ()):
                return True
    return False


def release_unused(d, sess, addrs, stream=None):
    """Gives back to the arena the allocations among addrs that no graph or
    executable graph holds and that are not live. Work queued before may
    still use them: the stream (or the whole context) is synchronised
    first, as cuMemFreeAsync's handler does (mempool.py)."""
    gone = [a for a in addrs if a in sess.graph_mem and not sess.graph_mem[a]["live"] and not _held(sess, a)]
    if not gone:
        return
    if stream is not None:
        d.backend.stream_sync(stream)
    else:
        # a graph or executable graph destroyed while a launch may still run
        for c in list(sess.contexts.values()):
            d.backend.ctx_sync(c.real)
    for a in gone:
        del sess.graph_mem[a]
        try:
            sess.arena.free(a)
        except ArenaError:
            pass        # already gone with a reset context: nothing more to give back


def free_outside(d, sess, fn_name: str, addr: int, stream=None) -> bool:
    """cuMemFree / cuMemFreeAsync of addr. Returns False when addr is not a
    graph allocation (the caller frees it as usual)."""
    r = sess.graph_mem.get(addr)
    if r is None:
        return False
    if not r["live"]:
        # cuda.h: an allocation is freed once; one freed (or never launched)
        # is not an allocation any more
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn_name}: graph allocation {addr:#x} is not allocated (its "
                                                  "graph has not run since it was freed)")
    r["live"] = False
    release_unused(d, sess, [addr], stream)
    return True


def _claim_free(d, sess, fn, ctx, addr, stream, name) -> bool:
    return free_outside(d, sess, name, addr, stream)


register_claim(10, _claim_free)     # cuMemFree/cuMemFreeAsync ask it first (frees.py)


def run_marker(d, sess, fn_name: str, op, stream) -> None:
    """An alloc or free node of a launched executable graph."""
    from .._generated import NAMES
    fid, _ctxh, args = op
    addr = int(args[0])
    r = sess.graph_mem.get(addr)
    if NAMES.get(fid) == "cuGraphAddMemAllocNode":
        if r is None:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn_name}: graph allocation {addr:#x} is gone")
        r["live"] = True
        return
    if r is None or not r["live"]:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn_name}: a free node frees {addr:#x}, which is not an "
                                                  "allocated graph allocation")
    r["live"] = False


def before_launch(d, sess, fn_name: str, e, stream) -> None:
    """cuGraphLaunch's check (cuda.h): allocations of this executable graph
    still live from a previous launch make the launch fail, unless it was
    instantiated to free them on launch."""
    live = [a for a in e.info.get("mem", ()) if sess.graph_mem.get(a, {}).get("live")]
    if not live:
        return
    if not e.info.get("flags", 0) & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn_name}: the graph's allocation {live[0]:#x} from an earlier "
                                                  "launch has not been freed")
    for a in live:
        sess.graph_mem[a]["live"] = False


def capture_alloc(d, sess, fn, ctx, args, g, ctxh: int, size_i: int, pool_i: int | None):
    """cuMemAllocAsync / cuMemAllocFromPoolAsync on a capturing stream: an
    alloc node of the capture's graph (cuda.h: the address is returned at
    once and is valid for the graph's work after the node). Returns outs."""
    from ..core.registry import need_ctx
    if pool_i is not None:
        dev = _pool(sess, args[pool_i]).info["device"]
    else:
        dev = current_pool(d, sess, need_ctx(ctx, fn).device).info["device"]
    addr = new_allocation(d, sess, fn.name, int(args[size_i] or 0), dev)
    g.info.setdefault("mem", []).append(addr)
    g.info["nodes"].append(alloc_marker(ctxh, addr, sess.graph_mem[addr]["size"]))
    return [addr]


def capture_free(d, sess, fn, args, g, ctxh: int):
    """cuMemFreeAsync on a capturing stream: a free node; only a graph
    allocation can be freed by a graph."""
    addr = sess.translate(int(args[0] or 0))
    if addr not in sess.graph_mem:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: {addr:#x} is not a graph allocation; a graph can "
                                                  "only free memory that a graph allocates")
    g.info["nodes"].append(free_marker(ctxh, addr))


# ------------------------------------------------------------ node handlers

def _alloc_params(fn, raw) -> tuple[int, int]:
    """[bytesize, allocType, handleTypes, location type, location id] as the
    shim sends CUDA_MEM_ALLOC_NODE_PARAMS (interceptor/graph_mem.c)."""
    if not isinstance(raw, list) or len(raw) != 5 or any(type(x) is not int for x in raw):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: malformed allocation parameters")
    size, atype, htypes, ltype, lid = raw
    if atype != CU_MEM_ALLOCATION_TYPE_PINNED or ltype != CU_MEM_LOCATION_TYPE_DEVICE:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: only pinned device memory can be allocated by a "
                                                  f"graph (allocType {atype}, location type {ltype})")
    if htypes != CU_MEM_HANDLE_TYPE_NONE:
        # cuda.h: "handleTypes must be CU_MEM_HANDLE_TYPE_NONE. IPC is not supported."
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: graph allocations cannot be exported")
    return size, lid


@handler("graph_mem_alloc_node")
def h_alloc_node(d, sess, fn, ctx, args, **kw):
    """cuGraphAddMemAllocNode: [out, graph, [deps], count, params] ->
    [node, dptr]."""
    size, dev = _alloc_params(fn, args[4])
    dev = physical(sess, dev)        # the app's ordinal after a remapping restore (devnum.py)
    g, info = add_node_info(sess, fn, args, T_MEM_ALLOC)
    addr = new_allocation(d, sess, fn.name, size, dev)
    info["ops"] = [alloc_marker(kw.get("ctxh", 0), addr, size)]
    g.info.setdefault("mem", []).append(addr)
    n = commit_node(sess, g, info)
    return CUDA_SUCCESS, [n.handle if args[0] else None, addr]


@handler("graph_mem_node_params")
def h_node_params(d, sess, fn, ctx, args, **kw):
    """cuGraphMemAllocNodeGetParams -> [dptr, bytesize, device];
    cuGraphMemFreeNodeGetParams -> [dptr]."""
    n = node(sess, args[0])
    want = T_MEM_ALLOC if "Alloc" in fn.name else T_MEM_FREE
    if n.info["type"] != want:
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: the node is not a memory "
                                                  f"{'allocation' if want == T_MEM_ALLOC else 'free'} node")
    addr = int(n.info["ops"][0][2][0])
    if want == T_MEM_FREE:
        return CUDA_SUCCESS, [addr]
    r = sess.graph_mem.get(addr, {})
    return CUDA_SUCCESS, [addr, int(n.info["ops"][0][2][1]), app_device(sess, int(r.get("device", 0)))]


def _device(d, fn, dev) -> int:
    dev = int(dev or 0)
    if not 0 <= dev < d.backend.device_count():
        raise CudaError(CUDA_ERROR_INVALID_DEVICE, f"{fn.name}: invalid device ordinal {dev}")
    return dev


@handler("graph_mem_trim")
def h_trim(d, sess, fn, ctx, args, **kw):
    """Nothing is cached: graph memory is held by its graphs (see the top)."""
    _device(d, fn, args[0])
    return CUDA_SUCCESS, []


@handler("graph_mem_attribute")
def h_attribute(d, sess, fn, ctx, args, **kw):
    """cuDeviceGetGraphMemAttribute: [device, attr, want] -> [value];
    cuDeviceSetGraphMemAttribute: [device, attr, 8 bytes]: only the
    high-water marks, only to 0 (cuda.h). Used and reserved are the same
    figure here: every graph allocation that exists is mapped."""
    dev, attr = _device(d, fn, args[0]), int(args[1])
    if attr not in (ATTR_USED_MEM_CURRENT, ATTR_USED_MEM_HIGH, ATTR_RESERVED_MEM_CURRENT, ATTR_RESERVED_MEM_HIGH):
        raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: unknown attribute {attr}")
    if "Set" in fn.name:
        raw = bytes(d.data(sess, args[2]) or b"")
        if len(raw) != 8:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: a value of {len(raw)} bytes (cuuint64_t)")
        if attr not in (ATTR_USED_MEM_HIGH, ATTR_RESERVED_MEM_HIGH) or int.from_bytes(raw, "little") != 0:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: only the high-water marks can be set, to 0")
        _high(sess)[dev] = _used(sess, dev)
        return CUDA_SUCCESS, []
    if attr in (ATTR_USED_MEM_CURRENT, ATTR_RESERVED_MEM_CURRENT):
        return CUDA_SUCCESS, [_used(sess, dev)]
    return CUDA_SUCCESS, [max(_high(sess).get(dev, 0), _used(sess, dev))]


# ------------------------------------------------------------ checkpoints

def describe(sess) -> dict:
    return {"allocs": [[a, r["size"], r["device"], bool(r["live"])] for a, r in sorted(sess.graph_mem.items())],
            "high": {str(k): int(v) for k, v in sess.graph_mem_high.items()}}


def rebuild(sess, desc: dict, dmap):
    """After the arena (the allocations are arena allocations, back at their
    addresses with their bytes)."""
    for a, size, dev, live in (desc or {}).get("allocs", []):
        a = int(a)
        if a not in sess.arena.allocs:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"graph allocation {a:#x} is not in the image's arena")
        sess.graph_mem[a] = {"size": int(size), "device": dmap(int(dev)), "live": bool(live)}
    sess.graph_mem_high = {dmap(int(k)): int(v) for k, v in (desc or {}).get("high", {}).items()}


register(Kind("graph_mem", Stage.GRAPH_MEM, ("graph_mem",), describe=lambda sess: {"graph_mem": describe(sess)},
              rebuild=lambda r: rebuild(r.sess, r.desc.get("graph_mem", {}), r.dmap), owner=__name__))
