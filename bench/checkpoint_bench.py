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
    def __init__(self, exe: Path, gib: float, env: dict, count: int = 0):
        argv = [str(exe), str(gib)] + ([str(count)] if count else [])
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=env, text=True, bufsize=1)
        line = self.p.stdout.readline()
        if not line.startswith("ready"):
            raise RuntimeError(f"holder failed: {line!r} {self.p.stderr.read()[-2000:]}")
        self.bytes = int(line.split()[1])
        self.allocations = int(line.split()[2]) if len(line.split()) > 2 else None

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
    from gpuproxy.proxyd.client import ControlClient
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


def build_hold(work: Path) -> Path:
    exe = work / "ckpt_hold"
    if not exe.exists():
        arch = os.environ.get("GPUPROXY_NVCC_ARCH", "sm_90")
        subprocess.run(["nvcc", "-cudart", "shared", f"-arch={arch}", "-O2", "-o", str(exe),
                        str(HERE / "ckpt_hold.cu")], check=True)
    return exe


def checkpoint_suite(backend: str, work: Path) -> dict:
    exe = build_hold(work)
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
            if os.environ.get("BENCH_CKPT_COMPRESS", "zstd:1") != "none":
                # the same dump with the image compressed (bench data: a fill pattern; see
                # bench/image_write_bench.py for model weights and optimizer state)
                r["dump_zstd"] = dump("z", leave_running=True, compress=os.environ.get("BENCH_CKPT_COMPRESS",
                                                                                       "zstd:1"))
                drop("z")
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


def small_suite(backend: str, work: Path) -> dict:
    """Target 6 of issue 13: a session holding many small allocations (4 KiB
    to 1 MiB, ckpt_hold's count mode), dumped and restored; per-byte rates
    and per-object costs. Counts: $BENCH_SMALL_COUNT (default 100000 on a
    GPU, 300 emulated). On a GPU a second pass sets
    GPUPROXY_CKPT_SPAN_COPIES=0 (a copy per mapping, the old default)."""
    exe = build_hold(work)
    count = int(os.environ.get("BENCH_SMALL_COUNT", "100000" if backend == "cuda" else "300"))
    root = Path(os.environ.get("BENCH_CKPT_DIR", "/dev/shm"))
    emu = [str(HERE / "ckpt_hold_emu.py")] if backend == "emu" else []
    passes = {"default": {}}
    if backend == "cuda":
        passes["copy_per_mapping"] = {"GPUPROXY_CKPT_SPAN_COPIES": "0"}
    out = {"count": count, "passes": {}}
    for name, extra in passes.items():
        r: dict = {}
        d = Daemon(backend=backend, emu_kernels=emu, env=dict(os.environ, **extra))
        d.start()
        tmp = Path(tempfile.mkdtemp(prefix="gpxsmall-", dir=root))
        try:
            t0 = time.monotonic()
            h = Holder(exe, 0, d.env_for_client(), count=count)
            r["setup_s"] = round(time.monotonic() - t0, 2)
            r["bytes"], r["allocations"] = h.bytes, h.allocations
            s0 = h.checksum()
            r["dump_first"] = ctl(d, "dump", pid=h.p.pid, dir=str(tmp / "a"), leave_running=True)
            shutil.rmtree(tmp / "a", ignore_errors=True)
            r["dump_release"] = ctl(d, "dump", pid=h.p.pid, dir=str(tmp / "r"))
            r["restore"] = ctl(d, "restore", dir=str(tmp / "r"))
            r["checksum_ok"] = h.checksum() == s0
            h.close()
        except Exception as e:      # reported with the other pass's numbers
            r["error"] = str(e)[-2000:]
        finally:
            d.cleanup()
            shutil.rmtree(tmp, ignore_errors=True)
        out["passes"][name] = r
    return out


def small_table(res: dict) -> str:
    lines = [f"{res['count']} allocations of 4 KiB-1 MiB:", "",
             "| pass | bytes | chunks | dump to host memory | per allocation | restore | per allocation | "
             "of which upload | data intact |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in res["passes"].items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error'][:200]} | | | | | | | |")
            continue
        n, k = r["bytes"], r["allocations"]
        d, rs = r["dump_release"], r["restore"]
        up = rs.get("upload", {})
        lines.append(f"| {name} | {n / 2**30:.2f} GiB | {d.get('chunks')} | {d['host_ms']:.0f} ms "
                     f"({gbps(n, d['host_ms'])} GB/s) | {d['host_ms'] * 1000 / k:.2f} us | {rs['total_ms']:.0f} ms "
                     f"({gbps(n, rs['total_ms'])} GB/s) | {rs['total_ms'] * 1000 / k:.2f} us | "
                     f"{up.get('wall_ms', 0):.0f} ms, {up.get('copies')} copies | "
                     f"{'yes' if r['checksum_ok'] else 'NO'} |")
    return "\n".join(lines)


