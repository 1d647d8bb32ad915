"""The multi-GPU part of the GPU check (``scripts/gpu-check --multigpu``, or
alone: ``python3 scripts/gpu_check_multigpu.py --out DIR [--torch-python PY]``).
Needs two or more GPUs; with fewer every step reports SKIP with the reason.

1. the GPU-marked multi-GPU tests on the cuda backend: tests/test_peer.py
   (two-device checkpoint restored with --device-map onto other GPUs, VMM
   over two devices), tests/test_multidevice.py, and the corpus program
   peer_copy with its checkpoints (tests/test_corpus_checkpoint.py);
2. examples/multigpu_torch.py --mode peer (``x.to('cuda:1')``, copies on a
   stream, a model split over two GPUs) natively and proxied: identical
   output;
3. examples/multigpu_torch.py --mode ddp under ``torchrun
   --nproc_per_node=2`` and, with 4 GPUs, 4 (DDP over NCCL) natively and
   proxied: identical
   output; proxyd runs with GPUPROXY_SESSION_PRIMARY=1 (NCCL in the workers,
   docs/multigpu.md);
4. (fsdp) examples/multigpu_torch.py --mode fsdp (FSDP2) on all visible GPUs,
   natively and proxied: identical losses and parameter checksums;
5. (ckpt) the DDP run on all visible GPUs, proxied, checkpointed in the
   middle as one consistent cut of every rank (`proxy-cli dump --job
   TORCHRUN_PID --gpu-only`), proxyd killed and started again, every rank
   restored and its communicators made again (`proxy-cli restore`): the
   printed losses equal the native run's;
6. (bench) all_reduce bus bandwidth 1 MiB .. 1 GiB and a DDP step of a
   GPT-style model, natively and proxied on all visible GPUs, into
   DIR/multigpu-bench.json (proxied/native ratios included).
Steps: STEPS below (gpu-check --multigpu-steps).

NCCL_NVLS_ENABLE=0 is set for everything started here (no NVLink
multicast on the shared GPU machines). Results go to DIR/multigpu.json and
DIR/multigpu-*.log.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from proxy import Daemon  # noqa: E402

EXAMPLE = ROOT / "examples" / "multigpu_torch.py"


def _gpus() -> int:
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    except OSError:
        return 0          # no driver tools: no GPU
    return sum(1 for line in r.stdout.splitlines() if line.startswith("GPU "))


def _env(extra: dict | None = None) -> dict:
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    env.pop("LD_PRELOAD", None)
    env.update(extra or {})
    return env


def _run(cmd, env, log_path: Path, timeout=600):
    t = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as e:
        # a hang is a failure with what it printed, never a stuck check
        r = subprocess.CompletedProcess(cmd, 124, (e.stdout or b"").decode(errors="replace") if isinstance(
            e.stdout, bytes) else (e.stdout or ""), f"timed out after {timeout} s")
    log_path.write_text(f"$ {' '.join(map(str, cmd))}\nrc={r.returncode} ({time.time() - t:.1f} s)\n"
                        f"--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}")
    return r


STEPS = ("pytest", "peer", "ddp", "fsdp", "ckpt", "fsdpckpt", "wpckpt", "bench")
# GiB each rank of the checkpointed jobs keeps on its GPU (ckpt, fsdpckpt,
# wpckpt): issue 22 asks for the figures of a job holding >= 10 GiB per GPU
HOLD_GIB = float(os.environ.get("GPUPROXY_MGPU_HOLD_GIB", "0"))
CLI = [sys.executable, "-m", "gpuproxy.cli"]


def _torchrun(py: str, nproc: int, *args) -> list:
    return [py, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(EXAMPLE), *args]


def _proxyd(out: Path, name: str, endpoint: str | None = None, env: dict | None = None) -> Daemon:
    # NCCL in the workers: sessions on the devices' primary contexts (docs/multigpu.md)
    return Daemon(backend="cuda", endpoint=endpoint, log_path=str(out / f"multigpu-proxyd-{name}.log"),
                  env={**os.environ, "GPUPROXY_SESSION_PRIMARY": "1", **(env or {})}).start()


def fsdp_step(log, out: Path, py: str, n: int) -> tuple[str, str]:
    tr = _torchrun(py, n, "--mode", "fsdp", "--steps", "6")
    nat = _run(tr, _env(), out / f"multigpu-fsdp{n}-native.log", timeout=300)
    d = _proxyd(out, f"fsdp{n}")
    try:
        prx = _run(tr, d.env_for_client({"NCCL_NVLS_ENABLE": "0"}), out / f"multigpu-fsdp{n}-proxied.log",
                   timeout=300)
    finally:
        d.stop()
    ok = nat.returncode == 0 and prx.returncode == 0 and nat.stdout == prx.stdout and "fsdp done" in nat.stdout
    log(f"torch fsdp {n}: native rc={nat.returncode} proxied rc={prx.returncode} same={nat.stdout == prx.stdout}")
    return (f"torchrun FSDP2 {n} GPUs, proxied == native",
            "PASS" if ok else f"FAIL (native rc={nat.returncode}, proxied rc={prx.returncode})")


def _img_root(hold_gib: float, n: int) -> str | None:
    """Where the image of a job of n ranks goes: /dev/shm when each holds
    GiBs and it has room for all of them (twice: the whole-process form's
    CRIU part is beside it), else the default temporary folder."""
    if hold_gib:
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize > 2.2 * hold_gib * (1 << 30) * n:
            return "/dev/shm"
    return None


def ckpt_step(log, out: Path, py: str, n: int, summary: dict, mode: str = "ddp", hold_gib: float = 0.0,
              whole: bool = False) -> tuple[str, str]:
    """`mode` (ddp, fsdp) on n GPUs, proxied, with a consistent checkpoint of
    all ranks, the ranks' tree gone (whole: CRIU dumped it) or waiting (GPU
    only), a daemon restart and a restore in the middle; the printed losses
    (and the held memory's sums) == an uninterrupted native run's."""
    import shutil
    import tempfile
    import threading
    steps, gate_step = 12, 8
    extra = ["--hold-gib", str(hold_gib)] if hold_gib else []
    tag = f"{mode}{n}{'-wp' if whole else ''}{f'-hold{hold_gib:g}' if hold_gib else ''}"
    nat = _run(_torchrun(py, n, "--mode", mode, "--steps", str(steps), *extra), _env(),
               out / f"multigpu-ckpt-{tag}-native.log", timeout=300)
    tmp = Path(tempfile.mkdtemp(prefix="gpuproxy-mgpu-"))
    img_dir = Path(tempfile.mkdtemp(prefix="gpuproxy-mgpu-img-", dir=_img_root(hold_gib, n)))
    gate, img, ep = tmp / "gate", img_dir / "job", f"ipc://{tmp}/proxyd.sock"
    d = _proxyd(out, f"ckpt-{tag}", ep)
    held = f", {hold_gib:g} GiB held per GPU" if hold_gib else ""
    what = (f"torchrun {mode.upper()} {n} GPUs{held}: consistent {'whole-process' if whole else 'GPU-only'} "
            f"checkpoint + proxyd restart + restore mid-run == native")
    # the ProcessGroupNCCL watchdog's heartbeat would end a rank whose calls
    # wait for the restore (minutes at most here); NCCL's own timeouts stay.
    # (The rendezvous store's libuv ring, which CRIU cannot dump, is kept out
    # by the shim: interceptor/io_uring_off.c; UV_USE_IO_URING=0 did not.)
    env = d.env_for_client({"NCCL_NVLS_ENABLE": "0", "TORCH_NCCL_ENABLE_MONITORING": "0"})
    argv = _torchrun(py, n, "--mode", mode, "--steps", str(steps), "--pace-s", "0.3", "--gate", str(gate),
                     "--gate-step", str(gate_step), *extra)
    # whole: the job's streams are files (CRIU restores them at their
    # offsets; a pipe to this script would not reach the restored tree) and
    # the job is a session of its own (CRIU dumps it without --shell-job)
    fo, fe = tmp / "job.out", tmp / "job.err"
    lines, err = [], []
    if whole:
        with open(fo, "w") as a, open(fe, "w") as b:
            p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=a, stderr=b, cwd=ROOT,
                                 start_new_session=True)
    else:
        p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        threading.Thread(target=lambda: err.extend(p.stderr), daemon=True).start()
    logf = out / f"multigpu-ckpt-{tag}-proxied.log"
    root = p.pid
    cli_env = dict(os.environ)
    cli_env.pop("LD_PRELOAD", None)

    def cli(*args, timeout=300):
        r = subprocess.run(CLI + ["--endpoint", ep, *args, "--json"], capture_output=True, text=True,
                           timeout=timeout, env=cli_env)
        if r.returncode != 0:
            raise RuntimeError(f"{args[0]}: {(r.stderr or r.stdout).strip()[-500:]}")
        return json.loads(r.stdout)

    def out_text() -> str:
        return fo.read_text(errors="replace") if whole else "".join(lines)

    try:
        t0 = time.time()
        while True:
            if whole:
                if any(x.startswith("step 3 ") for x in out_text().splitlines()):
                    break
                if p.poll() is not None:
                    raise RuntimeError("the job ended before step 3")
                time.sleep(0.05)
            else:
                line = p.stdout.readline()
                if not line:
                    raise RuntimeError("the job ended before step 3")
                lines.append(line)
                if line.startswith("step 3 "):
                    break
            if time.time() - t0 > 240:
                raise RuntimeError("no step 3 within 240 s")
        td = time.monotonic()
        dump = cli("dump", "--job", str(root), "--dir", str(img), *([] if whole else ["--gpu-only"]))
        dump_wall = (time.monotonic() - td) * 1000
        if whole:
            p.wait(timeout=60)          # CRIU ended the tree
            t = time.time()
            while any(os.path.exists(f"/proc/{q}") for q in dump["criu"]["pids"]):
                if time.time() - t > 60:
                    raise RuntimeError(f"pids {dump['criu']['pids']} still there after the dump")
                time.sleep(0.05)
        d.kill()
        d = _proxyd(out, f"ckpt-{tag}-after", ep)
        td = time.monotonic()
        rest = cli("restore", "--dir", str(img))
        restore_wall = (time.monotonic() - td) * 1000
        gate.touch()
        if whole:
            t = time.time()
            while os.path.exists(f"/proc/{root}") and time.time() - t < 300:
                time.sleep(0.1)
            rc = 0 if f"{mode} done" in out_text() else 1
        else:
            rest_out, _ = p.communicate(timeout=300)
            lines.append(rest_out)
            rc = p.returncode
        summary.setdefault("ckpt", []).append({
            "what": tag, "gpus": n, "mode": mode, "whole_process": whole, "hold_gib_per_gpu": hold_gib,
            "image_on": str(img_dir.parent), "dump_cli_ms": round(dump_wall, 1),
            "restore_cli_ms": round(restore_wall, 1), "dump": {k: dump.get(k) for k in (
                "hold_ms", "dump_ms", "stall_ms", "app_stopped_ms", "ranks_app_stopped_ms", "stall_from", "bytes",
                "stages_ms")},
            "dump_criu_ms": (dump.get("criu") or {}).get("ms") if whole else None,
            "restore": {k: rest.get(k) for k in ("restore_ms", "comm_ms", "criu_ms", "gpu_ms", "wall_ms")}})
        ok = nat.returncode == 0 and rc == 0 and out_text() == nat.stdout
        res = "PASS" if ok else f"FAIL (native rc={nat.returncode}, proxied rc={rc}, same={out_text() == nat.stdout})"
    except Exception as e:
        res = f"FAIL ({e})"
    finally:
        gate.touch()
        if p.poll() is None:
            p.kill()
        p.wait()
        try:
            os.killpg(root, 9) if whole else None
        except OSError:
            pass
        d.stop()
        errs = fe.read_text(errors="replace") if whole and fe.exists() else "".join(err)
        logf.write_text("--- stdout\n" + out_text() + "\n--- native stdout\n" + nat.stdout +
                        "\n--- stderr\n" + errs[-20000:])
        shutil.rmtree(img_dir, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"{what}: {res}")
    return (what, res)


def bench_step(log, out: Path, py: str, n: int, summary: dict) -> tuple[str, str]:
    """all_reduce bus bandwidth and the DDP step, natively and proxied; then
    the DDP step again proxied with the shim's call profile and the workers'
    cProfile (where the proxied step's time goes; its step time is not the
    figure), and natively once more (the native spread between two runs)."""
    tr = _torchrun(py, n, "--mode", "bench", "--steps", "30")
    nat = _run(tr, _env(), out / f"multigpu-bench{n}-native.log", timeout=300)
    d = _proxyd(out, f"bench{n}")
    try:
        prx = _run(tr, d.env_for_client({"NCCL_NVLS_ENABLE": "0"}), out / f"multigpu-bench{n}-proxied.log",
                   timeout=300)
    finally:
        d.stop()
    prof_dir = out / f"multigpu-bench{n}-profile"
    prof_dir.mkdir(exist_ok=True)
    ddp_only = _torchrun(py, n, "--mode", "bench", "--steps", "30", "--bench-parts", "ddp")
    d = _proxyd(out, f"bench{n}-prof", env={"GPUPROXY_WORKER_CPROFILE": str(prof_dir)})
    try:
        prof = _run(ddp_only, d.env_for_client({"NCCL_NVLS_ENABLE": "0",
                                                "GPUPROXY_PROFILE": str(prof_dir / "calls")}),
                    out / f"multigpu-bench{n}-profiled.log", timeout=300)
    finally:
        d.stop()
    nat2 = _run(ddp_only, _env(), out / f"multigpu-bench{n}-native2.log", timeout=300)
    r = subprocess.run(CLI + ["profile", str(prof_dir / "calls")], capture_output=True, text=True,
                       env=_env(), cwd=ROOT)
    (prof_dir / "calls.txt").write_text(r.stdout + r.stderr)
    try:
        import pstats
        import io
        for f in sorted(prof_dir.glob("worker-*.pstats")):
            buf = io.StringIO()
            pstats.Stats(str(f), stream=buf).sort_stats("tottime").print_stats(40)
            f.with_suffix(".txt").write_text(buf.getvalue())
    except Exception as e:       # a figure for reading, never a failure of the step
        log(f"bench {n}: worker profiles unreadable: {e}")

    def parse(r):
        for line in r.stdout.splitlines():
            if line.startswith("BENCH "):
                return json.loads(line[6:])
        return None
    a, b, a2, bp = parse(nat), parse(prx), parse(nat2), parse(prof)
    if a is None or b is None:
        return (f"all_reduce bandwidth and DDP step, {n} GPUs", f"FAIL (native rc={nat.returncode}, proxied "
                                                                 f"rc={prx.returncode})")
    fig = {"gpus": n, "device": a.get("device"), "native": a, "proxied": b, "native_again": a2,
           "proxied_profiled": bp,
           "busbw_ratio": {str(x["bytes"]): round(y["busbw_GBps"] / x["busbw_GBps"], 3)
                           for x, y in zip(a["all_reduce"], b["all_reduce"]) if x["busbw_GBps"]},
           # the same from the GPU's events (the collectives' own time)
           "gpu_busbw_ratio": {str(x["bytes"]): round(y["gpu_busbw_GBps"] / x["gpu_busbw_GBps"], 3)
                               for x, y in zip(a["all_reduce"], b["all_reduce"]) if x.get("gpu_busbw_GBps")},
           "ddp_step_ratio": round(b["ddp_gpt_step_ms"] / a["ddp_gpt_step_ms"], 3)}
    if a2:
        fig["ddp_step_ratio_vs_native_again"] = round(b["ddp_gpt_step_ms"] / a2["ddp_gpt_step_ms"], 3)
    summary["bench"] = fig
    (out / f"multigpu-bench{n}.json").write_text(json.dumps(fig, indent=1))
    gib = fig["busbw_ratio"].get(str(1 << 30))
    log(f"bench {n}: 1 GiB busbw native {a['all_reduce'][-1]['busbw_GBps']} proxied "
        f"{b['all_reduce'][-1]['busbw_GBps']} GB/s (GPU events: {a['all_reduce'][-1].get('gpu_busbw_GBps')}, "
        f"{b['all_reduce'][-1].get('gpu_busbw_GBps')}); DDP step native {a['ddp_gpt_step_ms']} "
        f"(again {a2 and a2['ddp_gpt_step_ms']}) proxied {b['ddp_gpt_step_ms']} ms")
    # figures, not pass/fail (timing never decides a test); the targets of
    # issue 22 are stated next to them
    return (f"all_reduce bandwidth and DDP step, {n} GPUs (1 GiB busbw proxied/native {gib}, target >= 0.9; "
            f"DDP step proxied/native {fig['ddp_step_ratio']}, target <= 1.1)", "done")


def run(log, out: Path, torch_python: str | None = None, steps=STEPS) -> list[tuple[str, str]]:
    n = _gpus()
    if n < 2:
        return [("multigpu", f"SKIP (needs 2 GPUs, {n} here)")]
    results = []
    summary: dict = {"gpus": n}
    try:
        return _run_steps(log, out, torch_python, steps, n, results, summary)
    finally:
        summary["results"] = results
        (out / "multigpu-summary.json").write_text(json.dumps(summary, indent=1))


def _run_steps(log, out, torch_python, steps, n, results, summary):
    if "pytest" not in steps:
        return _torch_steps(log, out, torch_python, steps, n, results, summary)
    # 1. the GPU-marked tests
    env = _env({"GPUPROXY_TEST_GPU": "1", "GPUPROXY_TEST_BACKEND": "cuda"})
    # test_nccl_cut's GPU test: a job whose collectives are graph launches,
    # cut and restored on NVIDIA's NCCL
    r = _run([sys.executable, "-m", "pytest", "-q", "-rs", "-m", "gpu", "-p", "no:cacheprovider", "tests/test_peer.py",
              "tests/test_multidevice.py", "tests/test_corpus_checkpoint.py", "tests/test_nccl.py",
              "tests/test_nccl_cut.py", "-k", "peer or device or vmm or nccl or rank or on_gpus"],
             env, out / "multigpu-pytest.log", timeout=int(os.environ.get("GPUPROXY_MGPU_PYTEST_TIMEOUT_S", "1500")))
    tail = (r.stdout.strip().splitlines() or ["(no output)"])[-1]
    results.append(("multigpu pytest (peer, device map, VMM, NCCL ranks)",
                    "PASS" if r.returncode == 0 else f"FAIL ({tail})"))
    log(f"multigpu pytest: {tail}")

    return _torch_steps(log, out, torch_python, steps, n, results, summary)


def _torch_steps(log, out, torch_python, steps, n, results, summary):
    py = torch_python or os.environ.get("GPUPROXY_TORCH_PYTHON") or sys.executable
    probe = subprocess.run([py, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    if probe.returncode != 0:
        results.append(("multigpu torch", f"SKIP (no torch in {py})"))
        return results
    todo = [("fsdp", lambda k=k: fsdp_step(log, out, py, k)) for k in sorted({2, n})]
    todo += [("ckpt", lambda: ckpt_step(log, out, py, n, summary, "ddp", HOLD_GIB)),
             ("fsdpckpt", lambda: ckpt_step(log, out, py, n, summary, "fsdp")),
             ("wpckpt", lambda: ckpt_step(log, out, py, n, summary, "ddp", HOLD_GIB, whole=True)),
             ("bench", lambda: bench_step(log, out, py, n, summary))]
    for name, fn in todo:
        if name in steps:
            t = time.time()
            results.append(fn())
            log(f"[multigpu {name} took {time.time() - t:.1f} s]")
    if "peer" in steps:
        # 2. peer copies and a two-GPU model in one process
        d = Daemon(backend="cuda", log_path=str(out / "multigpu-proxyd-peer.log")).start()
        try:
            nat = _run([py, str(EXAMPLE), "--mode", "peer"], _env(), out / "multigpu-peer-native.log")
            prx = _run([py, str(EXAMPLE), "--mode", "peer"], d.env_for_client({"NCCL_NVLS_ENABLE": "0"}),
                       out / "multigpu-peer-proxied.log")
        finally:
            d.stop()
        ok = nat.returncode == 0 and prx.returncode == 0 and nat.stdout == prx.stdout and "peer done" in nat.stdout
        results.append(("torch x.to('cuda:1') + 2-GPU model, proxied == native", "PASS" if ok else "FAIL"))
        log(f"torch peer: native rc={nat.returncode} proxied rc={prx.returncode} same={nat.stdout == prx.stdout}")
    # 3. DDP over NCCL with torchrun, on 2 GPUs and (where there are) 4
    for nproc in (2, 4) if "ddp" in steps else ():
        if nproc > n:
            results.append((f"torchrun DDP {nproc} GPUs", f"SKIP (needs {nproc} GPUs, {n} here)"))
            continue
        tr = [py, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(EXAMPLE),
              "--mode", "ddp"]
        nat = _run(tr, _env(), out / f"multigpu-ddp{nproc}-native.log")
        d = _proxyd(out, f"ddp{nproc}")
        try:
            prx = _run(tr, d.env_for_client({"NCCL_NVLS_ENABLE": "0"}), out / f"multigpu-ddp{nproc}-proxied.log",
                       timeout=600)
        finally:
            d.stop()
        ok = nat.returncode == 0 and prx.returncode == 0 and nat.stdout == prx.stdout and "ddp done" in nat.stdout
        results.append((f"torchrun DDP {nproc} GPUs, proxied == native",
                        "PASS" if ok else f"FAIL (native rc={nat.returncode}, proxied rc={prx.returncode})"))
        log(f"torch ddp {nproc}: native rc={nat.returncode} proxied rc={prx.returncode} "
            f"same={nat.stdout == prx.stdout}")
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "gpu-check-out"))
    ap.add_argument("--torch-python", default=None)
    ap.add_argument("--steps", default=",".join(STEPS), help=f"comma list of {', '.join(STEPS)}")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = run(print, out, a.torch_python, a.steps.split(","))
    (out / "multigpu.json").write_text(json.dumps(res, indent=1))
    for what, r in res:
        print(f"{r:6s} {what}")
    sys.exit(0 if all(r.startswith(("PASS", "SKIP")) for _, r in res) else 1)


if __name__ == "__main__":
    main()
