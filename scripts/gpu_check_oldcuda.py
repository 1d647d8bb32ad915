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

The runtimes come from NVIDIA's wheels in .carry/oldcuda/ (no network on the
GPU machine): nvidia_cuda_runtime_cu12-12.4.127 and _cu11-11.8.89, and
cuda_bindings-12.9.* (cp312) with cuda_pathfinder for the Python check.
"""
from __future__ import annotations

import subprocess
import time
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


def oldcuda_check(log, out: Path) -> list[tuple[str, str]]:
    results = []
    nvcc = corpus.nvcc_path()
    bdir = corpus.default_build_dir() / "oldcuda"
    flags = [f"-arch={corpus.nvcc_arch()}", "-O2"]
    d = Daemon(backend="cuda", log_path=str(out / "proxyd-oldcuda.log")).start()
    try:
        for v in ("12.4", "11.8"):
            try:
                oldcuda_kit.kit(v)
            except oldcuda_kit.KitUnavailable as e:
                results.append((f"CUDA {v} runtime wheel", f"FAIL ({e})"))
                continue
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
        results += _python_bindings(log, d)
    finally:
        d.stop()
    results += _oldest_driver_mode(log, out)
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
