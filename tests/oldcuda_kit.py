"""NVIDIA's CUDA 12.4 and 11.8 runtimes and headers for the older-CUDA tests
(tests/test_oldcuda.py, scripts/gpu-check --oldcuda).

They come from NVIDIA's wheels (nvidia-cuda-runtime-cu12 12.4.*, -cu11
11.8.*: include/ with cuda.h, cuda_runtime_api.h, driver_types.h; lib/ with
libcudart.so.12 / libcudart.so.11.0), found in this order: .carry/oldcuda/
(or .carry/oldcuda2/, where `python3 tests/oldcuda_kit.py --carry
.carry/oldcuda2` puts them) of the checkout (the GPU machine has no
network), the cache folder
($GPUPROXY_OLDCUDA_CACHE, default ~/.cache/gpuproxy/oldcuda), else
downloaded there with pip. Where none works the callers skip with the reason.

Programs are built by the CUDA 13 nvcc (the toolkit here) against the older
headers and linked against the older runtime, so the application side is
that version's: its structure layouts, macros (cudaGetDeviceProperties is
cudaGetDeviceProperties_v2 in 12.x), symbol versions (cudaMalloc@libcudart.so.12).
nvcc 13's own crt headers remain; for 11.8 its kernel stubs are told to use
cudaLaunchKernel (__NV_LEGACY_LAUNCH), as 11.8 has no __cudaLaunchKernel,
and an 11.8 header lacks cudaKernel_t, which nvcc 13's device_functions.h names
only outside that mode.
"""
from __future__ import annotations

import glob
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# version tag -> (pip requirement, soname of the runtime, CUDART_VERSION)
KITS = {
    "12.4": ("nvidia-cuda-runtime-cu12==12.4.127", "libcudart.so.12", 12040),
    "11.8": ("nvidia-cuda-runtime-cu11==11.8.89", "libcudart.so.11.0", 11080),
}


# checkout folders searched for carried wheels, in this order
CARRY_DIRS = (REPO / ".carry" / "oldcuda2", REPO / ".carry" / "oldcuda")


class KitUnavailable(Exception):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("GPUPROXY_OLDCUDA_CACHE") or Path.home() / ".cache" / "gpuproxy" / "oldcuda")


def _wheel_name(req: str) -> str:
    name, ver = req.split("==")
    return f"{name.replace('-', '_')}-{ver}-"


def _find_wheel(req: str) -> Path | None:
    stem = _wheel_name(req)
    for d in (*CARRY_DIRS, cache_dir()):
        hits = sorted(glob.glob(str(d / f"{stem}*.whl")))
        if hits:
            return Path(hits[0])
    return None


def _download(req: str) -> Path:
    d = cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    print(f"oldcuda: downloading {req} into {d}", file=sys.stderr)
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--platform", "manylinux2014_x86_64", "--implementation",
                        "cp", "-d", str(d), req], capture_output=True, text=True, timeout=300)
    w = _find_wheel(req)
    if r.returncode != 0 or w is None:
        raise KitUnavailable(f"cannot download {req}: {(r.stderr or r.stdout).strip()[-300:]}")
    return w


def kit(version: str) -> Path:
    """The unpacked wheel's nvidia/cuda_runtime folder (include/, lib/)."""
    req = KITS[version][0]
    w = _find_wheel(req) or _download(req)
    dest = cache_dir() / f"unpacked-{w.stem}"
    root = dest / "nvidia" / "cuda_runtime"
    if not (root / "lib" / KITS[version][1]).exists():
        tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
        with zipfile.ZipFile(w) as z:
            z.extractall(tmp)
        try:
            os.rename(tmp, dest)
        except OSError:         # another process unpacked it first
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)
    if not (root / "include" / "cuda_runtime_api.h").exists():
        raise KitUnavailable(f"{w} has no include/cuda_runtime_api.h")
    return root


