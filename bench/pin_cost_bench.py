"""What page-locking host memory costs (issue 13, target 2): bench/pin_cost.cu
run natively for $BENCH_PIN_GIB (default "1,8") with the machine's cores
(at most 16) as threads. Through bench/run_bench.py --suite pin."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent


def pin_suite(work: Path) -> dict:
    exe = work / "pin_cost"
    arch = os.environ.get("GPUPROXY_NVCC_ARCH", "sm_90")
    subprocess.run(["nvcc", "-cudart", "shared", f"-arch={arch}", "-O2", "-o", str(exe), str(HERE / "pin_cost.cu")],
                   check=True)
    threads = str(min(16, os.cpu_count() or 1))
    out = {"threads": int(threads), "sizes": {}}
    for gib in os.environ.get("BENCH_PIN_GIB", "1,8").split(","):
        r = subprocess.run([str(exe), gib, threads], capture_output=True, text=True, timeout=600)
        rows = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
        out["sizes"][gib] = {"rows": rows, "rc": r.returncode, "stderr": r.stderr[-1000:]}
    return out


def pin_table(res: dict) -> str:
    lines = ["| GiB | what | threads | seconds | GB/s | s per GiB | details |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    base = {"bench", "bytes", "seconds", "gbps", "threads"}
    for gib, r in res["sizes"].items():
        for x in r["rows"]:
            if "error" in x:
                lines.append(f"| {gib} | {x['bench']} | | error: {x['error']} | | | |")
                continue
            lines.append(f"| {gib} | {x['bench']} | {x['threads']} | {x['seconds']:.4f} | {x['gbps']:.2f} | "
                         f"{x['seconds'] / (x['bytes'] / 2**30):.4f} | "
                         f"{', '.join(f'{k} {v}' for k, v in x.items() if k not in base)} |")
        if r["rc"]:
            lines.append(f"| {gib} | failed ({r['rc']}): {r['stderr'][-200:]} | | | | | |")
    return "\n".join(lines)
