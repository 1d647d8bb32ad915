"""Generates the library stand-ins' C code from the library spec families
(specs/cublas, specs/cublaslt, specs/nvml; docs/libraries.md).

Per library (api), into the generated folder:
  gp_lib_<api>.h        the library's types, written from the spec's `types`
                        (size, alignment, class: no NVIDIA header is needed),
                        function ids, prototypes of hand-written (gpo_) and
                        generic (gpg_) bodies
  gp_lib_<api>_stubs.c  every exported symbol of the real library
  <soname>.map          version script: the real library's version node

Generic bodies follow docs/protocol.md like the driver's (one argument slot
per parameter, outs in the reply), with two differences: the call's own
status is the library's (cublasStatus_t, nvmlReturn_t), and a failure of an
earlier asynchronous op stays pending for the next synchronising CUDA call
instead of answering this call (gp_lib_op_sync, interceptor/lib_state.c).
A scalar_ptr (alpha, beta) travels as its value in host pointer mode and as
the pointer in device pointer mode. A scalar_out (a level-1 result such as
cublasSdot's, cublas_api.h) travels, in host pointer mode, as `size` zero
bytes that the worker fills and answers (the call is then synchronous by
nature: the app reads the value when it returns); in device pointer mode as
the address, which the library writes on the device.
"""
from __future__ import annotations

from .gen_c import GenError, call_args, g, header_comment, param_decl, proto

# types the C library headers that the generated header includes define
STD_TYPES = {"FILE", "size_t"}


def _c_typedef(name: str, t: dict) -> str:
    cls = t.get("class")
    if name in STD_TYPES:
        return ""
    if name.startswith(("struct ", "enum ", "union ")):
        if cls == "opaque":
            return f"{name};"
        return f"{name} {{ _Alignas({t['align']}) unsigned char gp_bytes_[{t['size']}]; }};"
    if cls == "opaque":
        return f"typedef struct gp_opaque_{name} {name};"
    if cls in ("int", "uint"):
        return f"typedef {'' if cls == 'int' else 'u'}int{8 * t['size']}_t {name};"
    if cls == "float":
        return f"typedef {'float' if t['size'] == 4 else 'double'} {name};"
    if cls == "pointer":
        return f"typedef void *{name};"
    if cls == "struct":
        return f"typedef struct {{ _Alignas({t['align']}) unsigned char gp_bytes_[{t['size']}]; }} {name};"
    raise GenError(f"type {name}: class {cls} has no C stand-in")


def can_be_generic(f) -> bool:
    if not g(f, "sync", True) and g(f, "ids") != "shim" and \
            any(g(p, "role") in ("out_value", "inout_value", "out_buffer", "scalar_out") for p in g(f, "params") or []):
        # asynchronous with outputs the generic body cannot name: only a
        # hand-written body (cudnnBackendCreateDescriptor)
        return False
    for p in g(f, "params") or []:
        if g(p, "role") in ("host_ptr", "callback", None) or g(p, "type") == "...":
            return False
        if g(p, "role") in ("in_buffer", "out_buffer", "scalar_ptr", "scalar_out") and g(p, "size") in (None, "?"):
            return False
    return True


def gen_header(sf, fns, sources) -> str:
    api = sf.api
    out = [header_comment(sources), f"#ifndef GP_LIB_{api.upper()}_H", f"#define GP_LIB_{api.upper()}_H", "",
           "#include <stddef.h>", "#include <stdint.h>", "#include <stdio.h>", "#include <string.h>", "", "#include \"gp_libraries.h\"", "",
           f"/* {sf.library}: types as the spec records them ({sf.header}) */"]
    for name, t in sorted(sf.types.items()):
        line = _c_typedef(name, t)
        if line:
            out.append(line)
    er = sf.errors
    out += ["", f"#define GP_{api.upper()}_SUCCESS {er['success']}",
            f"#define GP_{api.upper()}_NOT_SUPPORTED {er['not_supported']}",
            f"#define GP_{api.upper()}_UNAVAILABLE {er['unavailable']}",
            f"#define GP_{api.upper()}_INVALID {er.get('invalid', er['not_supported'])}", ""]
    for f in fns:
        out.append(f"#define GP_FID_{g(f, 'name')} {g(f, 'id')}u")
    out.append("")
    for f in fns:
        if g(f, "status") != "supported":
            continue
        if g(f, "shim") == "override":
            out.append(proto(f, "gpo_" + g(f, "name")) + ";")
        if can_be_generic(f):
            out.append(proto(f, "gpg_" + g(f, "name")) + ";")
    out += ["", "#endif", ""]
    return "\n".join(out)


