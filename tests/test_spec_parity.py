"""The specs (specs/**.yaml) against the real CUDA 13 headers and libcudart.

Needs the CUDA toolkit at $CUDA_HOME (default /usr/local/cuda); skipped when
its cuda.h is missing.
"""

import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "autogen"))

import header  # noqa: E402
import bootstrap  # noqa: E402
import specload  # noqa: E402

CUDA_HOME = header.cuda_home()
SPEC_DIR = REPO / "specs"

pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(CUDA_HOME, "include", "cuda.h")),
    reason=f"CUDA headers not found ({CUDA_HOME}/include/cuda.h)")


@pytest.fixture(scope="module")
def specs():
    return specload.load_specs(SPEC_DIR)


@pytest.fixture(scope="module")
def driver_protos():
    return header.parse_driver(CUDA_HOME)


@pytest.fixture(scope="module")
def runtime_protos():
    return header.parse_runtime(CUDA_HOME)


@pytest.fixture(scope="module")
def runtime_exports():
    lib = header.runtime_library(CUDA_HOME)
    assert os.path.exists(lib), f"{lib} is missing"
    return set(header.runtime_exports(CUDA_HOME))


# --------------------------------------------------------------------------
# prototypes
# --------------------------------------------------------------------------

def _check_prototype(fn, proto):
    assert fn.returns == proto.returns, \
        f"{fn.file}: {fn.name}: returns {fn.returns!r}, header says {proto.returns!r}"
    assert len(fn.params) == len(proto.params), \
        f"{fn.file}: {fn.name}: {len(fn.params)} params, header has {len(proto.params)} " \
        f"({proto.c_decl()})"
    for sp, hp in zip(fn.params, proto.params):
        assert sp.type == hp.type, \
            f"{fn.file}: {fn.name}: param {sp.name}: type {sp.type!r}, header says {hp.type!r}"


def test_driver_prototypes_match_headers(specs, driver_protos):
    for fn in specs.driver:
        assert fn.name in driver_protos, f"{fn.file}: {fn.name} is declared in no driver header"
        _check_prototype(fn, driver_protos[fn.name])


def test_runtime_prototypes_match_headers(specs, runtime_protos):
    for fn in specs.runtime:
        assert fn.name in runtime_protos, f"{fn.file}: {fn.name} is declared in no runtime header"
        _check_prototype(fn, runtime_protos[fn.name])


def test_every_header_function_is_in_the_specs(specs, driver_protos, runtime_protos,
                                               runtime_exports):
    missing = sorted(set(driver_protos) - {f.name for f in specs.driver})
    assert not missing, f"driver functions without a spec entry: {missing}"
    # runtime: every declared function that libcudart.so.13 exports
    wanted = {n for n in runtime_protos if n in runtime_exports}
    missing = sorted(wanted - {f.name for f in specs.runtime})
    assert not missing, f"runtime functions without a spec entry: {missing}"
    # declared but not exported (CUDA 13 removed texture/surface references)
    assert sorted(set(runtime_protos) - runtime_exports) == \
        ["__cudaRegisterSurface", "__cudaRegisterTexture"]


def test_every_spec_function_is_declared(specs, driver_protos, runtime_protos):
    for fn in specs.functions:
        protos = driver_protos if fn.api == "driver" else runtime_protos
        assert fn.name in protos, f"{fn.file}: {fn.name} not found in any header"
        p = protos[fn.name]
        if not p.declared:
            assert fn.name in header.UNDECLARED_RUNTIME_EXPORTS


def test_every_libcudart_export_is_a_runtime_spec(specs, runtime_exports):
    names = {f.name for f in specs.runtime}
    missing = sorted(runtime_exports - names)
    assert not missing, f"exported by libcudart.so.13 but not in specs/runtime: {missing}"
    extra = sorted(names - runtime_exports)
    assert not extra, f"in specs/runtime but not exported by libcudart.so.13: {extra}"


