"""Build step of gpuproxy: specs -> generated code -> the shim's shared libraries.

Run by setup.py during `pip install .` (policy: generated code is produced at
build time and never committed). Also usable by hand:

    python -m autogen.build --out build/shim      # from the repository root

Produces, in the package's interceptor/lib folder:
  libcuda.so.1, libcudart.so.13   the shim (plain shared libraries: no
                                  libpython, sonames of the real libraries,
                                  version scripts)
  libzmq-*.so*, libsodium-*.so*   the libzmq of the pyzmq wheel, which the
                                  shim links (found at build time, copied so
                                  the shim finds it through its $ORIGIN rpath)
and the daemon's dispatch module proxyd/_generated.py.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

try:
    from . import gen_c, gen_lib, gen_py, header, lib_majors, specload, typeinfo
except ImportError:  # run as a script with autogen/ on sys.path
    import header  # type: ignore
    import gen_c  # type: ignore
    import gen_lib  # type: ignore
    import lib_majors  # type: ignore
    import gen_py  # type: ignore
    import specload  # type: ignore
    import typeinfo  # type: ignore

REPO = Path(__file__).resolve().parents[1]

DRIVER_SOURCES = ["gp_msgpack.c", "log.c", "lock.c", "shm_private.c", "transport.c", "hostmem.c", "context.c", "funcs.c",
                  "memcpy.c", "driver.c", "launch.c", "launch_ex.c", "proc_address.c",
                  "undocumented.c", "channel.c", "curve.c", "pmemcpy.c", "park.c", "dlopen.c", "legacy_launch.c",
                  "copy2d.c", "hostmap_api.c", "export_tables.c", "library.c", "pointer_attrs.c", "capture.c",
                  "hostfn.c", "mempool.c", "mempool_ipc.c", "capture_mode.c", "link.c", "ipc_event.c", "sha256.c",
                  "lib_state.c", "profile.c", "lib_ids.c", "lt_heuristic.c",
                  "query_cache.c", "graph_build.c", "graph_cond.c", "graph_add_node.c", "tensor_map.c", "slab.c", "graph_mem.c", "capture_copy.c", "shm_name.c", "peer.c", "owner.c", "io_uring_off.c"]
# libc functions that libcuda.so.1 interposes (interceptor/dlopen.c,
# interceptor/io_uring_off.c).
INTERPOSED_LIBC = ["dlopen", "dlmopen", "syscall"]
RUNTIME_SOURCES = ["rt_state.c", "rt_register.c", "rt_api.c", "rt_hostmap.c", "rt_ipc.c", "rt_hostfn.c", "rt_mempool.c", "rt_arrays.c",
                   "rt_graph.c", "rt_graph_cond.c", "rt_peer.c"]


# Library stand-ins (docs/libraries.md): api -> hand-written sources, and
# whether it needs the runtime stand-in (cudaFree(NULL) before a handle).
# gp_msgpack.c: each stand-in has its own (hidden) copy of the encoder; the
# buffers it writes to belong to libcuda.so.1's transport.
LIBRARY_SOURCES = {"cublas": (["lib_cublas.c", "lib_cublas_copy.c", "gp_msgpack.c"], True), "cublaslt": (["lib_cublaslt.c", "gp_msgpack.c"], True),
                   "nvml": (["lib_nvml.c", "gp_msgpack.c"], False),
                   "cudnn": (["lib_cudnn.c", "gp_msgpack.c"], True),
                   "cufft": (["lib_cufft.c", "gp_msgpack.c"], True), "curand": (["lib_curand.c", "lib_curand_host.c", "gp_msgpack.c"], True),
                   "cusparse": (["lib_cusparse.c", "gp_msgpack.c"], True),
                   "cusolver": (["lib_cusolver.c", "gp_msgpack.c"], True),
                   "nccl": (["lib_nccl.c", "gp_msgpack.c"], True)}


class BuildError(RuntimeError):
    pass


def cuda_include() -> str:
    for base in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if base and os.path.exists(os.path.join(base, "include", "cuda.h")):
            return os.path.join(base, "include")
    raise BuildError("gpuproxy needs the CUDA 13 toolkit headers (cuda.h); set CUDA_HOME to the toolkit folder")


def find_libzmq() -> list[str]:
    """The libzmq that the pyzmq wheel bundles, and the libraries it needs
    from the same folder (libsodium)."""
    try:
        import zmq  # noqa: F401
    except ImportError as e:
        raise BuildError("building the shim needs pyzmq installed (it provides libzmq)") from e
    zdir = Path(zmq.__file__).resolve().parent
    cands = glob.glob(str(zdir.parent / "pyzmq.libs" / "libzmq*.so*")) + glob.glob(str(zdir / ".libs" / "libzmq*.so*"))
    if not cands:
        raise BuildError(f"no bundled libzmq found next to pyzmq in {zdir.parent}")
    libzmq = cands[0]
    libs = [libzmq] + [p for p in glob.glob(os.path.join(os.path.dirname(libzmq), "*.so*")) if p != libzmq]
    return libs


def undocumented_exports() -> list[str]:
    """Driver symbols without a header declaration (interceptor/undocumented.c)."""
    import re
    text = (REPO / "interceptor" / "undocumented.c").read_text()
    return re.findall(r"^GP_UNDOCUMENTED\((\w+)\)", text, flags=re.M)


def _write(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text() == text:
        return
    path.write_text(text)


def generate(spec_dir: Path, gen_dir: Path, py_out: Path, include: str, cc: str = "cc") -> None:
    specs = specload.load_specs(str(spec_dir))
    driver = list(specs.driver)
    runtime = list(specs.runtime)
    sources = sorted(str(Path(p).relative_to(spec_dir.parent)) for p in glob.glob(str(spec_dir / "*" / "*.yaml")))
    supported = [f for f in driver if gen_c.g(f, "status") == "supported"]
    types = typeinfo.probe(gen_c.needed_types(supported), include, cc)
    _write(gen_dir / "gp_gen.h", gen_c.gen_header(driver, runtime, sources))
    dh = [sf.header for sf in specs.files if sf.api == "driver"]
    rh = [sf.header for sf in specs.files if sf.api == "runtime"]
    _write(gen_dir / "gp_driver_stubs.c", gen_c.gen_driver_stubs(driver, types, sources, dh))
    _write(gen_dir / "gp_runtime_stubs.c", gen_c.gen_runtime_stubs(runtime, sources, rh))
    _write(gen_dir / "gp_proc_table.c", gen_c.gen_proc_table(driver, sources, dh))
    cu, rt = gen_c.gen_errors(Path(include, "cuda.h").read_text(), Path(include, "driver_types.h").read_text(), sources)
    _write(gen_dir / "gp_errors_cu.c", cu)
    _write(gen_dir / "gp_errors_rt.c", rt)
    cmap, rmap = gen_c.gen_version_scripts(driver, runtime, undocumented_exports() + INTERPOSED_LIBC)
    _write(gen_dir / "libcuda.map", cmap)
    _write(gen_dir / "libcudart.map", rmap)
    for sf, fns in gen_lib.lib_files(specs):
        _write(gen_dir / f"gp_lib_{sf.api}.h", gen_lib.gen_header(sf, fns, sources))
        _write(gen_dir / f"gp_lib_{sf.api}_stubs.c", gen_lib.gen_stubs(sf, fns, sources))
        _write(gen_dir / f"{sf.soname}.map", gen_lib.gen_version_script(sf, fns))
    _write(py_out, gen_py.gen_dispatch(driver, types, sources, gen_lib.lib_files(specs)))


def _cc(cmd: list[str]):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError("compiler failed:\n" + " ".join(cmd) + "\n" + r.stderr[-6000:])
    if r.stderr.strip() and os.environ.get("GPUPROXY_BUILD_VERBOSE"):
        sys.stderr.write(r.stderr)


def compile_flags(src: Path, gen_dir: Path, include: str, version: str, optimise: str = "-O2",
                  debug: bool = True) -> list[str]:
    """The compiler flags of every shim source (scripts/shim_layers.py
    compiles with them too, at -O0)."""
    return [optimise, *(["-g"] if debug else []), "-fPIC", "-std=gnu11", "-Wall", "-Werror=implicit-function-declaration", "-Wno-unused-parameter",
            "-pthread", f"-I{src}", f"-I{gen_dir}", f"-I{include}", f'-DGP_VERSION="{version}"']


# Generated stubs define every symbol variant (legacy, _v2, _ptds), which
# cuda.h declares only with __CUDA_API_VERSION_INTERNAL; hand-written code
# uses the normal header view so that cuMemAlloc means cuMemAlloc_v2.
def internal_flags() -> list[str]:
    return ["-D__CUDA_API_VERSION_INTERNAL", "-idirafter", header.standin_dir()]


GENERATED_INTERNAL = {"gp_driver_stubs.c", "gp_proc_table.c", "gp_runtime_stubs.c"}


def reproducible(gen_dir: Path) -> list[str]:
    """Compiler options that keep the folders of a build out of its output,
    so that two builds of one version are byte-identical wherever they ran
    (pip builds in a temporary folder of its own, a clone lies anywhere).
    A process restored by CRIU maps the stand-in libraries again, and CRIU
    refuses a file whose ELF build-id (a hash of its bytes, ld --build-id)
    changed since the dump (criu --help: --file-validation, buildid by
    default): a reinstall of the same version must keep every image usable.
    The debug information names source files and the compiler's working
    folder; -ffile-prefix-map (GCC >= 8) rewrites those names. The last
    matching map wins, so the most specific folders come last."""
    maps = [(os.getcwd(), "."), (str(REPO), "gpuproxy"),
            (str(gen_dir), "gpuproxy-gen"), (str(Path(gen_dir).resolve()), "gpuproxy-gen"),
            (header.standin_dir(), "gpuproxy-standin")]
    return [f"-ffile-prefix-map={old}={new}" for old, new in maps]


def compile_libs(gen_dir: Path, lib_dir: Path, include: str, version: str, cc: str = "cc") -> None:
    lib_dir.mkdir(parents=True, exist_ok=True)
    zlibs = find_libzmq()
    for p in zlibs:
        dst = lib_dir / os.path.basename(p)
        if not dst.exists():
            shutil.copy2(p, dst)
    libzmq = os.path.basename(zlibs[0])
    src = REPO / "interceptor"
    common = [*compile_flags(src, gen_dir, include, version), *reproducible(gen_dir)]
    objs_dir = gen_dir / "obj"
    objs_dir.mkdir(exist_ok=True)

    def objs(files: list[Path], extra: list[str]) -> list[str]:
        out = []
        for f in files:
            o = objs_dir / (f.stem + ".o")
            _cc([cc, *common, *extra, "-c", str(f), "-o", str(o)])
            out.append(str(o))
        return out

    internal = internal_flags()
    d_objs = objs([src / s for s in DRIVER_SOURCES], [])
    d_objs += objs([gen_dir / "gp_driver_stubs.c", gen_dir / "gp_proc_table.c"], internal)
    d_objs += objs([gen_dir / "gp_errors_cu.c"], [])
    cuda_so = lib_dir / "libcuda.so.1"
    _cc([cc, "-shared", "-o", str(cuda_so), *d_objs, "-Wl,-soname,libcuda.so.1",
         f"-Wl,--version-script={gen_dir / 'libcuda.map'}", f"-L{lib_dir}", f"-l:{libzmq}",
         "-Wl,-rpath,$ORIGIN", "-Wl,--no-undefined", "-pthread", "-lrt", "-ldl"])
    r_objs = objs([src / s for s in RUNTIME_SOURCES], [])
    r_objs += objs([gen_dir / "gp_runtime_stubs.c"], internal)
    r_objs += objs([gen_dir / "gp_errors_rt.c"], [])
    _cc([cc, "-shared", "-o", str(lib_dir / "libcudart.so.13"), *r_objs, "-Wl,-soname,libcudart.so.13",
         f"-Wl,--version-script={gen_dir / 'libcudart.map'}", f"-L{lib_dir}", "-l:libcuda.so.1",
         "-Wl,-rpath,$ORIGIN", "-Wl,--no-undefined", "-pthread"])
    specs = specload.load_specs(str(REPO / "specs"))
    for sf, _fns in gen_lib.lib_files(specs):
        hand, needs_rt = LIBRARY_SOURCES[sf.api]
        l_objs = objs([src / s for s in hand] + [gen_dir / f"gp_lib_{sf.api}_stubs.c"], [])
        _cc([cc, "-shared", "-o", str(lib_dir / sf.soname), *l_objs, f"-Wl,-soname,{sf.soname}",
             f"-Wl,--version-script={gen_dir / (sf.soname + '.map')}", f"-L{lib_dir}", "-l:libcuda.so.1",
             *(["-l:libcudart.so.13"] if needs_rt else []),
             "-Wl,-rpath,$ORIGIN", "-Wl,--no-undefined", "-pthread"])
        # older majors of this library (specs/abi/library_majors.yaml): the
        # same objects under that soname and version node
        for soname in lib_majors.variants(sf.api):
            vmap = gen_dir / (soname + ".map")
            _write(vmap, lib_majors.version_script(soname, [gen_lib.g(f, "name") for f in _fns]))
            vsrc = gen_dir / ("gp_major_" + soname.replace(".", "_") + ".c")
            _write(vsrc, lib_majors.major_source(soname))
            _cc([cc, "-shared", "-o", str(lib_dir / soname), *l_objs, *objs([vsrc], []), f"-Wl,-soname,{soname}",
                 f"-Wl,--version-script={vmap}", f"-L{lib_dir}", "-l:libcuda.so.1",
                 *(["-l:libcudart.so.13"] if needs_rt else []),
                 "-Wl,-rpath,$ORIGIN", "-Wl,--no-undefined", "-pthread"])


def compile_daemon_helper(out: Path, include: str, cc: str = "cc") -> None:
    """proxyd's native helper (proxyd/native/gpxd.c): the C launch path and
    the gp64 checkpoint hash. Loaded with cffi in ABI mode; no libpython."""
    srcs = [REPO / "proxyd" / "native" / "gpxd.c", REPO / "interceptor" / "gp_msgpack.c"]
    gp64 = REPO / "proxyd" / "checkpoint" / "gp64.c"
    if gp64.exists():
        srcs.append(gp64)
    out.parent.mkdir(parents=True, exist_ok=True)
    _cc([cc, "-O3", "-g", "-fPIC", "-shared", "-std=gnu11", "-Wall", "-pthread", f"-I{REPO / 'interceptor'}",
         f"-I{include}", *map(str, srcs), "-o", str(out), "-ldl"])


def build_all(pkg_root: Path, temp: Path, version: str) -> None:
    """pkg_root: the folder that holds the installed `gpuproxy` package."""
    include = cuda_include()
    gen_dir = temp / "gen"
    generate(REPO / "specs", gen_dir, pkg_root / "gpuproxy" / "proxyd" / "_generated.py", include)
    compile_libs(gen_dir, pkg_root / "gpuproxy" / "interceptor" / "lib", include, version)
    compile_daemon_helper(pkg_root / "gpuproxy" / "proxyd" / "libgpxd.so", include)
    compile_hash_kernel(pkg_root / "gpuproxy" / "proxyd" / "gp64.ptx")
    compile_criu_plugin(pkg_root / "gpuproxy" / "proxyd" / "checkpoint" / "gpuproxy_criu_plugin.so")


def compile_criu_plugin(out: Path, cc: str = "cc") -> None:
    """gpuproxy's CRIU plugin (proxyd/checkpoint/criu_plugin.c); it runs its
    hooks with the Python that installs gpuproxy. Its symbol criu_get_image_dir
    comes from the criu executable that loads it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    _cc([cc, "-O2", "-g", "-fPIC", "-shared", "-std=gnu11", "-Wall", f'-DGP_PYTHON="{sys.executable}"',
         str(REPO / "proxyd" / "checkpoint" / "criu_plugin.c"), "-o", str(out), "-ldl"])