# each library's status type (its header): what an unsupported or failed call answers
STATUS_TYPES = {"cublas": "cublasStatus_t", "cublaslt": "cublasStatus_t", "nvml": "nvmlReturn_t",
                "cufft": "cufftResult", "curand": "curandStatus_t", "cusparse": "cusparseStatus_t",
                "cusolver": "cusolverStatus_t", "cudnn": "cudnnStatus_t", "nccl": "ncclResult_t"}


def _status_type(sf):
    return STATUS_TYPES[sf.api]


def _int_handle(sf, p) -> bool:
    """A handle type that is an integer, not a pointer (cufft.h: typedef int
    cufftHandle): the worker answers the object's id, written with its own size."""
    t = g(p, "type").replace("*", "").replace("const", "").strip()
    return (sf.types.get(t) or {}).get("class") in ("int", "uint")


def _fail(sf, ret: str, what: str) -> str:
    """The return statement for a call that cannot be made."""
    if ret == _status_type(sf):
        return f"return ({ret})GP_{sf.api.upper()}_{what};"
    if ret == "void":
        return "return;"
    if (sf.types.get(ret) or {}).get("class") == "struct":
        return f"{ret} z_ = {{{{0}}}}; return z_;"
    return f"return ({ret})0;"


# protocol kind codes of library objects whose handles the shim chooses
# (spec `ids: shim`; proxyd/core/protocol.py K_*; tests/test_libraries.py checks
# that the two agree)
SHIM_ID_KINDS = {"cublaslt_matmul_desc": 34, "cublaslt_layout": 35, "cublaslt_preference": 36}


# handles the shim knows (lib_state.c): an asynchronous call on one it does
# not know fails at once, as the real library would answer (a destroyed
# cuBLAS handle: CUBLAS_STATUS_NOT_INITIALIZED)
KNOWN_HANDLES = {"cublas_handle": ("gp_cublas_known", "1")}


# cuBLAS handle settings that PyTorch makes before every gemm (stream,
# workspace, math mode) are kept in the shim and sent only when they differ
# from what proxyd has, by the time a call uses the handle
# (interceptor/lib_cublas.c, "Coalesced settings"). Every other call on a
# cuBLAS handle (or a cuBLAS handle passed as a cuBLASLt one) flushes them
# before its own op; the setters' own generic bodies are what a flush sends.
FLUSH_KINDS = ("cublas_handle", "cublaslt_handle")
COALESCED_SETTERS = ("cublasSetStream_v2", "cublasSetWorkspace_v2", "cublasSetMathMode")


