"""JAX natively and under gpuproxy, digest by digest (issue 26): step `jax` of
scripts/gpu_check_python.py.

scripts/pyframeworks/jax_check.py (JAX on the GPU with no CPU fallback, a
jit/grad training loop, matmul, FFT, random, solve/eigh, conv, sparse) runs
four times: natively and proxied, each with XLA's command buffers (CUDA
graphs, XLA's default) and without them (XLA_FLAGS=
--xla_gpu_enable_command_buffer=). The native and the proxied run of one
setting, and both settings, run at the same time (four processes, one GPU,
no preallocation).

Written to the output folder: jax-digests.json,
  {"command_buffers" | "no_command_buffers":
     {"checks": {check: {"native": ..., "proxied": ...}},
      "digests": {name: {"native": hex, "proxied": hex, "identical": bool}},
      "not_supported": [the proxied run's "not supported" lines]}}
and one result row per setting: PASS when every digest the native run
produced is bit-identical proxied, else FAIL naming the digests that differ.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "pyframeworks" / "jax_check.py"
SETTINGS = (("command_buffers", {}), ("no_command_buffers", {"XLA_FLAGS": "--xla_gpu_enable_command_buffer="}))


def _parse(stdout: str, stderr: str, rc) -> dict:
    try:
        return json.loads(stdout)
    except ValueError:
        tail = (stderr.strip().splitlines() or ["(no output)"])[-1][:300]
        return {"(script)": f"FAIL: rc={rc} {tail}"}


def run(log, out: Path, client_env, base_env: dict, limit_s: float | None = None) -> list[tuple[str, str]]:
    limit_s = limit_s or float(os.environ.get("GPUPROXY_JAX_CHECK_TIMEOUT_S", "150"))
    summary, results = {}, []
    # all four runs at once (16 cores, one GPU, no preallocation): the step stays within a minute or two
    procs = {}
    for label, extra in SETTINGS:
        for m, e in (("native", dict(base_env, **extra)), ("proxied", client_env(dict(base_env, **extra)))):
            # output to files, not pipes: JAX's warnings must never block a run on a full pipe
            fo, fe = open(out / f"jax-{label}-{m}.out", "w+"), open(out / f"jax-{label}-{m}.log", "w+")
            procs[label, m] = (subprocess.Popen([sys.executable, str(SCRIPT)], stdout=fo, stderr=fe, env=e), fo, fe)
    deadline = time.monotonic() + limit_s
    recs, errs = {}, {}
    for (label, m), (p, fo, fe) in procs.items():
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            fe.write(f"\n(ran out of time: {limit_s:g} s)\n")
        fo.seek(0), fe.seek(0)
        so, se = fo.read(), fe.read()
        fo.close(), fe.close()
        recs[label, m], errs[label, m] = _parse(so, se, p.returncode), se
    for label, _extra in SETTINGS:
        nat, prx = recs[label, "native"], recs[label, "proxied"]
        nd = nat.get("result digests") or {}
        pd = prx.get("result digests") or {}
        digests = {k: {"native": v, "proxied": pd.get(k), "identical": pd.get(k) == v} for k, v in nd.items()}
        checks = {k: {"native": v, "proxied": prx.get(k)} for k, v in nat.items() if k != "result digests"}
        unsupported = sorted({ln.strip()[:200] for ln in errs[label, "proxied"].splitlines() if "not supported" in ln})
        summary[label] = {"checks": checks, "digests": digests, "not_supported": unsupported}
        for k, v in digests.items():
            log(f"jax ({label}) {k}: native {v['native']} proxied {v['proxied']} "
                f"{'identical' if v['identical'] else 'DIFFER'}")
        for k, v in checks.items():
            if v["native"] != v["proxied"]:
                log(f"jax ({label}) check {k}: native {v['native']} | proxied {v['proxied']}")
        for ln in unsupported:
            log(f"jax ({label}) proxied: {ln}")
        differ = [k for k, v in digests.items() if not v["identical"]]
        if not digests:
            results.append((f"jax digests bit-identical ({label})", "FAIL (no digest natively)"))
        else:
            results.append((f"jax digests bit-identical ({label}, {len(digests)})",
                            "PASS" if not differ else f"FAIL ({', '.join(differ)})"))
    (out / "jax-digests.json").write_text(json.dumps(summary, indent=1))
    return results
