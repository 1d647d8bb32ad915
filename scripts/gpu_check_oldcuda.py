"""scripts/gpu-check --oldcuda: programs built for CUDA 12.4 and 11.8, natively
and under the proxy on the GPU, and the worker in its oldest-driver mode
(issue 24; docs/compatibility.md, "Programs built for CUDA 11 and 12").

- devprops (tests/oldcuda/devprops.c) built against each version's headers
  and runtime: native and proxied output must be identical.
- the corpus programs that build against that version's headers (those that
  link NVIDIA libraries or load separate cubins are left out): native must
  print the expected output, proxied exactly the native output.
- the CUDA 11.8 builds proxied by a worker forced into its CUDA 11.4 driver
  mode (GPUPROXY_DRIVER_VERSION_CAP=11040): programs that need a newer driver
  function must fail with not-supported, the others pass.

- NVIDIA's cuda.bindings 12.9 (Python; its CUDA 12.9 runtime linked in),
  natively and proxied: identical output.
- libs: tests/oldcuda/libs_major.c built against CUDA 12.4's (11.8's)
  cuBLAS/cuFFT/cuRAND/cuSPARSE/cuSOLVER headers and linked against the older
  sonames (libcublas.so.12, libcufft.so.11, libcurand.so.10, libcusparse.so.12,
  libcusolver.so.11; .11, .10, .10, .11, .11), proxied
  (the stand-ins of those majors); natively the same source built against
  CUDA 13 with NVIDIA's libraries (nvidia/cu13 of this Python): the outputs
  must be identical (NVIDIA's 12.x/11.x libraries, 300-700 MB, are not
  carried, so the native side is 13's).
- samples: NVIDIA's CUDA samples (tests/oldcuda_kit.py SAMPLES) built
  against each runtime, natively and proxied: same exit status and verdict.
- checkpoint: tests/test_oldcuda_checkpoint.py on the GPU (a 12.4 and an
  11.8 program dumped mid-run, GPU-only and the whole process with CRIU,
  output equal to the uninterrupted native run).

Steps: $GPUPROXY_OLDCUDA_STEPS (comma list of corpus, driver11, bindings,
libs, samples, checkpoint; default all). A compact summary goes to
$OUT/oldcuda-summary.json.

The runtimes come from NVIDIA's wheels in .carry/oldcuda/ (no network on the
GPU machine): nvidia_cuda_runtime_cu12-12.4.127 and _cu11-11.8.89, and
cuda_bindings-12.9.* (cp312) with cuda_pathfinder for the Python check
(or .carry/oldcuda2/, made by `python3 tests/oldcuda_kit.py --carry
.carry/oldcuda2 --samples-from <clone of NVIDIA/cuda-samples>`, which also
puts the 12.x/11.x library headers and the samples' sources there).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import corpus
import oldcuda_kit
from proxy import Daemon

HERE = Path(__file__).resolve().parents[1] / "tests"


def _run(argv, env=None, timeout=180):
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    return r.stdout, r.stderr, r.returncode


def _old_programs():
    return [p for p in corpus.load_corpus()
            if not p.link and not p.cubins and p.driver is None and not p.proxy_only]


STEPS = ("corpus", "driver11", "bindings", "libs", "samples", "checkpoint")


def _prebuild(log, versions, bdir, nvcc, flags):
    """Every corpus program for each version, in parallel (nvcc is slow; the
    loops below find them in the cache)."""
    jobs = [(v, p) for v in versions for p in _old_programs()]

    def one(job):
        v, p = job
        try:
            oldcuda_kit.build(v, p.source_path, bdir, nvcc=nvcc, flags=flags + list(p.compile_flags))
        except Exception:
            pass        # reported by the loop that needs it
    t = time.time()
    with ThreadPoolExecutor(max(2, min(16, os.cpu_count() or 2))) as ex:
        list(ex.map(one, jobs))
    log(f"prebuilt {len(jobs)} corpus builds in {time.time() - t:.1f} s")


def oldcuda_check(log, out: Path) -> list[tuple[str, str]]:
    steps = set((os.environ.get("GPUPROXY_OLDCUDA_STEPS") or ",".join(STEPS)).split(","))
    t0 = time.time()
    results, timing = [], {}
    nvcc = corpus.nvcc_path()
    bdir = corpus.default_build_dir() / "oldcuda"
    flags = [f"-arch={corpus.nvcc_arch()}", "-O2"]
    versions = []
    for v in ("12.4", "11.8"):
        try:
            oldcuda_kit.kit(v)
            versions.append(v)
        except oldcuda_kit.KitUnavailable as e:
            results.append((f"CUDA {v} runtime wheel", f"FAIL ({e})"))
    if steps & {"corpus", "driver11"}:
        _prebuild(log, versions, bdir, nvcc, flags)
    timing["prebuild"] = round(time.time() - t0, 1)
    d = Daemon(backend="cuda", log_path=str(out / "proxyd-oldcuda.log")).start()
    try:
        for v in (versions if "corpus" in steps else []):
            exe = oldcuda_kit.build(v, HERE / "oldcuda" / "devprops.c", bdir)
            no, ne, nrc = _run([str(exe)])
            po, pe, prc = _run([str(exe)], env=d.env_for_client())
            log(f"devprops {v} native rc={nrc}:\n{no}{ne}")
            ok = nrc == 0 and prc == 0 and po == no and pe == ""
            results.append((f"devprops CUDA {v}: proxied == native", "PASS" if ok else "FAIL"))
            if not ok:
                log(f"devprops {v} proxied rc={prc}:\n{po}{pe}")
            built, skipped = {}, []
            for p in _old_programs():
                try:
                    built[p.name] = (p, oldcuda_kit.build(v, p.source_path, bdir, nvcc=nvcc,
                                                          flags=flags + list(p.compile_flags)))
                except Exception as e:
                    skipped.append(p.name)
                    log(f"{p.name} does not build against CUDA {v}'s headers: {str(e).splitlines()[-1][:200]}")
            log(f"CUDA {v}: {len(built)} corpus programs built, not built: {', '.join(skipped) or 'none'}")
            for name, (p, exe) in built.items():
                t = time.time()
                no, ne, nrc = _run([str(exe), *p.args])
                ok = nrc == 0 and no == p.expected_output
                results.append((f"native {name} [CUDA {v}]", "PASS" if ok else "FAIL"))
                if not ok:
                    log(f"native {name} [CUDA {v}]: rc={nrc}\n{no[-1500:]}\n{ne[-1500:]}")
                po, pe, prc = _run([str(exe), *p.args], env=d.env_for_client())
                ok = prc == 0 and po == no and po == p.expected_output
                results.append((f"proxied {name} [CUDA {v}]", "PASS" if ok else "FAIL"))
                log(f"proxied {name} [CUDA {v}]: {'PASS' if ok else 'FAIL'} ({time.time() - t:.2f} s)")
                if not ok:
                    log(f"  rc={prc}\n--- stdout\n{po[-1500:]}\n--- stderr\n{pe[-3000:]}")
        timing["corpus"] = round(time.time() - t0 - timing["prebuild"], 1)
        for step, fn in (("bindings", lambda: _python_bindings(log, d)),
                         ("libs", lambda: _library_programs(log, d, versions)),
                         ("samples", lambda: _samples(log, d, versions, flags))):
            if step in steps:
                t = time.time()
                results += fn()
                timing[step] = round(time.time() - t, 1)
    finally:
        d.stop()
    if "driver11" in steps and "11.8" in versions:
        t = time.time()
        results += _oldest_driver_mode(log, out)
        timing["driver11"] = round(time.time() - t, 1)
    if "checkpoint" in steps:
        t = time.time()
        results += _checkpoints(log, out)
        timing["checkpoint"] = round(time.time() - t, 1)
    timing["total"] = round(time.time() - t0, 1)
    bad = [r for r in results if not r[1].startswith(("PASS", "SKIP"))]
    (out / "oldcuda-summary.json").write_text(json.dumps(
        {"passed": sum(r[1].startswith("PASS") for r in results), "skipped": sum(r[1].startswith("SKIP") for r in results),
         "failed": [f"{a}: {b}" for a, b in bad], "seconds": timing}, indent=1))
    log(f"oldcuda: {timing}")
    return results


def _cuda13_wheels():
    """nvidia/cu13/{include,lib} of this Python (NVIDIA's CUDA 13 wheels, as
    PyTorch cu130 installs them), or (None, None)."""
    for sp in sys.path:
        base = Path(sp or ".") / "nvidia" / "cu13"
        if (base / "include" / "cublas_v2.h").exists() and (base / "lib" / "libcublas.so.13").exists():
            return base / "include", base / "lib"
    return None, None


def _library_programs(log, d, versions) -> list[tuple[str, str]]:
    """tests/oldcuda/libs_major.c of the older majors proxied, against its
    CUDA 13 build run natively with NVIDIA's libraries: identical output."""
    from gpuproxy import interceptor
    src = HERE / "oldcuda" / "libs_major.c"
    bdir = corpus.default_build_dir() / "oldcuda" / "libs"
    results, native = [], None
    inc13, lib13 = _cuda13_wheels()
    if inc13 is None:
        results.append(("libs_major native [CUDA 13, NVIDIA's libraries]",
                        "SKIP (no nvidia/cu13 cuBLAS headers and libraries in this Python)"))
    else:
        try:
            exe = oldcuda_kit.build_lib_program("13", src, bdir, ["libcublas.so.13", "libcufft.so.12",
                                                                  "libcurand.so.10", "libcusparse.so.12",
                                                                  "libcusolver.so.12"], lib13, cuda13_include=inc13)
            no, ne, nrc = _run([str(exe)])
            ok = nrc == 0 and no.endswith("PASSED\n")
            native = no if ok else None
            results.append(("libs_major native [CUDA 13, NVIDIA's libraries]", "PASS" if ok else "FAIL"))
            log(f"libs_major native rc={nrc}:\n{no[-3000:]}{ne[-1500:]}")
        except Exception as e:
            results.append(("libs_major native [CUDA 13, NVIDIA's libraries]", f"FAIL (build: {str(e)[-300:]})"))
    majors = {"12.4": ["libcublas.so.12", "libcufft.so.11", "libcurand.so.10", "libcusparse.so.12", "libcusolver.so.11"],
              "11.8": ["libcublas.so.11", "libcufft.so.10", "libcurand.so.10", "libcusparse.so.11", "libcusolver.so.11"]}
    for v in versions:
        what = f"libs_major [CUDA {v}: {', '.join(majors[v])}] proxied == native 13"
        try:
            exe = oldcuda_kit.build_lib_program(v, src, bdir, majors[v], Path(interceptor.lib_dir()))
        except Exception as e:
            results.append((what, f"FAIL (build: {str(e)[-300:]})"))
            continue
        po, pe, prc = _run([str(exe)], env=d.env_for_client())
        ok = prc == 0 and po.endswith("PASSED\n") and pe == "" and (native is None or po == native)
        verdict = "PASS" if ok else "FAIL"
        if ok and native is None:
            verdict = "PASS (own host references only: no native run to compare)"
        results.append((what, verdict))
        if not ok:
            log(f"libs_major {v} proxied rc={prc}:\n{po[-3000:]}\n--- stderr\n{pe[-2000:]}")
    return results


