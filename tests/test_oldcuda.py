"""Programs built for CUDA 12.4 and 11.8 under the proxy (issue 24), on the
emulated backend; and the worker's driver calls against an older cuda.h.

The design (docs/compatibility.md, "Programs built for CUDA 11 and 12"):
NVIDIA's runtime of the program's own major runs in the application, on the
shim's driver API (libcuda.so.1), so every runtime structure keeps that
version's layout; the shim's libcudart.so.13 stands only for CUDA 13.

NVIDIA's runtimes and headers come from its wheels (tests/oldcuda_kit.py:
.carry/oldcuda, the cache folder, or pip); without them the tests skip with
the reason.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import corpus
import oldcuda_kit
from conftest import client_env

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _kit(version):
    try:
        return oldcuda_kit.kit(version)
    except oldcuda_kit.KitUnavailable as e:
        pytest.skip(f"NVIDIA's CUDA {version} runtime wheel unavailable: {e}")


def _build(version, source, tmp_path_factory, nvcc=None):
    _kit(version)
    out = Path(os.environ.get("GPUPROXY_OLDCUDA_BUILD_DIR") or corpus.default_build_dir()) / "oldcuda"
    return oldcuda_kit.build(version, source, out, nvcc=nvcc)


def _fields(stdout: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in stdout.splitlines() if " " in line)


def _expected_props(version: str) -> dict[str, str]:
    """The emulated device as NVIDIA's runtime of `version` must describe it:
    the emu backend's attribute table (by the numbers of that version's
    cuda.h) and its name and memory size, not anything the shim computes."""
    from gpuproxy.emu import backend as emu
    num = oldcuda_kit.driver_attribute_numbers(version)

    def a(name):
        return emu.ATTRS[num[name]]
    return {
        "devices": "1",
        "name": emu.EmuBackend.device_name(None, 0),
        "totalGlobalMem": str(emu.EMU_TOTAL_MEM),
        "sharedMemPerBlock": str(a("MAX_SHARED_MEMORY_PER_BLOCK")),
        "regsPerBlock": str(a("MAX_REGISTERS_PER_BLOCK")),
        "warpSize": str(a("WARP_SIZE")),
        "maxThreadsPerBlock": str(a("MAX_THREADS_PER_BLOCK")),
        "maxThreadsDim": " ".join(str(a(f"MAX_BLOCK_DIM_{x}")) for x in "XYZ"),
        "maxGridSize": " ".join(str(a(f"MAX_GRID_DIM_{x}")) for x in "XYZ"),
        "clockRate": str(a("CLOCK_RATE")),
        "totalConstMem": str(a("TOTAL_CONSTANT_MEMORY")),
        "major": str(a("COMPUTE_CAPABILITY_MAJOR")),
        "minor": str(a("COMPUTE_CAPABILITY_MINOR")),
        "multiProcessorCount": str(a("MULTIPROCESSOR_COUNT")),
        "asyncEngineCount": str(a("ASYNC_ENGINE_COUNT")),
        "memoryClockRate": str(a("MEMORY_CLOCK_RATE")),
        "memoryBusWidth": str(a("GLOBAL_MEMORY_BUS_WIDTH")),
        "l2CacheSize": str(a("L2_CACHE_SIZE")),
        "maxThreadsPerMultiProcessor": str(a("MAX_THREADS_PER_MULTIPROCESSOR")),
        "sharedMemPerMultiprocessor": str(a("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR")),
        "regsPerMultiprocessor": str(a("MAX_REGISTERS_PER_MULTIPROCESSOR")),
        "managedMemory": str(a("MANAGED_MEMORY")),
        "concurrentKernels": str(a("CONCURRENT_KERNELS")),
        "sharedMemPerBlockOptin": str(a("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")),
        "maxBlocksPerMultiProcessor": str(a("MAX_BLOCKS_PER_MULTIPROCESSOR")),
        "persistingL2CacheMaxSize": str(a("MAX_PERSISTING_L2_CACHE_SIZE")),
    }


VERSIONS = ["12.4", "11.8"]


@pytest.mark.parametrize("version", VERSIONS)
def test_device_properties_in_the_programs_layout(version, tmp_path_factory, emu_daemon):
    """The issue's case: a CUDA 12.4 (11.8) program's cudaDeviceProp, in its
    own layout (with the fields 13 dropped), holds the emulated device's
    values."""
    exe = _build(version, HERE / "oldcuda" / "devprops.c", tmp_path_factory)
    r = subprocess.run([str(exe)], env=client_env(emu_daemon), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr + emu_daemon.log()[-2000:]
    got = _fields(r.stdout)
    assert got.pop("runtime") == str(oldcuda_kit.KITS[version][2])
    assert got == _expected_props(version)
    assert r.stderr == ""


def _offset_of(version, field, tmp_path_factory) -> int:
    """offsetof(struct cudaDeviceProp, field) in `version`'s header, by the C compiler."""
    inc = _kit(version) / "include"
    src = tmp_path_factory.mktemp("off") / "off.c"
    src.write_text("#include <stdio.h>\n#include <stddef.h>\n#include <cuda_runtime_api.h>\n"
                   f"int main(void){{printf(\"%zu\\n\", offsetof(struct cudaDeviceProp, {field}));}}\n")
    exe = src.with_suffix("")
    crt = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda") / "include"
    subprocess.run(["cc", f"-I{inc}", f"-idirafter{crt}", str(src), "-o", str(exe)], check=True)
    return int(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout)


