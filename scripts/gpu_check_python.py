"""The Python-framework part of the GPU check (scripts/gpu_check.py --python).

1. installs pycuda from .carry/pycuda (scripts/install-pycuda --from; the GPU
   machine has no network) into gpuproxy's private site folder;
2. examples/train_mlp_pycuda.py natively and under the proxy: the loss curves
   must be identical; seconds per epoch of both go to python-epoch-times.json
   (docs/benchmarks.md);
3. tests/test_pycuda.py on the GPU (curve vs the numpy reference, and a
   mid-training dump / fresh proxyd / restore with a byte-identical curve);
4. pycuda's own test_driver.py, test_gpuarray.py, test_cumath.py (from the
   sdist) natively and proxied, per-test outcomes compared
   (pycuda-tests.json: counts, and every test that passes natively but not
   under the proxy);
5. CuPy, cuda-python and PyTorch-library feature checks (scripts/pyframeworks/*)
   natively and proxied (cupy.json, cuda-python.json, torch-libraries.json);
   the matrix products (cupy.matmul, torch.mm/bmm/Linear: cuBLAS and
   cuBLASLt in the worker, docs/libraries.md) must give bit-identical results;
6. steps `jaxsuite` and `cupysparse` (not in the default --python-steps: the
   tests are carried, scripts/fetch_test_suites.py): JAX's own tests and CuPy's
   cupyx_tests/scipy_tests/sparse_tests natively and proxied, compared test
   by test (scripts/suite_compare.py: jax.json, cupy-sparse.json); step
   `jax` runs scripts/pyframeworks/jax_check.py (JAX on the GPU, no CPU
   fallback, a jit/grad training loop) natively and proxied, with and
   without XLA's command buffers, digest by digest (scripts/gpu_check_jax.py:
   jax-digests.json);
7. step `torch` (not in the default --python-steps: PyTorch is not installed
   by gpuproxy): examples/train_torch.py natively and proxied, a mid-training
   dump/restore, step times, import-to-first-kernel (gpu_check_torch.py,
   torch.json).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from proxy import Daemon  # noqa: E402

import gpu_check_jax  # noqa: E402  (scripts/gpu_check_jax.py: this script's folder is on sys.path)
import suite_compare  # noqa: E402  (scripts/suite_compare.py)

PYCUDA_VERSION = "2026.1"
# GPUPROXY_PYCUDA_TESTS=test_driver.py,... runs a subset (a time-limited runner splits the suite)
PYCUDA_TESTS = [t for t in os.environ.get("GPUPROXY_PYCUDA_TESTS", "test_driver.py,test_gpuarray.py,test_cumath.py")
                .split(",") if t]


def _site() -> str:
    return os.environ.get("GPUPROXY_SITE", "/tmp/gpuproxy-site")


def _env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    cuda_bin = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin")
    env["PATH"] = cuda_bin + os.pathsep + env.get("PATH", "")   # SourceModule needs nvcc
    env.pop("LD_PRELOAD", None)
    env.update(extra or {})
    return env


def install_pycuda(log, out: Path, carry: Path) -> bool:
    r = subprocess.run(["bash", str(ROOT / "scripts" / "install-pycuda"), "--from", str(carry)],
                       capture_output=True, text=True, timeout=1500,
                       env=_env({"PYTHON": sys.executable, "PYCUDA_TARGET": _site()}))
    (out / "install-pycuda.log").write_text(r.stdout + r.stderr)
    log(f"install-pycuda: rc={r.returncode}")
    if r.returncode != 0:
        log(r.stdout[-3000:] + r.stderr[-3000:])
    return r.returncode == 0


def _epochs(stdout: str):
    curve, times = [], []
    for line in stdout.splitlines():
        m = re.match(r"^epoch (\d+) loss (\S+) time (\S+)$", line)
        if m:
            curve.append(m.group(2))
            times.append(float(m.group(3)))
    return curve, times


def example(log, out: Path, d: Daemon) -> list[tuple[str, str]]:
    argv = [sys.executable, str(ROOT / "examples" / "train_mlp_pycuda.py"), "--epochs", "20", "--time"]
    nat = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=_env())
    prx = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=d.env_for_client(_env()))
    (out / "example-native.log").write_text(nat.stdout + nat.stderr)
    (out / "example-proxied.log").write_text(prx.stdout + prx.stderr)
    cn, tn = _epochs(nat.stdout)
    cp, tp = _epochs(prx.stdout)
    same = nat.returncode == 0 and prx.returncode == 0 and cn == cp and len(cn) == 20
    # the first epoch includes the module load and warm-up: report the rest
    med = (lambda t: sorted(t[1:])[len(t[1:]) // 2] if len(t) > 1 else None)
    times = {"native_s_per_epoch_median": med(tn), "proxied_s_per_epoch_median": med(tp),
             "native": tn, "proxied": tp}
    (out / "python-epoch-times.json").write_text(json.dumps(times, indent=1))
    log(f"pycuda example: curves {'identical' if same else 'DIFFER'}; s/epoch native {med(tn)} proxied {med(tp)}")
    if not same:
        log(nat.stdout[-1500:] + nat.stderr[-1500:] + "\n---\n" + prx.stdout[-1500:] + prx.stderr[-1500:])
    return [("pycuda example native == proxied", "PASS" if same else "FAIL")]


def test_pycuda_on_gpu(log, out: Path) -> list[tuple[str, str]]:
    env = _env({"GPUPROXY_TEST_GPU": "1", "GPUPROXY_TEST_BACKEND": "cuda"})
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(ROOT / "tests" / "test_pycuda.py")], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=1200)
    (out / "test_pycuda-gpu.log").write_text(r.stdout + r.stderr)
    tail = (r.stdout.strip().splitlines() or ["(no output)"])[-1]
    log(f"tests/test_pycuda.py on the GPU (incl. mid-training dump/restore): {tail}")
    return [("tests/test_pycuda.py (cuda backend)", "PASS" if r.returncode == 0 else f"FAIL ({tail})")]


def pycuda_suite(log, out: Path, carry: Path, d: Daemon) -> list[tuple[str, str]]:
    tmp = Path(tempfile.mkdtemp(prefix="pycuda-src-"))
    with tarfile.open(carry / f"pycuda-{PYCUDA_VERSION}.tar.gz") as t:
        t.extractall(tmp, filter="data")
    tdir = tmp / f"pycuda-{PYCUDA_VERSION}" / "test"
    summary, results = {}, []
    for fname in PYCUDA_TESTS:
        runs = {}
        for mode in ("native", "proxied"):
            xml = out / f"pycuda-{fname[:-3]}-{mode}.xml"
            env = _env() if mode == "native" else d.env_for_client(_env())
            # run from the test folder, not the source tree: `import pycuda` must be the installed one
            r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                                fname], capture_output=True, text=True, env=env, cwd=tdir, timeout=1500)
            (out / f"pycuda-{fname[:-3]}-{mode}.log").write_text(r.stdout + r.stderr)
            runs[mode] = suite_compare.junit(xml)
        nat, prx = runs["native"], runs["proxied"]
        count = lambda r, s: sum(1 for v in r.values() if v == s)  # noqa: E731
        regress = sorted(n for n, v in nat.items() if v == "passed" and prx.get(n) != "passed")
        summary[fname] = {"native": {s: count(nat, s) for s in ("passed", "failed", "skipped")},
                          "proxied": {s: count(prx, s) for s in ("passed", "failed", "skipped")},
                          "pass_natively_not_proxied": regress}
        log(f"pycuda {fname}: native {summary[fname]['native']} proxied {summary[fname]['proxied']}; "
            f"{len(regress)} pass natively only")
        results.append((f"pycuda {fname} proxied >= native", "PASS" if not regress else f"FAIL ({len(regress)})"))
    (out / "pycuda-tests.json").write_text(json.dumps(summary, indent=1))
    return results


def cupy_suite(log, out: Path, d: Daemon) -> list[tuple[str, str]]:
    """A chosen part of CuPy's own test suite (issue 11), natively and
    proxied side by side, compared test by test. The tests are not part of
    this repository: scripts/gpu-check's caller carries them (a `git
    archive` of the matching CuPy release's tests/, e.g. .carry/cupy-tests;
    $GPUPROXY_CUPY_TESTS_DIR). $GPUPROXY_CUPY_TESTS names the files (default:
    every test_*.py there); $GPUPROXY_CUPY_TEST_TIMEOUT_S bounds each file
    per mode (default 120): a file that runs out of time in either mode is
    reported, not compared."""
    root = Path(os.environ.get("GPUPROXY_CUPY_TESTS_DIR", str(ROOT / ".carry" / "cupy-tests")))
    tdir = root / "tests"
    if not tdir.is_dir():
        log(f"cupy suite: no CuPy tests at {tdir} (carry them: see scripts/gpu_check_python.py)")
        return [("cupy suite", "SKIP (no tests carried)")]
    names = suite_compare._names(tdir, "GPUPROXY_CUPY_TESTS", "**/test_*.py")
    # names may be given from cupy_tests/ (CuPy's own layout: tests/cupy_tests/<group>/test_x.py)
    names = [n if (tdir / n).exists() or not (tdir / "cupy_tests" / n).exists() else f"cupy_tests/{n}"
             for n in names]
    # the runner is scripts/suite_compare.py's (natively and proxied side by side, test by test)
    return suite_compare.compare(log, out, "cupy", tdir, names, d.env_for_client,
                                 _env({"CUPY_CACHE_DIR": str(out / "cupy-kernel-cache")}),
                                 float(os.environ.get("GPUPROXY_CUPY_TEST_TIMEOUT_S", "120")))


def feature_checks(log, out: Path, d: Daemon) -> list[tuple[str, str]]:
    results = []
    only = [n for n in os.environ.get("GPUPROXY_FRAMEWORK_CHECKS", "").split(",") if n]
    for name, script, module in (("cupy", "cupy_check.py", "cupy"),
                                 ("cuda-python", "cuda_python_check.py", "cuda.bindings.driver"),
                                 ("numba-cuda", "numba_check.py", "numba.cuda"),
                                 ("torch-libraries", "torch_check.py", "torch"),
                                 ("torch-compile", "torch_compile_check.py", "torch")):
        # JAX: step `jax` (scripts/gpu_check_jax.py, digest by digest, with and without command buffers)
        # $GPUPROXY_FRAMEWORK_CHECKS (comma list of the names above) runs a part
        if only and name not in only:
            continue
        if subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, env=_env()).returncode:
            log(f"{name}: not installed on this machine")
            results.append((f"{name} checks", "FAIL (not installed)"))
            continue
        rec = {}
        extra = None
        for mode in ("native", "proxied"):
            env = _env(extra) if mode == "native" else d.env_for_client(_env(extra))
            r = subprocess.run([sys.executable, str(ROOT / "scripts" / "pyframeworks" / script)], capture_output=True,
                               text=True, env=env, timeout=900)
            (out / f"{name}-{mode}.log").write_text(r.stdout + r.stderr)
            try:
                rec[mode] = json.loads(r.stdout)
            except ValueError:
                rec[mode] = {"(script)": f"FAIL: rc={r.returncode} {r.stderr.strip().splitlines()[-1:]}"}
        (out / f"{name}.json").write_text(json.dumps(rec, indent=1))
        for check, v in rec["native"].items():
            log(f"{name}: {check}: native {v} | proxied {rec['proxied'].get(check)}")
        # recorded, not judged: the results go to docs/compatibility.md
        results.append((f"{name} checks (see {name}.json)", "done"))
        nd, pd = rec["native"].get("result digests"), rec["proxied"].get("result digests")
        if isinstance(nd, dict) and nd:
            # library calls (cuBLAS, cuBLASLt) run by NVIDIA's library in the
            # worker on the same GPU: the results must be the same bits
            same = isinstance(pd, dict) and all(pd.get(k) == v for k, v in nd.items())
            log(f"{name}: result digests native {nd} | proxied {pd}")
            results.append((f"{name} library results bit-identical to native", "PASS" if same else "FAIL"))
    return results


STEPS = ("example", "suite", "frameworks", "tests", "torch", "cupysuite", "jax", "jaxsuite", "cupysparse")


def _pycuda_installed() -> bool:
    return subprocess.run([sys.executable, "-c", "import pycuda.driver"], capture_output=True,
                          env=_env()).returncode == 0


def run(log, out: Path, carry: Path, steps=STEPS) -> list[tuple[str, str]]:
    """steps: any of STEPS (so that a run can be split across several calls
    of a time-limited runner; the install is skipped when pycuda imports)."""
    results = []
    if not set(steps) & {"example", "suite", "tests"}:
        log("pycuda not needed by the steps asked for")   # frameworks alone: CuPy, cuda-python
    elif _pycuda_installed():
        log("pycuda already installed")
        results.append(("install pycuda", "PASS"))
    elif not install_pycuda(log, out, carry):
        return [("install pycuda", "FAIL")]
    else:
        results.append(("install pycuda", "PASS"))
    if not set(steps) & {"example", "suite", "frameworks", "cupysuite", "jax", "jaxsuite", "cupysparse"}:
        d = None                 # the remaining steps start their own proxyd
    else:
        d = Daemon(backend="cuda", log_path=str(out / "proxyd-python.log"))
        d.start()
    try:
        for name, step in (("example", lambda: example(log, out, d)),
                           ("suite", lambda: pycuda_suite(log, out, carry, d)),
                           ("frameworks", lambda: feature_checks(log, out, d)),
                           ("cupysuite", lambda: cupy_suite(log, out, d)),
                           # issue 26: JAX's digests natively/proxied, with and without command buffers
                           ("jax", lambda: gpu_check_jax.run(log, out, d.env_for_client, _env())),
                           # issue 26: JAX's and CuPy's sparse tests compared test by test (suite_compare.py)
                           ("jaxsuite", lambda: suite_compare.jax_suite(log, out, ROOT, d.env_for_client, _env())),
                           ("cupysparse", lambda: suite_compare.cupy_sparse_suite(log, out, ROOT, d.env_for_client,
                                                                                  _env()))):
            if name not in steps:
                continue
            try:
                results += step()
            except Exception as e:   # one failing step must not hide the others' results
                log(f"{name} failed: {type(e).__name__}: {e}")
                results.append((name, "ERROR"))
    finally:
        if d is not None:
            d.stop()
    if "tests" in steps:
        results += test_pycuda_on_gpu(log, out)
    if "torch" in steps:
        import gpu_check_torch
        results += gpu_check_torch.run(log, out)
    return results
