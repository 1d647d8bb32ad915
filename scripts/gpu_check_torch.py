"""The PyTorch part of the GPU check (gpu_check_python.py step `torch`, or
alone: ``python3 scripts/gpu_check_torch.py --out DIR [--torch-python PY]``).

PyTorch is not installed by gpuproxy: the interpreter that has it is
``--torch-python`` / ``$GPUPROXY_TORCH_PYTHON`` (default: this one). Without
torch the step reports SKIP with the reason.

1. examples/train_torch.py --model pointwise, mlp and gpt, natively and
   under the proxy: the printed loss curves (float.hex per step) must be
   identical;
2. a mid-training GPU-only checkpoint (pointwise and gpt): the proxied run waits after
   step K, ``proxy-cli --dump --gpu-only``, proxyd is killed, a fresh proxyd
   restores the image, the run goes on; the whole curve must equal the
   uninterrupted one. While it waits, /proc/PID/maps and /proc/PID/fd are
   searched for /dev/nvidia* (the proxied app must open none);
3. ``--bench`` natively and proxied: median step time of the gpu-bound and
   the launch-bound configuration;
4. import-to-first-kernel time (the example's ``timing`` line), natively
   and proxied, with an empty and with a warm module cache
   (proxyd/families/modstore.py);
5. how many module images the checkpoint holds (only those the session
   loaded: libtorch registers hundreds);
6. a whole-process checkpoint (CRIU + proxyd) of the proxied GPT run between
   two steps, the app ended, proxyd killed, restored into a fresh proxyd:
   the curve must equal the uninterrupted one.

Everything goes to DIR/torch.json (and DIR/torch-*.log).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from proxy import Daemon  # noqa: E402

EXAMPLE = ROOT / "examples" / "train_torch.py"
# pointwise: torch's own kernels only (no cuBLAS/cuDNN), so it runs proxied
# before the library remoting (issue 12 part 2) has landed
STEPS = {"pointwise": 60, "mlp": 60, "gpt": 40}
WAIT_AT = 15


def torch_python() -> str:
    return os.environ.get("GPUPROXY_TORCH_PYTHON") or sys.executable


def _env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.update(extra or {})
    return env


def _steps(stdout: str) -> list[str]:
    return [ln for ln in stdout.splitlines() if re.match(r"^step \d+ loss \S+$", ln)]


def _timing(stdout: str) -> dict | None:
    m = re.search(r"^timing (.*)$", stdout, re.M)
    if not m:
        return None
    return {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}


def _nvidia_files(pid: int) -> list[str]:
    found = set()
    try:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            if "/dev/nvidia" in line:
                found.add(line.split()[-1])
    except OSError:
        pass
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                t = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if t.startswith("/dev/nvidia"):
                found.add(t)
    except OSError:
        pass
    return sorted(found)


def _run(argv, env, timeout=1200) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)


def curves(log, out: Path, d: Daemon, rec: dict) -> list[tuple[str, str]]:
    py = torch_python()
    results = []
    for model, n in STEPS.items():
        argv = [py, str(EXAMPLE), "--model", model, "--steps", str(n)]
        nat = _run(argv, _env())
        prx = _run(argv, d.env_for_client(_env()))
        (out / f"torch-{model}-native.log").write_text(nat.stdout + nat.stderr)
        (out / f"torch-{model}-proxied.log").write_text(prx.stdout + prx.stderr)
        cn, cp = _steps(nat.stdout), _steps(prx.stdout)
        same = nat.returncode == 0 and prx.returncode == 0 and len(cn) == n and cn == cp
        first_diff = next((i + 1 for i, (a, b) in enumerate(zip(cn, cp)) if a != b), None)
        rec["curves"][model] = {"native_rc": nat.returncode, "proxied_rc": prx.returncode, "steps": n,
                                "native_steps": len(cn), "proxied_steps": len(cp), "identical": same,
                                "first_difference_at_step": first_diff,
                                "timing_native": _timing(nat.stdout), "timing_proxied": _timing(prx.stdout),
                                "proxied_stderr_tail": prx.stderr[-2000:] if not same else ""}
        rec["_uninterrupted"][model] = cn
        log(f"torch {model}: native rc={nat.returncode} {len(cn)} steps, proxied rc={prx.returncode} {len(cp)} "
            f"steps, identical={same}" + ("" if same else f"\n{prx.stderr[-1500:]}"))
        results.append((f"torch {model}: loss curve native == proxied ({n} steps)", "PASS" if same else "FAIL"))
    return results


def checkpoint(log, out: Path, rec: dict, model: str = "gpt") -> list[tuple[str, str]]:
    py = torch_python()
    n, k = STEPS[model], WAIT_AT
    tmp = Path(f"/tmp/gpx-torch-{os.getpid()}")
    tmp.mkdir(exist_ok=True)
    cli = [sys.executable, "-m", "gpuproxy.cli"]
    d = Daemon(backend="cuda", endpoint=f"ipc://{tmp}/proxyd.sock", log_path=str(out / f"torch-proxyd-{model}-a.log")).start()
    proc = subprocess.Popen([py, str(EXAMPLE), "--model", model, "--steps", str(n), "--wait-at-step", str(k)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=d.env_for_client(_env()))
    err: list[str] = []
    threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True).start()
    cli_env = _env({"GPUPROXY_ENDPOINT": d.endpoint})
    got, rest, c = [], "", {"model": model, "wait_at": k}
    d2 = None
    try:
        for line in proc.stdout:
            got.append(line)
            if line == "waiting\n":
                break
        if not got or got[-1] != "waiting\n":
            raise RuntimeError("the run ended before step %d:\n%s%s" % (k, "".join(got)[-1000:], "".join(err)[-3000:]))
        c["nvidia_files_open"] = _nvidia_files(proc.pid)
        img = tmp / "img"
        t = time.monotonic()
        r = _run([*cli, "--dump", "--gpu-only", "--pid", str(proc.pid), "--dir", str(img)], cli_env, 600)
        c["dump_s"] = time.monotonic() - t
        c["dump"] = (r.stdout + r.stderr)[-2000:]
        if r.returncode != 0:
            raise RuntimeError(f"dump failed: {r.stdout}{r.stderr}")
        c["image_bytes"] = sum(f.stat().st_size for f in img.rglob("*") if f.is_file())
        try:
            from gpuproxy.proxyd.checkpoint.image import Image
            c["modules_in_image"] = len(Image.open(str(img)).modules())
        except Exception as e:      # recorded, not judged
            c["modules_in_image"] = f"unknown: {e}"
        d.kill()
        d2 = Daemon(backend="cuda", endpoint=d.endpoint, log_path=str(out / f"torch-proxyd-{model}-b.log")).start()
        t = time.monotonic()
        r = _run([*cli, "--restore", "--gpu-only", "--dir", str(img)], cli_env, 600)
        c["restore_s"] = time.monotonic() - t
        c["restore"] = (r.stdout + r.stderr)[-2000:]
        if r.returncode != 0:
            raise RuntimeError(f"restore failed: {r.stdout}{r.stderr}")
        proc.stdin.write("\n")
        proc.stdin.flush()
        rest, _ = proc.communicate(timeout=1200)
        c["rc"] = proc.returncode
    except Exception as e:
        c["error"] = f"{type(e).__name__}: {e}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        d.cleanup()
        if d2:
            d2.cleanup()
    printed = _steps("".join(got) + rest)
    (out / f"torch-checkpoint-{model}.log").write_text("".join(got) + rest + "\n--- stderr\n" + "".join(err))
    want = rec["_uninterrupted"].get(model)
    c["steps_printed"] = len(printed)
    c["identical_to_uninterrupted"] = bool(want) and printed == want and len(printed) == n
    rec.setdefault("checkpoint", {})[model] = c
    log(f"torch checkpoint at step {k}: {json.dumps({x: y for x, y in c.items() if x not in ('dump', 'restore')})}")
    return [(f"torch {model}: dump at step {k}, proxyd killed, restore: curve identical",
             "PASS" if c["identical_to_uninterrupted"] else "FAIL"),
            (f"torch {model}: no /dev/nvidia* open in the proxied app",
             "PASS" if "nvidia_files_open" in c and not c["nvidia_files_open"] else "FAIL")]


def whole_process(log, out: Path, rec: dict, model: str = "gpt") -> list[tuple[str, str]]:
    """Whole-process checkpoint of a proxied torch training (issue 12 part 5,
    with the CRIU issue's machinery): proxy-cli --dump (CRIU for the Python
    process, proxyd for its GPU state) between two steps, which ends the app;
    proxyd killed; a fresh proxyd and proxy-cli --restore bring the process
    back; the curve it prints, before and after, must be the uninterrupted
    one. Needs CRIU (scripts/install-criu)."""
    from gpuproxy.proxyd.checkpoint.criu import pid_alive
    py = torch_python()
    n, k = STEPS[model], WAIT_AT
    tmp = Path(f"/tmp/gpx-torch-whole-{os.getpid()}")
    tmp.mkdir(exist_ok=True)
    cli = [sys.executable, "-m", "gpuproxy.cli"]
    d = Daemon(backend="cuda", endpoint=f"ipc://{tmp}/proxyd.sock", log_path=str(out / f"torch-whole-{model}-a.log")).start()
    outf = tmp / "train.out"
    proc = subprocess.Popen([py, str(EXAMPLE), "--model", model, "--steps", str(n), "--pause", "0.3"],
                            stdin=subprocess.DEVNULL, stdout=open(outf, "w"), stderr=open(str(outf) + ".err", "w"),
                            env=d.env_for_client(_env()), start_new_session=True)
    pid = proc.pid
    cli_env = _env({"GPUPROXY_ENDPOINT": d.endpoint})
    c = {"model": model, "dump_after_step": k}
    d2 = None
    try:
        end = time.monotonic() + 600
        while f"step {k} " not in outf.read_text():
            if proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError("the run ended before step %d:\n%s" % (k, open(str(outf) + ".err").read()[-3000:]))
            time.sleep(0.02)
        img = tmp / "img"
        t = time.monotonic()
        r = _run([*cli, "--dump", "--pid", str(pid), "--dir", str(img)], cli_env, 900)
        c["dump_s"] = time.monotonic() - t
        c["dump"] = (r.stdout + r.stderr)[-2000:]
        if r.returncode != 0:
            raise RuntimeError(f"dump failed: {r.stdout}{r.stderr}")
        proc.wait(60)
        c["steps_before_dump"] = len(_steps(outf.read_text()))
        c["image_bytes"] = sum(f.stat().st_size for f in img.rglob("*") if f.is_file())
        d.kill()
        d2 = Daemon(backend="cuda", endpoint=d.endpoint, log_path=str(out / f"torch-whole-{model}-b.log")).start()
        t = time.monotonic()
        r = _run([*cli, "--restore", "--dir", str(img)], cli_env, 900)
        c["restore_s"] = time.monotonic() - t
        c["restore"] = (r.stdout + r.stderr)[-2000:]
        if r.returncode != 0:
            raise RuntimeError(f"restore failed: {r.stdout}{r.stderr}")
        end = time.monotonic() + 900
        while pid_alive(pid):
            if time.monotonic() > end:
                raise RuntimeError("the restored training did not finish")
            time.sleep(0.05)
    except Exception as e:
        c["error"] = f"{type(e).__name__}: {e}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        try:
            os.kill(pid, 9)
        except OSError:
            pass
        d.cleanup()
        if d2:
            d2.cleanup()
    text = outf.read_text() if outf.exists() else ""
    (out / f"torch-whole-{model}.log").write_text(text + "\n--- stderr\n" +
                                                  (open(str(outf) + ".err").read() if outf.exists() else ""))
    printed = _steps(text)
    want = rec["_uninterrupted"].get(model)
    c["steps_printed"] = len(printed)
    c["identical_to_uninterrupted"] = bool(want) and printed == want and len(printed) == n
    rec.setdefault("whole_process", {})[model] = c
    log(f"torch whole-process checkpoint after step {k}: "
        f"{json.dumps({x: y for x, y in c.items() if x not in ('dump', 'restore')})}")
    return [(f"torch {model}: whole-process dump after step {k}, proxyd killed, restore: curve identical",
             "PASS" if c["identical_to_uninterrupted"] else "FAIL")]


def bench(log, out: Path, d: Daemon, rec: dict) -> list[tuple[str, str]]:
    argv = [torch_python(), str(EXAMPLE), "--bench"]
    res = {}
    for mode in ("native", "proxied"):
        r = _run(argv, _env() if mode == "native" else d.env_for_client(_env()), 1800)
        (out / f"torch-bench-{mode}.log").write_text(r.stdout + r.stderr)
        res[mode] = {m.group(1): float(m.group(2))
                     for m in re.finditer(r"^bench (\S+) median_ms (\S+)$", r.stdout, re.M)}
        res[mode]["errors"] = {m.group(1): m.group(2)
                               for m in re.finditer(r"^bench (\S+) error (.*)$", r.stdout, re.M)}
        res[mode]["rc"] = r.returncode
        res[mode]["timing"] = _timing(r.stdout)
    for cfg in ("gpu-bound", "launch-bound", "launch-bound-pointwise"):
        n, p = res["native"].get(cfg), res["proxied"].get(cfg)
        if n and p:
            res[f"{cfg} overhead_pct"] = round((p / n - 1) * 100, 2)
    rec["bench"] = res
    log(f"torch bench: {json.dumps(res)}")
    ok = all(res[m].get("rc") == 0 for m in ("native", "proxied"))
    return [("torch bench (median step time, torch.json)", "done" if ok else "FAIL")]


def first_kernel(log, out: Path, rec: dict) -> list[tuple[str, str]]:
    """import-to-first-kernel: natively, and proxied with an empty module
    cache (the first run: the module image is sent and parsed) and again
    (later runs: the digest is enough, the layout comes from the disk
    cache; proxyd/families/modstore.py), three times each, a fresh proxyd and cache
    folder each time."""
    py = torch_python()
    argv = [py, str(EXAMPLE), "--model", "pointwise", "--steps", "1"]
    res = {"native": [], "proxied_cold_cache": [], "proxied_warm_cache": []}
    for _ in range(3):
        r = _run(argv, _env())
        res["native"].append(_timing(r.stdout))
    tmp = Path(f"/tmp/gpx-torch-fk-{os.getpid()}")
    tmp.mkdir(exist_ok=True)
    for i in range(3):
        env = _env({"GPUPROXY_CACHE_DIR": str(tmp / f"cache-{i}")})
        d = Daemon(backend="cuda", endpoint=f"ipc://{tmp}/proxyd.sock", log_path=str(out / "torch-proxyd-fk.log"),
                   env=env)
        d.start()
        try:
            res["proxied_cold_cache"].append(_timing(_run(argv, d.env_for_client(_env())).stdout))
            res["proxied_warm_cache"].append(_timing(_run(argv, d.env_for_client(_env())).stdout))
        finally:
            d.cleanup()
    rec["import_to_first_kernel"] = res
    log(f"torch import-to-first-kernel: {json.dumps(res)}")
    ok = all(t for v in res.values() for t in v)
    return [("torch import-to-first-kernel (torch.json)", "done" if ok else "FAIL")]


def run(log, out: Path) -> list[tuple[str, str]]:
    py = torch_python()
    probe = subprocess.run([py, "-c", "import torch; print(torch.__version__, torch.version.cuda, "
                                      "torch.cuda.is_available())"], capture_output=True, text=True, env=_env())
    if probe.returncode != 0:
        log(f"torch: not importable with {py}: {probe.stderr.strip().splitlines()[-1:]}")
        return [("torch (set GPUPROXY_TORCH_PYTHON to a python with torch)", "SKIP")]
    rec: dict = {"torch": probe.stdout.strip(), "python": py, "curves": {}, "_uninterrupted": {}}
    log(f"torch: {rec['torch']} ({py})")
    results = []
    d = Daemon(backend="cuda", log_path=str(out / "torch-proxyd.log")).start()
    try:
        for name, fn in (("curves", lambda: curves(log, out, d, rec)), ("bench", lambda: bench(log, out, d, rec))):
            try:
                results += fn()
            except Exception as e:      # one failing part must not hide the others
                log(f"torch {name} failed: {type(e).__name__}: {e}")
                results.append((f"torch {name}", "ERROR"))
    finally:
        d.stop()
    for name, fn in (("checkpoint pointwise", lambda: checkpoint(log, out, rec, "pointwise")),
                     ("checkpoint gpt", lambda: checkpoint(log, out, rec, "gpt")),
                     ("whole-process gpt", lambda: whole_process(log, out, rec, "gpt")),
                     ("first-kernel", lambda: first_kernel(log, out, rec))):
        try:
            results += fn()
        except Exception as e:
            log(f"torch {name} failed: {type(e).__name__}: {e}")
            results.append((f"torch {name}", "ERROR"))
    rec.pop("_uninterrupted", None)
    (out / "torch.json").write_text(json.dumps(rec, indent=1))
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "gpu-check-out"))
    ap.add_argument("--torch-python", default=None, help="python with torch (default $GPUPROXY_TORCH_PYTHON or this one)")
    a = ap.parse_args()
    if a.torch_python:
        os.environ["GPUPROXY_TORCH_PYTHON"] = a.torch_python
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from gpu_check_report import appending_log, report_and_exit     # scripts/: this script's folder
    log = appending_log(out / "torch-check.log")
    report_and_exit(run(log, out), log)


if __name__ == "__main__":
    main()