def _samples(log, d, versions, flags) -> list[tuple[str, str]]:
    """NVIDIA's samples built against 12.4 and 11.8 (shared runtime of that
    version), natively and proxied: the same exit status and verdict line."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from public_suite import verdict
    src = oldcuda_kit.samples_dir()
    if src is None:
        return [("CUDA samples for 12.4/11.8", "FAIL (no .carry/oldcuda2/cuda-samples: see the module doc)")]
    bdir = corpus.default_build_dir() / "oldcuda" / "samples"
    nvcc = corpus.nvcc_path()
    jobs = [(v, s) for v in versions for s in oldcuda_kit.SAMPLES]

    def build(job):
        v, name = job
        sd = src / "Samples" / "0_Introduction" / name
        main = sd / f"{name}.cu"
        extra = [p for p in sorted(sd.iterdir()) if p.suffix in (".cu", ".cpp") and p != main]
        try:
            return oldcuda_kit.build(v, main, bdir, nvcc=nvcc, extra_sources=extra,
                                     flags=flags + ["-std=c++17", f"-I{src / 'Common'}", f"-I{sd}",
                                                    "-Wno-deprecated-gpu-targets"]), ""
        except Exception as e:
            return None, str(e).strip().splitlines()[-1][:200]
    with ThreadPoolExecutor(max(2, min(16, os.cpu_count() or 2))) as ex:
        built = dict(zip(jobs, ex.map(build, jobs)))
    results = []
    for (v, name), (exe, why) in built.items():
        if exe is None:
            log(f"sample {name} does not build against CUDA {v}: {why}")
            results.append((f"sample {name} [CUDA {v}]", f"SKIP (does not build against {v}'s headers here)"))
            continue
        n = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, cwd=exe.parent,
                           stdin=subprocess.DEVNULL, errors="replace")
        p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120, cwd=exe.parent,
                           env=d.env_for_client(), stdin=subprocess.DEVNULL, errors="replace")
        nv, pv = verdict(n.stdout + n.stderr), verdict(p.stdout + p.stderr)
        ok = n.returncode == p.returncode and nv == pv
        native_ok = n.returncode == 0 and nv in ("pass", "")
        results.append((f"sample {name} [CUDA {v}] proxied == native (rc {n.returncode}, {nv or 'no verdict'})",
                        "PASS" if ok and native_ok else "FAIL"))
        if not (ok and native_ok):
            log(f"sample {name} [{v}]: native rc={n.returncode} {nv}: {n.stdout[-800:]}{n.stderr[-500:]}\n"
                f"  proxied rc={p.returncode} {pv}: {p.stdout[-800:]}{p.stderr[-1500:]}")
    return results


def _checkpoints(log, out: Path) -> list[tuple[str, str]]:
    """tests/test_oldcuda_checkpoint.py on the GPU: each test's outcome."""
    import xml.etree.ElementTree as ET
    xml = out / "oldcuda-checkpoint.xml"
    env = dict(os.environ, GPUPROXY_TEST_GPU="1", GPUPROXY_TEST_BACKEND="cuda")
    logf = out / "oldcuda-checkpoint.log"
    # written as it runs (-v, durations): a run stopped by a time limit still
    # shows which tests finished and how long each took
    with open(logf, "w") as f:
        r = subprocess.run([sys.executable, "-m", "pytest", "-v", "--durations=0", "-p", "no:cacheprovider",
                            f"--junitxml={xml}", str(HERE / "test_oldcuda_checkpoint.py")],
                           stdout=f, stderr=subprocess.STDOUT, env=env, cwd=HERE.parent, timeout=900)
    log(logf.read_text()[-3000:])
    results = []
    try:
        for tc in ET.parse(xml).getroot().iter("testcase"):
            kids = {c.tag for c in tc}
            res = "FAIL" if kids & {"failure", "error"} else ("SKIP" if "skipped" in kids else "PASS")
            if res == "SKIP":
                res += f" ({next(c for c in tc if c.tag == 'skipped').get('message', '')[:200]})"
            results.append((f"checkpoint {tc.get('name')}", res))
    except (OSError, ET.ParseError) as e:
        results.append(("checkpoint tests", f"FAIL (no results: {e}; rc {r.returncode})"))
    return results