def build(version: str, source: Path, out_dir: Path, nvcc: str | None = None, flags=(), extra_sources=()) -> Path:
    """source (.c: cc; .cu: nvcc 13, with `flags` and `extra_sources`) built
    against `version`'s headers and linked against its runtime (RUNPATH to
    the wheel's lib/). Cached by content in out_dir."""
    root = kit(version)
    soname = KITS[version][1]
    inc, lib = root / "include", root / "lib"
    h = hashlib.sha256(source.read_bytes() + version.encode() + str(root).encode()
                       + b"".join(Path(x).read_bytes() for x in extra_sources)
                       + repr(list(flags)).encode()).hexdigest()[:16]
    exe = out_dir / f"{source.stem}-cuda{version}-{h}"
    if exe.exists():
        return exe
    out_dir.mkdir(parents=True, exist_ok=True)
    link = [f"-L{lib}", f"-l:{soname}", f"-Wl,-rpath,{lib}"]
    if source.suffix == ".c":
        # crt/host_defines.h is not in the runtime wheel: the CUDA 13 toolkit's, as nvcc uses
        crt = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda") / "include"
        cmd = ["cc", "-O1", "-Wall", f"-I{inc}", f"-idirafter{crt}", str(source), "-o", str(exe) + ".tmp", *link]
    else:
        if nvcc is None:
            raise KitUnavailable("nvcc not found")
        cmd = [nvcc, "-cudart", "none", *flags, f"-I{inc}", str(source), *map(str, extra_sources),
               "-o", str(exe) + ".tmp",
               *[f"-Xlinker={a[4:]}" if a.startswith("-Wl,") else a for a in link]]
        if version.startswith("11."):
            cmd[1:1] = ["-D__NV_LEGACY_LAUNCH", "-Xcompiler", "-D__NV_LEGACY_LAUNCH"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"build failed: {' '.join(cmd)}\n{r.stderr[-3000:]}")
    os.rename(str(exe) + ".tmp", exe)
    return exe


def driver_attribute_numbers(version: str) -> dict[str, int]:
    """CU_DEVICE_ATTRIBUTE_* -> value, from that version's cuda.h."""
    import re
    text = (kit(version) / "include" / "cuda.h").read_text()
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"\bCU_DEVICE_ATTRIBUTE_(\w+)\s*=\s*(\d+)", text)}


# NVIDIA's Python bindings for CUDA 12 (cuda.bindings 12.9, which carries
# the CUDA 12.9 runtime linked in, and cuda.pathfinder, which it imports):
# the Python stack on CUDA 12 that tests/test_oldcuda.py runs under the proxy.
PY_CUDA12 = ("cuda-bindings==12.9.*", "cuda-pathfinder")


def python_site(reqs=PY_CUDA12) -> Path:
    """A folder (for PYTHONPATH) with `reqs` installed for this Python,
    from .carry/oldcuda or the cache folder, else downloaded there."""
    tag = hashlib.sha256(repr((reqs, sys.version_info[:2])).encode()).hexdigest()[:12]
    site = cache_dir() / f"site-{tag}"
    if (site / ".ok").exists():
        return site
    wheels = []
    for req in reqs:
        name = req.split("==")[0].replace("-", "_")
        found = sorted(sum((glob.glob(str(d / f"{name}-*.whl")) for d in CARRY_DIRS), [])
                       + glob.glob(str(cache_dir() / f"{name}-*.whl")))
        pyver = f"cp{sys.version_info[0]}{sys.version_info[1]}"
        found = [w for w in found if "-py3-none-" in w or f"-{pyver}-" in w]
        if not found:
            cache_dir().mkdir(parents=True, exist_ok=True)
            print(f"oldcuda: downloading {req} into {cache_dir()}", file=sys.stderr)
            r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                                "-d", str(cache_dir()), req], capture_output=True, text=True, timeout=300)
            found = [w for w in sorted(glob.glob(str(cache_dir() / f"{name}-*.whl")))
                     if "-py3-none-" in w or f"-{pyver}-" in w]
            if r.returncode != 0 or not found:
                raise KitUnavailable(f"cannot download {req}: {(r.stderr or r.stdout).strip()[-300:]}")
        wheels.append(found[-1])
    tmp = site.with_name(site.name + f".tmp{os.getpid()}")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                        str(tmp), *wheels], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise KitUnavailable(f"cannot install {wheels}: {r.stderr.strip()[-300:]}")
    (tmp / ".ok").write_text("\n".join(wheels) + "\n")
    try:
        os.rename(tmp, site)
    except OSError:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return site


