"""Checkpoint/restore benchmark: a proxied program holding N GiB of device
memory (bench/ckpt_hold.cu) is dumped and restored in several ways.

Run through bench/run_bench.py --suite checkpoint. Sizes: $BENCH_CKPT_GIB
(default "1,8,24" on a GPU, "0.25" on the emulated backend). Images go to
$BENCH_CKPT_DIR (default /dev/shm, i.e. host memory), one at a time.
cuda-checkpoint is run on a native copy of the same program in the same run
when the `cuda-checkpoint` binary is present; otherwise the table cites the
figures measured on the same machine model (shared/anchors.md).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from proxy import Daemon

HERE = Path(__file__).resolve().parent

# cuda-checkpoint on an H100 80GB HBM3, driver 580.159.04, on a PyTorch process
# holding N GiB (the CUDA context adds about 0.5 GiB): checkpoint s, restore s
ANCHOR_CUDA_CHECKPOINT = {1: (2.40, 1.09), 8: (15.7, 5.6), 24: (47.8, 14.5)}


class Holder:
    def __init__(self, exe: Path, gib: float, env: dict):
        self.p = subprocess.Popen([str(exe), str(gib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=env, text=True, bufsize=1)
        line = self.p.stdout.readline()
        if not line.startswith("ready"):
            raise RuntimeError(f"holder failed: {line!r} {self.p.stderr.read()[-2000:]}")
        self.bytes = int(line.split()[1])

    def cmd(self, c: str) -> list[str]:
        self.p.stdin.write(c + "\n")
        self.p.stdin.flush()
        out = []
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError(f"holder died: {self.p.stderr.read()[-2000:]}")
            if line.strip() == "ok":
                return out
            out.append(line.strip())

    def checksum(self) -> int:
        return int(self.cmd("sum")[0].split()[1])

    def close(self):
        try:
            self.cmd("quit")
        except Exception:
            pass
        self.p.kill()
        self.p.wait()


def ctl(d, cmd, **args):
    from gpuproxy.cli.client import ControlClient
    return ControlClient(d.endpoint, timeout_s=3600).call(cmd, args)


def gbps(nbytes, ms):
    return round(nbytes / (ms / 1000.0) / 1e9, 2) if ms else None


def cuda_checkpoint_native(exe: Path, gib: float) -> dict | None:
    """cuda-checkpoint --toggle on the native program, timed the same way."""
    tool = shutil.which("cuda-checkpoint")
    if not tool:
        return None
    h = Holder(exe, gib, dict(os.environ))
    try:
        pid = str(h.p.pid)
        t0 = time.monotonic()
        subprocess.run([tool, "--toggle", "--pid", pid], check=True)
        t1 = time.monotonic()
        subprocess.run([tool, "--toggle", "--pid", pid], check=True)
        t2 = time.monotonic()
        return {"checkpoint_s": round(t1 - t0, 3), "restore_s": round(t2 - t1, 3)}
    finally:
        h.close()


def checkpoint_suite(backend: str, work: Path) -> dict:
    exe = work / "ckpt_hold"
    arch = os.environ.get("GPUPROXY_NVCC_ARCH", "sm_90")
    subprocess.run(["nvcc", "-cudart", "shared", f"-arch={arch}", "-O2", "-o", str(exe), str(HERE / "ckpt_hold.cu")],
                   check=True)
    sizes = [float(x) for x in os.environ.get("BENCH_CKPT_GIB", "1,8,24" if backend == "cuda" else "0.25").split(",")]
    root = Path(os.environ.get("BENCH_CKPT_DIR", "/dev/shm"))
    emu = [str(HERE / "ckpt_hold_emu.py")] if backend == "emu" else []
    out = {"sizes": {}}
    for gib in sizes:
        r: dict = {}
        d = Daemon(backend=backend, emu_kernels=emu)
        d.start()
        tmp = Path(tempfile.mkdtemp(prefix="gpxbench-", dir=root))
        try:
            h = Holder(exe, gib, d.env_for_client())
            nbytes = h.bytes
            s0 = h.checksum()

            def dump(name, **kw):
                path = tmp / name
                st = ctl(d, kw.pop("cmd", "dump"), pid=h.p.pid, dir=str(path), **kw)
                return st

            def drop(name):
                shutil.rmtree(tmp / name, ignore_errors=True)

            r["dump_first"] = dump("a", leave_running=True)
            drop("a")
            r["dump"] = dump("b", leave_running=True)
            drop("b")
            r["concurrent"] = dump("c", leave_running=True, concurrent=True)
            drop("c")
            r["pre_dump"] = dump("i", cmd="pre-dump")
            h.cmd("touch 10 777")                     # 1 % of every allocation changes
            r["incremental"] = dump("i", leave_running=True)
            drop("i")
            s1 = h.checksum()
            r["dump_release"] = dump("r")              # GPU state released; the program waits
            r["restore"] = ctl(d, "restore", dir=str(tmp / "r"))
            s2 = h.checksum()
            r["checksum_ok"] = (s2 == s1) and (s0 != s1)
            h.close()
        finally:
            d.cleanup()
            shutil.rmtree(tmp, ignore_errors=True)
        r["bytes"] = nbytes
        if backend == "cuda":
            try:
                r["cuda_checkpoint"] = cuda_checkpoint_native(exe, gib)
            except Exception as e:   # reported, not fatal to the other numbers
                r["cuda_checkpoint"] = {"error": str(e)}
        out["sizes"][str(gib)] = r
    return out


def checkpoint_table(res: dict) -> str:
    lines = ["| GiB held | dump to host memory (stop-the-world) | same, first dump (pins host memory) | "
             "image written | concurrent dump: app stopped | pre-dump, 1 % changed, dump: app stopped | "
             "restore | data intact | cuda-checkpoint checkpoint / restore |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for gib, r in res["sizes"].items():
        n = r["bytes"]
        d, f, c, inc, rs = r["dump"], r["dump_first"], r["concurrent"], r["incremental"], r["restore"]
        cc = r.get("cuda_checkpoint")
        if cc and "checkpoint_s" in cc:
            ccs = f"{cc['checkpoint_s']} s / {cc['restore_s']} s (this run)"
        else:
            a = ANCHOR_CUDA_CHECKPOINT.get(int(float(gib)))
            ccs = f"{a[0]} s / {a[1]} s (anchors)" if a else "n/a"
        lines.append(
            f"| {float(gib):g} | {d['host_ms']:.0f} ms ({gbps(n, d['host_ms'])} GB/s) | {f['host_ms']:.0f} ms | "
            f"{d['write_ms']:.0f} ms | {c['stop_ms']:.1f} ms | {inc['stop_ms']:.1f} ms "
            f"({inc['changed_bytes'] / 2**20:.0f} MiB changed) | {rs['total_ms']:.0f} ms ({gbps(n, rs['total_ms'])} GB/s) | "
            f"{'yes' if r['checksum_ok'] else 'NO'} | {ccs} |")
    return "\n".join(lines)