def generic_body(sf, f) -> str:
    name = g(f, "name")
    params = g(f, "params") or []
    sync = bool(g(f, "sync", True))
    ret = g(f, "returns")
    lines = ["    gp_lock();",
             "    if (gp_session() != CUDA_SUCCESS) {", "        gp_unlock();", f"        {_fail(sf, ret, 'UNAVAILABLE')}",
             "    }",
             f"    gp_buf *b_ = gp_op_begin(GP_FID_{name}, {len(params)});"]
    if name not in COALESCED_SETTERS:
        flush = [p for p in params if g(p, "role") == "handle" and g(p, "kind") in FLUSH_KINDS]
        if flush:
            lines.insert(5, f"    gp_cublas_flush({g(flush[0], 'name')});")
    outs = []
    for p in params:
        role, pn = g(p, "role"), g(p, "name")
        cls = (sf.types.get(g(p, "type")) or {}).get("class")
        if role == "scalar":
            if cls == "struct":
                lines.append(f"    mp_bin(b_, &{pn}, sizeof {pn});")
            elif cls == "pointer":
                lines.append(f"    mp_uint(b_, (uint64_t)(uintptr_t){pn});")
            else:
                lines.append(f"    GP_PUT_SCALAR(b_, {pn});")
        elif role in ("device_ptr", "handle"):
            lines.append(f"    mp_uint(b_, (uint64_t)(uintptr_t){pn});")
        elif role == "scalar_ptr":
            # host pointer mode: the value itself; device mode: the pointer
            lines.append(f"    if (!{pn}) mp_nil(b_);")
            lines.append(f"    else if ({g(p, 'mode')}) mp_uint(b_, (uint64_t)(uintptr_t){pn});")
            lines.append(f"    else mp_bin(b_, {pn}, (size_t)({g(p, 'size')}));")
        elif role == "scalar_out":
            # host pointer mode: `size` zero bytes, the value's room, which
            # the worker answers filled; device mode: the pointer
            lines.append(f"    if (!{pn}) mp_nil(b_);")
            lines.append(f"    else if ({g(p, 'mode')}) mp_uint(b_, (uint64_t)(uintptr_t){pn});")
            lines.append(f"    else {{ static const unsigned char z_[64]; size_t n_ = (size_t)({g(p, 'size')}); "
                         f"mp_bin(b_, z_, n_ < sizeof z_ ? n_ : sizeof z_); }}")
            outs.append(p)
        elif role == "in_buffer":
            lines.append(f"    gp_put_data(b_, {pn}, {pn} ? (size_t)({g(p, 'size')}) : 0, {0 if sync else 1});")
        elif role == "out_buffer":
            lines.append(f"    if ({pn}) mp_uint(b_, (uint64_t)({g(p, 'size')})); else mp_nil(b_);")
            outs.append(p)
        elif role == "out_value" and g(f, "ids") == "shim":
            # the shim names the new object (gp_lib_new_handle), so nothing
            # comes back and the create can travel asynchronously
            code = SHIM_ID_KINDS.get(g(p, "kind"))
            if code is None:
                raise GenError(f"{name}: ids: shim for kind {g(p, 'kind')}, which has no kind code here")
            lines.insert(0, f"    if (!{pn}) {_fail(sf, ret, 'INVALID')}")
            lines.append(f"    uint64_t h_ = gp_lib_new_handle({code});")
            lines.append("    mp_uint(b_, h_);")
            lines.append(f"    *{pn} = ({g(p, 'type')[:-1].strip()})(uintptr_t)h_;")
        elif role == "out_value":
            lines.append(f"    mp_bool(b_, {pn} != NULL);")
            outs.append(p)
        elif role == "inout_value":
            # the value (nil for NULL), answered back like an out_value
            lines.append(f"    if ({pn}) GP_PUT_SCALAR(b_, *{pn}); else mp_nil(b_);")
            outs.append(p)
        else:
            raise GenError(f"{name}: parameter {pn} has role {role}, which the generic path cannot send")
    if outs and not sync:
        raise GenError(f"{name}: async function with out parameters")
    if not sync:
        for p in params:
            known = KNOWN_HANDLES.get(g(p, "kind")) if g(p, "role") == "handle" else None
            if known:
                lines.insert(0, f"    if (!{known[0]}({g(p, 'name')})) return ({ret}){known[1]};")
    if not sync:
        lines += ["    int rc_ = gp_lib_op_async();", "    gp_unlock();",
                  f"    if (rc_ < 0) {{ {_fail(sf, ret, 'UNAVAILABLE')} }}", f"    {_fail(sf, ret, 'SUCCESS')}"]
        return "\n".join(lines)
    lines += ["    gp_reply r_;", "    if (gp_lib_op_sync(&r_) < 0) {", "        gp_reply_done(&r_);", "        gp_unlock();",
              f"        {_fail(sf, ret, 'UNAVAILABLE')}", "    }"]
    if outs:
        lines.append(f"    if (r_.code == GP_{sf.api.upper()}_SUCCESS && r_.have_outs && r_.nouts >= {len(outs)}) {{")
        for p in outs:
            pn = g(p, "name")
            if g(p, "role") == "out_buffer":
                lines.append(f"        gp_out_buffer(&r_, {pn}, {pn} ? (size_t)({g(p, 'size')}) : 0);")
            elif g(p, "role") == "scalar_out":
                # nil in device pointer mode (the library wrote device memory)
                lines.append(f"        gp_out_buffer(&r_, {pn}, {pn} ? (size_t)({g(p, 'size')}) : 0);")
            elif g(p, "kind") and g(p, "kind") != "device" and not _int_handle(sf, p):
                lines.append(f"        gp_out_handle(&r_, (void **){pn});")
            else:
                lines.append(f"        gp_out_value(&r_, {pn}, {pn} ? sizeof *{pn} : 0);")
        lines.append("    }")
    if ret == "void":
        lines += ["    gp_reply_done(&r_);", "    gp_unlock();"]
    else:
        # the worker answers the function's return value as the op's code
        lines += [f"    {ret} ret_ = ({ret})r_.code;", "    gp_reply_done(&r_);", "    gp_unlock();", "    return ret_;"]
    return "\n".join(lines)