def fetch_carry(dest: Path, python_version: str = "3.12") -> list[Path]:
    """Downloads every wheel the GPU check needs into `dest` (for the GPU
    machine, which has no network): the two runtime kits and the Python
    CUDA 12 stack for `python_version` (the GPU machine's python3.12)."""
    dest.mkdir(parents=True, exist_ok=True)
    import shutil
    # the library headers of CUDA 12 and 11 that tests/oldcuda/libs_major.c needs
    for cuda in ("12", "11"):
        reqs = lib_header_reqs(cuda)
        for api in ("cublas", "cufft", "curand", "cusparse", "cusolver"):
            inc = lib_include(reqs[api])
            stem = inc.parents[2].name
            if not (dest / "headers" / stem / ".ok").exists():
                shutil.copytree(inc.parents[2], dest / "headers" / stem, dirs_exist_ok=True)
    reqs = [k[0] for k in KITS.values()] + list(PY_CUDA12)
    for req in reqs:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "--python-version", python_version, "--platform", "manylinux2014_x86_64",
                            "--platform", "manylinux_2_28_x86_64", "--implementation", "cp", "-d", str(dest), req],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise KitUnavailable(f"cannot download {req}: {(r.stderr or r.stdout).strip()[-300:]}")
    return sorted(dest.glob("*.whl"))


# ------------------------------------------------------------ library headers
# NVIDIA's library wheels of each CUDA major (specs/abi/library_majors.yaml
# names the 11.x and 12.x ones; the 13 ones are those the specs were checked
# against: proxyd/backends/emu/versions.py). Only their include/ folders are
# kept (a few MB; the wheels are 50-420 MB each and are deleted once unpacked).
LIB13 = {"cublas": "nvidia-cublas==13.10.0.20", "cublaslt": "nvidia-cublas==13.10.0.20",
         "cusparse": "nvidia-cusparse==12.9.4.2", "cufft": "nvidia-cufft==12.5.0.14",
         "cusolver": "nvidia-cusolver==12.4.1.2", "curand": "nvidia-curand==10.4.5.25"}


def _lib_majors() -> list[dict]:
    import yaml
    return yaml.safe_load((REPO / "specs" / "abi" / "library_majors.yaml").read_text())["majors"]


def lib_header_reqs(cuda: str) -> dict[str, str]:
    """api -> the wheel with that CUDA major's headers ("11", "12" or "13")."""
    if cuda == "13":
        return dict(LIB13)
    return {m["api"]: m["headers"] for m in _lib_majors() if m["cuda"] == cuda}


def _header_dirs():
    return [d / "headers" for d in CARRY_DIRS] + [cache_dir() / "headers"]


def lib_include(req: str) -> Path:
    """The include/ folder of `req`'s wheel (carried, cached, else downloaded)."""
    stem = req.replace("==", "-").replace("-", "_")
    for d in _header_dirs():
        if (d / stem / ".ok").exists():
            hits = sorted((d / stem).glob("nvidia/*/include"))
            if hits:
                return hits[0]
    dest = cache_dir() / "headers" / stem
    tmp = cache_dir() / "headers" / f".{stem}.tmp{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    print(f"oldcuda: downloading {req} for its headers", file=sys.stderr)
    r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--platform", "manylinux2014_x86_64", "--platform",
                        "manylinux_2_27_x86_64", "--platform", "manylinux_2_28_x86_64", "--implementation", "cp",
                        "-d", str(tmp), req], capture_output=True, text=True, timeout=900)
    wheels = sorted(tmp.glob("*.whl"))
    if r.returncode != 0 or not wheels:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
        raise KitUnavailable(f"cannot download {req}: {(r.stderr or r.stdout).strip()[-300:]}")
    with zipfile.ZipFile(wheels[0]) as z:
        z.extractall(tmp, [n for n in z.namelist() if "/include/" in n and not n.endswith("/")])
    wheels[0].unlink()
    (tmp / ".ok").write_text(req + "\n")
    try:
        os.rename(tmp, dest)
    except OSError:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(dest.glob("nvidia/*/include"))[0]