def compile_hash_kernel(out: Path) -> None:
    """The GPU version of the checkpoint hash, as PTX (the driver compiles it
    for whatever GPU proxyd runs on). Without nvcc, checkpoints hash on the CPU."""
    nvcc = shutil.which("nvcc") or os.path.join(os.path.dirname(cuda_include()), "bin", "nvcc")
    if not os.path.exists(nvcc):
        sys.stderr.write("gpuproxy: nvcc not found; checkpoint hashing will run on the CPU\n")
        return
    _cc([nvcc, "-ptx", "-arch=compute_75", "-O3", str(REPO / "proxyd" / "native" / "gp64.cu"), "-o", str(out)])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(REPO / "build" / "shim"), help="output folder")
    ap.add_argument("--version", default="0.0.0-dev")
    ap.add_argument("--generate-only", action="store_true",
                    help="write the generated sources (gen/, _generated.py) and stop: no compiling")
    a = ap.parse_args(argv)
    out = Path(a.out)
    include = cuda_include()
    generate(REPO / "specs", out / "gen", out / "_generated.py", include)
    if a.generate_only:
        print(f"generated {out / 'gen'}")
        return
    compile_libs(out / "gen", out / "lib", include, a.version)
    print(f"built {out / 'lib'}")


if __name__ == "__main__":
    main()
