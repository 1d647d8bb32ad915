"""Modules and kernels (CUDA Driver API, "Module Management"): loading
images (by content, through the module store: modstore.py), unloading,
kernels and their parameter layouts, __device__ variables; and modules and
kernels as checkpoint object kinds (core/kinds.py).

Every handler takes (dispatcher, session, fn, ctx, args) with one argument per
spec'd parameter and returns (CUresult, outs), outs being one value per
out_value/out_buffer parameter (None where the client passed NULL).

Locking: called on the worker's main loop (dispatch.py).
"""
from __future__ import annotations

import logging

from ..core import protocol as P
from ..core.kinds import CheckpointError, Kind, Stage, register
from ..core.registry import CUDA_SUCCESS, handler, need_ctx
from ..core.session import CudaError
from . import device_vars     # __device__ variables: captured with the modules, checked and written back
from .contexts import release_object

log = logging.getLogger("proxyd")

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_IMAGE = 200


def parse_image_cached(image, uid=None, digest=None) -> object:
    """The parsed layout of a module image, once per distinct content: the
    worker's module store (modstore.py: a bounded LRU by SHA-256, and the
    disk cache of earlier runs for uid's images)."""
    from ..core.fatbin import FatbinError
    from .modstore import store
    try:
        return store().parsed(bytes(image), uid, digest)
    except FatbinError as e:
        raise CudaError(CUDA_ERROR_INVALID_IMAGE, f"module image rejected: {e}") from e


def placement_seq(sess) -> int:
    """The next number of the session's placement order: module loads and
    first kernel lookups, the driver calls that take space in the driver's
    own device memory for code and __device__ variables (modrestore.py).
    Loop thread only, as every handler."""
    n = getattr(sess, "_placement_seq", 0) + 1
    sess._placement_seq = n
    return n


def session_uid(sess):
    """The client's user (for the per-user module cache), None if unknown:
    a keyed-tcp client's key user, else the owner of its process where
    this worker can see it (same pid namespace)."""
    if getattr(sess, "key_uid", None) is not None:
        return sess.key_uid
    cached = getattr(sess, "_module_uid", False)
    if cached is not False:
        return cached
    from ..core import procinfo
    uid = None
    if getattr(sess, "pid", None) and (getattr(sess, "pidns", "") or procinfo.OWN_PIDNS) == procinfo.OWN_PIDNS:
        who = procinfo.owner(sess.pid)
        uid = who[0] if who else None
    sess._module_uid = uid
    return uid


# ----------------------------------------------------------------------- modules

def load_module(d, sess, ctx, image, create, ident=None, digest=None, parsed=None, real=None):
    """real: the driver's module when the caller loaded it already
    (modrestore.py's measuring mode)."""
    image = bytes(image)
    if parsed is None:
        parsed = parse_image_cached(image, session_uid(sess), digest)
    if real is None:
        real = d.backend.module_load(ctx.real, image, parsed)
    return sess.add(P.K_MODULE, real, ctx.id, {"image": image, "parsed": parsed, "globals": {},
                                               "seq": placement_seq(sess)},
                    create=create, ident=ident)


@handler("module_load")
def h_module_load(d, sess, fn, ctx, args, fid=0, ctxh=0, **kw):
    """cuModuleLoadData and friends. The image comes by content first
    (P.ContentRef, docs/protocol.md "Module images by content"): known to
    the store, it is loaded; otherwise the answer is no module and a second
    out of 1, and the shim sends the bytes. Outs: [module, missing]."""
    ctx = need_ctx(ctx, fn)
    image = args[1]
    from .modstore import store
    uid = session_uid(sess)
    if isinstance(image, P.ContentRef):
        digest = image.digest
        image = store().image(digest, image.length, uid)
        if image is None:
            return CUDA_SUCCESS, [0, 1]
    else:
        if not image:
            raise CudaError(CUDA_ERROR_INVALID_VALUE, f"{fn.name}: empty image")
        digest = store().add_image(bytes(image), uid)
    o = load_module(d, sess, ctx, image, create=(fid, ctxh, []), digest=digest)
    return CUDA_SUCCESS, [o.handle, 0]


@handler("module_unload")
def h_module_unload(d, sess, fn, ctx, args, **kw):
    o = sess.get(P.K_MODULE, int(args[0]))
    for f in sess.of_kind(P.K_FUNCTION):
        if f.info.get("module") == o.id:
            sess.drop(f)
    release_object(d, sess, o)
    return CUDA_SUCCESS, []


def function_layout(d, mod, name: str, real) -> list[list[int]]:
    """Parameter layout of kernel `name`: parsed from the module image, and
    checked against the driver's own answer where the backend has one."""
    parsed = mod.info["parsed"]
    k = parsed.kernels.get(name)
    layout = [[p.offset, p.size] for p in k.params] if k is not None else None
    driver = d.backend.param_info(real)
    if layout is None:
        if driver is None:
            amb = getattr(parsed, "ambiguous", {}).get(name)
            if amb:
                raise CudaError(CUDA_ERROR_INVALID_IMAGE, f"kernel {name}: its parameter layout differs between the "
                                                          f"module image's entries ({amb}) and this backend cannot "
                                                          f"say which entry it loaded")
            raise CudaError(CUDA_ERROR_INVALID_IMAGE, f"no parameter layout for kernel {name} in its module image")
        return [list(x) for x in driver]
    if driver is not None and [tuple(x) for x in layout] != [tuple(x) for x in driver]:
        msg = (f"parameter layout of {name} parsed from the image {layout} disagrees with "
               f"cuFuncGetParamInfo {[list(x) for x in driver]}")
        log.error(msg)
        raise CudaError(CUDA_ERROR_INVALID_IMAGE, msg)
    return layout


