"""NVIDIA's libraries of CUDA 11 and 12 in the application (issue 24):
the stand-ins of the older sonames (specs/abi/library_majors.yaml), on the
emulated backend, and the per-major ABI parity against each major's own
headers (NVIDIA's wheels: tests/oldcuda_kit.py downloads them once and
keeps their include/ folders; without network the tests skip with the
reason).

docs/compatibility.md, "Library majors 11 and 12", says why stand-ins and
not NVIDIA's own library of that major in the application.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import oldcuda_abi
import oldcuda_kit
from conftest import client_env

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MAJORS = yaml.safe_load((REPO / "specs" / "abi" / "library_majors.yaml").read_text())
PREFIX = {"cublas": ("CUBLAS_",), "cublaslt": ("CUBLASLT_",), "cufft": ("CUFFT_",), "curand": ("CURAND_",),
          "cusparse": ("CUSPARSE_",), "cusolver": ("CUSOLVER_",)}
HANDLING = {"unknown_to_13", "same_meaning", "status_only", "sentinel", "refused"}


def _include(req):
    try:
        return oldcuda_kit.lib_include(req)
    except oldcuda_kit.KitUnavailable as e:
        pytest.skip(f"NVIDIA's {req} wheel unavailable: {e}")


def _runtime_include(cuda):
    try:
        return oldcuda_kit.kit({"12": "12.4", "11": "11.8"}[cuda]) / "include"
    except oldcuda_kit.KitUnavailable as e:
        pytest.skip(f"NVIDIA's CUDA {cuda} runtime wheel unavailable: {e}")


def _incs(m):
    """That major's headers: the library's, what it includes of its siblings
    (cusolverDn.h includes cublas_v2.h), and that CUDA's runtime headers."""
    incs = [_include(m["headers"])]
    if m["api"] == "cusolver":
        incs.append(_include(oldcuda_kit.lib_header_reqs(m["cuda"])["cublas"]))
    return incs + [_runtime_include(m["cuda"])]


def _incs13(api):
    incs = [_include(oldcuda_kit.LIB13[api])]
    if api == "cusolver":
        incs.append(_include(oldcuda_kit.LIB13["cublas"]))
    return incs


def _spec(api):
    sys.path.insert(0, str(REPO / "autogen"))
    import specload
    return next(sf for sf in specload.load_specs(str(REPO / "specs")).files if sf.api == api)


def _id(m):
    return f"{m['soname']}-cuda{m['cuda']}"


def test_yaml_is_consistent():
    """Every major has its fields; each stand-in soname is preloaded
    (gpuproxy.interceptor.LIBRARIES) and built; handling words are known."""
    from gpuproxy import interceptor
    for m in MAJORS["majors"]:
        assert {"api", "soname", "cuda", "headers", "header"} <= set(m), m
        assert m["soname"] in interceptor.LIBRARIES, m["soname"]
        assert os.path.exists(os.path.join(interceptor.lib_dir(), m["soname"])), m["soname"]
        for name, how in (m.get("enumerators") or {}).items():
            assert how in HANDLING, (name, how)
    for n in MAJORS["not_served"]:
        assert n["soname"] not in interceptor.LIBRARIES and n["why"]


@pytest.mark.slow
@pytest.mark.parametrize("m", MAJORS["majors"], ids=_id)
def test_prototypes_per_major(m):
    """Every function that major's header declares and the 13 spec has takes
    the same parameter types (a pointer typedef for a pointer typedef:
    cuSPARSE 12 made descriptor parameters const, the same pointer in the
    ABI), so the stand-in's function of that name is the one the older
    program calls."""
    old = oldcuda_abi.prototypes(m["api"], _incs(m))
    assert len(old) > 10, old
    sf = _spec(m["api"])
    ptr_old = oldcuda_abi.pointer_typedefs(m["header"], _incs(m))
    ptr_new = {n for n, t in sf.types.items() if getattr(t, "cls", None) == "pointer" or
               (isinstance(t, dict) and t.get("class") == "pointer")} | oldcuda_abi.pointer_typedefs(m["header"], _incs13(m["api"]))

    def ptr(t, names):
        return t.endswith("*") or t.replace("const ", "").strip() in names
    differ, common = [], 0
    for f in sf.functions:
        if f.name not in old:
            continue
        common += 1
        new = [oldcuda_abi.norm(f.returns)] + [oldcuda_abi.norm(p.type) for p in f.params]
        a = old[f.name]
        if len(a) != len(new) or any(x != y and not (ptr(x, ptr_old) and ptr(y, ptr_new)) for x, y in zip(a, new)):
            differ.append((f.name, a, new))
    assert common > 10
    assert differ == []


