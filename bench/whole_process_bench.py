"""Whole-process checkpoint benchmark (issue 9): a program holding DEV GiB
of device memory and HOST GiB of host memory (bench/wp_hold.cu) is dumped
whole and restored whole, twice in the same run:

* gpuproxy: the program runs under the shim; `proxy-cli --dump` parks it,
  proxyd writes its GPU state, CRIU its process (the process is gone);
  `proxy-cli --restore` puts the GPU state back into the daemon, then CRIU
  the process, which reconnects and ticks on.
* NVIDIA's way, on a native copy of the same program: `cuda-checkpoint
  --toggle` (GPU memory copied into the process), then `criu dump`; restore:
  `criu restore`, then `cuda-checkpoint --toggle` (the flow of
  cuda-checkpoint's README). Needs the cuda-checkpoint binary on PATH
  (NVIDIA/cuda-checkpoint, bin/x86_64_Linux) and a usable CRIU.

After each restore the program recomputes the checksums of both memories
and its tick counter and compares them with the values taken before the
dump ("verify ok"), so a timing is only reported for a checkpoint that kept
the data. Timing is never pass/fail.

    python bench/whole_process_bench.py [--backend cuda|emu] [--dev-gib 8] [--host-gib 2] [--images DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from proxy import Daemon  # noqa: E402

from gpuproxy.proxyd.checkpoint import criu  # noqa: E402


class Program:
    """One wp_hold process, started in its own session (CRIU dumps it as a
    session leader), driven through its control file, watched through its
    stdout file. After a restore it is no longer our child: only its pid and
    files are used from then on."""

    def __init__(self, exe: Path, dev_gib: float, host_gib: float, work: Path, env: dict, tag: str):
        self.ctl = work / f"{tag}.ctl"
        self.out = work / f"{tag}.out"
        self.p = subprocess.Popen([str(exe), str(dev_gib), str(host_gib), str(self.ctl)], env=env,
                                  stdin=subprocess.DEVNULL, stdout=open(self.out, "w"),
                                  stderr=open(work / f"{tag}.err", "w"), start_new_session=True)
        self.pid = self.p.pid
        self.wait_for(lambda ls: any(x.startswith("ready") for x in ls), 900, "ready")
        self.wait_ticks(3)

    def lines(self) -> list[str]:
        try:
            return self.out.read_text().splitlines()
        except OSError:
            return []

    def ticks(self) -> int:
        return sum(1 for x in self.lines() if x.startswith("tick"))

    def wait_for(self, pred, timeout: float, what: str):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred(self.lines()):
                return
            if not criu.pid_alive(self.pid):
                raise RuntimeError(f"the program ended before {what}: {self.lines()[-5:]} "
                                   f"{(self.out.with_suffix('.err')).read_text()[-2000:]}")
            time.sleep(0.01)
        raise RuntimeError(f"no {what} within {timeout} s: {self.lines()[-5:]}")

    def wait_ticks(self, n: int, timeout: float = 120):
        base = self.ticks()
        self.wait_for(lambda ls: sum(1 for x in ls if x.startswith("tick")) >= base + n, timeout, f"{n} ticks")

    def verify(self) -> str:
        self.ctl.write_text("verify")
        self.wait_for(lambda ls: any(x.startswith("verify") for x in ls), 300, "verify")
        return [x for x in self.lines() if x.startswith("verify")][-1]

    def wait_gone(self, timeout: float = 120):
        """Waits until the pid is free: reaped while it is our child (CRIU
        restores into that very pid), merely gone after a restore."""
        if self.p is not None:
            self.p.wait(timeout)
            self.p = None           # a restored process is not our child
            return
        end = time.monotonic() + timeout
        while criu.pid_alive(self.pid):
            if time.monotonic() > end:
                raise RuntimeError(f"pid {self.pid} still runs")
            time.sleep(0.01)

    def quit(self):
        try:
            self.ctl.write_text("quit")
            self.wait_gone(30)
        except Exception:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass


def build(work: Path, backend: str) -> Path:
    exe = work / "wp_hold"
    arch = os.environ.get("GPUPROXY_NVCC_ARCH", "sm_90")
    subprocess.run(["nvcc", "-cudart", "shared", f"-arch={arch}", "-O2", "-o", str(exe), str(HERE / "wp_hold.cu")],
                   check=True)
    return exe


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def timed(argv, env=None, timeout=1800) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    return round(time.monotonic() - t0, 3), r


def gpuproxy_run(exe: Path, a, work: Path, images: Path) -> dict:
    emu = [HERE / "ckpt_hold_emu.py", HERE / "wp_hold_emu.py"] if a.backend == "emu" else []
    img = images / "gpuproxy-img"
    shutil.rmtree(img, ignore_errors=True)
    res: dict = {}
    with Daemon(backend=a.backend, emu_kernels=emu) as d:
        cli = [shutil.which("proxy-cli") or "proxy-cli", "--endpoint", d.endpoint]
        prog = Program(exe, a.dev_gib, a.host_gib, work, d.env_for_client(), "gpuproxy")
        try:
            secs, r = timed(cli + ["--dump", "--pid", str(prog.pid), "--dir", str(img), "--json"])
            if r.returncode != 0:
                raise RuntimeError(f"proxy-cli --dump failed: {r.stderr[-3000:]}")
            prog.wait_gone()
            out = json.loads(r.stdout)
            gpu, rec = out.get("gpu") or {}, out.get("criu") or {}
            res["dump_s"] = secs
            res["dump_detail"] = {k: gpu.get(k) for k in ("stop_ms", "ms", "bytes", "write_ms", "total_ms")
                                  if k in gpu}
            res["criu_dump_s"] = round((rec.get("ms") or 0) / 1000.0, 3)
            res["image_bytes"] = du(img)
            res["criu_bytes"] = rec.get("size")
            secs, r = timed(cli + ["--restore", "--dir", str(img), "--json"])
            if r.returncode != 0:
                raise RuntimeError(f"proxy-cli --restore failed: {r.stderr[-3000:]}")
            res["restore_s"] = secs
            try:
                rr = json.loads(r.stdout)
                res["restore_detail"] = {k: v for k, v in rr.items() if k.endswith("ms") or k.endswith("_s")}
            except ValueError:
                pass
            t0 = time.monotonic()
            prog.wait_ticks(1)
            res["first_tick_after_restore_s"] = round(time.monotonic() - t0, 3)
            res["verify"] = prog.verify()
        finally:
            prog.quit()
    shutil.rmtree(img, ignore_errors=True)
    return res


def native_run(exe: Path, a, work: Path, images: Path) -> dict:
    tool = shutil.which("cuda-checkpoint")
    if a.backend != "cuda":
        return {"skipped": "needs the GPU"}
    if not tool:
        return {"skipped": "cuda-checkpoint not on PATH"}
    c = criu.usable()
    img = images / "native-img"
    shutil.rmtree(img, ignore_errors=True)
    img.mkdir(parents=True)
    res: dict = {}
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    prog = Program(exe, a.dev_gib, a.host_gib, work, env, "native")
    try:
        t0 = time.monotonic()
        s1, r = timed([tool, "--toggle", "--pid", str(prog.pid)])
        if r.returncode != 0:
            raise RuntimeError(f"cuda-checkpoint --toggle failed: {r.stdout}{r.stderr}")
        t1 = time.monotonic()
        rec = criu.dump(c, prog.pid, str(img), leave_running=False)
        prog.wait_gone()
        res["cuda_checkpoint_s"] = s1
        res["criu_dump_s"] = round(time.monotonic() - t1, 3)
        res["dump_s"] = round(time.monotonic() - t0, 3)
        res["image_bytes"] = du(img)
        t0 = time.monotonic()
        pid, _ms = criu.restore(c, str(img), rec)
        t1 = time.monotonic()
        s2, r = timed([tool, "--toggle", "--pid", str(pid)])
        if r.returncode != 0:
            raise RuntimeError(f"cuda-checkpoint --toggle (restore) failed: {r.stdout}{r.stderr}")
        res["criu_restore_s"] = round(t1 - t0, 3)
        res["cuda_restore_s"] = s2
        res["restore_s"] = round(time.monotonic() - t0, 3)
        t0 = time.monotonic()
        prog.wait_ticks(1)
        res["first_tick_after_restore_s"] = round(time.monotonic() - t0, 3)
        res["verify"] = prog.verify()
    finally:
        prog.quit()
        shutil.rmtree(img, ignore_errors=True)
    return res


def table(r: dict) -> str:
    g, n = r.get("gpuproxy") or {}, r.get("native") or {}

    def cell(d, k):
        v = d.get(k)
        return f"{v:.2f} s" if isinstance(v, (int, float)) else ("n/a" if not d.get("error") else "failed")

    def ratio(k):
        x, y = g.get(k), n.get(k)
        return f"{y / x:.1f}x" if isinstance(x, (int, float)) and isinstance(y, (int, float)) and x else "n/a"
    rows = ["| whole process, %s GiB device + %s GiB host | gpuproxy | cuda-checkpoint + CRIU | gpuproxy faster by |"
            % (r["dev_gib"], r["host_gib"]), "| --- | --- | --- | --- |"]
    for k, label in (("dump_s", "dump (process gone)"), ("restore_s", "restore (process running again)"),
                     ("first_tick_after_restore_s", "restore -> first tick")):
        rows.append(f"| {label} | {cell(g, k)} | {cell(n, k)} | {ratio(k)} |")
    rows.append(f"| image size | {g.get('image_bytes', 0) / 2**30:.2f} GiB | "
                f"{n.get('image_bytes', 0) / 2**30:.2f} GiB | |")
    rows.append(f"| data after restore | {g.get('verify', g.get('error', 'n/a'))} | "
                f"{n.get('verify', n.get('error', n.get('skipped', 'n/a')))} | |")
    return "\n".join(rows)


def image_root(work: Path, gib: float) -> Path:
    """/dev/shm when it holds both images with room to spare (host memory,
    as cuda-checkpoint's own staging is), else the work folder."""
    shm = Path("/dev/shm")
    try:
        st = os.statvfs(shm)
        if st.f_bavail * st.f_frsize > 3 * gib * 2**30:
            return shm / f"gpuproxy-bench-{os.getpid()}"
    except OSError:
        pass
    return work


def whole_suite(backend: str, work: Path, dev_gib: float, host_gib: float, images: Path | None = None) -> dict:
    a = argparse.Namespace(backend=backend, dev_gib=dev_gib, host_gib=host_gib)
    images = images or work
    images.mkdir(parents=True, exist_ok=True)
    exe = build(work, backend)
    r = {"dev_gib": dev_gib, "host_gib": host_gib, "images": str(images)}
    try:
        for name, fn in (("gpuproxy", gpuproxy_run), ("native", native_run)):
            try:
                r[name] = fn(exe, a, work, images)
            except Exception as e:     # reported in the table, never hidden
                r[name] = {"error": str(e)[-3000:]}
    finally:
        if images.name.startswith("gpuproxy-bench-"):     # made by image_root: ours to remove
            shutil.rmtree(images, ignore_errors=True)
    return r


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="cuda", choices=["cuda", "emu"])
    ap.add_argument("--dev-gib", type=float, default=8.0)
    ap.add_argument("--host-gib", type=float, default=2.0)
    ap.add_argument("--images", default=None, help="where the images go (default: a temporary folder)")
    ap.add_argument("--out", default=None, help="write whole.json there")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        images = Path(a.images) if a.images else image_root(work, a.dev_gib + a.host_gib)
        r = whole_suite(a.backend, work, a.dev_gib, a.host_gib, images)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "whole.json").write_text(json.dumps(r, indent=2))
    print(json.dumps(r, indent=2))
    print(table(r))


if __name__ == "__main__":
    main()
