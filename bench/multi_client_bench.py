"""Many clients (issue 13, target 5): N = 1, 4, 8 processes each running a
launch-heavy loop, then a copy-heavy loop (bench/mc_loop.cu), natively and
under one proxyd, started together; aggregate throughput proxied / native.
Then latency under load: one client measures launch + synchronous 4-byte
copy round trips while N-1 others run the launch loop, against the same
client alone.

Run through bench/run_bench.py --suite clients. $BENCH_CLIENTS (default
"1,4,8"; "1,2" emulated), $BENCH_CLIENT_SECONDS (default 3; 0.3 emulated),
$BENCH_CLIENT_COPY_MB (default 64; 1 emulated). Timing is never pass/fail.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from proxy import Daemon

HERE = Path(__file__).resolve().parent


def build_loop(work: Path) -> Path:
    exe = work / "mc_loop"
    if not exe.exists():
        arch = os.environ.get("GPUPROXY_NVCC_ARCH", "sm_90")
        subprocess.run(["nvcc", "-cudart", "shared", f"-arch={arch}", "-O2", "-o", str(exe),
                        str(HERE / "mc_loop.cu")], check=True)
    return exe


def together(argvs: list[list[str]], env: dict, timeout: float = 300) -> list[dict]:
    """Starts the clients, waits until every one is set up, lets them all
    go at once, and returns their JSON results in order."""
    ps = [subprocess.Popen(a, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                           text=True, bufsize=1) for a in argvs]
    try:
        for p in ps:
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"client failed to start: {line!r} {p.stderr.read()[-1500:]}")
        for p in ps:
            p.stdin.write("go\n")
            p.stdin.flush()
        out = []
        for p in ps:
            o, e = p.communicate(timeout=timeout)
            if p.returncode != 0:
                raise RuntimeError(f"client failed ({p.returncode}): {e[-1500:]}")
            out.append(json.loads(o.strip().splitlines()[-1]))
        return out
    finally:
        for p in ps:
            if p.poll() is None:
                p.kill()
                p.wait()


def clients_suite(backend: str, work: Path) -> dict:
    exe = str(build_loop(work))
    emu = backend == "emu"
    counts = [int(x) for x in os.environ.get("BENCH_CLIENTS", "1,2" if emu else "1,4,8").split(",")]
    secs = os.environ.get("BENCH_CLIENT_SECONDS", "0.3" if emu else "3")
    mb = os.environ.get("BENCH_CLIENT_COPY_MB", "1" if emu else "64")
    res: dict = {"seconds": float(secs), "copy_mb": int(mb), "n": {}}
    runs = {"native": None} if not emu else {}
    runs["proxied"] = None
    for where in runs:
        d = None
        env = dict(os.environ)
        if where == "proxied":
            d = Daemon(backend=backend, emu_kernels=[str(HERE / "mc_loop_emu.py")] if emu else [])
            d.start()
            env = d.env_for_client()
        try:
            for n in counts:
                r = res["n"].setdefault(str(n), {})
                la = together([[exe, "launch", secs]] * n, env)
                co = together([[exe, "copy", secs, mb]] * n, env)
                lat = together([[exe, "sync", secs]] + [[exe, "launch", secs]] * (n - 1), env)
                r[where] = {"launch_per_s": round(sum(x["per_s"] for x in la), 1),
                            "launch_each": [x["per_s"] for x in la],
                            "copy_gbps": round(sum(x["gbps"] for x in co), 3),
                            "copy_each": [x["gbps"] for x in co],
                            "sync_p50_us": lat[0]["p50_us"], "sync_p99_us": lat[0]["p99_us"]}
        finally:
            if d is not None:
                d.cleanup()
    for n, r in res["n"].items():
        if r.get("native") and r.get("proxied"):
            r["launch_ratio"] = round(r["proxied"]["launch_per_s"] / r["native"]["launch_per_s"], 3)
            r["copy_ratio"] = round(r["proxied"]["copy_gbps"] / r["native"]["copy_gbps"], 3)
    return res


def clients_table(res: dict) -> str:
    lines = ["| clients | launches/s, all clients: native / proxied (ratio) | copy GB/s, all clients: native / "
             "proxied (ratio) | sync round trip of one client while the others launch, p50 / p99: native / "
             "proxied |", "| --- | --- | --- | --- |"]
    for n, r in res["n"].items():
        nat, pr = r.get("native") or {}, r["proxied"]
        lines.append(f"| {n} | {nat.get('launch_per_s', 'n/a')} / {pr['launch_per_s']} ({r.get('launch_ratio', 'n/a')}) "
                     f"| {nat.get('copy_gbps', 'n/a')} / {pr['copy_gbps']} ({r.get('copy_ratio', 'n/a')}) | "
                     f"{nat.get('sync_p50_us', 'n/a')} / {nat.get('sync_p99_us', 'n/a')} us; "
                     f"{pr['sync_p50_us']} / {pr['sync_p99_us']} us |")
    return "\n".join(lines)