def test_registration_table_matches_header_text():
    """The hard-coded __cuda* prototypes are declared in the named C++ headers."""
    for name, (hdr, ret, params) in header.REGISTRATION_PROTOTYPES.items():
        text = header.raw_text(CUDA_HOME, hdr)
        assert re.search(re.escape(name) + r"\s*\(", text), f"{name} not found in {hdr}"
        decl = header.raw_declaration(CUDA_HOME, hdr, name)
        assert decl is not None, f"no declaration of {name} in {hdr}"
        assert decl[0] == ret, f"{name}: returns {ret!r}, {hdr} says {decl[0]!r}"
        assert [p.type for p in decl[1]] == [t for _, t in params], \
            f"{name}: params differ from {hdr}: {[p.type for p in decl[1]]}"
    for name in header.UNDECLARED_RUNTIME_EXPORTS:
        for hdr in ("crt/host_runtime.h", "crt/device_functions.h", "cuda_runtime_api.h"):
            assert name + "(" not in header.raw_text(CUDA_HOME, hdr)


def test_header_parser_normalises_types(driver_protos, runtime_protos):
    p = driver_protos["cuMemAlloc_v2"]
    assert (p.returns, p.param_types, p.group, p.header) == \
        ("CUresult", ("CUdeviceptr *", "size_t"), "CUDA_MEM", "cuda.h")
    assert driver_protos["cuMemAlloc"].param_types == ("CUdeviceptr_v1 *", "unsigned int")
    assert driver_protos["cuGetErrorString"].param_types == ("CUresult", "const char **")
    assert driver_protos["cuMemcpyHtoD_v2_ptds"].group == "CUDA_MEM"
    assert driver_protos["cuLaunchKernel_ptsz"].param_types[-1] == "void **"
    assert runtime_protos["cudaGetErrorString"].returns == "const char *"
    assert runtime_protos["cudaMalloc"].params[0] == header.Param("devPtr", "void **")
    assert header.normalize_type("const  char*") == "const char *"
    assert header.normalize_type("void * *") == "void **"
    assert header.normalize_type("struct CUstream_st*") == "struct CUstream_st *"
    for p in list(driver_protos.values()) + list(runtime_protos.values()):
        assert p.group, f"{p.name} has no doxygen group"
        for t in (p.returns,) + p.param_types:
            assert "__attribute" not in t and "CUDAAPI" not in t and "  " not in t, (p.name, t)


# --------------------------------------------------------------------------
# ids, proc, annotations
# --------------------------------------------------------------------------

def test_ids_unique_and_in_range(specs):
    ids = [f.id for f in specs.functions]
    assert len(ids) == len(set(ids))
    assert all(1 <= f.id <= 9999 for f in specs.driver)
    assert all(10000 <= f.id <= 19999 for f in specs.runtime)
    names = [f.name for f in specs.functions]
    assert len(names) == len(set(names))


def test_every_family_id_fits_the_call_profile():
    """The shim's call profile (interceptor/profile.c) counts ids below
    65536; NCCL's (47000..) once fell past its old 32768 and were all
    counted as one "id 0" in a DDP profile (2026-11-28)."""
    root = Path(__file__).resolve().parents[1] / "specs"
    ids = [f["id"] for y in root.glob("*/*.yaml") for f in (yaml.safe_load(y.read_text()) or {}).get("functions", [])
           if isinstance(f, dict) and "id" in f]
    assert len(ids) > 1000 and max(ids) < 65536, max(ids)


def test_proc_entries_follow_cudatypedefs(specs, driver_protos):
    matched, unmatched = header.match_pfns(driver_protos, CUDA_HOME)
    assert not unmatched, [f.typedef for f in unmatched]
    for fn in specs.driver:
        pfn = matched.get(fn.name)
        if pfn is None:
            assert fn.proc is None, fn.name
            continue
        assert fn.proc == specload.Proc(pfn.base, pfn.version, pfn.stream or None), fn.name
    by = specs.by_name
    assert by["cuMemAlloc_v2"].proc == specload.Proc("cuMemAlloc", 3020)
    assert by["cuMemAlloc"].proc == specload.Proc("cuMemAlloc", 2000)
    assert by["cuMemcpyHtoD_v2_ptds"].proc == specload.Proc("cuMemcpyHtoD", 7000, "ptds")
    assert by["cuLaunchKernel_ptsz"].proc == specload.Proc("cuLaunchKernel", 7000, "ptsz")
    assert by["cuDeviceGetUuid"].proc.version < by["cuDeviceGetUuid_v2"].proc.version
    assert all(f.proc is None for f in specs.runtime)