@pytest.mark.parametrize("version", VERSIONS)
def test_runtime_by_path_is_nvidias(version, tmp_path_factory, emu_daemon):
    """dlopen of NVIDIA's libcudart.so.12 (.11.0) by absolute path (what CuPy
    and cuda-pathfinder do) loads that runtime, not the shim's 13: the
    structure it fills has that version's layout (multiProcessorCount at
    388 in 12.4, where 13 has another field)."""
    soname, cuda_version = oldcuda_kit.KITS[version][1:]
    lib = _kit(version) / "lib" / soname
    off = _offset_of(version, "multiProcessorCount", tmp_path_factory)
    fn = "cudaGetDeviceProperties_v2" if cuda_version >= 12000 else "cudaGetDeviceProperties"
    code = ("import ctypes, struct\n"
            f"rt = ctypes.CDLL({str(lib)!r})\n"
            "buf = ctypes.create_string_buffer(4096)\n"
            f"e = rt.{fn}(buf, 0)\n"
            "v = ctypes.c_int(); rt.cudaRuntimeGetVersion(ctypes.byref(v))\n"
            f"print(e, v.value, buf.raw[:256].split(b'\\0')[0].decode(), struct.unpack_from('<i', buf.raw, {off})[0])\n")
    r = subprocess.run([sys.executable, "-c", code], env=client_env(emu_daemon), capture_output=True, text=True,
                       timeout=60)
    exp = _expected_props(version)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split(None, 2)[:2] == ["0", str(cuda_version)], r.stdout
    assert r.stdout.strip().endswith(f"{exp['name']} {exp['multiProcessorCount']}"), r.stdout
    assert r.stderr == ""


def test_offsets_differ_from_cuda13(tmp_path_factory):
    """Why the redirect to the shim's 13 runtime was wrong: 13 moved the field."""
    assert _offset_of("12.4", "multiProcessorCount", tmp_path_factory) == 388
    inc13 = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda") / "include"
    src = tmp_path_factory.mktemp("off13") / "off.c"
    src.write_text("#include <stdio.h>\n#include <stddef.h>\n#include <cuda_runtime_api.h>\n"
                   "int main(void){printf(\"%zu\\n\", offsetof(struct cudaDeviceProp, multiProcessorCount));}\n")
    subprocess.run(["cc", f"-I{inc13}", str(src), "-o", str(src.with_suffix(""))], check=True)
    assert int(subprocess.run([str(src.with_suffix(""))], capture_output=True, text=True).stdout) != 388


OLD_CORPUS = ["iterative", "vector_add", "mempool_async"]


