"""A broad public suite of CUDA programs natively and under the proxy
(issue 10's count): NVIDIA's cuda-samples (github.com/NVIDIA/cuda-samples),
not written by us, each built with `-cudart shared` as its CMakeLists.txt
says, skipping those that need what a headless machine or the proxy's
scope lacks (OpenGL/EGL/Vulkan windows, MPI, the math libraries, NVRTC,
multi-GPU-only programs are still built and report themselves).

    python scripts/public_suite.py build SAMPLES_CHECKOUT OUT   # here (nvcc, no GPU needed)
    python scripts/public_suite.py run OUT [--results FILE]     # on the GPU machine

NVIDIA's library samples (github.com/NVIDIA/CUDALibrarySamples: cuBLAS and
cuRAND, issue 26) are built the same way with `build-libs`, against the
headers of NVIDIA's wheels (nvidia-cublas, nvidia-curand: nvidia/cu13/include)
and linked with gpuproxy's stand-in libraries (same sonames and symbol
versions as NVIDIA's):

    python scripts/public_suite.py build-libs LIBSAMPLES_CHECKOUT OUT --lib-include DIR
    python scripts/public_suite.py run OUT [--results FILE]

Natively they load NVIDIA's libraries (`run` puts the folder of the wheels'
libraries, nvidia/cu13/lib of this Python or $GPUPROXY_NVIDIA_LIB_DIR, on
LD_LIBRARY_PATH); proxied, the stand-ins. Their outputs (the matrices and
random numbers they print) must be the same, line for line.

`build` writes OUT/<name>/<name> (plus the sample's data files) and
OUT/built.json (what was built, what was skipped and why). `run` runs every
program natively, then under the proxy (one proxyd with the cuda backend; a
worker per program), each in its own folder with a time limit, and counts a
proxied run as the same result when its exit status equals the native one
and, where the native output carries the sample's verdict (PASS/passed/
"Test passed"/"Result = PASS"), the proxied output carries the same verdict.
Programs that fail or are waived natively are reported apart (they say
nothing about the proxy). Timing never decides anything here.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GROUPS = ("0_Introduction", "1_Utilities", "2_Concepts_and_Techniques", "3_CUDA_Features", "6_Performance")
# libraries a sample may link besides the runtime and the driver: none of
# them is remoted yet (issue 12), so such samples are skipped, with the reason
ALLOWED_LIBS = {"CUDA::cudart", "CUDA::cuda_driver", "cuda", "cudart", "${CUDAToolkit_LIBRARY_DIR}", "dl",
                "pthread", "rt", "OpenMP::OpenMP_CXX"}
SKIP_WORDS = ("OpenGL", "GLUT", "EGL", "Vulkan", "X11", "MPI", "NVSCI", "cudla", "FreeImage", "GLEW")
VERDICT = re.compile(r"(Result\s*=\s*PASS|Test passed|PASSED|\bPASS\b|passed|Result = FAIL|FAILED|\bFAIL\b|"
                     r"[Ww]aiv)", re.M)


def parse_cmake(text: str) -> tuple[list[tuple[str, list[str]]], list[str], bool]:
    """(executables and their sources, linked libraries, separable compilation)."""
    text = re.sub(r"#.*", "", text)
    exes = []
    for m in re.finditer(r"add_executable\(\s*([\w.-]+)\s+([^)]*)\)", text):
        files = [f for f in m.group(2).split() if re.search(r"\.(cu|cpp|cc|c)$", f)]
        exes.append((m.group(1), files))
    libs = []
    for m in re.finditer(r"target_link_libraries\(\s*[\w.-]+\s+(?:PUBLIC|PRIVATE|INTERFACE)?([^)]*)\)", text):
        libs += [x for x in m.group(1).split() if x not in ("PUBLIC", "PRIVATE", "INTERFACE")]
    return exes, libs, "CUDA_SEPARABLE_COMPILATION ON" in text


def shim_lib_dir() -> str:
    """Where the driver library is linked from at build time: gpuproxy's own
    libcuda.so.1 (this machine has no driver); at run time the loader finds
    the driver's (native runs) or the shim's (under LD_PRELOAD)."""
    from gpuproxy.interceptor import lib_dir
    return str(lib_dir())


def build_one(sample: Path, common: Path, out: Path, arch: str) -> dict:
    cm = sample / "CMakeLists.txt"
    if not cm.exists():
        return {"sample": sample.name, "skipped": "no CMakeLists.txt"}
    text = cm.read_text(errors="replace")
    exes, libs, rdc = parse_cmake(text)
    bad_libs = sorted({x for x in libs if x not in ALLOWED_LIBS})
    if bad_libs:
        return {"sample": sample.name, "skipped": f"links {', '.join(bad_libs)}"}
    words = [w for w in SKIP_WORDS if re.search(rf"\b{w}\b", text, re.I)]
    if words:
        return {"sample": sample.name, "skipped": f"needs {', '.join(words)}"}
    if not exes:
        return {"sample": sample.name, "skipped": "no executable in CMakeLists.txt"}
    built = []
    for name, files in exes:
        dest = out / name
        dest.mkdir(parents=True, exist_ok=True)
        srcs = [str((sample / f).resolve()) for f in files]
        cmd = ["nvcc", "-cudart", "shared", "-L", shim_lib_dir(), f"-arch={arch}", "-O2", "-std=c++17", "--extended-lambda",
               "-Wno-deprecated-gpu-targets", "-I", str(common), "-I", str(sample), "-o", str(dest / name), *srcs,
               "-l:libcuda.so.1"]
        if rdc:
            cmd.insert(1, "-rdc=true")
        if "OpenMP" in text:
            cmd += ["-Xcompiler", "-fopenmp", "-lgomp"]
        cmd += ["-ldl", "-lpthread", "-lrt"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            shutil.rmtree(dest, ignore_errors=True)
            return {"sample": sample.name, "skipped": "does not build here: " + (r.stderr.strip().splitlines()
                                                                                    or ["?"])[-1][:200]}
        subprocess.run(["strip", str(dest / name)], capture_output=True)
        # data files the sample looks for next to itself (sdkFindFilePath)
        for d in ("data",):
            if (sample / d).is_dir():
                shutil.copytree(sample / d, dest / d, dirs_exist_ok=True)
        for f in sample.iterdir():       # kernels some samples load at run time (.ptx/.cubin sources)
            if f.suffix in (".ptx", ".fatbin", ".cubin", ".raw", ".ppm", ".pgm", ".bmp", ".dat", ".txt") \
                    and f.name != "CMakeLists.txt":
                shutil.copy(f, dest / f.name)
        built.append(name)
    return {"sample": sample.name, "built": built}


def build(src: Path, out: Path, arch: str, jobs: int) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    samples = [d for g in GROUPS for d in sorted((src / "Samples" / g).iterdir()) if d.is_dir()]
    with ThreadPoolExecutor(jobs) as ex:
        res = list(ex.map(lambda s: build_one(s, src / "Common", out, arch), samples))
    commit = ""
    if (src / "COMMIT").exists():            # an export of the repository (git archive or the like)
        commit = (src / "COMMIT").read_text().strip()
    elif (src / ".git").exists():
        commit = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    info = {"source": "https://github.com/NVIDIA/cuda-samples", "commit": commit, "arch": arch, "samples": res}
    (out / "built.json").write_text(json.dumps(info, indent=1))
    return info


# CUDALibrarySamples: group folders whose subfolders are one sample each, and
# the library each links (the stand-in's soname, also NVIDIA's)
LIB_GROUPS = {"cuBLAS/Level-1": "libcublas.so.13", "cuBLAS/Level-2": "libcublas.so.13",
              "cuBLAS/Level-3": "libcublas.so.13", "cuBLAS/Extensions": "libcublas.so.13",
              "cuRAND/Host": "libcurand.so.10"}


def build_lib_one(sample: Path, utils: Path, soname: str, include: str, out: Path, arch: str) -> dict:
    srcs = sorted(p for p in sample.iterdir() if p.is_file() and re.search(r"_example\.(cu|cpp)$", p.name))
    if not srcs:
        return {"sample": f"{sample.parent.name}/{sample.name}", "skipped": "no *_example source"}
    built, skipped = [], []
    for src in srcs:
        name = src.name.rsplit(".", 1)[0]
        dest = out / name
        dest.mkdir(parents=True, exist_ok=True)
        cmd = ["nvcc", "-cudart", "shared", f"-arch={arch}", "-O2", "-std=c++17", "-Wno-deprecated-gpu-targets",
               "-x", "cu", "-I", str(utils), "-I", include, "-o", str(dest / name), str(src),
               "-L", shim_lib_dir(), f"-l:{soname}", "-l:libcuda.so.1",
               # the stand-in's own references to the shim resolve at run time
               "-Xlinker", "--allow-shlib-undefined"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            shutil.rmtree(dest, ignore_errors=True)
            skipped.append(f"{name}: does not build here: " + (r.stderr.strip().splitlines() or ["?"])[-1][:200])
            continue
        subprocess.run(["strip", str(dest / name)], capture_output=True)
        built.append(name)
    rec = {"sample": f"{sample.parent.name}/{sample.name}", "built": built}
    if skipped:
        rec["skipped_programs"] = skipped
    return rec


def build_libs(src: Path, out: Path, arch: str, jobs: int, include: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    todo = []
    for group, soname in LIB_GROUPS.items():
        g = src / group
        if not g.is_dir():
            continue
        utils = g.parent / "utils" if (g.parent / "utils").is_dir() else g.parent.parent / "utils"
        todo += [(d, utils, soname) for d in sorted(g.iterdir()) if d.is_dir()]
    with ThreadPoolExecutor(jobs) as ex:
        res = list(ex.map(lambda t: build_lib_one(t[0], t[1], t[2], include, out, arch), todo))
    commit = ""
    if (src / ".git").exists():
        commit = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    info = {"source": "https://github.com/NVIDIA/CUDALibrarySamples", "commit": commit, "arch": arch,
            "samples": res, "compare_output": True, "native_lib_path": True}
    (out / "built.json").write_text(json.dumps(info, indent=1))
    return info


def nvidia_lib_dirs() -> list[str]:
    """Where NVIDIA's libraries are for the native runs of the library
    samples: $GPUPROXY_NVIDIA_LIB_DIR, then nvidia/cu13/lib of this Python
    (the wheels PyTorch and CuPy install)."""
    out = [d for d in os.environ.get("GPUPROXY_NVIDIA_LIB_DIR", "").split(os.pathsep) if d]
    for sp in sys.path:
        d = os.path.join(sp, "nvidia", "cu13", "lib")
        if os.path.isdir(d):
            out.append(d)
    return out


def verdict(text: str) -> str:
    hits = VERDICT.findall(text)
    if not hits:
        return ""
    h = hits[-1].lower()
    return "waived" if h.startswith("waiv") else ("fail" if "fail" in h else "pass")


def run_one(exe: Path, env: dict, timeout: float) -> dict:
    t0 = time.monotonic()
    try:
        r = subprocess.run([str(exe)], cwd=exe.parent, env=env, capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL, errors="replace")
        rc, out, err = r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        rc = "timeout"
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = ""
    return {"rc": rc, "verdict": verdict(out + err), "s": round(time.monotonic() - t0, 2),
            "tail": (out + err).strip().splitlines()[-3:], "stdout": out}


def run(bins: Path, results: Path | None, timeout: float, only: set[str] | None, jobs: int = 4) -> dict:
    sys.path.insert(0, str(ROOT / "tests"))
    from proxy import Daemon
    bins = bins.resolve()
    info = json.loads((bins / "built.json").read_text())
    names = [n for s in info["samples"] for n in s.get("built", [])]
    if only:
        names = [n for n in names if n in only]
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if info.get("native_lib_path"):
        # library samples: NVIDIA's libraries for the native runs (proxied,
        # the preloaded stand-ins of the same sonames are used first)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(nvidia_lib_dirs() + [p for p in env.get("LD_LIBRARY_PATH", "")
                                                                    .split(os.pathsep) if p])
    # several programs at a time (each proxied one has its own worker); the
    # results are compared per program, so the overlap changes none of them
    with ThreadPoolExecutor(jobs) as ex:
        native = dict(zip(names, ex.map(lambda n: run_one(bins / n / n, env, timeout), names)))
    with Daemon(backend="cuda") as d, ThreadPoolExecutor(jobs) as ex:
        penv = d.env_for_client({"LD_LIBRARY_PATH": env["LD_LIBRARY_PATH"]} if "LD_LIBRARY_PATH" in env else None)
        proxied = dict(zip(names, ex.map(lambda n: run_one(bins / n / n, penv, timeout), names)))
    same, differ, native_bad = [], [], []
    for n in names:
        a, b = native[n], proxied[n]
        ok_native = a["rc"] == 0 and a["verdict"] in ("pass", "")
        if not ok_native:
            native_bad.append(n)
            continue
        if a["rc"] == b["rc"] and a["verdict"] == b["verdict"] and \
                (not info.get("compare_output") or a["stdout"] == b["stdout"]):
            same.append(n)
        else:
            differ.append(n)
    res = {"source": info["source"], "commit": info["commit"], "programs": len(names),
           "pass_natively": len(names) - len(native_bad), "same_under_proxy": len(same),
           "differ_under_proxy": differ, "fail_or_waived_natively": native_bad,
           "skipped_at_build": {s["sample"]: s["skipped"] for s in info["samples"] if "skipped" in s},
           "native": native, "proxied": proxied}
    for rec in list(native.values()) + list(proxied.values()):
        rec.pop("stdout", None)     # compared above; the tails stay in the results
    if results:
        results.write_text(json.dumps(res, indent=1))
    print(f"{res['programs']} programs; {res['pass_natively']} pass natively; "
          f"{res['same_under_proxy']} of those give the same result under the proxy")
    for n in differ:
        print(f"DIFFER {n}: native {native[n]['rc']}/{native[n]['verdict']} proxied {proxied[n]['rc']}/"
              f"{proxied[n]['verdict']}: {' | '.join(proxied[n]['tail'])[:300]}")
    for n in native_bad:
        print(f"native-fail {n}: {native[n]['rc']}/{native[n]['verdict']}: {' | '.join(native[n]['tail'])[:200]}")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("src")
    b.add_argument("out")
    b.add_argument("--arch", default="sm_90")
    b.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    bl = sub.add_parser("build-libs", help="NVIDIA's cuBLAS and cuRAND samples (CUDALibrarySamples)")
    bl.add_argument("src")
    bl.add_argument("out")
    bl.add_argument("--lib-include", required=True, help="nvidia/cu13/include of the nvidia-cublas/-curand wheels")
    bl.add_argument("--arch", default="sm_90")
    bl.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    r = sub.add_parser("run")
    r.add_argument("bins")
    r.add_argument("--results")
    r.add_argument("--timeout", type=float, default=60)
    r.add_argument("--only", default="")
    r.add_argument("--jobs", type=int, default=4)
    a = ap.parse_args()
    if a.cmd == "build-libs":
        info = build_libs(Path(a.src), Path(a.out), a.arch, a.jobs, a.lib_include)
        n = sum(len(s.get("built", [])) for s in info["samples"])
        bad = [p for s in info["samples"] for p in s.get("skipped_programs", [])]
        print(f"built {n} programs; {len(bad)} did not build")
        for b_ in bad:
            print("  " + b_)
    elif a.cmd == "build":
        info = build(Path(a.src), Path(a.out), a.arch, a.jobs)
        n = sum(len(s.get("built", [])) for s in info["samples"])
        print(f"built {n} programs; skipped {sum(1 for s in info['samples'] if 'skipped' in s)} samples")
    else:
        res = run(Path(a.bins), Path(a.results) if a.results else None, a.timeout,
                  set(a.only.split(",")) if a.only else None, a.jobs)
        sys.exit(0 if not res["differ_under_proxy"] else 1)


if __name__ == "__main__":
    main()