def _variants(specs, name):
    return [f for f in specs.functions if f.name in (name, name + "_ptds", name + "_ptsz")]


def test_supported_annotations(specs):
    supported = {f.name for f in specs.functions if f.supported}
    for table in (bootstrap.DRIVER_SUPPORTED, bootstrap.RUNTIME_SUPPORTED):
        for name in table:
            for f in _variants(specs, name):
                assert f.name in supported, f.name
    expected = set()
    for name in list(bootstrap.DRIVER_SUPPORTED) + list(bootstrap.RUNTIME_SUPPORTED):
        expected |= {f.name for f in _variants(specs, name)}
    assert supported == expected
    for name in bootstrap.DRIVER_ASYNC | bootstrap.RUNTIME_ASYNC:
        for f in _variants(specs, name):
            assert f.sync is False, f.name
    for f in specs.functions:
        if f.sync is False:
            base = re.sub(r"_(ptds|ptsz)$", "", f.name)
            assert base in bootstrap.DRIVER_ASYNC | bootstrap.RUNTIME_ASYNC or \
                f.name in bootstrap.RUNTIME_ASYNC, f.name
    by = specs.by_name
    assert by["cuMemAlloc_v2"].handler == "mem_alloc"
    assert by["cuGetProcAddress_v2"].shim == "local"
    assert by["cuLaunchKernel_ptsz"].shim == "override" and by["cuLaunchKernel_ptsz"].sync is False
    assert by["cuMemcpyDtoHAsync_v2"].sync is True
    assert all(f.shim == "override" for f in specs.runtime if f.supported)
    p = by["cuMemcpyHtoD_v2"].params
    assert [(q.role, q.size) for q in p] == [("device_ptr", None), ("in_buffer", "ByteCount"),
                                             ("scalar", None)]


def test_memory_features_of_issue_10_round_3(specs):
    """2D/3D memsets, exportable pools and mipmapped arrays: remoted through
    their handlers, with the restore rules docs/compatibility.md states."""
    by = specs.by_name
    for w in (8, 16, 32):
        for v in ("_v2", "_v2_ptds", "Async", "Async_ptsz"):
            f = by[f"cuMemsetD2D{w}{v}"]
            # one batched op each, the pitch checked in the shim first (copy2d.c)
            assert (f.supported, f.handler, f.shim, f.sync, f.restore.rule) == \
                (True, "memset2d", "override", False, "memory"), f.name
    for name in ("cudaMemset2D", "cudaMemset3D", "cudaMemset2DAsync", "cudaMemset3DAsync", "cudaMalloc3D",
                 "cudaMemPoolExportToShareableHandle", "cudaMemPoolImportFromShareableHandle",
                 "cudaMemPoolExportPointer", "cudaMemPoolImportPointer", "cudaMallocMipmappedArray",
                 "cudaGetMipmappedArrayLevel", "cudaFreeMipmappedArray"):
        assert by[name].supported and by[name].restore.rule == "driver", name
    for name in ("cuMemPoolExportToShareableHandle", "cuMemPoolImportFromShareableHandle",
                 "cuMemPoolExportPointer", "cuMemPoolImportPointer"):
        f = by[name]
        assert f.supported and f.restore.rule == "none-needed" and "refused at dump" in f.restore.why, name
    for name, h in (("cuMipmappedArrayCreate", "mipmap_create"), ("cuMipmappedArrayGetLevel", "mipmap_get_level"),
                    ("cuMipmappedArrayDestroy", "mipmap_destroy")):
        assert (by[name].supported, by[name].handler, by[name].restore.rule) == (True, h, "object"), name
    from gpuproxy.proxyd.core import protocol as P
    assert P.KIND_CODES["mipmapped_array"] == P.K_MIPMAPPED_ARRAY


# --------------------------------------------------------------------------
# bootstrap: merge mode, idempotent
# --------------------------------------------------------------------------