@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", OLD_CORPUS)
def test_corpus_program_identical(name, version, nvcc, tmp_path_factory, emu_daemon):
    """A corpus program built for CUDA 12.4 (11.8) (nvcc 13 front end, that
    version's headers, NVIDIA's runtime of that version) prints exactly what
    its CUDA 13 build must."""
    prog = next(p for p in corpus.load_corpus() if p.name == name)
    exe = _build(version, prog.source_path, tmp_path_factory, nvcc=nvcc)
    r = subprocess.run([str(exe), *prog.args], env=client_env(emu_daemon), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr + emu_daemon.log()[-2000:]
    assert r.stdout == prog.expected_output
    assert r.stderr == ""


class _Built:
    def __init__(self, exe, args=()):
        self.exe, self.args = exe, list(args)

    def argv(self):
        return [str(self.exe), *self.args]


def _ctl(d, cmd, **args):
    from gpuproxy.proxyd.client import ControlClient
    return ControlClient(d.endpoint, timeout_s=120).call(cmd, args)


@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_program_across_dump_and_restore(version, nvcc, tmp_path_factory, shim_installed, emu_kernel_files):
    """The CUDA 12.4 (11.8) build of `iterative`, paced, dumped after
    iterations 20 and 40, proxyd killed and a fresh one restoring each time:
    the same output as its CUDA 13 build without a checkpoint. The older
    runtime's own state (module registrations in the context-local storage)
    lives in the application and keeps its handles."""
    import shutil
    import time
    from paced import PacedRun
    from proxy import Daemon
    prog = next(p for p in corpus.load_corpus() if p.name == "iterative")
    exe = _build(version, prog.source_path, tmp_path_factory, nvcc=nvcc)
    tmp = Path(f"/tmp/gpo-{os.getpid()}-{time.monotonic_ns() % 10**9}")   # ipc paths stay short
    tmp.mkdir()

    def daemon(name):
        return Daemon(backend="emu", emu_kernels=emu_kernel_files, endpoint=f"ipc://{tmp}/proxyd.sock",
                      log_path=str(tmp / f"{name}.log")).start()
    d = daemon("first")
    try:
        with PacedRun(_Built(exe), d) as run:
            for k in (20, 40):
                run.step_to(k)
                st = _ctl(d, "dump", pid=run.pid, dir=str(tmp / f"img{k}"))
                assert st["released"], st
                d.kill()
                d = daemon(f"after{k}")
                assert _ctl(d, "restore", dir=str(tmp / f"img{k}"))["pid"] == run.pid
            out = run.finish()
            assert out == prog.expected_output, f"{out}\n--- stderr\n{run.stderr()}\n{d.log()[-3000:]}"
            assert run.stderr() == ""
    finally:
        d.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


def test_oldest_driver_mode_as_natively(tmp_path_factory, fresh_daemon):
    """With the worker forced into its CUDA 11.4 driver mode
    (GPUPROXY_DRIVER_VERSION_CAP=11040), the application is told 11040:
    the 11.8 runtime runs on it (CUDA's minor-version compatibility, as on an
    R470 driver natively), the 12.4 runtime refuses it as it would natively
    (cudaErrorInsufficientDriver), never a wrong answer."""
    import os as _os
    d = fresh_daemon(env=dict(_os.environ, GPUPROXY_DRIVER_VERSION_CAP="11040"))
    exe11 = _build("11.8", HERE / "oldcuda" / "devprops.c", tmp_path_factory)
    r = subprocess.run([str(exe11)], env=client_env(d), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr + d.log()[-2000:]
    got = _fields(r.stdout)
    assert got.pop("runtime") == "11080"
    assert got == _expected_props("11.8")
    exe12 = _build("12.4", HERE / "oldcuda" / "devprops.c", tmp_path_factory)
    r = subprocess.run([str(exe12)], env=client_env(d), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.startswith("devprops: cudaErrorInsufficientDriver"), r.stdout + r.stderr


@pytest.mark.slow
def test_python_cuda12_bindings(emu_daemon):
    """A Python stack on CUDA 12: NVIDIA's cuda.bindings 12.9 (the CUDA 12.9
    runtime linked into it) under the proxy. Its cudaDeviceProp (12.x
    layout) holds the emulated device's values; a copy to the device, a
    memset and a copy back give the expected bytes."""
    try:
        site = oldcuda_kit.python_site()
    except oldcuda_kit.KitUnavailable as e:
        pytest.skip(f"cuda-bindings 12 unavailable: {e}")
    env = client_env(emu_daemon, {"PYTHONPATH": str(site)})
    r = subprocess.run([sys.executable, str(HERE / "oldcuda" / "bindings12.py")], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    got = _fields(r.stdout)
    assert got.pop("runtime").startswith("12")
    exp = _expected_props("12.4")     # attribute numbers are the same in every 12.x cuda.h
    assert got == {"name": exp["name"], "multiProcessorCount": exp["multiProcessorCount"],
                   "clockRate": exp["clockRate"], "memoryClockRate": exp["memoryClockRate"],
                   "l2CacheSize": exp["l2CacheSize"],
                   "maxThreadsPerMultiProcessor": exp["maxThreadsPerMultiProcessor"],
                   "warpSize": exp["warpSize"], "major": exp["major"], "minor": exp["minor"],
                   "totalGlobalMem": exp["totalGlobalMem"], "roundtrip": "same", "free": "0"}
    assert r.stderr == ""


# ---------------------------------------------------------------- driver entry points per CUDA version

@pytest.mark.parametrize("version", ["12.4", "11.8"])
def test_proc_address_per_version(version, shim_installed):
    """An older runtime resolves every driver function through
    cuGetProcAddress with its own CUDA version. For every PFN_<name>_v<N> of
    that version's cudaTypedefs.h (NVIDIA's list of the driver's entry points
    and the version each variant came with), the shim must answer, and with
    the variant that version knew: the one asked for at the newest <N> of
    that name in the older header, never a variant a later CUDA added (whose
    parameters may differ, e.g. cuStreamGetCaptureInfo_v3 of 12.3 to an 11.8
    runtime). The shim's table comes from the specs' `proc:` entries."""
    import ctypes
    cuda_version = oldcuda_kit.KITS[version][2]
    text = (_kit(version) / "include" / "cudaTypedefs.h").read_text()
    variants: dict[str, set[int]] = {}
    for name, v in re.findall(r"\bPFN_(cu\w+?)_v(\d+)\b", text):
        if not name.endswith(("_ptds", "_ptsz")):
            variants.setdefault(name, set()).add(int(v))
    assert len(variants) > 300
    lib = ctypes.CDLL(os.path.join(shim_installed.lib_dir(), "libcuda.so.1"))
    proc = lib.cuGetProcAddress_v2
    proc.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                     ctypes.POINTER(ctypes.c_int)]

    def lookup(name, v):
        p, st = ctypes.c_void_p(), ctypes.c_int()
        rc = proc(name.encode(), ctypes.byref(p), v, 0, ctypes.byref(st))
        return p.value if rc == 0 else None
    missing = sorted(n for n in variants if not lookup(n, cuda_version))
    assert missing == [], missing
    newer = sorted(n for n, vs in variants.items() if lookup(n, cuda_version) != lookup(n, max(vs)))
    assert newer == [], newer


def _cuda13_include() -> Path:
    return Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda") / "include"


def _struct_sizes(include: Path, names, tmp: Path) -> dict[str, int]:
    src = tmp / "sizes.c"
    src.write_text("#include <stdio.h>\n#include <cuda.h>\nint main(void){\n"
                   + "".join(f'printf("{n} %zu\\n", sizeof({n}));\n' for n in names) + "return 0;}\n")
    exe = tmp / "sizes"
    # the _v1 structures are declared for __CUDA_API_VERSION_INTERNAL only
    subprocess.run(["cc", "-D__CUDA_API_VERSION_INTERNAL", f"-I{include}", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return {n: int(v) for n, v in (line.split() for line in out.splitlines())}


def _struct_names(cuda_h: str) -> set[str]:
    return set(re.findall(r"\}\s*(CU\w+|CUDA_\w+)\s*;", re.sub(r"/\*.*?\*/", "", cuda_h, flags=re.S)))


@pytest.mark.parametrize("version", ["12.4", "11.8"])
def test_driver_structures_per_version(version, tmp_path):
    """Every structure that version's cuda.h and CUDA 13's both define has
    the same size, but those specs/abi/driver_structs.yaml lists with the
    reason the shim may still pass them as it does."""
    import yaml
    listed = yaml.safe_load((REPO / "specs" / "abi" / "driver_structs.yaml").read_text())[version] or {}
    old_inc = _kit(version) / "include"
    names = sorted(_struct_names((old_inc / "cuda.h").read_text())
                   & _struct_names((_cuda13_include() / "cuda.h").read_text()))
    assert len(names) > 100
    old = _struct_sizes(old_inc, names, tmp_path)
    new = _struct_sizes(_cuda13_include(), names, tmp_path)
    differ = {n: [old[n], new[n]] for n in names if old[n] != new[n]}
    assert differ == {n: e["size"] for n, e in listed.items()}


@pytest.mark.slow
@pytest.mark.parametrize("version", ["12.4", "11.8"])
def test_driver_prototypes_per_version(version, tmp_path):
    """Every driver function that version's cuda.h declares is declared by
    CUDA 13's under the same name with the same parameter types (typedef
    aliases of the older header resolved: 11.8's CUDA_KERNEL_NODE_PARAMS is
    13's CUDA_KERNEL_NODE_PARAMS_v1): the shim's function of that name
    (built from 13's headers) is the one the older program calls."""
    sys.path.insert(0, str(REPO / "autogen"))
    import header
    home = tmp_path / "home"
    inc = home / "include"
    inc.mkdir(parents=True)
    old_inc = _kit(version) / "include"
    # headers the runtime wheel does not ship (cudaProfiler.h, ...) from 13
    for f in _cuda13_include().iterdir():
        (inc / f.name).symlink_to(old_inc / f.name if (old_inc / f.name).exists() else f)
    old = header.parse_driver(str(home))
    new = header.parse_driver(str(_cuda13_include().parent))
    def resolver(cuda_h: Path):
        """A type spelled through each header's own typedef chains."""
        text = re.sub(r"/\*.*?\*/", "", cuda_h.read_text(), flags=re.S)
        alias = dict((b, a) for a, b in re.findall(r"typedef\s+(\w+)\s+(\w+)\s*;", text))

        def word(w):
            seen = set()
            while w in alias and w not in seen:
                seen.add(w)
                w = alias[w]
            return w
        return lambda t: re.sub(r"\w+", lambda m: word(m.group(0)), t)
    norm_old, norm_new = resolver(old_inc / "cuda.h"), resolver(_cuda13_include() / "cuda.h")
    assert len(old) > 500
    assert sorted(set(old) - set(new)) == []
    pairs, differ = set(), []
    for n in old:
        a = [norm_old(old[n].returns)] + [norm_old(p.type) for p in old[n].params]
        b = [norm_new(new[n].returns)] + [norm_new(p.type) for p in new[n].params]
        if len(a) != len(b):
            differ.append(n)
            continue
        for x, y in zip(a, b):
            if x != y:
                # a structure defined directly in one header and as an alias of
                # its _v1 in the other (11.8's CUDA_BATCH_MEM_OP_NODE_PARAMS):
                # the same if the pointed-to types have the same size
                bx, by = (re.sub(r"\b(const|struct)\b|\*", "", t).strip() for t in (x, y))
                if x.replace(bx, "") != y.replace(by, "") or not re.fullmatch(r"CU\w+", bx + by):
                    differ.append(n)
                pairs.add((bx, by))
    assert differ == []
    if pairs:
        (tmp_path / "o").mkdir()
        (tmp_path / "n").mkdir()
        so = _struct_sizes(old_inc, sorted({x for x, _ in pairs}), tmp_path / "o")
        sn = _struct_sizes(_cuda13_include(), sorted({y for _, y in pairs}), tmp_path / "n")
        assert [(x, y) for x, y in sorted(pairs) if so[x] != sn[y]] == []


# ---------------------------------------------------------------- the worker on older drivers

def _declared_driver_functions(cuda_h: str) -> set[str]:
    """Symbols a driver of that cuda.h exports: each declared function under
    the name its #define maps it to (cuMemAlloc -> cuMemAlloc_v2), and the
    declared name itself (the older entry point)."""
    text = re.sub(r"/\*.*?\*/", "", cuda_h, flags=re.S)
    decl = set(re.findall(r"\bCUresult\s+CUDAAPI\s+(cu\w+)\s*\(", text))
    alias = dict(re.findall(r"#\s*define\s+(cu\w+)\s+(cu\w+_v\d+)\b", text))
    return decl | {alias[d] for d in decl if d in alias}


def _worker_driver_calls() -> set[str]:
    """lib.cuX( in the worker's Python (backends, families), and the
    functions its C helpers (proxyd/native/*.c) look up with dlsym."""
    names = set()
    for f in (REPO / "proxyd").rglob("*.py"):
        names |= set(re.findall(r"\blib\.(cu[A-Z]\w+)\(", f.read_text()))
    for f in (REPO / "proxyd" / "native").glob("*.c"):
        names |= set(re.findall(r"dlsym\(\w+,\s*\"(cu[A-Z]\w+)\"\)", f.read_text()))
    return names


def test_worker_driver_calls_exist_in_an_older_cuda_h():
    """Every driver function the worker calls is in CUDA 11.7's cuda.h (the
    oldest NVIDIA wheel that ships one; 11.4's is not on PyPI) or listed in
    backends/driver_floor.py with the version it needs, and used only then."""
    from gpuproxy.proxyd.backends import driver_floor
    req = "nvidia-cuda-runtime-cu11==11.7.99"
    oldcuda_kit.KITS.setdefault("11.7", (req, "libcudart.so.11.0", 11070))
    cuda_h = (_kit("11.7") / "include" / "cuda.h").read_text()
    assert "#define CUDA_VERSION 11070" in cuda_h
    have = _declared_driver_functions(cuda_h)
    calls = _worker_driver_calls()
    assert len(calls) > 40   # the scan found the worker's calls
    missing = {c for c in calls if c not in have}
    assert missing <= set(driver_floor.NEWER), missing - set(driver_floor.NEWER)
    # a listed function that 11.7 has must have come with 11.5-11.7 (11.4 lacks it)
    assert all(11040 < driver_floor.NEWER[n] <= 11070 for n in set(driver_floor.NEWER) & have)
    assert set(driver_floor.NEWER) <= calls     # nothing listed that the worker does not call
    assert all(v > driver_floor.MIN_DRIVER for v in driver_floor.NEWER.values())


def test_gated_lib_answers_newer_functions_not_supported(caplog):
    from gpuproxy.proxyd.backends import driver_floor

    class Fake:
        def cuCtxSetFlags(self, flags):
            return 0

        def cuInit(self, flags):
            return 0
    lib = driver_floor.GatedLib(Fake(), 11040)
    assert lib.cuInit(0) == 0
    assert not lib.has("cuCtxSetFlags")
    from gpuproxy.proxyd.core.session import CudaError
    msg = "cuCtxSetFlags needs a CUDA 12.1 driver; this one is 11.4: not supported"
    with caplog.at_level("WARNING", logger="proxyd"):
        with pytest.raises(CudaError) as e:
            lib.cuCtxSetFlags(0)
    assert (e.value.code, e.value.message) == (driver_floor.CUDA_ERROR_NOT_SUPPORTED, msg)
    assert [r.getMessage() for r in caplog.records] == [msg]
    assert driver_floor.GatedLib(Fake(), 13000).cuCtxSetFlags(0) == 0


def test_function_the_driver_lacks_is_not_supported(caplog):
    """A function declared for the generic path that the host driver does
    not export (an application's call of a newer function on an older
    driver): not-supported with one line naming it, not a crash."""
    from cffi import FFI
    from gpuproxy.proxyd.backends import driver_floor
    from gpuproxy.proxyd.core.session import CudaError
    ffi = FFI()
    ffi.cdef("int gp_no_such_driver_function(int); int abs(int);")
    lib = driver_floor.GatedLib(ffi.dlopen(None), 11040)
    assert lib.abs(-3) == 3
    with caplog.at_level("WARNING", logger="proxyd"):
        with pytest.raises(CudaError) as e:
            lib.gp_no_such_driver_function(1)
    msg = "gp_no_such_driver_function is not in this driver (CUDA 11.4): not supported"
    assert (e.value.code, e.value.message) == (801, msg)
    assert [r.getMessage() for r in caplog.records] == [msg]
    with pytest.raises(AttributeError):      # never declared: as the cffi library
        lib.gp_never_declared


def test_driver_version_cap(monkeypatch):
    from gpuproxy.proxyd.backends import driver_floor
    monkeypatch.delenv(driver_floor.CAP_ENV, raising=False)
    assert driver_floor.effective_version(13000) == 13000
    monkeypatch.setenv(driver_floor.CAP_ENV, "11040")
    assert driver_floor.effective_version(13000) == 11040
