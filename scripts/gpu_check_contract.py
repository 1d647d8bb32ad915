"""The preemption contract on the GPU (issue 25 part 6): `proxy-cli run
--checkpoint-dir` with a PyTorch training (examples/train_torch.py --model
gpt), as a scheduler drives it. `scripts/gpu-check --contract --skip
corpus,static,whole,pytest,bench` runs it alone (about 2 minutes), or
``python3 scripts/gpu_check_contract.py --out DIR``.

1. the training natively, uninterrupted: the reference curve (float.hex of
   every step's loss);
2. the same command under `proxy-cli run --checkpoint-dir D` on proxyd A
   (GPU 0); after step K1 the wrapper gets SIGTERM (what the kubelet and
   Slurm send): it must checkpoint and exit 143;
3. proxyd A is killed (the node is gone); proxyd B starts at the same
   endpoint and the same command line restores the job from D; after step
   K2 it gets SIGTERM again and exits 143;
4. proxyd B is killed; proxyd C starts, on the other GPU when there are two
   (CUDA_VISIBLE_DEVICES=1 in proxyd's environment: the job lands on another
   card, as on another node), and the same command line restores the job
   and runs it to the end (exit 0, `latest` removed).
The three logs together must be exactly the reference curve. Recorded per
checkpoint: the wrapper's time from SIGTERM to its exit, the app's stall
(job.json's stall_ms: park to the end of the dump), the image's size; per
restore: GPU and CRIU times from the wrapper's line and the time from the
wrapper's start to the app's next step; which GPU the restored session's
worker ran on (nvidia-smi). Everything goes to DIR/contract.json (logs as
DIR/contract-*.log).

PyTorch: the interpreter named by $GPUPROXY_TORCH_PYTHON (default this
one); without torch the check reports SKIP. Needs CRIU (scripts/install-criu,
.carry/criu on the GPU machine).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from proxy import Daemon  # noqa: E402

EXAMPLE = ROOT / "examples" / "train_torch.py"
MODEL, STEPS, PAUSE = "gpt", 40, "0.1"
K1, K2 = 12, 26          # SIGTERM after these steps
DEADLINE_S = 170         # the whole check (the coordinator's budget is 3 minutes)


def _torch_python() -> str:
    return os.environ.get("GPUPROXY_TORCH_PYTHON") or sys.executable


def _env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(extra or {})
    return env


def _gpus() -> int:
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return len([ln for ln in r.stdout.splitlines() if ln.startswith("GPU ")]) if r.returncode == 0 else 0


def _steps(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if re.match(r"^step \d+ loss \S+$", ln)]


class Run:
    """One `proxy-cli run --checkpoint-dir` of the training, its stdout
    appended to the job log (as a pod's log or Slurm's output file)."""

    def __init__(self, endpoint: str, ckpt: Path, log: Path, argv: list[str]):
        self.log, self.err = log, Path(f"{log}.err")
        self.start = time.monotonic()
        self.before = len(_steps(log.read_text())) if log.exists() else 0
        self.p = subprocess.Popen([sys.executable, "-m", "gpuproxy.cli", "--endpoint", endpoint, "run",
                                   "--checkpoint-dir", str(ckpt), "--", *argv],
                                  env=_env(), stdin=subprocess.DEVNULL, stdout=open(log, "a"),
                                  stderr=open(self.err, "a"), start_new_session=True)

    def steps(self) -> int:
        return len(_steps(self.log.read_text()))

    def wait_step(self, k: int, deadline: float) -> float:
        """Waits until the log holds k steps; the seconds since the start."""
        while self.steps() < k:
            if self.p.poll() is not None:
                raise RuntimeError(f"the job ended (status {self.p.returncode}) before step {k}: "
                                   f"{self.err.read_text()[-1500:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no step {k} in time: {self.err.read_text()[-1500:]}")
            time.sleep(0.02)
        return time.monotonic() - self.start

    def term(self, deadline: float) -> tuple[int, float]:
        t = time.monotonic()
        self.p.send_signal(signal.SIGTERM)
        rc = self.p.wait(max(5.0, deadline - time.monotonic()))
        return rc, time.monotonic() - t

    def kill(self) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()


def _restored_line(err: Path) -> dict:
    m = None
    for m in re.finditer(r"restored .* from (\S+) \(pid (\d+), GPU (\d+) ms, CRIU (\d+) ms\)", err.read_text()):
        pass
    if m is None:
        return {}
    return {"image": m.group(1), "pid": int(m.group(2)), "restore_gpu_ms": int(m.group(3)),
            "restore_criu_ms": int(m.group(4))}


def _image_facts(ckpt: Path) -> dict:
    cur = ckpt / "latest"
    if not cur.is_symlink():
        return {"image": None}
    img = ckpt / os.readlink(cur)
    job = json.loads((img / "job.json").read_text())
    size = sum(f.stat().st_size for f in img.rglob("*") if f.is_file() and not f.is_symlink())
    return {"image": img.name, "stall_ms": job.get("stall_ms"), "image_bytes": size, "kind": job.get("kind")}


def _worker_gpu(d: Daemon) -> str | None:
    """The index of the GPU that one of proxyd d's processes uses (nvidia-smi
    --query-compute-apps), or None where nvidia-smi cannot tell."""
    r = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_bus_id", "--format=csv,noheader"],
                       capture_output=True, text=True)
    g = subprocess.run(["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
                       capture_output=True, text=True)
    bus = {b.strip(): i.strip() for i, b in (ln.split(",", 1) for ln in g.stdout.splitlines() if "," in ln)}
    kids = set()
    try:
        kids = {int(x) for x in subprocess.run(["pgrep", "-g", str(os.getpgid(d.proc.pid))], capture_output=True,
                                               text=True).stdout.split()}
    except (OSError, ValueError):
        pass
    for ln in r.stdout.splitlines():
        pid, _, b = ln.partition(",")
        if pid.strip().isdigit() and int(pid) in kids:
            return bus.get(b.strip())
    return None


def run(log, out: Path) -> list[tuple[str, str]]:
    py = _torch_python()
    probe = subprocess.run([py, "-c", "import torch; print(torch.__version__, torch.cuda.is_available())"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return [("contract (PyTorch)", f"SKIP (no torch in {py})")]
    from gpuproxy.proxyd.checkpoint import criu
    try:
        criu.usable()
    except criu.CriuError as e:
        return [("contract (PyTorch)", f"FAIL (CRIU is not usable: {e})")]
    deadline = time.monotonic() + DEADLINE_S
    argv = [py, str(EXAMPLE), "--model", MODEL, "--steps", str(STEPS), "--pause", PAUSE]
    rec: dict = {"model": MODEL, "steps": STEPS, "sigterm_after": [K1, K2], "gpus": _gpus(),
                 "torch": probe.stdout.strip()}
    tmp = Path(f"/tmp/gpx-contract-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    ckpt, job = tmp / "ckpt", out / "contract-job.log"
    ckpt.mkdir()
    job.unlink(missing_ok=True)
    endpoint = f"ipc://{tmp}/proxyd.sock"
    results: list[tuple[str, str]] = []
    daemons: list[Daemon] = []
    runs: list[Run] = []

    def proxyd(name: str, gpu: str | None) -> Daemon:
        env = _env({"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else None)
        d = Daemon(backend="cuda", endpoint=endpoint, env=env, log_path=str(out / f"contract-proxyd-{name}.log"))
        daemons.append(d)
        return d.start()

    try:
        t = time.monotonic()
        nat = subprocess.run(argv, env=_env(), capture_output=True, text=True, timeout=120)
        rec["native_s"] = round(time.monotonic() - t, 2)
        (out / "contract-native.log").write_text(nat.stdout + nat.stderr)
        want = _steps(nat.stdout)
        if nat.returncode != 0 or len(want) != STEPS:
            raise RuntimeError(f"the native run failed (status {nat.returncode}): {nat.stderr[-1500:]}")

        a = proxyd("a", None)
        r1 = Run(a.endpoint, ckpt, job, argv)
        runs.append(r1)
        rec["first_step_k1_s"] = round(r1.wait_step(K1, deadline), 2)
        rc, s = r1.term(deadline)
        rec["checkpoint1"] = dict(_image_facts(ckpt), exit=rc, sigterm_to_exit_s=round(s, 2),
                                  steps_logged=r1.steps())
        if rc != 143:
            raise RuntimeError(f"the first SIGTERM: exit {rc}, not 143: {r1.err.read_text()[-1500:]}")
        a.kill()

        b = proxyd("b", None)
        r2 = Run(b.endpoint, ckpt, job, argv)
        runs.append(r2)
        s = r2.wait_step(r1.steps() + 1, deadline)
        rec["restore1"] = dict(_restored_line(r2.err), start_to_next_step_s=round(s, 2), gpu="0")
        r2.wait_step(K2, deadline)
        rc, s = r2.term(deadline)
        rec["checkpoint2"] = dict(_image_facts(ckpt), exit=rc, sigterm_to_exit_s=round(s, 2),
                                  steps_logged=r2.steps())
        if rc != 143:
            raise RuntimeError(f"the second SIGTERM: exit {rc}, not 143: {r2.err.read_text()[-1500:]}")
        b.kill()

        other = "1" if rec["gpus"] >= 2 else None
        c = proxyd("c", other)
        r3 = Run(c.endpoint, ckpt, job, argv)
        runs.append(r3)
        s = r3.wait_step(r2.steps() + 1, deadline)
        rec["restore2"] = dict(_restored_line(r3.err), start_to_next_step_s=round(s, 2),
                               gpu_asked=other or "0", gpu_seen=_worker_gpu(c))
        rc = r3.p.wait(max(5.0, deadline - time.monotonic()))
        rec["final_exit"] = rc
        got = _steps(job.read_text())
        rec["steps_logged"] = len(got)
        rec["curve_identical"] = got == want
        rec["latest_removed"] = not (ckpt / "latest").exists()
        results.append(("contract: SIGTERM -> 143 twice, restores on fresh proxyds, exit 0",
                        "PASS" if rc == 0 and rec["latest_removed"] else f"FAIL (exit {rc})"))
        results.append(("contract: the job's curve == the uninterrupted native run",
                        "PASS" if got == want else f"FAIL ({len(got)} steps, first difference at "
                        f"{next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))})"))
        if other:
            seen = rec["restore2"]["gpu_seen"]
            results.append(("contract: second restore onto GPU 1",
                            "PASS" if seen == "1" else f"INFO (nvidia-smi shows the worker on {seen})"))
        else:
            results.append(("contract: restore onto the other GPU", "SKIP (one GPU here)"))
    except Exception as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        results.append(("contract (PyTorch)", f"FAIL ({rec['error'][:300]})"))
    finally:
        for r in runs:
            r.kill()
        for d in daemons:
            d.kill()
            d.cleanup()
        if Path(f"{job}.err").exists():
            shutil.copy(f"{job}.err", out / "contract-job.err.log")
        shutil.rmtree(tmp, ignore_errors=True)
    rec["results"] = results
    (out / "contract.json").write_text(json.dumps(rec, indent=1))
    log("contract: " + json.dumps({k: v for k, v in rec.items() if k != "results"}))
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "gpu-check-out"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = run(lambda *x: print(*x, flush=True), out)
    for what, r in res:
        print(f"{r:6s} {what}")
    sys.exit(0 if all(r.startswith(("PASS", "SKIP", "INFO")) for _, r in res) else 1)


if __name__ == "__main__":
    main()
