"""Every check that needs the GPU, in one run (scripts/gpu-check calls this).

1. the whole tests/programs corpus natively, then under the proxy (cuda
   backend), comparing outputs byte for byte; then the same programs built
   with NVIDIA's static runtime (-cudart static; step "static");
2. whole-process prerequisites: CRIU usable (installed from .carry/criu by
   scripts/gpu-check), and a proxied CUDA program holds no /dev/nvidia* file
   descriptor or mapping (what lets stock CRIU dump it);
3. the GPU-marked pytest tests (tests/test_whole_process.py among them);
4. the benchmarks (bench/run_bench.py), native and proxied in the same run;
5. with --tcp: the corpus again under the proxy over a keyed (CURVE) tcp
   endpoint, the client with a key of its own listed in authorized_keys, as
   a remote client would be (docs/security.md, "Remote clients");
6. with --python: pycuda (installed from .carry/pycuda), its example and test
   suite, CuPy, cuda-python and PyTorch (cuBLAS/cuBLASLt results compared bit
   for bit), natively and proxied (gpu_check_python.py).
Prints a summary and writes logs under --out ($OUT when set).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import corpus  # noqa: E402
from proxy import Daemon  # noqa: E402


class Log:
    def __init__(self, path: Path):
        self.f = open(path, "w")

    def __call__(self, *a):
        s = " ".join(str(x) for x in a)
        print(s, flush=True)
        self.f.write(s + "\n")
        self.f.flush()


def run_program(b, env=None, timeout=180):
    p = b.program
    if p.driver == "udp_counter":
        out = "".join(corpus.run_udp_counter(b.argv(), env=env, timeout=30))
        return out, "", 0
    r = subprocess.run(b.argv(), capture_output=True, text=True, env=env, timeout=timeout)
    return r.stdout, r.stderr, r.returncode


def tcp_check(log, out: Path) -> list[tuple[str, str]]:
    """The corpus over a keyed tcp endpoint (cuda backend): proxyd's own keys
    in a private key directory, the client with a key pair made by proxy-cli
    keygen, listed for this user, and given by environment only."""
    import socket
    import tempfile
    results = []
    kdir = Path(tempfile.mkdtemp(prefix="gpuproxy-gpucheck-keys-")) / "keys"
    env = {**os.environ, "GPUPROXY_KEY_DIR": str(kdir)}
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        port = so.getsockname()[1]
    d = Daemon(backend="cuda", endpoint=f"tcp://127.0.0.1:{port}", env=env, log_path=str(out / "proxyd-tcp.log"))
    os.environ["GPUPROXY_KEY_DIR"] = str(kdir)      # Daemon.start's ping uses the daemon's own client key
    try:
        d.start()
        ck = kdir.parent / "client.key"
        r = subprocess.run([sys.executable, "-m", "gpuproxy.cli", "keygen", "--out", str(ck)], capture_output=True,
                           text=True, env=env, timeout=60)
        (kdir / "authorized_keys").write_text(r.stdout)
        (kdir / "authorized_keys").chmod(0o600)
        cenv = d.env_for_client({"GPUPROXY_CURVE_KEY_FILE": str(ck), "GPUPROXY_KEY_DIR": str(kdir.parent / "none"),
                                 "GPUPROXY_CURVE_SERVERKEY": (kdir / "curve-server.pub").read_text().strip()})
        built = {b.program.name: b for b in corpus.build_all()}
        for name, b in built.items():
            t = time.time()
            o, e, rc = run_program(b, env=cenv)
            ok = rc == 0 and o == b.program.expected_output
            results.append((f"keyed tcp {name}", "PASS" if ok else "FAIL"))
            log(f"keyed tcp {name}: {'PASS' if ok else 'FAIL'} ({time.time() - t:.2f} s)")
            if not ok:
                log(f"  rc={rc}\n--- stdout\n{o[-1500:]}\n--- stderr\n{e[-3000:]}")
    finally:
        d.stop()
        os.environ.pop("GPUPROXY_KEY_DIR", None)
        shutil.rmtree(kdir.parent, ignore_errors=True)
    return results


def _isolation_first(log, d) -> list[tuple[str, str]]:
    results = []
    src = ROOT / "tests" / "programs_extra" / "isolation.cu"
    iso = corpus.build(corpus.Program(name="isolation", source=src.name, link=(), cubins=(), args=(), emu=None,
                                      expected="", driver=None, pace=False, proxy_only=False, source_path=src),
                       corpus.default_build_dir() / "programs_extra").binary
    r = subprocess.run([str(iso), "assert"], env=d.env_for_client(), capture_output=True, text=True, timeout=120)
    ok = r.returncode == 0 and r.stdout.strip() == "after assert: cudaErrorAssert"
    results.append(("proxied device assert before the corpus", "PASS" if ok else "FAIL"))
    log(f"proxied assert: {r.stdout.strip()} {r.stderr.strip()[-300:]}")
    return results


def _gpu_count() -> int:
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return sum(1 for line in r.stdout.splitlines() if line.startswith("GPU "))


def corpus_check(log, out: Path, daemon_args=(), cudart: str = "shared") -> list[tuple[str, str]]:
    """cudart "static": the same programs with NVIDIA's runtime linked in
    (-cudart static), which reaches the shim through cuGetExportTable."""
    results = []
    t = time.time()
    tag = "" if cudart == "shared" else f" [cudart {cudart}]"
    programs = [p for p in corpus.load_corpus() if cudart == "shared" or p.driver is None]
    ngpu = _gpu_count()
    for p in [p for p in programs if p.devices > ngpu]:
        results.append((f"corpus {p.name}{tag}", f"SKIP (needs {p.devices} GPUs, {ngpu} here)"))
    programs = [p for p in programs if p.devices <= ngpu]
    built = {b.program.name: b for b in corpus.build_all(programs=programs, cudart=cudart)}
    log(f"corpus{tag} built in {time.time() - t:.1f} s ({len(built)} programs)")
    native = {}
    for name, b in built.items():
        if b.program.proxy_only:
            continue
        o, e, rc = run_program(b)
        native[name] = o
        ok = rc == 0 and o == b.program.expected_output
        results.append((f"native {name}{tag}", "PASS" if ok else "FAIL"))
        if not ok:
            log(f"native {name}{tag}: rc={rc}\n{o[-1500:]}\n{e[-1500:]}")
    d = Daemon(backend="cuda", extra_args=list(daemon_args), log_path=str(out / f"proxyd-corpus-{cudart}.log"))
    d.start()
    try:
        # issue 7: a device-side assert (a sticky error in its CUDA context)
        # first, in the same proxyd: with a worker per session it must not
        # reach any program that follows
        if cudart == "shared":
            results += _isolation_first(log, d)
        for name, b in built.items():
            t = time.time()
            o, e, rc = run_program(b, env=d.env_for_client())
            want = b.program.expected_output if b.program.proxy_only else native.get(name)
            ok = rc == 0 and o == want and o == b.program.expected_output
            results.append((f"proxied {name}{tag}", "PASS" if ok else "FAIL"))
            log(f"proxied {name}{tag}: {'PASS' if ok else 'FAIL'} ({time.time() - t:.2f} s)")
            if not ok:
                log(f"  rc={rc}\n--- stdout\n{o[-1500:]}\n--- stderr\n{e[-3000:]}")
    finally:
        d.stop()
    return results


def whole_process_check(log, out: Path) -> list[tuple[str, str]]:
    from gpuproxy.proxyd.checkpoint import criu
    results = []
    try:
        c = criu.usable()
        log(f"CRIU: {c.version_text} ({c.source}: {c.path}); memory tracking "
            f"{'on' if c.mem_tracking() else 'off'}")
        results.append(("CRIU usable", "PASS"))
    except criu.CriuError as e:
        log(f"CRIU unusable: {e}")
        results.append(("CRIU usable", f"FAIL ({e})"))
    b = corpus.build(corpus.get_program("counter"), corpus.default_build_dir())
    d = Daemon(backend="cuda", log_path=str(out / "proxyd-nvidia-fds.log"))
    d.start()
    port = corpus.free_udp_port()
    p = subprocess.Popen(b.argv() + [str(port)], env=d.env_for_client(), stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import socket
        end = time.time() + 60
        while corpus._udp_port_bound(port) is False and time.time() < end:
            time.sleep(0.05)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:    # one request: CUDA is in use
            s.settimeout(60)
            s.sendto(b"hello", ("127.0.0.1", port))
            reply = s.recvfrom(64)[0].decode().strip()
        fds = []
        for fd in os.listdir(f"/proc/{p.pid}/fd"):
            try:
                fds.append(os.readlink(f"/proc/{p.pid}/fd/{fd}"))
            except OSError:
                pass
        maps = Path(f"/proc/{p.pid}/maps").read_text().splitlines()
        nv = [f for f in fds if "nvidia" in f] + [m for m in maps if "/dev/nvidia" in m]
        (out / "proxied-counter-fds-maps.txt").write_text("\n".join(["# fds"] + fds + ["# maps"] + maps) + "\n")
        log(f"proxied counter (reply {reply}): {len(fds)} fds, {len(maps)} mappings, "
            f"{len(nv)} of them /dev/nvidia*" + (f": {nv[:5]}" if nv else ""))
        results.append(("proxied process has no /dev/nvidia* fd or mapping",
                        "PASS" if reply == "101" and not nv else f"FAIL ({nv[:3]}, reply {reply})"))
        # the native program, for contrast
        q = subprocess.Popen(b.argv() + [str(corpus.free_udp_port())], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(3)
        try:
            native = [m for m in Path(f"/proc/{q.pid}/maps").read_text().splitlines() if "/dev/nvidia" in m]
            log(f"native counter, for contrast: {len(native)} /dev/nvidia* mappings")
        finally:
            q.kill()
            q.wait()
    finally:
        p.kill()
        p.wait()
        d.stop()
    return results


def pytest_gpu(log, out: Path, files=(), select: str = "") -> list[tuple[str, str]]:
    """files: test files to run (paths from the repository root); all of
    tests/ when empty. select: a pytest -k expression, or empty."""
    # GPUPROXY_TEST_BACKEND=cuda: the checkpoint tests run on the GPU too
    env = dict(os.environ, GPUPROXY_TEST_GPU="1", GPUPROXY_TEST_BACKEND="cuda")
    targets = [str(ROOT / f) for f in files] or [str(ROOT / "tests")]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-m", "gpu", "-p", "no:cacheprovider",
                        "--durations=15", *(["-k", select] if select else []), *targets], capture_output=True, text=True, env=env, cwd=ROOT, timeout=1500)
    (out / "pytest-gpu.log").write_text(r.stdout + r.stderr)
    lines = r.stdout.strip().splitlines() or ["(no output)"]
    tail = lines[-1]
    log(f"pytest -m gpu{' ' + ' '.join(files) if files else ''}: {tail}")
    if r.returncode != 0:
        log(r.stdout[-6000:])
    return [("pytest -m gpu", "PASS" if r.returncode == 0 else f"FAIL ({tail})")]


def bench(log, out: Path, suites: str) -> list[tuple[str, str]]:
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "run_bench.py"), "--backend", "cuda", "--out", str(out),
                        "--suite", suites], capture_output=True, text=True, cwd=ROOT, timeout=2400)
    (out / "bench.log").write_text(r.stdout + r.stderr)
    log(r.stdout[-6000:])
    if r.returncode != 0:
        log(r.stderr[-4000:])
    return [("benchmarks", "done" if r.returncode == 0 else "FAIL")]


def real_workloads(log, out: Path, sizes: str) -> list[tuple[str, str]]:
    """bench/real_workloads.py: its table in the log, real.json in out; PASS
    when every checkpointed run's loss curve equals the uninterrupted one."""
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "real_workloads.py"), "--out", str(out),
                        "--sizes", sizes], capture_output=True, text=True, cwd=ROOT, timeout=600)
    (out / "real.log").write_text(r.stdout + r.stderr)
    log(r.stdout[r.stdout.rfind("| size |"):] if "| size |" in r.stdout else r.stdout[-4000:])
    if r.returncode not in (0, 1):
        log(r.stderr[-4000:])
    return [("real workloads: checkpointed curves identical to uninterrupted",
             "PASS" if r.returncode == 0 else f"FAIL (rc {r.returncode}, see real.log)")]


