"""Round trips (issue 13, target 4): single synchronous calls natively and
under the proxy, min / median / p90 / p99 of each of several runs, and a
per-stage profile of the worker's part (proxyd/worker/rtprofile.py).

Run through bench/run_bench.py --suite roundtrip (add `rtprofile` to the
suite list for the stage profile). $BENCH_RT_RUNS (default 5) runs of
$BENCH_RT_ITERS (default 5000; 2000 emulated) samples per case, each run in
a fresh client process against one proxyd. Timing is never pass/fail.
"""
from __future__ import annotations

import glob
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from proxy import Daemon

HERE = Path(__file__).resolve().parent
CASES = [
    ("null_call", "one sync call, no GPU work (cudaDeviceGetAttribute)"),
    ("stream_query", "cudaStreamQuery, idle stream"),
    ("sync_copy", "launch + sync 4-byte D2H copy"),
    ("malloc_free", "cudaMalloc + cudaFree, 256 B"),
    ("malloc_launch_free", "cudaMalloc 256 B + kernel on it + cudaFree"),
]
# issue 13's targets (medians unless said)
TARGETS = {"null_call": "median <= 10 us", "sync_copy": "median <= 25 us, p99 <= 60 us",
           "malloc_free": "<= 2x native", "malloc_launch_free": "<= 2x native"}


def build(work: Path) -> Path:
    exe = work / "roundtrip"
    if not exe.exists():
        arch = os.environ.get("GPUPROXY_NVCC_ARCH", "sm_90")
        subprocess.run(["nvcc", "-cudart", "shared", f"-arch={arch}", "-O2", "-o", str(exe),
                        str(HERE / "roundtrip.cu")], check=True)
    return exe


def _run(argv, env) -> dict:
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    res = {}
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            if d.get("check", 1) != 1:
                raise RuntimeError(f"{d['bench']}: wrong result (check {d.get('check')}): {line}")
            res[d["bench"]] = d
    return res


def _combine(runs: list[dict]) -> dict:
    """Per case: every run's figures, and the median over runs of each."""
    out = {}
    for case, _ in CASES:
        rs = [r[case] for r in runs if case in r]
        if not rs:
            continue
        out[case] = {"runs": [{k: r[k] for k in ("min", "median", "p90", "p99", "max")} for r in rs]}
        for k in ("min", "median", "p90", "p99"):
            out[case][k] = round(statistics.median(r[k] for r in rs), 2)
        out[case]["median_spread"] = [min(r["median"] for r in rs), max(r["median"] for r in rs)]
    return out


def roundtrip_suite(backend: str, work: Path, env_extra: dict | None = None) -> dict:
    exe = build(work)
    runs = int(os.environ.get("BENCH_RT_RUNS", "5"))
    iters = os.environ.get("BENCH_RT_ITERS", "5000" if backend == "cuda" else "2000")
    env = dict(os.environ, **(env_extra or {}))
    native = None
    if backend == "cuda":
        native = _combine([_run([str(exe), iters], env) for _ in range(runs)])
    with Daemon(backend=backend, env=env,
                emu_kernels=[HERE / "roundtrip_emu.py"] if backend == "emu" else []) as d:
        proxied = _combine([_run([str(exe), iters], d.env_for_client(env)) for _ in range(runs)])
    return {"native": native, "proxied": proxied, "runs": runs, "iters": int(iters)}


def roundtrip_table(res: dict) -> str:
    lines = ["| what | native min / median / p99 | proxied min / median / p90 / p99 | medians of the runs | "
             "proxied / native (median) | target |",
             "| --- | --- | --- | --- | --- | --- |"]
    for case, label in CASES:
        p = res["proxied"].get(case)
        if not p:
            continue
        n = (res["native"] or {}).get(case)
        ns = f"{n['min']} / {n['median']} / {n['p99']} us" if n else "n/a"
        ratio = f"{p['median'] / n['median']:.1f}x" if n and n["median"] else "n/a"
        meds = ", ".join(f"{r['median']}" for r in p["runs"])
        lines.append(f"| {label} | {ns} | {p['min']} / {p['median']} / {p['p90']} / {p['p99']} us | {meds} | "
                     f"{ratio} | {TARGETS.get(case, '')} |")
    return "\n".join(lines)


STAGE_ORDER = ["gap", "handle", "handle_zmq", "chan_poll", "decode", "run_ops", "backend", "pack", "chan_reply"]


def profile_suite(backend: str, work: Path) -> dict:
    """Each case alone, in its own client, with the worker's stage timers on
    (GPUPROXY_RT_PROFILE): per case, the client's end-to-end figures and the
    worker's per-stage times."""
    exe = build(work)
    iters = os.environ.get("BENCH_RT_ITERS", "5000" if backend == "cuda" else "2000")
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case, _ in CASES:
            prefix = os.path.join(tmp, case)
            env = dict(os.environ, GPUPROXY_RT_PROFILE=prefix)
            with Daemon(backend=backend, env=env,
                        emu_kernels=[HERE / "roundtrip_emu.py"] if backend == "emu" else []) as d:
                e2e = _run([str(exe), iters, case], d.env_for_client(env))[case]
            files = glob.glob(prefix + ".*")
            if not files:
                raise RuntimeError(f"no stage profile written for {case} ({d.log()[-2000:]})")
            # the worker that served the client had the most calls
            stages = max((json.loads(Path(f).read_text()) for f in files),
                         key=lambda s: s.get("handle", {}).get("n", 0))
            out[case] = {"e2e": e2e, "stages": stages}
    return out


def profile_table(prof: dict) -> str:
    lines = ["| case | client round trip, median | " + " | ".join(STAGE_ORDER) + " |",
             "| --- | --- | " + " | ".join("---" for _ in STAGE_ORDER) + " |"]
    for case, _ in CASES:
        p = prof.get(case)
        if not p:
            continue
        cells = []
        for st in STAGE_ORDER:
            s = p["stages"].get(st) or {}
            if not s.get("n"):
                cells.append("-")
            else:
                # per round trip: several backend calls may make one message
                per = s["mean_us"] * s["n"] / max(p["stages"]["handle"]["n"], 1)
                cells.append(f"{s['median_us']} ({per:.1f})")
        lines.append(f"| {case} | {p['e2e']['median']} us | " + " | ".join(cells) + " |")
    return "\n".join(lines) + ("\n\nCells: median us per call of the stage (mean us per message). "
                               "gap = between two messages in the worker: the client's part and the wake-ups.")
