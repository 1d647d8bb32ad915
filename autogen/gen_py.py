"""Generates the daemon's dispatch table (a Python module) from the specs.

For every supported driver function: its name, whether the caller waits,
the hand-written handler (if any), and each parameter's role, object kind,
C type and the class/size of the value that travels (for out-values: of the
pointee). Also the cffi declarations proxyd uses to call the real driver for
the generic path, derived from the same specs.
"""
from __future__ import annotations

from .gen_c import g, is_handle, pointee
from .typeinfo import CType


def _param_tuple(p, types: dict[str, CType]):
    role, t = g(p, "role"), g(p, "type")
    cls, size = None, None
    if role in ("scalar", "handle", "device_ptr") and t in types:
        cls, size = types[t].cls, types[t].size
    elif role == "out_value" and not is_handle(p):
        ct = types[pointee(t)]
        cls, size = ct.cls, ct.size
    elif role == "out_value":
        cls, size = "handle", 8
    return (g(p, "name"), role, g(p, "kind"), t, cls, size, g(p, "size"))


def _cffi_param(p, types: dict[str, CType]) -> str:
    role, t = g(p, "role"), g(p, "type")
    if role in ("scalar", "handle", "device_ptr") and t in types:
        ct = types[t]
        if ct.cls == "struct":
            return None
        return ct.cffi
    return "void *"


# C builtin types of library prototypes: (class, size)
_BUILTIN = {"char": ("int", 1), "signed char": ("int", 1), "unsigned char": ("uint", 1), "short": ("int", 2),
            "unsigned short": ("uint", 2), "int": ("int", 4), "unsigned int": ("uint", 4), "long": ("int", 8),
            "unsigned long": ("uint", 8), "long long": ("int", 8), "unsigned long long": ("uint", 8),
            "size_t": ("uint", 8), "int8_t": ("int", 1), "int16_t": ("int", 2), "int32_t": ("int", 4),
            "int64_t": ("int", 8), "uint8_t": ("uint", 1), "uint16_t": ("uint", 2), "uint32_t": ("uint", 4),
            "uint64_t": ("uint", 8), "float": ("float", 4), "double": ("float", 8)}


def _lib_class(t: str, sf):
    t = t.replace("const ", "").strip()
    if t.endswith(" const"):     # cudnnBackendDescriptor_t const (cudnn_graph.h)
        t = t[:-len(" const")]
    words = t.split()
    if words and set(words) <= {"long", "int", "short", "char", "signed", "unsigned"} and len(words) > 1:
        # 'long long int', 'unsigned long long int', 'unsigned int', ...
        size = 8 if "long" in words else 2 if "short" in words else 1 if "char" in words else 4
        return ("uint" if "unsigned" in words else "int"), size
    if t in _BUILTIN:
        return _BUILTIN[t]
    info = sf.types.get(t)
    if info and info.get("class") != "opaque":
        return info["class"], info["size"]
    return None, None


def _lib_param_tuple(p, sf):
    role, t = g(p, "role"), g(p, "type")
    cls, size = None, None
    if role in ("scalar", "handle", "device_ptr"):
        cls, size = _lib_class(t, sf)
    elif role == "out_value" and g(p, "kind") and g(p, "kind") != "device":
        cls, size = "handle", 8
    elif role in ("out_value", "inout_value"):
        cls, size = _lib_class(pointee(t), sf)
    return (g(p, "name"), role, g(p, "kind"), t, cls, size, g(p, "size"))


def _lib_cffi(t: str, role: str, sf) -> str:
    if role in ("scalar", "handle", "device_ptr"):
        cls, size = _lib_class(t, sf)
        if cls in ("int", "uint"):
            return ("" if cls == "int" else "u") + f"int{8 * size}_t"
        if cls == "float":
            return "float" if size == 4 else "double"
        if cls == "struct":
            return None
    return "void *"


