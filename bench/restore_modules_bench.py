"""Module restore modes side by side (issue 23, target 4): the globals_table
program (tests/programs) dumped after its first step, restored into a fresh
proxyd once per GPUPROXY_RESTORE_MODULES mode (serial, parallel,
unordered), several times each; prints the restore's module figures and how
many __device__ variables moved, as JSON.

    python3 bench/restore_modules_bench.py [--backend emu|cuda] [--repeat N]

Figures only; nothing here is a pass/fail test (tests/test_globals_placement.py
is).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import corpus  # noqa: E402
from paced import PacedRun  # noqa: E402
from proxy import Daemon  # noqa: E402


def ctl(d, cmd, **args):
    from gpuproxy.proxyd.client import ControlClient
    return ControlClient(d.endpoint, timeout_s=600).call(cmd, args)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="emu")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    b = corpus.build(corpus.get_program("globals_table"), corpus.default_build_dir())
    kernels = [str(corpus.PROGRAMS_DIR / "globals_table_emu.py")] if a.backend == "emu" else []
    out = {"backend": a.backend, "modes": {}}
    tmp = Path(tempfile.mkdtemp(prefix="gpxmodbench-"))
    for mode in ("serial", "parallel", "unordered"):
        rows = []
        for i in range(a.repeat):
            env = dict(os.environ, GPUPROXY_RESTORE_MODULES=mode)
            d = Daemon(backend=a.backend, emu_kernels=kernels, env=env).start()
            try:
                with PacedRun(b, d) as run:
                    run.step_to(1)
                    img = tmp / f"{mode}-{i}"
                    ctl(d, "dump", pid=run.pid, dir=str(img))
                    d.kill()
                    d = Daemon(backend=a.backend, emu_kernels=kernels, env=env).start()
                    r = ctl(d, "restore", dir=str(img))
                    run.finish()
                rows.append({k: r.get(k) for k in ("modules_ms", "modules_prep_ms", "modules_load_ms",
                                                   "functions_ms", "contexts_modules_ms", "total_ms")}
                            | {"moved": len(r.get("moved_globals") or [])})
            finally:
                d.cleanup()
        out["modes"][mode] = {"runs": rows,
                              "median_modules_ms": statistics.median(x["modules_ms"] for x in rows),
                              "moved": [x["moved"] for x in rows]}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
