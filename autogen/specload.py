"""Load and validate the API spec YAML files (specs/driver, specs/runtime).

    specs = load_specs("specs")
    specs.functions      # every function, in id order
    specs.driver         # driver functions, in id order
    specs.runtime        # runtime functions, in id order
    specs.by_name["cuMemAlloc_v2"].params[0].role

The format is described in docs/spec-format.md. Any problem raises
SpecError, whose message names the file and the function. Depends only on
pyyaml.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import yaml

# Library families (docs/libraries.md): NVIDIA's math libraries and NVML,
# whose shim stand-ins forward each call to the session's worker.
LIBRARY_APIS = ("cublas", "cublaslt", "nvml", "cudnn", "cufft", "curand", "cusparse", "cusolver", "nccl")
# driver object kinds whose creates may name the object in the shim (`ids: shim`):
# proxyd's generic path registers them under that handle (proxyd/worker/dispatch.py)
DRIVER_SHIM_IDS = ("event",)
APIS = ("driver", "runtime") + LIBRARY_APIS
LIBRARIES = {"driver": "libcuda.so.1", "runtime": "libcudart.so.13", "cublas": "libcublas.so.13",
             "cublaslt": "libcublasLt.so.13", "nvml": "libnvidia-ml.so.1", "cudnn": "libcudnn.so.9",
             "cufft": "libcufft.so.12", "curand": "libcurand.so.10", "cusparse": "libcusparse.so.12",
             "cusolver": "libcusolver.so.12", "nccl": "libnccl.so.2"}
ID_RANGES = {"driver": (1, 9999), "runtime": (10000, 19999), "cublas": (20000, 24999),
             "cublaslt": (25000, 26999), "nvml": (27000, 29999), "cudnn": (30000, 31999),
             "cufft": (40000, 40999), "curand": (41000, 41999), "cusparse": (42000, 43999),
             "cusolver": (44000, 46999), "nccl": (47000, 47999)}
# scalar_ptr: a library's alpha/beta: a host pointer to one value (sent as
# the value, `size` bytes) or a device pointer, as the C expression `mode`
# says (the handle's pointer mode, tracked in the shim). scalar_out: its
# counterpart for a result (cublasSdot's `result`, cublas_api.h: "host or
# device pointer" by the handle's pointer mode): in host mode the value,
# `size` bytes, comes back in the answer; in device mode the address travels
ROLES = ("scalar", "device_ptr", "handle", "in_buffer", "out_buffer", "out_value",
         "host_ptr", "callback", "scalar_ptr", "scalar_out",
         # a host value the call reads and writes (cusparseSpGEMM_workEstimation's
         # bufferSize1: in, the buffer's size or 0; out, the size needed); library
         # functions only: sent as the value, answered like an out_value
         "inout_value")
MODE_ROLES = ("scalar_ptr", "scalar_out")
KINDS = ("context", "module", "function", "library", "kernel", "stream", "event", "memory",
         "graph", "graph_exec", "graph_node", "mem_pool", "array", "mipmapped_array", "texref",
         "surfref", "tex_object", "surf_object", "external_memory", "external_semaphore",
         "graphics_resource", "link_state", "user_object", "green_ctx", "mem_handle",
         "log_callback", "device", "async_callback", "dev_resource_desc", "graph_conditional",
         # library objects (docs/libraries.md)
         "cublas_handle", "cublaslt_handle", "cublaslt_matmul_desc", "cublaslt_layout",
         "cublaslt_preference", "cublaslt_transform_desc", "cublaslt_emulation_desc", "nvml_device",
         "nvml_unit", "nvml_event_set", "nvml_gpu_instance", "nvml_compute_instance", "nvml_gpm_sample",
         # cuDNN: the handle, backend (graph API) descriptors, the legacy descriptors (one kind)
         "cudnn_handle", "cudnn_backend_desc", "cudnn_desc",
         "cufft_plan", "curand_generator", "cusparse_handle", "cusparse_spmat", "cusparse_dnvec",
         "cusparse_dnmat", "cusparse_spgemm", "cusparse_spsv", "cusparse_spsm", "cusparse_spvec", "cusolver_dn_handle", "cusolver_dn_params",
         "cusolver_syevj_info", "cusolver_gesvdj_info",
         # NCCL communicators (shim-chosen handles) and registration windows
         "nccl_comm", "nccl_window")
EFFECTS = ("create", "destroy", "use")
STATUSES = ("supported", "unsupported")
SHIMS = {"driver": ("override", "local"), "runtime": ("override",),
         **{a: ("override",) for a in LIBRARY_APIS}}
PROC_STREAMS = ("ptds", "ptsz")
# roles that may carry `kind` (buffers: an array of handles of that kind)
KIND_ROLES = ("handle", "out_value", "in_buffer", "out_buffer")
SIZE_ROLES = ("in_buffer", "out_buffer", "scalar_ptr", "scalar_out")

FILE_KEYS = ("api", "family", "library", "soname", "header", "doc_group", "cuda_version",
             "functions")
# library files also name the symbol version node of the real library's
# exports (null: unversioned), the status codes the shim answers with, and the
# size/alignment/class of every named type their prototypes use
LIBRARY_FILE_KEYS = FILE_KEYS + ("version_node", "errors", "types")
ERROR_KEYS = ("success", "not_supported", "unavailable")
ERROR_KEYS_OPTIONAL = ("invalid",)     # the invalid-argument status, where the shim checks arguments
TYPE_CLASSES = ("int", "uint", "float", "pointer", "struct", "opaque")
FUNCTION_KEYS = ("name", "id", "returns", "params", "objects", "sync", "status", "proc",
                 "handler", "shim", "restore", "declared", "ids")
# How a supported function's effect comes back after a restore (docs/spec-format.md,
# "Restore rules"); every supported function names one.
RESTORE_RULES = ("replay", "object", "memory", "driver", "client", "query", "none-needed")
RESTORE_KEYS = ("rule", "key", "why")
# the pseudo-parameter of a replay key: the calling thread's current context
REPLAY_CONTEXT = "context"
REQUIRED_FUNCTION_KEYS = ("name", "id", "returns", "params", "objects", "sync", "status")
PARAM_KEYS = ("name", "type", "role", "kind", "size", "mode")

_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HANDLER = re.compile(r"^[a-z_][a-z0-9_]*$")


class SpecError(ValueError):
    """A spec file is malformed; the message names file and function."""


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    role: str
    kind: Optional[str] = None
    size: Optional[str] = None          # C expression over the other params, or '?'
    mode: Optional[str] = None          # scalar_ptr, scalar_out: C expression, true for a device pointer

    @property
    def is_pointer(self) -> bool:
        return "*" in self.type


@dataclass(frozen=True)
class ObjectEffect:
    kind: str
    effect: str


@dataclass(frozen=True)
class Proc:
    base: str
    version: int
    stream: Optional[str] = None


@dataclass(frozen=True)
class Restore:
    rule: str
    key: tuple = ()                     # replay: the params (or "context") naming the setting
    why: Optional[str] = None           # none-needed: the reason


@dataclass
class Function:
    name: str
    id: int
    returns: str
    params: List[Param]
    objects: List[ObjectEffect]
    sync: bool
    status: str
    api: str
    family: str
    file: str
    proc: Optional[Proc] = None
    handler: Optional[str] = None
    shim: Optional[str] = None
    restore: Optional[Restore] = None
    declared: bool = True               # library exports without a header declaration: False
    ids: Optional[str] = None           # "shim": the shim names the object it creates (async create)

    @property
    def is_library(self) -> bool:
        return self.api in LIBRARY_APIS

    @property
    def supported(self) -> bool:
        return self.status == "supported"

    @property
    def param_types(self) -> List[str]:
        return [p.type for p in self.params]

    def c_params(self) -> str:
        """'CUdeviceptr *dptr, size_t bytesize' (or 'void')."""
        if not self.params:
            return "void"
        out = []
        for p in self.params:
            if p.type == "...":
                out.append("...")
            elif "(*)" in p.type:
                out.append(p.type.replace("(*)", f"(*{p.name})", 1))
            elif p.type.endswith("*"):
                out.append(f"{p.type}{p.name}")
            else:
                out.append(f"{p.type} {p.name}")
        return ", ".join(out)

    def c_prototype(self) -> str:
        sep = "" if self.returns.endswith("*") else " "
        return f"{self.returns}{sep}{self.name}({self.c_params()})"


@dataclass
class SpecFile:
    path: str
    api: str
    family: str
    library: str
    soname: str
    header: str
    doc_group: List[str]
    cuda_version_min: int
    cuda_version_max: int
    functions: List[Function] = field(default_factory=list)
    version_node: Optional[str] = None
    errors: Dict[str, int] = field(default_factory=dict)
    types: Dict[str, Dict[str, Any]] = field(default_factory=dict)


@dataclass
class Specs:
    files: List[SpecFile]
    functions: List[Function]
    driver: List[Function]
    runtime: List[Function]
    libraries: List[Function]          # library families (not in `functions`)
    by_name: Dict[str, Function]
    by_id: Dict[int, Function]

    def __len__(self) -> int:
        return len(self.functions)

    def __iter__(self):
        return iter(self.functions)


class _Errors:
    def __init__(self):
        self.items: List[str] = []

    def add(self, path, func, msg):
        where = f"{path}: {func}" if func else f"{path}"
        self.items.append(f"{where}: {msg}")

    def raise_if_any(self):
        if self.items:
            n = len(self.items)
            head = self.items[0] if n == 1 else f"{n} problems in the specs:"
            body = "" if n == 1 else "\n  " + "\n  ".join(self.items)
            raise SpecError(head + body)


def _as_size(v: Any) -> Optional[str]:
    if v is None:
        return None
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str) and v.strip():
        return v.strip()
    return None


def _parse_function(raw: Any, api: str, family: str, path: str, errs: _Errors) -> Optional[Function]:
    if not isinstance(raw, dict):
        errs.add(path, None, f"function entry is not a mapping: {raw!r}")
        return None
    name = raw.get("name")
    fname = name if isinstance(name, str) else f"<entry {raw.get('id', '?')}>"
    ok = True

    def bad(msg):
        nonlocal ok
        ok = False
        errs.add(path, fname, msg)

    for k in REQUIRED_FUNCTION_KEYS:
        if k not in raw:
            bad(f"missing key '{k}'")
    for k in raw:
        if k not in FUNCTION_KEYS:
            bad(f"unknown key '{k}'")
    if not ok:
        return None
    if not isinstance(name, str) or not _IDENT.match(name):
        bad(f"invalid name {name!r}")
    fid = raw["id"]
    if not isinstance(fid, int) or isinstance(fid, bool):
        bad(f"id must be an integer, got {fid!r}")
    else:
        lo, hi = ID_RANGES[api]
        if not lo <= fid <= hi:
            bad(f"id {fid} outside the {api} range {lo}..{hi}")
    if not isinstance(raw["returns"], str) or not raw["returns"].strip():
        bad("returns must be a C type")
    status = raw["status"]
    if status not in STATUSES:
        bad(f"status {status!r} is not one of {', '.join(STATUSES)}")
    sync = raw["sync"]
    if not isinstance(sync, bool):
        bad(f"sync must be true or false, got {sync!r}")

    params: List[Param] = []
    raw_params = raw["params"]
    if not isinstance(raw_params, list):
        bad("params must be a list")
        raw_params = []
    seen_params = set()
    for i, rp in enumerate(raw_params):
        if not isinstance(rp, dict):
            bad(f"param {i} is not a mapping")
            continue
        pname = rp.get("name")
        label = f"param {pname or i}"
        for k in rp:
            if k not in PARAM_KEYS:
                bad(f"{label}: unknown key '{k}'")
        if not isinstance(pname, str) or not (_IDENT.match(pname) or pname == "..."):
            bad(f"{label}: invalid name {pname!r}")
            continue
        if pname in seen_params:
            bad(f"{label}: duplicate parameter name")
        seen_params.add(pname)
        ptype = rp.get("type")
        if not isinstance(ptype, str) or not ptype.strip():
            bad(f"{label}: missing type")
            continue
        role = rp.get("role")
        if role not in ROLES:
            bad(f"{label}: role {role!r} is not one of {', '.join(ROLES)}")
            continue
        kind = rp.get("kind")
        if kind is not None:
            if kind not in KINDS:
                bad(f"{label}: kind {kind!r} is not one of {', '.join(KINDS)}")
            elif role not in KIND_ROLES:
                bad(f"{label}: role {role} takes no kind")
        if role == "handle" and kind is None:
            bad(f"{label}: role handle needs a kind")
        size = _as_size(rp.get("size"))
        if role in SIZE_ROLES and size is None:
            bad(f"{label}: role {role} needs a size")
        if role not in SIZE_ROLES and "size" in rp:
            bad(f"{label}: role {role} takes no size")
        mode = rp.get("mode")
        if role in MODE_ROLES and api not in LIBRARY_APIS:
            bad(f"{label}: role {role} is for library functions")
        if mode is not None and (role not in MODE_ROLES or not isinstance(mode, str)):
            bad(f"{label}: mode is a C expression, only for roles {', '.join(MODE_ROLES)}")
        params.append(Param(name=pname, type=ptype.strip(), role=role, kind=kind,
                            size=size if role in SIZE_ROLES else None, mode=mode))

    objects: List[ObjectEffect] = []
    raw_objects = raw["objects"]
    if not isinstance(raw_objects, list):
        bad("objects must be a list")
        raw_objects = []
    for ro in raw_objects:
        if not isinstance(ro, dict) or set(ro) != {"kind", "effect"}:
            bad(f"object entry {ro!r} must be {{kind, effect}}")
            continue
        if ro["kind"] not in KINDS:
            bad(f"object kind {ro['kind']!r} is not one of {', '.join(KINDS)}")
        if ro["effect"] not in EFFECTS:
            bad(f"object effect {ro['effect']!r} is not one of {', '.join(EFFECTS)}")
        objects.append(ObjectEffect(ro["kind"], ro["effect"]))
    listed = {o.kind for o in objects}
    for p in params:
        if p.role == "handle" and p.kind and p.kind not in listed:
            bad(f"param {p.name}: handle of kind {p.kind} is not listed in objects")

    proc = None
    if "proc" in raw:
        rp = raw["proc"]
        if api != "driver":
            bad("runtime entries carry no proc")
        elif not isinstance(rp, dict) or not set(rp) <= {"base", "version", "stream"} \
                or not isinstance(rp.get("base"), str) or not isinstance(rp.get("version"), int):
            bad(f"proc must be {{base: str, version: int[, stream]}}, got {rp!r}")
        elif rp.get("stream") is not None and rp["stream"] not in PROC_STREAMS:
            bad(f"proc stream {rp['stream']!r} is not one of {', '.join(PROC_STREAMS)}")
        else:
            proc = Proc(rp["base"], rp["version"], rp.get("stream"))

    handler = raw.get("handler")
    if handler is not None:
        if api != "driver":
            bad("handler is only for driver functions")
        elif not isinstance(handler, str) or not _HANDLER.match(handler):
            bad(f"handler {handler!r} must be a lowercase identifier")
        elif status != "supported":
            bad("handler on an unsupported function")
    shim = raw.get("shim")
    if shim is not None:
        if shim not in SHIMS[api]:
            bad(f"shim {shim!r} is not allowed for {api} functions "
                f"(allowed: {', '.join(SHIMS[api])})")
        elif status != "supported":
            bad(f"shim: {shim} on an unsupported function")
    if shim == "local" and handler is not None:
        bad("shim: local functions are never sent, they take no handler")
    if api == "runtime" and status == "supported" and shim != "override":
        bad("a supported runtime function must be shim: override")
    ids = raw.get("ids")
    if ids is not None:
        # docs/spec-format.md, "ids: shim": library creates, and driver
        # creates of the kinds in DRIVER_SHIM_IDS, whose shim override picks
        # the handle (interceptor/ipc_event.c); either may then be
        # asynchronous because the caller needs no answer
        creates = [p for p in params if p.role == "out_value" and p.kind]
        if ids != "shim":
            bad(f"ids {ids!r} must be 'shim'")
        elif status != "supported" or not (api in LIBRARY_APIS or api == "driver"):
            bad("ids: shim is only for supported library and driver functions")
        elif api == "driver" and (shim != "override" or not creates or creates[0].kind not in DRIVER_SHIM_IDS):
            bad(f"ids: shim on a driver function needs shim: override and a created kind of "
                f"{', '.join(sorted(DRIVER_SHIM_IDS))}")
        elif len(creates) != 1 or len([p for p in params if p.role in ("out_value", "out_buffer")]) != 1:
            bad("ids: shim needs exactly one out parameter, the created object's handle")
        elif not any(o.kind == creates[0].kind and o.effect == "create" for o in objects):
            bad(f"ids: shim, but the function creates no {creates[0].kind}")
    declared = raw.get("declared", True)
    if not isinstance(declared, bool) or (not declared and (api not in LIBRARY_APIS or status == "supported")):
        bad("declared: false is only for unsupported library exports")
    if api in LIBRARY_APIS and status == "supported" and shim is None:
        # the generic library path (gen_lib.py, proxyd/families/libraries.py)
        for p in params:
            if p.role in SIZE_ROLES and p.size == "?":
                bad(f"supported without a shim override, but param {p.name} has size '?'")
            if p.role in ("callback", "host_ptr") or p.type == "...":
                bad(f"supported without a shim override, but param {p.name} is {p.role}")
            if p.role in MODE_ROLES and not p.mode:
                bad(f"param {p.name}: {p.role} needs a mode")
    if api == "driver" and status == "supported" and shim != "local" and handler is None:
        # the daemon's generic path: decode by role, translate handles, call, encode
        for p in params:
            if p.role in SIZE_ROLES and p.size == "?":
                bad(f"supported without a handler, but param {p.name} has size '?' "
                    "(the generic path cannot marshal it)")
            if p.role == "callback":
                bad(f"supported without a handler, but param {p.name} is a callback")
            if p.role in SIZE_ROLES and p.kind is not None:
                bad(f"supported without a handler, but param {p.name} is a buffer of handles "
                    "(the generic path does not translate them)")
            if p.type == "...":
                bad("supported without a handler, but the function is variadic")
        if isinstance(raw["returns"], str) and raw["returns"].strip() != "CUresult":
            bad("supported without a handler, but it does not return CUresult")
    restore = _parse_restore(raw.get("restore"), "restore" in raw, api, status, shim, params, bad)
    if not ok:
        return None
    return Function(name=name, id=fid, returns=raw["returns"].strip(), params=params,
                    objects=objects, sync=sync, status=status, api=api, family=family,
                    file=path, proc=proc, handler=handler, shim=shim, restore=restore,
                    declared=declared is not False, ids=ids)


def _parse_restore(raw, present: bool, api: str, status: str, shim, params: List[Param], bad) -> Optional[Restore]:
    """`restore: RULE` or `restore: {rule: RULE, key: [...], why: ...}`."""
    if not present:
        if status == "supported":
            bad("supported functions must say how a restore brings back their effect (restore: ...)")
        return None
    if isinstance(raw, str):
        raw = {"rule": raw}
    if not isinstance(raw, dict) or not set(raw) <= set(RESTORE_KEYS) or "rule" not in raw:
        bad(f"restore must be a rule or {{rule, key, why}}, got {raw!r}")
        return None
    rule = raw["rule"]
    if rule not in RESTORE_RULES:
        bad(f"restore rule {rule!r} is not one of {', '.join(RESTORE_RULES)}")
        return None
    if status != "supported":
        bad("restore on an unsupported function (it changes nothing)")
        return None
    key = raw.get("key", [])
    why = raw.get("why")
    if "key" in raw and rule != "replay" and not (rule == "object" and api in LIBRARY_APIS):
        bad("restore key is only for rule replay (and object, for library settings)")
    if rule == "none-needed" and not (isinstance(why, str) and why.strip()):
        bad("restore rule none-needed needs a why")
    if rule != "none-needed" and why is not None:
        bad("restore why is only for rule none-needed")
    if rule == "object" and "key" in raw:
        # a library object's setting: recorded on the object named by key[0],
        # replaced by a later call with the same key (proxyd/families/libraries.py)
        names = {p.name for p in params}
        if not isinstance(key, list) or not key or not all(isinstance(k, str) and k in names for k in key):
            bad(f"restore key must name parameters, got {key!r}")
            key = []
    if rule == "replay":
        if api != "driver" or shim == "local":
            bad("restore replay is for driver functions that proxyd executes (it records them)")
        names = {p.name for p in params}
        if not isinstance(key, list) or not all(isinstance(k, str) for k in key):
            bad(f"restore key must be a list of parameter names, got {key!r}")
            key = []
        for k in key:
            if k != REPLAY_CONTEXT and k not in names:
                bad(f"restore key {k!r} is not a parameter (nor {REPLAY_CONTEXT!r})")
        for p in params:
            # a recorded call is replayed as it was sent: it may only carry values
            if p.role not in ("scalar", "handle"):
                bad(f"restore replay, but param {p.name} is {p.role} (only values can be recorded)")
    if rule in ("driver",) and api != "runtime":
        bad("restore driver is for runtime functions (implemented on the driver API)")
    return Restore(rule=rule, key=tuple(key), why=why.strip() if isinstance(why, str) else None)


def _parse_file(path: Path, api: str, errs: _Errors) -> Optional[SpecFile]:
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.load(f, Loader=_SAFE_LOADER)
    except yaml.YAMLError as e:
        errs.add(path, None, f"YAML error: {e}")
        return None
    if not isinstance(data, dict):
        errs.add(path, None, "not a YAML mapping")
        return None
    ok = True
    keys = LIBRARY_FILE_KEYS if api in LIBRARY_APIS else FILE_KEYS
    for k in keys:
        if k not in data:
            errs.add(path, None, f"missing key '{k}'")
            ok = False
    for k in data:
        if k not in keys:
            errs.add(path, None, f"unknown key '{k}'")
            ok = False
    if not ok:
        return None
    if data["api"] != api:
        errs.add(path, None, f"api is {data['api']!r} but the file is under {api}/")
    if data["family"] != path.stem:
        errs.add(path, None, f"family {data['family']!r} differs from the file stem {path.stem!r}")
    for k in ("library", "soname"):
        if data[k] != LIBRARIES[api]:
            errs.add(path, None, f"{k} must be {LIBRARIES[api]}, got {data[k]!r}")
    if not isinstance(data["header"], str) or not data["header"]:
        errs.add(path, None, "header must be a header path")
    dg = data["doc_group"]
    if not isinstance(dg, list) or not all(isinstance(g, str) for g in dg):
        errs.add(path, None, "doc_group must be a list of group names")
        dg = []
    cv = data["cuda_version"]
    if not isinstance(cv, dict) or not isinstance(cv.get("min"), int) \
            or not isinstance(cv.get("max"), int) or cv["min"] > cv["max"]:
        errs.add(path, None, f"cuda_version must be {{min: int, max: int}} with min <= max, got {cv!r}")
        cv = {"min": 0, "max": 0}
    funcs = data["functions"]
    if funcs is None:
        funcs = []
    if not isinstance(funcs, list):
        errs.add(path, None, "functions must be a list")
        funcs = []
    sf = SpecFile(path=str(path), api=api, family=path.stem, library=data["library"],
                  soname=data["soname"], header=data["header"], doc_group=list(dg),
                  cuda_version_min=cv["min"], cuda_version_max=cv["max"])
    if api in LIBRARY_APIS:
        er, ty = data["errors"], data["types"]
        if not isinstance(er, dict) or not set(ERROR_KEYS) <= set(er) <= set(ERROR_KEYS + ERROR_KEYS_OPTIONAL) \
                or not all(isinstance(v, int) for v in er.values()):
            errs.add(path, None, f"errors must be {{{', '.join(ERROR_KEYS)}}} (integers), got {er!r}")
        else:
            sf.errors = dict(er)
        if not isinstance(ty, dict):
            errs.add(path, None, "types must be a mapping")
        else:
            for tname, v in ty.items():
                if not isinstance(v, dict) or v.get("class") not in TYPE_CLASSES or \
                        (v["class"] != "opaque" and not (isinstance(v.get("size"), int) and isinstance(v.get("align"), int))):
                    errs.add(path, None, f"type {tname}: must be {{size, align, class}}, got {v!r}")
            sf.types = dict(ty)
        vn = data["version_node"]
        if vn is not None and not isinstance(vn, str):
            errs.add(path, None, "version_node must be a string or null")
        sf.version_node = vn
    for raw in funcs:
        fn = _parse_function(raw, api, path.stem, str(path), errs)
        if fn is not None:
            sf.functions.append(fn)
    return sf


def load_specs(spec_dir: Union[str, Path]) -> Specs:
    """Load every specs/<api>/*.yaml file under spec_dir and validate them."""
    spec_dir = Path(spec_dir)
    errs = _Errors()
    files: List[SpecFile] = []
    if not spec_dir.is_dir():
        raise SpecError(f"{spec_dir}: spec directory not found")
    for api in APIS:
        d = spec_dir / api
        if not d.is_dir():
            continue
        for path in sorted(d.glob("*.yaml")):
            sf = _parse_file(path, api, errs)
            if sf is not None:
                files.append(sf)
    by_name: Dict[str, Function] = {}
    by_id: Dict[int, Function] = {}
    for sf in files:
        for fn in sf.functions:
            if fn.name in by_name:
                errs.add(fn.file, fn.name, f"duplicate name (also in {by_name[fn.name].file})")
            else:
                by_name[fn.name] = fn
            if fn.id in by_id:
                other = by_id[fn.id]
                errs.add(fn.file, fn.name, f"duplicate id {fn.id} (also {other.name} in {other.file})")
            else:
                by_id[fn.id] = fn
    errs.raise_if_any()
    functions = sorted(by_id.values(), key=lambda f: f.id)
    return Specs(files=files, functions=[f for f in functions if f.api in ("driver", "runtime")],
                 driver=[f for f in functions if f.api == "driver"],
                 runtime=[f for f in functions if f.api == "runtime"],
                 libraries=[f for f in functions if f.api in LIBRARY_APIS],
                 by_name=by_name, by_id=by_id)


if __name__ == "__main__":
    import sys
    d = sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).resolve().parents[1] / "specs")
    try:
        s = load_specs(d)
    except SpecError as e:
        print(e, file=sys.stderr)
        sys.exit(1)
    sup = [f for f in s.functions if f.supported]
    print(f"{len(s.files)} files, {len(s.driver)} driver + {len(s.runtime)} runtime functions, "
          f"{len(sup)} supported")
