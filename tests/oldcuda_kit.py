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


def build(version: str, source: Path, out_dir: Path, nvcc: str | None = None, flags=()) -> Path:
    """source (.c: cc; .cu: nvcc 13, with `flags`) built against `version`'s
    headers and linked against its runtime (RUNPATH to the wheel's lib/).
    Cached by content in out_dir."""
    root = kit(version)
    soname = KITS[version][1]
    inc, lib = root / "include", root / "lib"
    h = hashlib.sha256(source.read_bytes() + version.encode() + str(root).encode()
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
        cmd = [nvcc, "-cudart", "none", *flags, f"-I{inc}", str(source), "-o", str(exe) + ".tmp",
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
    reqs = [k[0] for k in KITS.values()] + list(PY_CUDA12)
    for req in reqs:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "--python-version", python_version, "--platform", "manylinux2014_x86_64",
                            "--platform", "manylinux_2_28_x86_64", "--implementation", "cp", "-d", str(dest), req],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise KitUnavailable(f"cannot download {req}: {(r.stderr or r.stdout).strip()[-300:]}")
    return sorted(dest.glob("*.whl"))


if __name__ == "__main__":
    # python3 tests/oldcuda_kit.py --carry .carry/oldcuda2: the wheels for the
    # GPU machine; without arguments: find (or fetch) the kits, print their folders
    if sys.argv[1:2] == ["--carry"]:
        for w in fetch_carry(Path(sys.argv[2] if len(sys.argv) > 2 else REPO / ".carry" / "oldcuda2")):
            print(f"{w.stat().st_size >> 10:8d} KiB  {w}")
    else:
        for v in sys.argv[1:] or list(KITS):
            print(v, kit(v))