def _snapshot(d: Path):
    return {p.relative_to(d).as_posix(): p.read_text() for p in sorted(d.rglob("*.yaml"))}


def test_bootstrap_is_idempotent_and_keeps_annotations(tmp_path):
    work = tmp_path / "specs"
    shutil.copytree(SPEC_DIR, work)
    before = _snapshot(work)
    assert bootstrap.main(["--cuda-home", CUDA_HOME, "--specs", str(work), "-q"]) == 0
    assert _snapshot(work) == before, "bootstrap changed the committed specs"
    assert bootstrap.main(["--cuda-home", CUDA_HOME, "--specs", str(work), "-q", "--check"]) == 0

    # hand edits survive a re-run
    mem = work / "driver" / "memory.yaml"
    data = yaml.safe_load(mem.read_text())
    ent = {e["name"]: e for e in data["functions"]}
    ent["cuMemAllocPitch_v2"]["status"] = "supported"
    ent["cuMemAllocPitch_v2"]["handler"] = "mem_alloc_pitch"
    ent["cuMemAllocPitch_v2"].pop("shim", None)   # a handler and shim: local exclude each other
    ent["cuMemAllocPitch_v2"]["params"][1]["role"] = "out_value"
    ent["cuMemAllocPitch_v2"]["params"][2]["role"] = "host_ptr"
    ent["cuMemAllocPitch_v2"]["restore"] = "memory"
    ent["cuMemFree_v2"]["sync"] = False
    # an unsupported function (the 32-bit pointer version) taken out and put back
    old_id = ent["cuMemHostGetDevicePointer"]["id"]
    data["functions"] = [e for e in data["functions"] if e["name"] != "cuMemHostGetDevicePointer"]
    data["functions"].append({"name": "cuMemGone", "id": 9000, "returns": "CUresult",
                              "params": [], "objects": [], "sync": True,
                              "status": "unsupported"})
    mem.write_text(yaml.safe_dump(data, sort_keys=False))
    max_id = max(f.id for f in specload.load_specs(work).driver)

    assert bootstrap.main(["--cuda-home", CUDA_HOME, "--specs", str(work), "-q"]) == 0
    again = yaml.safe_load(mem.read_text())
    ent = {e["name"]: e for e in again["functions"]}
    assert ent["cuMemAllocPitch_v2"]["status"] == "supported"
    assert ent["cuMemAllocPitch_v2"]["handler"] == "mem_alloc_pitch"
    assert ent["cuMemAllocPitch_v2"]["params"][2]["role"] == "host_ptr"
    assert ent["cuMemAllocPitch_v2"]["restore"] == "memory"
    assert ent["cuMemFree_v2"]["sync"] is False
    # a removed-from-the-headers symbol is kept, a re-added one gets a fresh id
    assert "cuMemGone" in ent
    assert ent["cuMemHostGetDevicePointer"]["id"] == max_id + 1 != old_id
    first = _snapshot(work)
    assert bootstrap.main(["--cuda-home", CUDA_HOME, "--specs", str(work), "-q"]) == 0
    assert _snapshot(work) == first
    # the specs still load
    s = specload.load_specs(work)
    assert s.by_name["cuMemAllocPitch_v2"].handler == "mem_alloc_pitch"


# --------------------------------------------------------------------------
# specload validation
# --------------------------------------------------------------------------

def _broken_copy(tmp_path, edit):
    work = tmp_path / "specs"
    (work / "driver").mkdir(parents=True)
    path = work / "driver" / "stream.yaml"
    shutil.copy(SPEC_DIR / "driver" / "stream.yaml", path)
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return work


def _entry(data, name):
    return next(e for e in data["functions"] if e["name"] == name)


def test_specload_rejects_duplicate_id(tmp_path):
    def edit(d):
        _entry(d, "cuStreamQuery")["id"] = _entry(d, "cuStreamCreate")["id"]
    with pytest.raises(specload.SpecError, match=r"stream\.yaml: cuStreamQuery: duplicate id"):
        specload.load_specs(_broken_copy(tmp_path, edit))