@handler("module_get_function")
def h_module_get_function(d, sess, fn, ctx, args, fid=0, ctxh=0, **kw):
    mod = sess.get(P.K_MODULE, int(args[1]))
    name = bytes(args[2]).rstrip(b"\0").decode()
    for f in sess.of_kind(P.K_FUNCTION):   # the same handle for the same kernel, as the driver does
        if f.info.get("module") == mod.id and f.info.get("name") == name:
            return CUDA_SUCCESS, [f.handle, f.info["layout"]]
    real = d.backend.module_function(mod.real, name)
    layout = function_layout(d, mod, name, real)
    o = sess.add(P.K_FUNCTION, real, mod.ctx, {"module": mod.id, "name": name, "layout": layout,
                                                "seq": placement_seq(sess)},
                 create=(fid, ctxh, list(args)))
    return CUDA_SUCCESS, [o.handle, layout]


@handler("module_get_global")
def h_module_get_global(d, sess, fn, ctx, args, **kw):
    mod = sess.get(P.K_MODULE, int(args[2]))
    name = bytes(args[3]).rstrip(b"\0").decode()
    addr, size = d.backend.module_global(mod.real, name)
    mod.info["globals"][name] = (addr, size)
    # a variable a restore moved is answered at the address the app first got
    # (Session.app_address): NVIDIA's runtimes look a variable up again for
    # each cudaMemcpy*Symbol and refuse one whose address changed
    # (cudaErrorInvalidSymbol); every call passing it is translated
    addr = sess.app_address(addr)
    return CUDA_SUCCESS, [addr if args[0] else None, size if args[1] else None]


# ------------------------------------------------------------ checkpoints
# Modules and kernels as checkpoint object kinds (core/kinds.py); contexts,
# streams and events are the engine's own steps.

def _describe_modules(sess) -> dict:
    return {"modules": [{"id": o.id, "ctx": o.ctx, "size": len(o.info["image"]),
                         "kernels": sorted(o.info["parsed"].kernels), "globals": {},
                         **({"seq": o.info["seq"]} if o.info.get("seq") else {})}
                        for o in sess.of_kind(P.K_MODULE)]}


def _rebuild_modules(r) -> None:
    """Modules first, in the order the app loaded them (ids grow with each
    load) and before any memory is mapped: a fresh process that loads the
    same modules in the same order gets their __device__ variables at the
    same addresses from the driver, which is what lets pointers to them that
    the app keeps (in host or device memory) stay valid. Kernels the app
    looked up are looked up again between the loads, in the order the app
    did (their placement numbers): with lazy loading the driver places a
    kernel's code at its first lookup, before the next module's variables.
    How the images are read and parsed (serially or in parallel, always
    loaded in order): modrestore.py."""
    from . import modrestore
    modrestore.rebuild(r, load_module, _restore_function, session_uid(r.sess))


def _restore_function(r, f) -> None:
    """A kernel of a reloaded module by name, its layout checked."""
    sess, b = r.sess, r.backend
    mod = sess.objects[(P.K_MODULE, f["module"])]
    b.make_current(sess.contexts[f["ctx"]].real)
    real = b.module_function(mod.real, f["name"])
    layout = function_layout(r.dispatcher, mod, f["name"], real)
    if [list(x) for x in layout] != [list(x) for x in f["layout"]]:
        raise CheckpointError(f"kernel {f['name']}: parameter layout changed")
    sess.add(P.K_FUNCTION, real, f["ctx"], {"module": f["module"], "name": f["name"], "layout": layout,
                                            "seq": placement_seq(sess)}, ident=f["id"])


def _describe_functions(sess) -> dict:
    return {"functions": [{"id": o.id, "ctx": o.ctx, "module": o.info["module"], "name": o.info["name"],
                           "layout": o.info["layout"], **({"seq": o.info["seq"]} if o.info.get("seq") else {})}
                          for o in sess.of_kind(P.K_FUNCTION)]}


def _rebuild_functions(r) -> None:
    """The kernels not looked up with their modules (images without
    placement numbers)."""
    for f in r.desc["functions"]:
        if (P.K_FUNCTION, f["id"]) not in r.sess.objects:
            _restore_function(r, f)


def _module_images(sess, desc: dict) -> list:
    """Each module's image with its manifest entry (describe's order)."""
    return list(zip(desc["modules"], [o.info["image"] for o in sess.of_kind(P.K_MODULE)], strict=True))


register(Kind("modules", Stage.MODULES, ("modules",), describe=_describe_modules, rebuild=_rebuild_modules,
              module_images=_module_images, capture=device_vars.capture, owner=__name__))
register(Kind("functions", Stage.FUNCTIONS, ("functions",), describe=_describe_functions,
              rebuild=_rebuild_functions, owner=__name__))