def stages_table(res: dict) -> str:
    """Where the time goes: first and later dump, restore, by stage."""
    lines = ["| GiB | first dump: host copy / waited for pinning / in copy calls / pool pinned in (touch, register; "
             "threads) | "
             "dump: queue / sync | restore: check / rebuild / upload / verify / total | upload: reads (thread-s) / "
             "waited for reads / waited for fences / GB/s (path) | image write: prepare / write, jobs | "
             "zstd dump: write, ratio |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for gib, r in res["sizes"].items():
        f, d, rs = r["dump_first"], r["dump"], r["restore"]
        fc, dc, up = f.get("copy", {}), d.get("copy", {}), rs.get("upload", {})
        pool = f.get("host_pool") or {}
        iw = d.get("image_write", {})
        z = r.get("dump_zstd") or {}
        zi = z.get("image_write", {})
        ratio = ""
        if zi.get("written_bytes"):
            ratio = f", {r['bytes'] / zi['written_bytes']:.2f}x"
        lines.append(
            f"| {float(gib):g} | {f['host_ms']:.0f} ms / {fc.get('wait_pinned_ms', 0):.0f} ms / "
            f"{fc.get('call_ms', 0):.0f} ms / {pool.get('pinned_in_s', 'n/a')} s ({pool.get('touch_s', 'n/a')} s, {pool.get('register_s', 'n/a')} s; "
            f"{pool.get('threads', 'n/a')}) | {dc.get('queue_ms', 0):.0f} / {dc.get('sync_ms', 0):.0f} ms | "
            f"{rs.get('check_ms', 0):.0f} / {rs.get('rebuild_ms', 0) - up.get('wall_ms', 0) - rs.get('verify_ms', 0):.0f}"
            f" / {up.get('wall_ms', 0):.0f} / {rs.get('verify_ms', 0):.0f} / {rs['total_ms']:.0f} ms | "
            f"{up.get('read_s', 0)} / {up.get('fill_ms', 0):.0f} ms / {up.get('fence_ms', 0):.0f} ms / "
            f"{up.get('gbps')} ({up.get('mode', 'ring')}) | {iw.get('prepare_ms', 0):.0f} / {iw.get('write_ms', 0):.0f} ms, "
            f"{iw.get('write_jobs')} | {z.get('write_ms', 0):.0f} ms{ratio} |")
    return "\n".join(lines)


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


# ---------------------------------------------------------------- variants
# Issue 13, targets 1 and 2: the copy paths' knobs compared in one run, each
# variant in a fresh proxyd (the knobs are read at its start): the first dump
# of the proxyd (its host pool pinned while copying), a second dump that
# releases the GPU state and writes the image, and the restore from it.
# $BENCH_CKPT_VARIANTS overrides the list: "name:K=V,K=V;name2:K=V" ("name:"
# alone: the defaults). $BENCH_CKPT_COUNT: hold that many small allocations
# (ckpt_hold's count mode) instead of GiB-sized buffers (the harness test).
DEFAULT_VARIANTS = {
    "default": {},
    "ring_restore": {"GPUPROXY_RESTORE_DIRECT": "0"},
    "reg_seg_256": {"GPUPROXY_RESTORE_REG_MB": "256"},
    "reg_seg_16": {"GPUPROXY_RESTORE_REG_MB": "16"},
    "reg_threads_4": {"GPUPROXY_RESTORE_REG_THREADS": "4"},
    "reg_populate": {"GPUPROXY_RESTORE_REG_POPULATE": "1"},
    "pin8_address": {"GPUPROXY_PIN_THREADS": "8", "GPUPROXY_CKPT_COPY_ORDER": "address"},
    "pin16_address": {"GPUPROXY_CKPT_COPY_ORDER": "address"},
    "pinthread": {"GPUPROXY_CKPT_COPY_ORDER": "pinthread"},
    "pin_seg_64": {"GPUPROXY_PIN_SEGMENT_MB": "64"},
    "pin_seg_1024": {"GPUPROXY_PIN_SEGMENT_MB": "1024"},
    "lanes_4": {"GPUPROXY_CKPT_LANES": "4"},
    "write_mmap": {"GPUPROXY_IMAGE_WRITE_MODE": "mmap"},
    "write_falloc": {"GPUPROXY_IMAGE_FALLOCATE": "1"},
}


def parse_variants(spec: str | None) -> dict[str, dict]:
    if not spec:
        return dict(DEFAULT_VARIANTS)
    out = {}
    for item in spec.split(";"):
        item = item.strip()
        if not item:
            continue
        name, _, kvs = item.partition(":")
        env = {}
        for kv in filter(None, (x.strip() for x in kvs.split(","))):
            k, eq, v = kv.partition("=")
            if not eq or not k.startswith("GPUPROXY_"):
                raise ValueError(f"BENCH_CKPT_VARIANTS: {kv!r} is not GPUPROXY_NAME=VALUE")
            env[k] = v
        out[name.strip()] = env
    return out


def variants_suite(backend: str, work: Path) -> dict:
    exe = build_hold(work)
    sizes = [float(x) for x in os.environ.get("BENCH_CKPT_GIB", "1,8" if backend == "cuda" else "0.03").split(",")]
    root = Path(os.environ.get("BENCH_CKPT_DIR", "/dev/shm"))
    emu = [str(HERE / "ckpt_hold_emu.py")] if backend == "emu" else []
    variants = parse_variants(os.environ.get("BENCH_CKPT_VARIANTS"))
    out = {"variants": {k: v for k, v in variants.items()}, "sizes": {}}
    for gib in sizes:
        rows = {}
        for name, extra in variants.items():
            r: dict = {"env": extra}
            d = Daemon(backend=backend, emu_kernels=emu, env=dict(os.environ, **extra))
            d.start()
            tmp = Path(tempfile.mkdtemp(prefix="gpxvar-", dir=root))
            try:
                h = Holder(exe, gib, d.env_for_client(), count=int(os.environ.get("BENCH_CKPT_COUNT", "0")))
                try:
                    r["bytes"] = h.bytes
                    s0 = h.checksum()
                    r["dump_first"] = ctl(d, "dump", pid=h.p.pid, dir=str(tmp / "a"), leave_running=True)
                    shutil.rmtree(tmp / "a", ignore_errors=True)
                    r["dump_release"] = ctl(d, "dump", pid=h.p.pid, dir=str(tmp / "r"))
                    r["restore"] = ctl(d, "restore", dir=str(tmp / "r"))
                    r["checksum_ok"] = h.checksum() == s0
                finally:
                    h.close()
            except Exception as e:        # reported beside the other variants
                r["error"] = str(e)[-2000:]
            finally:
                d.cleanup()
                shutil.rmtree(tmp, ignore_errors=True)
            rows[name] = r
        out["sizes"][str(gib)] = rows
    return out


def variants_table(res: dict) -> str:
    lines = ["| GiB | variant | first dump: host copy / waited for pinning / in copy calls (max) / pool pinned in "
             "(threads, segment) | image write | restore total / upload (mode, GB/s) / direct: register thread-s, "
             "waited for registrations, fences | data intact |",
             "| --- | --- | --- | --- | --- | --- |"]
    for gib, rows in res["sizes"].items():
        for name, r in rows.items():
            if "error" in r:
                lines.append(f"| {float(gib):g} | {name} | error: {r['error'][:200]} | | | |")
                continue
            f, w, rs = r["dump_first"], r["dump_release"], r["restore"]
            fc, pool, up = f.get("copy", {}), f.get("host_pool") or {}, rs.get("upload", {})
            dr = up.get("direct") or {}
            direct = (f"{dr.get('register_s')} s, {dr.get('reg_wait_ms', 0):.0f} ms, {dr.get('fence_ms', 0):.0f} ms"
                      + (f", refused: {dr['refused']}" if dr.get("refused") else "")) if dr else "n/a"
            lines.append(
                f"| {float(gib):g} | {name} | {f['host_ms']:.0f} ms / {fc.get('wait_pinned_ms', 0):.0f} ms / "
                f"{fc.get('call_ms', 0):.0f} ms ({fc.get('call_max_ms', 0):.0f}) / {pool.get('pinned_in_s', 'n/a')} s "
                f"({pool.get('threads', 'n/a')}, {pool.get('segment_mb', 'n/a')} MiB) | {w.get('write_ms', 0):.0f} ms | "
                f"{rs['total_ms']:.0f} ms / {up.get('wall_ms', 0):.0f} ms ({up.get('mode')}, {up.get('gbps')}) / "
                f"{direct} | {'yes' if r['checksum_ok'] else 'NO'} |")
    return "\n".join(lines)