def gen_dispatch(driver, types: dict[str, CType], sources: list[str], libs=()) -> str:
    rows, cdef, names = [], [], []
    lib_rows, lib_cdef = [], {}
    for sf, fns in libs:
        decls = []
        for f in fns:
            names.append(f"    {g(f, 'id')}: {g(f, 'name')!r},")
            if g(f, "status") != "supported":
                continue
            params = g(f, "params") or []
            pt = tuple(_lib_param_tuple(p, sf) for p in params)
            objs = tuple((g(o, "kind"), g(o, "effect")) for o in (g(f, "objects") or []))
            rs = g(f, "restore")
            pnames = [g(p, "name") for p in params]
            key = tuple(pnames.index(k) for k in (g(rs, "key") or ()))
            # every library call goes through proxyd/families/libraries.py (handler "library")
            rows.append(f"    {g(f, 'id')}: Fn({g(f, 'name')!r}, {bool(g(f, 'sync', True))!r}, 'library', "
                        f"{g(f, 'shim')!r}, {pt!r}, {objs!r}, {g(rs, 'rule')!r}, {key!r}, {g(f, 'ids')!r}),")
            lib_rows.append(f"    {g(f, 'id')}: {sf.api!r},")
            cp = [_lib_cffi(g(p, "type"), g(p, "role"), sf) for p in params]
            ret = g(f, "returns")
            rcls, rsize = _lib_class(ret, sf)
            rc = "void *" if ret.endswith("*") else ("" if rcls == "int" else "u") + f"int{8 * (rsize or 4)}_t" \
                if rcls in ("int", "uint") else "void" if ret == "void" else None
            if None not in cp and rc:
                decls.append(f"{rc} {g(f, 'name')}({', '.join(cp) or 'void'});")
        lib_cdef[sf.api] = (sf.soname, "\n".join(decls))
    for f in driver:
        names.append(f"    {g(f, 'id')}: {g(f, 'name')!r},")
        if g(f, "status") != "supported":
            continue
        params = g(f, "params") or []
        pt = tuple(_param_tuple(p, types) for p in params)
        objs = tuple((g(o, "kind"), g(o, "effect")) for o in (g(f, "objects") or []))
        rs = g(f, "restore")
        rule = g(rs, "rule") if rs is not None else None
        # replay key as parameter indices; -1 stands for the current context
        pnames = [g(p, "name") for p in params]
        key = tuple(-1 if k == "context" else pnames.index(k) for k in (g(rs, "key") or ())) if rs else ()
        rows.append(f"    {g(f, 'id')}: Fn({g(f, 'name')!r}, {bool(g(f, 'sync', True))!r}, "
                    f"{g(f, 'handler')!r}, {g(f, 'shim')!r}, {pt!r}, {objs!r}, {rule!r}, {key!r}, {g(f, 'ids')!r}),")
        cp = [_cffi_param(p, types) for p in params]
        if None not in cp:
            cdef.append(f"int {g(f, 'name')}({', '.join(cp) or 'void'});")
    src = ", ".join(sorted(sources))
    return "\n".join([
        f'"""Generated by gpuproxy.autogen from specs ({src}).',
        "",
        "Do not edit: change the specs. Read by gpuproxy.proxyd.worker.dispatch.",
        '"""',
        "from collections import namedtuple",
        "",
        "# params: (name, role, kind, ctype, value class, value size, size expression)",
        "# restore: the spec's restore rule; key: for replay, the indices of the params",
        "# that name the setting (-1: the current context); ids: 'shim' where the shim",
        "# names the object the call creates",
        "Fn = namedtuple('Fn', 'name sync handler shim params objects restore key ids', defaults=(None,))",
        "",
        "FUNCTIONS = {",
        *rows,
        "}",
        "",
        "# library functions (docs/libraries.md): function id -> api",
        "LIBRARY = {",
        *lib_rows,
        "}",
        "",
        "# api -> (soname, cffi declarations of its supported functions)",
        f"LIBRARY_CDEF = {lib_cdef!r}",
        "",
        "NAMES = {",
        *names,
        "}",
        "",
        "CDEF = '''",
        *cdef,
        "'''",
        "",
    ])
