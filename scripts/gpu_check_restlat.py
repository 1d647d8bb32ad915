"""Restore latency and globals at their addresses on the GPU (issue 23,
targets 4 and 5): ``scripts/gpu-check --skip corpus,static,whole,pytest,bench
--restlat`` or alone ``python3 scripts/gpu_check_restlat.py --out DIR``.

1. placement probe (no gpuproxy: the driver alone, through ctypes): fresh
   processes, address randomisation off as in a worker, load the module of
   tests/programs/globals_table_kernels.cu four times under variations of
   what happens before and between the loads, and print where each load's
   first variable went. Which variations change the addresses is what makes
   the driver place globals differently in a restoring worker (kernel
   lookups between loads, launches, memory taken before, VMM reservations,
   CUDA_MODULE_LOADING, a cuBLAS handle, the host's address layout, ASLR),
   and whether the worker's way (cuFuncLoad at each lookup) makes a replay
   without launches land where the app's loads with launches did.
2. tests/test_globals_placement.py on the cuda backend: 512 variables with
   pointers to them kept in device memory, dumped and restored into a fresh
   proxyd (serial and parallel module restores): none may move.
3. the shared host pool (GPUPROXY_HOST_POOL_MB): bench/ckpt_hold.cu holding
   8 GiB, first dumps and the restore with and without it; the restore from
   host memory (the dump's memory kept in the pool, memory_restore.py)
   against a restore of the same state from the files, in GB/s;
4. PyTorch (examples/train_torch.py --model gpt): GPU-only checkpoints at one
   step restored into fresh proxyds with GPUPROXY_RESTORE_MODULES=serial,
   parallel, unordered; then whole-process checkpoints restored with the GPU
   and CRIU halves side by side and one after the other
   (GPUPROXY_RESTORE_OVERLAP=0). Each restore's figures (modules, their
   load/prepare times, globals checked and moved, why) are recorded; the
   loss curve must equal the uninterrupted run's.

Writes DIR/restlat.json (compact) and DIR/restlat-*.log. Meant to take about
3-4 minutes on an H100; $RESTLAT_PARTS (placement,globals,pool,torch) picks
parts.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

KERNELS = ROOT / "tests" / "programs" / "globals_table_kernels.cu"
VARIANTS = ["app", "app_again", "replay_lookups", "modules_first", "alloc_first", "vmm_first", "noise_first",
            "cublas_first", "eager", "eager_modules_first", "created_ctx", "aslr",
            "funcload_app", "funcload_replay"]
# pairs judged against each other rather than against "app": the worker's way
# (cuFuncLoad at each lookup) with launches, and its restore (no launches)
PAIRS = {"funcload_replay": "funcload_app"}


# ------------------------------------------------------------ 1. placement probe (child side)

def _probe(variant: str, cubin: str) -> dict:
    """Runs in a fresh process: the loads of one variant; prints the
    addresses. Driver API through ctypes (cuda.h signatures)."""
    if variant == "noise_first":
        # host address-space use before CUDA starts: what a Python worker
        # does differently before a restore (buffers, threads)
        import threading
        junk = [bytearray(64 << 20) for _ in range(8)]
        ev = threading.Event()
        ts = [threading.Thread(target=ev.wait) for _ in range(8)]
        for t in ts:
            t.start()
    cu = ctypes.CDLL("libcuda.so.1")
    vp, u64 = ctypes.c_void_p, ctypes.c_uint64

    def ck(r, what):
        if r != 0:
            raise RuntimeError(f"{what} -> {r}")
    ck(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    ck(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = vp()
    if variant == "created_ctx":
        r = cu.cuCtxCreate_v4(ctypes.byref(ctx), None, 0, dev) if hasattr(cu, "cuCtxCreate_v4") else \
            cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
        ck(r, "cuCtxCreate")
    else:
        ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    if variant == "alloc_first":
        p = u64()
        ck(cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(64 << 20)), "cuMemAlloc")
    if variant == "vmm_first":
        # what the worker's arena does: a reservation at a fixed address, 2 MiB mapped
        class Prop(ctypes.Structure):
            _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                        ("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int), ("win32", vp),
                        ("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                        ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]
        base = u64()
        ck(cu.cuMemAddressReserve(ctypes.byref(base), ctypes.c_size_t(1 << 30), ctypes.c_size_t(0),
                                  u64(0x2000_0000_0000), u64(0)), "cuMemAddressReserve")
        prop = Prop(type=1, loc_type=1, loc_id=0)
        h = u64()
        ck(cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(2 << 20), ctypes.byref(prop), u64(0)), "cuMemCreate")
        ck(cu.cuMemMap(base, ctypes.c_size_t(2 << 20), ctypes.c_size_t(0), h, u64(0)), "cuMemMap")
    if variant == "cublas_first":
        for name in ("libcublas.so.13", "libcublas.so.12", "libcublas.so"):
            try:
                cb = ctypes.CDLL(name)
                break
            except OSError:
                cb = None
        if cb is None:
            return {"skipped": "no libcublas"}
        hnd = vp()
        ck(cb.cublasCreate_v2(ctypes.byref(hnd)), "cublasCreate")
    image = open(cubin, "rb").read()
    mods = []
    table = u64()
    ck(cu.cuMemAlloc_v2(ctypes.byref(table), ctypes.c_size_t(4 * 128 * 8)), "cuMemAlloc(table)")

    def lookups(m, i, launch):
        for name in (b"gt_publish", b"gt_bump") + ((b"gt_gather",) if i == 0 else ()):
            f = vp()
            ck(cu.cuModuleGetFunction(ctypes.byref(f), m, name), "cuModuleGetFunction")
            off, sz = ctypes.c_size_t(), ctypes.c_size_t()
            cu.cuFuncGetParamInfo(f, 0, ctypes.byref(off), ctypes.byref(sz))     # as the worker does
            if variant.startswith("funcload"):
                ck(cu.cuFuncLoad(f), "cuFuncLoad")                               # as the worker does now
            if launch and name == b"gt_publish":
                base = ctypes.c_int(i * 128)
                args = (vp * 2)(ctypes.cast(ctypes.pointer(table), vp), ctypes.cast(ctypes.pointer(base), vp))
                ck(cu.cuLaunchKernel(f, 1, 1, 1, 128, 1, 1, 0, None, args, None), "cuLaunchKernel")

    order_first = variant in ("modules_first", "eager_modules_first")
    for i in range(4):
        m = vp()
        ck(cu.cuModuleLoadData(ctypes.byref(m), image), "cuModuleLoadData")
        mods.append(m)
        if not order_first:
            lookups(m, i, launch=variant not in ("replay_lookups", "funcload_replay"))
    if order_first:
        for i, m in enumerate(mods):
            lookups(m, i, launch=False)
    ck(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    out = {}
    for i, m in enumerate(mods):
        a, s = u64(), ctypes.c_size_t()
        ck(cu.cuModuleGetGlobal_v2(ctypes.byref(a), ctypes.byref(s), m, b"g00"), "cuModuleGetGlobal")
        b, s2 = u64(), ctypes.c_size_t()
        ck(cu.cuModuleGetGlobal_v2(ctypes.byref(b), ctypes.byref(s2), m, b"g177"), "cuModuleGetGlobal")
        out[f"m{i}"] = [hex(a.value), hex(b.value)]
    return {"addresses": out, "module_loading": os.environ.get("CUDA_MODULE_LOADING", "default")}


# ------------------------------------------------------------ 1. placement probe (parent side)

def placement(log, out: Path, rec: dict) -> list[tuple[str, str]]:
    nvcc = "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else "nvcc"
    arch = os.environ.get("GPUPROXY_NVCC_ARCH", "sm_90")
    cubin = out / "globals_table_kernels.cubin"
    r = subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-O2", "-o", str(cubin), str(KERNELS)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        rec["placement"] = {"error": r.stderr[-2000:]}
        return [("placement probe", f"FAIL (nvcc: {r.stderr[-200:]})")]
    res = {}
    norand = ["setarch", platform.machine(), "-R"]
    for v in VARIANTS:
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        if v.startswith("eager"):
            env["CUDA_MODULE_LOADING"] = "EAGER"
        pre = [] if v == "aslr" else norand
        p = subprocess.run([*pre, sys.executable, __file__, "--probe", v, str(cubin)], capture_output=True,
                           text=True, env=env, timeout=60)
        try:
            res[v] = json.loads(p.stdout.strip().splitlines()[-1])
        except Exception:
            res[v] = {"error": (p.stdout + p.stderr)[-600:]}
    summary = {}
    for v, x in res.items():
        base = res.get(PAIRS.get(v, "app"), {}).get("addresses")
        a = x.get("addresses")
        if not base or not a:
            summary[v] = x.get("error") or x.get("skipped") or "?"
            continue
        same = [k for k in base if a.get(k) == base[k]]
        ref = PAIRS.get(v, "app")
        summary[v] = f"same as {ref}" if len(same) == len(base) else \
            f"differs from {ref} ({len(base) - len(same)} of 4 loads moved)"
    rec["placement"] = {"summary": summary, "raw": res}
    log("placement probe: " + json.dumps(summary))
    ok = summary.get("app_again") == "same as app"
    rec["placement"]["worker_way_reproduces"] = summary.get("funcload_replay") == "same as funcload_app"
    return [("placement probe: the same loads in a fresh process land at the same addresses",
             "PASS" if ok else f"FAIL ({summary.get('app_again')})"),
            ("placement probe: what moves globals (recorded in restlat.json)", "done")]


# ------------------------------------------------------------ 2. the GPU test

def globals_test(log, out: Path, rec: dict) -> list[tuple[str, str]]:
    env = dict(os.environ, GPUPROXY_TEST_GPU="1", GPUPROXY_TEST_BACKEND="cuda")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(ROOT / "tests" / "test_globals_placement.py")], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=240)
    (out / "restlat-globals-pytest.log").write_text(r.stdout + r.stderr)
    tail = (r.stdout.strip().splitlines() or ["(no output)"])[-1]
    rec["globals_test"] = {"rc": r.returncode, "tail": tail,
                           "failures": re.findall(r"^E .*$", r.stdout, re.M)[:12]}
    log(f"test_globals_placement on the GPU: {tail}")
    return [("globals_table: 512 variables with pointers in device memory, none moved", 
             "PASS" if r.returncode == 0 else f"FAIL ({tail})")]


# ------------------------------------------------------------ 2b. the shared host pool

def _scalars(st: dict) -> dict:
    """A dump's or restore's figures without the long lists."""
    out = {k: v for k, v in st.items() if isinstance(v, (int, float, str, bool)) or v is None}
    for k in ("host_pool", "copy", "upload"):
        if isinstance(st.get(k), dict):
            out[k] = {a: b for a, b in st[k].items() if isinstance(b, (int, float, str, bool)) or b is None}
    return out


def host_pool(log, out: Path, rec: dict) -> list[tuple[str, str]]:
    """bench/ckpt_hold.cu holding $RESTLAT_POOL_GIB (8) GiB: without the
    pool (a worker's first dump pins its own memory) and with it
    (GPUPROXY_HOST_POOL_MB): the first dump makes the pool, the restore's
    worker borrows it for its staging ring, and that worker's first dump
    copies into memory page-locked already."""
    sys.path.insert(0, str(ROOT / "bench"))
    from checkpoint_bench import Holder, build_hold, ctl
    from proxy import Daemon
    import shutil
    import tempfile
    gib = float(os.environ.get("RESTLAT_POOL_GIB", "8"))
    exe = build_hold(out)
    res = {"gib": gib}
    for tag, env in (("own", {}), ("shared", {"GPUPROXY_HOST_POOL_MB": str(int(gib * 1024) + 2048)})):
        r = {}
        be = os.environ.get("RESTLAT_BACKEND", "cuda")       # emu: a dry run of this part without a GPU
        d = Daemon(backend=be, emu_kernels=[str(ROOT / "bench" / "ckpt_hold_emu.py")] if be == "emu" else (),
                   env=dict(os.environ, **env), log_path=str(out / f"restlat-pool-{tag}.log")).start()
        tmp = Path(tempfile.mkdtemp(prefix="gpxpool-", dir="/dev/shm"))
        try:
            h = Holder(exe, gib, d.env_for_client())
            s0 = h.checksum()
            r["dump_first"] = _scalars(ctl(d, "dump", pid=h.p.pid, dir=str(tmp / "a"), leave_running=True))
            shutil.rmtree(tmp / "a", ignore_errors=True)
            r["dump_release"] = _scalars(ctl(d, "dump", pid=h.p.pid, dir=str(tmp / "r")))
            rst = ctl(d, "restore", dir=str(tmp / "r"))
            r["restore"] = _scalars(rst)
            r["restore"]["upload_from_memory"] = (rst.get("upload") or {}).get("from_memory")
            shutil.rmtree(tmp / "r", ignore_errors=True)
            r["dump_first_new_worker"] = _scalars(ctl(d, "dump", pid=h.p.pid, dir=str(tmp / "b"),
                                                      leave_running=True))
            r["checksum_ok"] = h.checksum() == s0
            h.close()
        except Exception as e:
            r["error"] = f"{type(e).__name__}: {e}"[-1500:]
        finally:
            d.cleanup()
            shutil.rmtree(tmp, ignore_errors=True)
        res[tag] = r
        log(f"host pool ({tag}): {json.dumps(r)[:3000]}")
    rec["host_pool"] = res
    sh = res.get("shared", {})
    ok = sh.get("checksum_ok") and (sh.get("dump_first_new_worker", {}).get("host_pool") or {}).get("shared") == "lent"
    out_ = [(f"shared host pool, {gib:g} GiB: a new worker's first dump uses the pool the first made, data intact",
             "PASS" if ok else f"FAIL ({sh.get('error') or 'pool not lent'})")]
    # restore from host memory (issue 23 target 4: >= 40 GB/s): the figures side by side
    # from files: the same state restored by the daemon without the pool (its restore reads the image
    # in /dev/shm, by DMA from the file's mapping where it can: direct_upload.py)
    rm, rf = sh.get("restore") or {}, res.get("own", {}).get("restore") or {}
    fm = rm.get("upload_from_memory") or {}
    mem_all = (rm.get("from_memory_bytes") or 0) > 0 and rm.get("from_files_bytes") == 0    # all device memory
    files_only = rf.get("from_memory_bytes") == 0
    gbps = lambda st: round(st["bytes"] / (st["total_ms"] / 1000) / 1e9, 2) if st.get("total_ms") else None
    fig = {"memory_copy_gbps": fm.get("gbps"), "memory_upload_ms": (rm.get("upload") or {}).get("wall_ms"),
           "memory_total_ms": rm.get("total_ms"), "memory_total_gbps": gbps(rm),
           "files_upload_gbps": (rf.get("upload") or {}).get("gbps"), "files_total_ms": rf.get("total_ms"),
           "files_total_gbps": gbps(rf), "files_upload_mode": (rf.get("upload") or {}).get("mode")}
    rec["restore_from_memory"] = fig
    log(f"restore from host memory vs files: {json.dumps(fig)}")
    met = "met" if (fm.get("gbps") or 0) >= 40 else "not met"
    out_.append((f"restore from host memory, {gib:g} GiB: {rm.get('from_memory_bytes')} bytes from the pool, none from files "
                 f"({fm.get('gbps')} GB/s copy, {fig['memory_total_gbps']} GB/s whole restore; from files "
                 f"{fig['files_total_gbps']} GB/s; 40 GB/s {met}), data intact",
                 "PASS" if ok and mem_all and files_only else
                 f"FAIL (from_memory_bytes {rm.get('from_memory_bytes')}, from_files_bytes {rm.get('from_files_bytes')}; files run "
                 f"from_memory_bytes {rf.get('from_memory_bytes')}; {sh.get('error') or ''})"))
    return out_


# ------------------------------------------------------------ 3. PyTorch

def _restore_figures(text: str) -> dict:
    """The restore's JSON report (proxy-cli --json) reduced to what matters here."""
    try:
        j = json.loads(text[text.index("{"):])
    except Exception:
        return {"unparsed": text[-800:]}
    g = j.get("gpu", j)
    keep = ("total_ms", "check_ms", "rebuild_ms", "contexts_modules_ms", "memory_map_ms", "objects_ms", "upload_ms",
            "verify_ms", "modules_mode", "modules", "modules_ms", "modules_prep_ms", "modules_load_ms",
            "functions_ms", "functions_in_order", "globals", "moved_globals_why", "bytes")
    f = {k: g.get(k) for k in keep if k in g}
    f["moved"] = len(g.get("moved_globals") or [])
    for k in ("criu_ms", "gpu_ms", "both_ms", "overlapped", "sequential_why"):
        if k in j:
            f[k] = j[k]
    return f


def torch_part(log, out: Path, rec: dict) -> list[tuple[str, str]]:
    try:
        import torch  # noqa: F401
    except Exception as e:
        rec["torch"] = {"skipped": f"no torch: {e}"}
        return [("torch restores", f"SKIP (no torch: {e})")]
    from proxy import Daemon
    from gpu_check_torch import EXAMPLE, _env, _run, _steps
    from gpuproxy.proxyd.checkpoint.criu import pid_alive
    n, k = 24, 8
    py = sys.executable
    cli = [sys.executable, "-m", "gpuproxy.cli"]
    tmp = Path(f"/tmp/gpx-restlat-{os.getpid()}")
    tmp.mkdir(exist_ok=True)
    t = {"gpu_only": {}, "whole": {}}
    results = []
    ep = f"ipc://{tmp}/proxyd.sock"

    def daemon(tag, env=None):
        return Daemon(backend="cuda", endpoint=ep, log_path=str(out / f"restlat-proxyd-{tag}.log"),
                      env=env).start()
    # the uninterrupted curve (proxied)
    d = daemon("plain")
    try:
        r = _run([py, str(EXAMPLE), "--model", "gpt", "--steps", str(n)], d.env_for_client(_env()), 300)
        want = _steps(r.stdout)
    finally:
        d.cleanup()
    # GPU-only: one wait point, a dump and a restore into a fresh proxyd per mode
    d = daemon("gpu-a")
    proc = subprocess.Popen([py, str(EXAMPLE), "--model", "gpt", "--steps", str(n), "--wait-at-step", str(k)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=d.env_for_client(_env()))
    cli_env = _env({"GPUPROXY_ENDPOINT": ep})
    got, rest = [], ""
    try:
        for line in proc.stdout:
            got.append(line)
            if line == "waiting\n":
                break
        # one dump; the same image restored into a fresh proxyd per mode (the
        # app waits meanwhile, so it attaches to the last one when it goes on)
        img = tmp / "img"
        r = _run([*cli, "--dump", "--gpu-only", "--pid", str(proc.pid), "--dir", str(img)], cli_env, 300)
        if r.returncode != 0:
            raise RuntimeError(f"dump failed: {r.stdout}{r.stderr}")
        for mode in ("unordered", "serial", "parallel"):
            d.kill()
            d = daemon(f"gpu-{mode}", env=dict(os.environ, GPUPROXY_RESTORE_MODULES=mode))
            t0 = time.monotonic()
            r = _run([*cli, "--restore", "--gpu-only", "--json", "--dir", str(img)], cli_env, 300)
            t["gpu_only"][mode] = {"wall_s": round(time.monotonic() - t0, 3), **_restore_figures(r.stdout)}
            if r.returncode != 0:
                raise RuntimeError(f"restore ({mode}) failed: {r.stdout[-1500:]}{r.stderr[-1500:]}")
            log(f"torch gpu-only restore ({mode}): {json.dumps(t['gpu_only'][mode])}")
        proc.stdin.write("\n")
        proc.stdin.flush()
        rest, _ = proc.communicate(timeout=300)
    except Exception as e:
        t["gpu_only"]["error"] = f"{type(e).__name__}: {e}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        d.cleanup()
    same = bool(want) and _steps("".join(got) + rest) == want
    t["gpu_only"]["identical"] = same
    results.append(("torch gpt: GPU-only restores (serial, parallel, unordered module loads), curve identical",
                    "PASS" if same else "FAIL"))
    # whole process: overlap on, then off
    d = daemon("whole-a")
    outf = tmp / "train.out"
    proc = subprocess.Popen([py, str(EXAMPLE), "--model", "gpt", "--steps", str(n), "--pause", "0.3"],
                            stdin=subprocess.DEVNULL, stdout=open(outf, "w"), stderr=open(str(outf) + ".err", "w"),
                            env=d.env_for_client(_env()), start_new_session=True)
    pid = proc.pid
    try:
        for i, (tag, overlap) in enumerate((("overlap", "1"), ("sequential", "0"))):
            at = k + 4 * i
            end = time.monotonic() + 300
            while f"step {at} " not in outf.read_text():
                if not pid_alive(pid) or time.monotonic() > end:
                    raise RuntimeError("the run ended before step %d" % at)
                time.sleep(0.02)
            img = tmp / f"whole-{tag}"
            r = _run([*cli, "--dump", "--pid", str(pid), "--dir", str(img)], cli_env, 300)
            if r.returncode != 0:
                raise RuntimeError(f"whole dump failed: {r.stdout}{r.stderr}")
            if i == 0:
                proc.wait(60)
            else:
                end = time.monotonic() + 60
                while pid_alive(pid) and time.monotonic() < end:
                    time.sleep(0.02)
            d.kill()
            d = daemon(f"whole-{tag}")
            t0 = time.monotonic()
            r = _run([*cli, "--restore", "--json", "--dir", str(img)], dict(cli_env, GPUPROXY_RESTORE_OVERLAP=overlap),
                     300)
            t["whole"][tag] = {"wall_s": round(time.monotonic() - t0, 3), **_restore_figures(r.stdout)}
            if r.returncode != 0:
                raise RuntimeError(f"whole restore ({tag}) failed: {r.stdout[-1500:]}{r.stderr[-1500:]}")
            log(f"torch whole-process restore ({tag}): {json.dumps(t['whole'][tag])}")
        end = time.monotonic() + 300
        while pid_alive(pid) and time.monotonic() < end:
            time.sleep(0.05)
    except Exception as e:
        t["whole"]["error"] = f"{type(e).__name__}: {e}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        try:
            os.kill(pid, 9)
        except OSError:
            pass
        d.cleanup()
    text = outf.read_text() if outf.exists() else ""
    (out / "restlat-torch-whole.log").write_text(text + "\n--- stderr\n" +
                                                 (open(str(outf) + ".err").read() if outf.exists() else ""))
    same = bool(want) and _steps(text) == want
    t["whole"]["identical"] = same
    results.append(("torch gpt: whole-process restores (GPU and CRIU side by side, then one after the other), "
                    "curve identical", "PASS" if same else "FAIL"))
    # every restore but the unordered one (a measuring mode) must keep them all
    moved = {f"{part}/{m}": x.get("moved") for part in t for m, x in t[part].items()
             if isinstance(x, dict) and "moved" in x}
    judged = [v for key, v in moved.items() if not key.endswith("/unordered")]
    results.append((f"torch gpt: __device__ variables moved per restore: {moved}",
                    "PASS" if judged and not any(judged) else "FAIL"))
    rec["torch"] = t
    return results


def run(log, out: Path) -> list[tuple[str, str]]:
    rec: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True)
        rec["device"] = smi.stdout.strip()
    except OSError:
        pass
    results = []
    parts = os.environ.get("RESTLAT_PARTS", "placement,globals,pool,torch").split(",")
    for name, fn in (("placement", placement), ("globals", globals_test), ("pool", host_pool),
                     ("torch", torch_part)):
        if name not in parts:
            continue
        t0 = time.time()
        try:
            results += fn(log, out, rec)
        except Exception as e:
            import traceback
            log(traceback.format_exc())
            rec.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}"
            results.append((f"restlat {name}", "ERROR"))
        rec.setdefault("seconds", {})[name] = round(time.time() - t0, 1)
    rec["results"] = results
    (out / "restlat.json").write_text(json.dumps(rec, indent=1))
    return results


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--probe":
        print(json.dumps(_probe(sys.argv[2], sys.argv[3])))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "gpu-check-out"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from gpu_check_report import appending_log, report_and_exit
    log = appending_log(out / "restlat.log")
    report_and_exit(run(log, out), log)


if __name__ == "__main__":
    main()