def test_specload_rejects_handle_without_kind(tmp_path):
    def edit(d):
        del _entry(d, "cuStreamSynchronize")["params"][0]["kind"]
    with pytest.raises(specload.SpecError,
                       match=r"stream\.yaml: cuStreamSynchronize: param hStream: role handle needs a kind"):
        specload.load_specs(_broken_copy(tmp_path, edit))


@pytest.mark.parametrize("edit,pattern", [
    (lambda d: _entry(d, "cuStreamCreate").update(name="cuStreamQuery"), r"duplicate name"),
    (lambda d: _entry(d, "cuStreamQuery").update(status="maybe"), r"cuStreamQuery: status"),
    (lambda d: _entry(d, "cuStreamQuery").update(shim="remote"), r"cuStreamQuery: shim"),
    (lambda d: _entry(d, "cuStreamQuery").update(id=20000), r"outside the driver range"),
    (lambda d: _entry(d, "cuStreamGetFlags")["params"][1].update(role="in_buffer"),
     r"cuStreamGetFlags: param flags: role in_buffer needs a size"),
    (lambda d: _entry(d, "cuStreamGetFlags")["params"][0].update(kind="teapot"),
     r"cuStreamGetFlags: param hStream: kind 'teapot'"),
    (lambda d: _entry(d, "cuStreamQuery").update(objects=[{"kind": "stream", "effect": "eat"}]),
     r"cuStreamQuery: object effect"),
    (lambda d: [_entry(d, "cuStreamAddCallback").pop(k) for k in ("handler", "shim")],
     r"cuStreamAddCallback: supported without a handler, but param callback is a callback"),
])
def test_specload_rejects_bad_entries(tmp_path, edit, pattern):
    with pytest.raises(specload.SpecError, match=pattern):
        specload.load_specs(_broken_copy(tmp_path, edit))


# --------------------------------------------------------------------------
# restore rules: every supported function says how a restore brings back
# its effect (docs/spec-format.md, "Restore rules")
# --------------------------------------------------------------------------

# verbs of the CUDA API that change state (cuda.h / cuda_runtime_api.h naming)
_CHANGES = {"Set", "Create", "Destroy", "Alloc", "Malloc", "Free", "Load", "Unload", "Launch", "Memcpy",
            "Memset", "Record", "Register", "Unregister", "Retain", "Release", "Reset", "Push", "Pop", "Init",
            "Wait", "Synchronize", "Attach"}


def _changes_state(name: str) -> bool:
    return bool(_CHANGES & set(re.findall(r"[A-Z][a-z]*", name)))
# object kinds whose objects a restore recreates under their old handles
_RECREATED = {"context", "module", "function", "stream", "event", "device"}


# kinds whose open objects make proxyd refuse a dump (nothing changed, the
# app keeps running): JIT link states live for one compilation (proxyd/families/link.py);
# an event opened from another process's IPC handle (proxyd/families/ipc.py)
_REFUSED_AT_DUMP = {"link_state"}
# functions whose objects make the session refuse a dump (proxyd/families/ipc.py,
# proxyd/families/mempool_ipc.py): an opened IPC event, an imported memory pool
_REFUSED_AT_DUMP_FUNCS = {"cuIpcOpenEventHandle", "cuMemPoolImportFromShareableHandle"}


def _refused_at_dump(f) -> bool:
    kinds_ok = (f.name in _REFUSED_AT_DUMP_FUNCS
                or all(o.kind in _REFUSED_AT_DUMP for o in f.objects if o.effect in ("create", "destroy")))
    return kinds_ok and f.restore.rule == "none-needed" and "refused" in (f.restore.why or "")