def build_lib_program(version: str, source: Path, out_dir: Path, libs: list[str], lib_dir: Path,
                      cuda13_include: Path | None = None) -> Path:
    """A C program of NVIDIA's libraries built against `version`'s headers
    ("12.4", "11.8": the runtime kit and the library wheels of that major;
    "13": `cuda13_include`, the nvidia/cu13/include of NVIDIA's CUDA 13
    wheels) and linked against the sonames in `libs` found in `lib_dir`
    (the stand-ins; for 13 natively NVIDIA's own) and that version's runtime."""
    if version == "13":
        incs = [cuda13_include]
        lib64 = Path(os.environ.get('CUDA_HOME') or '/usr/local/cuda') / 'lib64'
        rt_link = [f"-L{lib64}", "-l:libcudart.so.13", f"-Wl,-rpath,{lib64}"]
    else:
        root = kit(version)
        major = version.split(".")[0]
        reqs = lib_header_reqs(major)
        apis = {"libcublas": "cublas", "libcufft": "cufft", "libcurand": "curand", "libcusparse": "cusparse",
                "libcusolver": "cusolver"}
        incs = [root / "include"] + [lib_include(reqs[apis[s.split(".so")[0]]]) for s in libs
                                     if s.split(".so")[0] in apis]
        rt_link = [f"-L{root / 'lib'}", f"-l:{KITS[version][1]}", f"-Wl,-rpath,{root / 'lib'}"]
    crt = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda") / "include"
    h = hashlib.sha256(source.read_bytes() + version.encode() + repr((incs, libs, str(lib_dir))).encode()
                       ).hexdigest()[:16]
    exe = out_dir / f"{source.stem}-cuda{version}-{h}"
    if exe.exists():
        return exe
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = ["cc", "-O1", "-Wall", "-Wno-deprecated-declarations", *[f"-I{i}" for i in incs], f"-idirafter{crt}", str(source),
           "-o", str(exe) + ".tmp", f"-L{lib_dir}", *[f"-l:{s}" for s in libs], f"-Wl,-rpath-link,{lib_dir}",
           # NVIDIA's 13 libraries natively by RUNPATH; the older majors' stand-ins
           # come from LD_PRELOAD (no NVIDIA library of that major exists here)
           *([f"-Wl,-rpath,{lib_dir}"] if version == "13" else []), *rt_link, "-lm"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"build failed: {' '.join(cmd)}\n{r.stderr[-3000:]}")
    os.rename(str(exe) + ".tmp", exe)
    return exe


# NVIDIA's CUDA samples that scripts/gpu-check --oldcuda builds against the
# 12.4 and 11.8 runtimes (github.com/NVIDIA/cuda-samples, the commit of the
# public-suite runs in docs/compatibility.md); none needs a data file.
SAMPLES_COMMIT = "c94ff366"
SAMPLES = ("vectorAdd", "matrixMul", "simpleStreams", "simpleCallback", "simpleCubemapTexture", "asyncAPI",
           "simpleTemplates", "simpleAtomicIntrinsics", "simpleVoteIntrinsics", "simpleZeroCopy", "simpleOccupancy",
           "clock", "simpleLayeredTexture", "simplePitchLinearTexture", "simpleMultiCopy", "simplePrintf")


def fetch_samples(src: str, dest: Path) -> str:
    """Those samples (0_Introduction) and Common/'s headers, exported from a
    clone of NVIDIA/cuda-samples (path) or its URL, into dest; the commit."""
    sys.path.insert(0, str(REPO / "scripts"))
    from fetch_test_suites import export
    ls = subprocess.run(["git", "-C", src, "ls-tree", "--name-only", SAMPLES_COMMIT, "Common/"], capture_output=True,
                        text=True) if Path(src).exists() else None
    common = [p for p in (ls.stdout.split() if ls and ls.returncode == 0 else []) if p.endswith((".h", ".cuh"))]
    commit = export(src, SAMPLES_COMMIT, (common or ["Common"]) + [f"Samples/0_Introduction/{s}" for s in SAMPLES],
                    dest)
    import shutil
    for s in SAMPLES:             # what the build does not read (editor settings, READMEs, pictures)
        for junk in (".vscode", "doc", "README.md"):
            p = dest / "Samples" / "0_Introduction" / s / junk
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return commit


def samples_dir() -> Path | None:
    for d in CARRY_DIRS:
        if (d / "cuda-samples" / "Common").is_dir():
            return d / "cuda-samples"
    return None


if __name__ == "__main__":
    # python3 tests/oldcuda_kit.py --carry .carry/oldcuda2: the wheels for the
    # GPU machine; without arguments: find (or fetch) the kits, print their folders
    if sys.argv[1:2] == ["--carry"]:
        dest = Path(sys.argv[2] if len(sys.argv) > 2 else REPO / ".carry" / "oldcuda2")
        for w in fetch_carry(dest):
            print(f"{w.stat().st_size >> 10:8d} KiB  {w}")
        if "--samples-from" in sys.argv:
            print("samples:", fetch_samples(sys.argv[sys.argv.index("--samples-from") + 1], dest / "cuda-samples"))
    else:
        for v in sys.argv[1:] or list(KITS):
            print(v, kit(v))