@pytest.mark.slow
@pytest.mark.parametrize("m", MAJORS["majors"], ids=_id)
def test_type_layouts_per_major(m):
    """Every named type of the 13 spec's prototypes (structures such as
    cublasLtMatmulHeuristicResult_t and cuComplex, enums, handles) that that
    major's headers define has the size and alignment the spec records for
    13 (the stand-in passes it as 13's)."""
    sf = _spec(m["api"])
    old = oldcuda_abi.type_layouts(m["header"], _incs(m), sf.types)
    assert len(old) > 3, old
    differ = {n: (v, (sf.types[n]["size"], sf.types[n]["align"])) for n, v in old.items()
              if v != (sf.types[n]["size"], sf.types[n]["align"])}
    assert differ == {}


@pytest.mark.slow
@pytest.mark.parametrize("m", MAJORS["majors"], ids=_id)
def test_enumerators_per_major(m):
    """Every enumerator of the library's own enums in that major's headers
    has the same value in 13's headers, or is listed in the yaml with its
    handling; `unknown_to_13` must be true (no enumerator of that enum in
    13 has that value, so 13's library rejects it rather than taking it
    for something else); a listed one that no longer differs is an error."""
    old = oldcuda_abi.enumerators(m["header"], _incs(m), PREFIX[m["api"]])
    assert len(old) > 5, old
    new13 = oldcuda_abi.enumerators(m["header"], _incs13(m["api"]), PREFIX[m["api"]])
    # each old name evaluated by the compiler against 13's headers (absent: left out)
    now13 = oldcuda_abi.values_in(m["header"], _incs13(m["api"]), old)
    found = {}
    for name, (typ, v) in old.items():
        if now13.get(name) == v:
            continue
        found[name] = (typ, v, now13.get(name))
    listed = m.get("enumerators") or {}
    assert sorted(found) == sorted(listed), {k: found.get(k) for k in set(found) ^ set(listed)}
    for name, how in listed.items():
        typ, v, now = found[name]
        if how == "unknown_to_13":
            taken = [n for n, (t, x) in new13.items() if t == typ and x == v]
            assert now is None and taken == [], (name, v, taken)
        elif how == "same_meaning":
            assert now is None and any(x == v for n, (t, x) in new13.items() if t == typ), name
        elif how == "refused":
            taken = [n for n, (t, x) in new13.items() if t == typ and x == v]
            assert now is None and taken, (name, v)
        elif how == "sentinel":
            assert name.endswith("_END") and all(x < v for n, (t, x) in old.items() if t == typ and n != name), name
            assert all(now13.get(n) == x or n in listed
                       for n, (t, x) in old.items() if t == typ and x < v), name
        elif how == "status_only":
            assert now is None and typ.endswith(("Result", "Status_t", "status_t", "Result_t")), (name, typ)