def gen_stubs(sf, fns, sources) -> str:
    api = sf.api
    out = [header_comment(sources), f"#include \"gp_lib_{api}.h\"", ""]
    for f in fns:
        name, ret = g(f, "name"), g(f, "returns")
        if g(f, "status") != "supported":
            out += [f"GP_EXPORT {proto(f)}", "{"]
            for p in g(f, "params") or []:
                if g(p, "name") != "...":
                    out.append(f"    (void){g(p, 'name')};")
            out += [f"    gp_warn_unsupported(\"{name}\");", f"    {_fail(sf, ret, 'NOT_SUPPORTED')}", "}", ""]
            continue
        if can_be_generic(f):
            out += [proto(f, "gpg_" + name), "{", generic_body(sf, f), "}", ""]
        if g(f, "shim") == "override":
            kw = "" if ret == "void" else "return "
            out += [f"GP_EXPORT {proto(f)}", "{", f"    {kw}gpo_{name}({call_args(f)});", "}", ""]
        else:
            if not can_be_generic(f):
                raise GenError(f"{name}: supported, no override, and not sendable generically")
            out += [f"GP_EXPORT {proto(f)}", "{", f"    return gpg_{name}({call_args(f)});", "}", ""]
    return "\n".join(out)


def gen_version_script(sf, fns) -> str:
    names = "\n".join(f"    {g(f, 'name')};" for f in fns)
    node = sf.version_node
    # the real libcublas.so.13 defines every symbol in version node
    # "libcublas.so.13" (readelf -V); programs linked against it (libtorch)
    # ask for name@libcublas.so.13. NVML's are unversioned.
    head = f"{node} {{" if node else "{"
    return "/* generated by gpuproxy.autogen; do not edit */\n" + head + "\n  global:\n" + names + \
        "\n  local: *;\n};\n"


def lib_files(specs) -> list:
    """[(SpecFile, [functions in id order])] of the library families."""
    out = []
    for sf in specs.files:
        if sf.api in ("driver", "runtime"):
            continue
        out.append((sf, sorted(sf.functions, key=lambda f: f.id)))
    return out


def _proto_check(fns):
    for f in fns:
        for p in g(f, "params") or []:
            param_decl(p)
