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
   docs/multigpu.md). Never run on GPUs before this script.

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
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
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


def run(log, out: Path, torch_python: str | None = None) -> list[tuple[str, str]]:
    n = _gpus()
    if n < 2:
        return [("multigpu", f"SKIP (needs 2 GPUs, {n} here)")]
    results = []
    # 1. the GPU-marked tests
    env = _env({"GPUPROXY_TEST_GPU": "1", "GPUPROXY_TEST_BACKEND": "cuda"})
    r = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_peer.py",
              "tests/test_multidevice.py", "tests/test_corpus_checkpoint.py", "tests/test_nccl.py",
              "-k", "peer or device or vmm or nccl or rank"],
             env, out / "multigpu-pytest.log", timeout=1500)
    tail = (r.stdout.strip().splitlines() or ["(no output)"])[-1]
    results.append(("multigpu pytest (peer, device map, VMM, NCCL ranks)",
                    "PASS" if r.returncode == 0 else f"FAIL ({tail})"))
    log(f"multigpu pytest: {tail}")

    py = torch_python or os.environ.get("GPUPROXY_TORCH_PYTHON") or sys.executable
    probe = subprocess.run([py, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    if probe.returncode != 0:
        results.append(("multigpu torch", f"SKIP (no torch in {py})"))
        return results
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
    for nproc in (2, 4):
        if nproc > n:
            results.append((f"torchrun DDP {nproc} GPUs", f"SKIP (needs {nproc} GPUs, {n} here)"))
            continue
        tr = [py, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(EXAMPLE),
              "--mode", "ddp"]
        nat = _run(tr, _env(), out / f"multigpu-ddp{nproc}-native.log")
        # NCCL in the workers: sessions on the devices' primary contexts (docs/multigpu.md)
        d = Daemon(backend="cuda", log_path=str(out / f"multigpu-proxyd-ddp{nproc}.log"),
                   env={**os.environ, "GPUPROXY_SESSION_PRIMARY": "1"}).start()
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
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = run(print, out, a.torch_python)
    (out / "multigpu.json").write_text(json.dumps(res, indent=1))
    for what, r in res:
        print(f"{r:6s} {what}")
    sys.exit(0 if all(r.startswith(("PASS", "SKIP")) for _, r in res) else 1)


if __name__ == "__main__":
    main()