@pytest.mark.parametrize("version,libs", [
    ("12.4", ["libcublas.so.12", "libcufft.so.11", "libcurand.so.10", "libcusparse.so.12", "libcusolver.so.11"]),
    ("11.8", ["libcublas.so.11", "libcufft.so.10", "libcurand.so.10", "libcusparse.so.11", "libcusolver.so.11"]),
])
def test_library_program_of_older_major(version, libs, emu_daemon):
    """tests/oldcuda/libs_major.c built against that CUDA's library and
    runtime headers, linked against the older sonames and NVIDIA's runtime
    of that version: cuBLAS, cuFFT, cuRAND, cuSPARSE and cuSOLVER results match the program's
    own host references, with no line on stderr."""
    from gpuproxy import interceptor
    try:
        exe = oldcuda_kit.build_lib_program(version, HERE / "oldcuda" / "libs_major.c",
                                            Path(os.environ.get("GPUPROXY_OLDCUDA_BUILD_DIR") or "/tmp/gpuproxy-oldcuda")
                                            / "libs", libs, Path(interceptor.lib_dir()))
    except oldcuda_kit.KitUnavailable as e:
        pytest.skip(f"NVIDIA's CUDA {version} wheels unavailable: {e}")
    r = subprocess.run([str(exe)], env=client_env(emu_daemon), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr + emu_daemon.log()[-2000:]
    checks = [l for l in r.stdout.splitlines() if l.startswith("check ")]
    assert len(checks) == 7 and all(l.endswith(": ok") for l in checks), r.stdout
    assert r.stdout.endswith("PASSED\n") and r.stderr == ""


def test_dlopen_of_majors(emu_daemon):
    """dlopen by soname or path: an older major gets its stand-in; cuDNN 8 and
    a major newer than 13 are refused (NULL, dlerror names why, one line;
    no line for an RTLD_NOLOAD probe)."""
    from gpuproxy import interceptor
    # the file a handle's function comes from: dladdr(3) of dlsym(handle, f)
    code = (
        "import ctypes, os, sys\n"
        "class Info(ctypes.Structure):\n"
        "    _fields_ = [('fname', ctypes.c_char_p), ('fbase', ctypes.c_void_p), ('sname', ctypes.c_char_p),"
        " ('saddr', ctypes.c_void_p)]\n"
        "libc = ctypes.CDLL(None)\n"
        "for n, f in (('libcublas.so.12', 'cublasCreate_v2'), ('/opt/x/libcublasLt.so.11.11.3.6', 'cublasLtCreate'),"
        " ('libcufft.so.11', 'cufftCreate'), ('libcusolver.so.11', 'cusolverDnCreate'),"
        " ('libcublas.so', 'cublasCreate_v2'), ('libcudnn.so.8', ''), ('libcublas.so.14', ''),"
        " ('libcudnn.so.8', 'noload')):\n"
        "    try:\n"
        "        h = ctypes.CDLL(n, mode=os.RTLD_NOLOAD if f == 'noload' else ctypes.DEFAULT_MODE)\n"
        "        i = Info()\n"
        "        assert libc.dladdr(ctypes.cast(getattr(h, f), ctypes.c_void_p), ctypes.byref(i))\n"
        "        print(n, 'loaded', i.fname.decode())\n"
        "    except OSError as e:\n"
        "        print(n + ('(noload)' if f == 'noload' else ''), 'refused', 'no stand-in' in str(e))\n")
    r = subprocess.run([sys.executable, "-c", code], env=client_env(emu_daemon), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = dict(l.split(" ", 1) for l in r.stdout.splitlines())
    d = interceptor.lib_dir()
    assert lines["libcublas.so.12"] == f"loaded {d}/libcublas.so.12"
    assert lines["/opt/x/libcublasLt.so.11.11.3.6"] == f"loaded {d}/libcublasLt.so.11"
    assert lines["libcufft.so.11"] == f"loaded {d}/libcufft.so.11"
    assert lines["libcusolver.so.11"] == f"loaded {d}/libcusolver.so.11"
    assert lines["libcublas.so"].startswith("loaded ")
    assert lines["libcudnn.so.8"] == "refused True"
    assert lines["libcublas.so.14"] == "refused True"
    assert lines["libcudnn.so.8(noload)"] == "refused True"      # a probe: NULL, and no line
    err = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(err) == 2 and all("no stand-in for this library major" in l for l in err), r.stderr


def test_value_of_another_meaning_in_13_is_refused(emu_daemon):
    """cuBLASLt 11's CUBLASLT_MATMUL_PREF_SM_COUNT_TARGET (13) is another
    attribute in 13: libcublasLt.so.11 answers it CUBLAS_STATUS_NOT_SUPPORTED
    (15) with one line naming it; libcublasLt.so.13 takes 13 as 13's attribute."""
    code = (
        "import ctypes\n"
        "for so in ('libcublasLt.so.11', 'libcublasLt.so.13'):\n"
        "    lt = ctypes.CDLL(so)\n"
        "    p = ctypes.c_void_p()\n"
        "    assert lt.cublasLtMatmulPreferenceCreate(ctypes.byref(p)) == 0\n"
        "    v = ctypes.c_uint32(1)\n"
        "    print(so, lt.cublasLtMatmulPreferenceSetAttribute(p, 13, ctypes.byref(v), 4),"
        " lt.cublasLtMatmulPreferenceSetAttribute(p, 1, ctypes.byref(ctypes.c_uint64(1 << 20)), 8))\n"
        "    assert lt.cublasLtMatmulPreferenceDestroy(p) == 0\n")
    r = subprocess.run([sys.executable, "-c", code], env=client_env(emu_daemon), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == ["libcublasLt.so.11 15 0", "libcublasLt.so.13 0 0"], r.stdout + r.stderr
    err = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(err) == 1 and "CUBLASLT_MATMUL_PREF_SM_COUNT_TARGET" in err[0], r.stderr