def test_no_state_changing_function_lacks_a_restore_rule(specs):
    for f in specs.functions:
        if not f.supported:
            continue
        assert f.restore is not None, f"{f.name}: supported without a restore rule"
        r = f.restore.rule
        # (device memory lives in the session's arena: restore: memory)
        creates = any(o.effect in ("create", "destroy") and o.kind != "memory" for o in f.objects)
        if _changes_state(f.name) or creates:
            assert r != "query", f"{f.name} changes state but says restore: query"
        if creates and f.api == "driver" and not _refused_at_dump(f):
            assert r == "object", f"{f.name} creates or destroys objects: restore: object, not {r}"
        if r == "query":
            outs = [p for p in f.params if p.role in ("out_value", "out_buffer")]
            assert outs or f.returns not in ("CUresult", "cudaError_t") or "Query" in f.name \
                or "PeekAt" in f.name, f"{f.name}: a query that returns nothing"
        if r == "replay":
            for p in f.params:
                assert p.role != "handle" or p.kind in _RECREATED, \
                    f"{f.name}: replays a {p.kind} handle, which a restore does not recreate"


def test_replayed_functions_reach_proxyd_and_are_recorded(specs):
    """replay rules travel into the daemon's dispatch table, which records
    the calls (dispatch.run_op); their keys index real parameters."""
    from gpuproxy.proxyd._generated import FUNCTIONS
    want = {f.id: f for f in specs.driver if f.supported and f.restore.rule == "replay"}
    assert want, "no function is restored by replay"
    got = {fid: fn for fid, fn in FUNCTIONS.items() if fn.restore == "replay"}
    assert set(got) == set(want)
    for fid, fn in got.items():
        names = [p[0] for p in fn.params]
        assert [("context" if i < 0 else names[i]) for i in fn.key] == list(want[fid].restore.key)
    for name in ("cuFuncSetAttribute", "cuFuncSetCacheConfig", "cuCtxSetLimit", "cuCtxSetCacheConfig",
                 "cuDevicePrimaryCtxSetFlags_v2"):
        assert specs.by_name[name].restore.rule == "replay", name


def _c_functions() -> dict[str, str]:
    """Bodies of the functions defined in interceptor/*.c, by name."""
    out = {}
    for path in sorted((REPO / "interceptor").glob("*.c")):
        text = path.read_text()
        for m in re.finditer(r"^[A-Za-z_][\w \t\*]*?\b(\w+)\s*\(([^;{)]*)\)\s*\{", text, re.M):
            depth, i = 0, m.end() - 1
            while i < len(text):
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                if depth == 0:
                    break
                i += 1
            out.setdefault(m.group(1), text[m.end():i])
    return out


def test_runtime_functions_restore_through_rules_of_the_driver_calls_they_make(specs):
    """`restore: driver` runtime functions are implemented in the shim on the
    driver API: every driver function they reach (through the shim's own
    helpers) is supported and has a restore rule of its own, and at least
    one of them changes state; functions without driver calls keep their
    state in the client process (`client`) or only read (`query`)."""
    bodies = _c_functions()
    driver = {f.name: f for f in specs.driver}
    calls = {name: set(re.findall(r"\b(\w+)\s*\(", body)) for name, body in bodies.items()}
    base_of = {}      # cuFoo -> cuFoo_v2: the shim calls the header's macro name
    for f in sorted(specs.driver, key=lambda f: (not f.supported, f.proc is not None and f.proc.stream is not None)):
        base_of.setdefault(f.proc.base if f.proc else f.name, f.name)

    def reach(name, seen):
        for c in calls.get(name, ()):
            if c in seen:
                continue
            seen.add(c)
            if c in bodies and not (c in driver or c in base_of):
                reach(c, seen)
        return seen

    problems = []
    for f in specs.runtime:
        if not f.supported or f.restore.rule not in ("driver", "client"):
            continue
        gpo = "gpo_" + f.name
        if gpo not in bodies:       # per-thread-stream twins share the base's body
            gpo = "gpo_" + re.sub(r"_(ptds|ptsz)$", "", f.name)
        assert gpo in bodies, f"{f.name}: no {gpo} in interceptor/"
        reached = [driver[n] for n in sorted({base_of.get(c, c) for c in reach(gpo, set())}) if n in driver]
        for d in reached:
            if not d.supported or d.restore is None:
                problems.append(f"{f.name} calls {d.name}, which has no restore rule")
        changing = [d.name for d in reached if d.supported and d.restore.rule != "query"]
        if f.restore.rule == "driver" and not changing:
            problems.append(f"{f.name}: restore: driver, but it makes no state-changing driver call")
    assert problems == [], "\n".join(problems)