def python_frameworks(log, out: Path, carry: Path, steps) -> list[tuple[str, str]]:
    import gpu_check_python
    return gpu_check_python.run(log, out, carry, steps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "gpu-check-out"))
    ap.add_argument("--skip", default="", help="comma list of: corpus,static,whole,pytest,bench")
    ap.add_argument("--bench-suites", default="micro,roundtrip,rtprofile,checkpoint,small,clients,pin,whole",
                    help="bench/run_bench.py suites (micro,roundtrip,rtprofile,checkpoint,small,clients,pin,whole)")
    ap.add_argument("--pytest-files", default="",
                    help="comma list of test files for the pytest step (default: all of tests/)")
    ap.add_argument("--pytest-k", default="", help="a pytest -k expression for the pytest step")
    ap.add_argument("--tcp", action="store_true", help="also the corpus over a keyed (CURVE) tcp endpoint")
    ap.add_argument("--python", action="store_true", help="also the Python-framework checks (gpu_check_python.py)")
    ap.add_argument("--multigpu", action="store_true",
                    help="also the multi-GPU checks (gpu_check_multigpu.py: peer copies, x.to('cuda:1'), DDP; "
                         "$GPUPROXY_TORCH_PYTHON names a python that has PyTorch)")
    ap.add_argument("--real", action="store_true",
                    help="also the real-workload checkpoint suite (bench/real_workloads.py: Llama training, small "
                         "and 0.78 B, gpuproxy vs cuda-checkpoint + CRIU; about 4 minutes)")
    ap.add_argument("--real-sizes", default="small,big", help="the --real suite's sizes (small,big)")
    ap.add_argument("--contract", action="store_true",
                    help="also the preemption contract with a PyTorch training (gpu_check_contract.py: SIGTERM "
                         "checkpoints, restores on fresh proxyds, the second onto GPU 1 where there are two; "
                         "$GPUPROXY_TORCH_PYTHON names a python that has PyTorch)")
    ap.add_argument("--multigpu-steps", default="pytest,peer,ddp,fsdp,ckpt,fsdpckpt,wpckpt,bench",
                    help="comma list of the --multigpu steps (gpu_check_multigpu.STEPS)")
    ap.add_argument("--oldcuda", action="store_true",
                    help="also programs built for CUDA 12.4 and 11.8 and the oldest-driver mode (gpu_check_oldcuda.py)")
    ap.add_argument("--pycuda-from", default=str(ROOT / ".carry" / "pycuda"),
                    help="folder with pycuda's sdist and its dependencies' wheels (no network on the GPU machine)")
    ap.add_argument("--python-steps", default="example,suite,frameworks,tests,jax",
                    help="comma list of the --python steps to run (gpu_check_python.STEPS; "
                         "`jax`: JAX's digests natively/proxied with and without command buffers; "
                         "`torch` too, with $GPUPROXY_TORCH_PYTHON naming a python that has PyTorch; "
                         "`jaxsuite`, `cupysparse`: JAX's tests and CuPy's sparse tests compared natively/proxied, "
                         "carried in .carry/ by scripts/fetch_test_suites.py)")
    ap.add_argument("--restlat", action="store_true",
                    help="also restore latency and globals at their addresses (gpu_check_restlat.py, issue 23)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / "gpu-check.log")
    smi = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total", "--format=csv"],
                         capture_output=True, text=True)
    log(smi.stdout.strip() or smi.stderr.strip())
    log("cuda-checkpoint:", shutil.which("cuda-checkpoint") or "not found")
    skip = set(a.skip.split(","))
    results: list[tuple[str, str]] = []
    # the optional parts run only when their option is given
    optional = {"python": a.python, "tcp": a.tcp, "multigpu": a.multigpu, "oldcuda": a.oldcuda,
                "restlat": a.restlat, "real": a.real, "contract": a.contract}
    for name, fn in (("corpus", lambda: corpus_check(log, out)),
                     ("static", lambda: corpus_check(log, out, cudart="static")),
                     ("whole", lambda: whole_process_check(log, out)),
                     ("pytest", lambda: pytest_gpu(log, out, [f for f in a.pytest_files.split(",") if f], a.pytest_k)),
                     ("bench", lambda: bench(log, out, a.bench_suites)),
                     ("tcp", lambda: tcp_check(log, out)),
                     ("python", lambda: python_frameworks(log, out, Path(a.pycuda_from), a.python_steps.split(","))),
                     ("multigpu", lambda: __import__("gpu_check_multigpu").run(log, out,
                                                                               steps=a.multigpu_steps.split(","))),
                     ("oldcuda", lambda: __import__("gpu_check_oldcuda").oldcuda_check(log, out)),
                     ("restlat", lambda: __import__("gpu_check_restlat").run(log, out)),
                     ("real", lambda: real_workloads(log, out, a.real_sizes)),
                     ("contract", lambda: __import__("gpu_check_contract").run(log, out))):
        if name in skip or not optional.get(name, True):
            continue
        t = time.time()
        try:
            results += fn()
        except Exception:
            log(traceback.format_exc())
            results.append((name, "ERROR"))
        log(f"[{name} took {time.time() - t:.1f} s]")
    log("\n==== summary ====")
    for what, res in results:
        log(f"{res:6s} {what}")
    bad = [r for r in results if not r[1].startswith(("PASS", "done", "SKIP", "INFO"))]
    skipped = sum(1 for r in results if r[1].startswith("SKIP"))
    log(f"{len(results) - len(bad) - skipped} passed, {skipped} skipped (reason given), {len(bad)} failed")
    (out / "summary.json").write_text(json.dumps(results, indent=1))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