def _python_bindings(log, d) -> list[tuple[str, str]]:
    """NVIDIA's cuda.bindings 12.9 (CUDA 12.9 runtime inside), natively and
    proxied: identical output (tests/oldcuda/bindings12.py)."""
    import os
    import sys
    try:
        site = oldcuda_kit.python_site()
    except oldcuda_kit.KitUnavailable as e:
        return [("cuda.bindings 12 wheels", f"FAIL ({e})")]
    env = dict(os.environ, PYTHONPATH=f"{site}:{os.environ.get('PYTHONPATH', '')}")
    argv = [sys.executable, str(HERE / "oldcuda" / "bindings12.py")]
    no, ne, nrc = _run(argv, env=env)
    penv = d.env_for_client()
    penv["PYTHONPATH"] = env["PYTHONPATH"]
    po, pe, prc = _run(argv, env=penv)
    log(f"cuda.bindings 12 native rc={nrc}:\n{no}{ne[-1500:]}")
    ok = nrc == 0 and prc == 0 and po == no and pe == ""
    if not ok:
        log(f"cuda.bindings 12 proxied rc={prc}:\n{po}{pe[-3000:]}")
    return [("cuda.bindings 12.9: proxied == native", "PASS" if ok else "FAIL")]


def _oldest_driver_mode(log, out: Path) -> list[tuple[str, str]]:
    """The CUDA 11.8 builds proxied by a worker that acts as on a CUDA 11.4
    driver (R470): it is told 11040 and the application too (NVIDIA's 11.8
    runtime runs on an 11.4 driver natively, by CUDA's minor-version
    compatibility). Each program must print what it prints natively, or,
    where it needs a driver function newer than 11.4, fail saying
    not-supported (the worker's log names the function)."""
    import os
    env = dict(os.environ, GPUPROXY_DRIVER_VERSION_CAP="11040")
    nvcc = corpus.nvcc_path()
    bdir = corpus.default_build_dir() / "oldcuda"
    flags = [f"-arch={corpus.nvcc_arch()}", "-O2"]
    results = []
    d = Daemon(backend="cuda", env=env, log_path=str(out / "proxyd-driver-11040.log")).start()
    try:
        for p in _old_programs():
            try:
                exe = oldcuda_kit.build("11.8", p.source_path, bdir, nvcc=nvcc, flags=flags + list(p.compile_flags))
            except Exception:
                continue
            o, e, rc = _run([str(exe), *p.args], env=d.env_for_client())
            ok = rc == 0 and o == p.expected_output
            verdict = "PASS" if ok else ("PASS (not supported on 11.4, as designed)"
                                         if "not supported" in e or "NotSupported" in e else "FAIL")
            results.append((f"proxied {p.name} [CUDA 11.8, worker as on a CUDA 11.4 driver]", verdict))
            if not ok:
                log(f"driver 11040 {p.name}: rc={rc}\n{o[-800:]}\n{e[-1500:]}")
        exe = oldcuda_kit.build("11.8", HERE / "oldcuda" / "devprops.c", bdir)
        o, e, rc = _run([str(exe)], env=d.env_for_client())
        results.append(("devprops CUDA 11.8 [worker as on 11.4]: runs", "PASS" if rc == 0 else "FAIL"))
        log(f"devprops 11.8 with the worker as on 11.4: rc={rc}\n{o}{e}")
    finally:
        d.stop()
    log("worker lines about newer functions:\n" + "\n".join(
        l for l in Path(out / "proxyd-driver-11040.log").read_text().splitlines() if "needs a CUDA" in l))
    return results
