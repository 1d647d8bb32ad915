"""Third-party test suites natively and under gpuproxy, compared test by test
(scripts/gpu_check_python.py steps `jaxsuite` and `cupysparse`, issue 26).

The tests are not part of this repository: they are fetched from the
projects' public repositories at the release installed on the GPU machine and
carried there in .carry/ (scripts/fetch_test_suites.py writes them; never
committed). Each file runs with pytest twice, natively and proxied, at the
same time (separate processes: each proxied one has its own proxyd worker);
the JUnit reports are compared test by test. A test that passes natively and
not proxied is a regression; one that fails in both is the machine's (a
missing optional package, a tolerance), not the proxy's. A file that runs
out of time in either mode is reported, not compared. Results: <label>.json
in the output folder (counts per mode, the regressions), and one PASS/FAIL
line per file.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def junit(path: Path) -> dict[str, str]:
    res = {}
    if not path.exists():
        return res
    for tc in ET.parse(path).getroot().iter("testcase"):
        name = f"{tc.get('classname')}::{tc.get('name')}"
        kids = {c.tag for c in tc}
        res[name] = ("failed" if kids & {"failure", "error"} else "skipped" if "skipped" in kids else "passed")
    return res


def compare(log, out: Path, label: str, tdir: Path, names: list[str], client_env, base_env: dict,
            limit_s: float, pytest_args: list[str] = ()) -> list[tuple[str, str]]:
    """Runs each of `names` (paths relative to tdir) natively (base_env) and
    proxied (client_env(base_env)); returns (check, PASS/FAIL/TIMEOUT) rows."""
    summary, results = {}, []
    for fname in names:
        tag = fname.replace("/", "-").removesuffix(".py")
        procs = {}
        for mode in ("native", "proxied"):
            xml = out / f"{label}-{tag}-{mode}.xml"
            env = dict(base_env) if mode == "native" else client_env(dict(base_env))
            log_f = open(out / f"{label}-{tag}-{mode}.log", "w")
            procs[mode] = (subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                             f"--junitxml={xml}", *pytest_args, fname], stdout=log_f,
                                            stderr=subprocess.STDOUT, env=env, cwd=tdir), xml, log_f)
        runs, timed_out = {}, []
        for mode, (pr, xml, log_f) in procs.items():
            try:
                pr.wait(timeout=limit_s)
            except subprocess.TimeoutExpired:
                pr.kill()
                pr.wait()
                timed_out.append(mode)
            log_f.close()
            runs[mode] = junit(xml)
        count = lambda r, s: sum(1 for v in r.values() if v == s)  # noqa: E731
        nat, prx = runs["native"], runs["proxied"]
        rec = {m: {s: count(runs[m], s) for s in ("passed", "failed", "skipped")} for m in runs}
        if timed_out:
            rec["timed_out"] = timed_out
            summary[fname] = rec
            log(f"{label} {fname}: ran out of time ({limit_s:g} s) in {', '.join(timed_out)}: not compared")
            results.append((f"{label} {fname}", f"TIMEOUT ({', '.join(timed_out)})"))
            continue
        regress = sorted(n for n, v in nat.items() if v == "passed" and prx.get(n) != "passed")
        rec["pass_natively_not_proxied"] = regress
        rec["pass_proxied_not_natively"] = sorted(n for n, v in prx.items() if v == "passed" and nat.get(n) != "passed")
        summary[fname] = rec
        if not nat or not prx:      # nothing ran: a missing file or a collection error, not a pass
            log(f"{label} {fname}: no test ran ({'native' if not nat else 'proxied'}; see {label}-{tag}-*.log)")
            results.append((f"{label} {fname}", "FAIL (no test ran)"))
            continue
        log(f"{label} {fname}: native {rec['native']} proxied {rec['proxied']}; {len(regress)} pass natively only")
        results.append((f"{label} {fname} proxied >= native", "PASS" if not regress else f"FAIL ({len(regress)})"))
    (out / f"{label}.json").write_text(json.dumps(summary, indent=1))
    return results


def _names(tdir: Path, env_var: str, default_glob: str) -> list[str]:
    names = [t for t in os.environ.get(env_var, "").split(",") if t]
    return names or sorted(str(p.relative_to(tdir)) for p in tdir.glob(default_glob))


def _with_carried_wheels(env: dict, carry: Path) -> dict:
    """Pure-Python packages the suites need that the GPU machine may lack
    (absl-py for JAX's tests), carried as an unpacked folder."""
    site = carry / "suite-site"
    if site.is_dir():
        env["PYTHONPATH"] = str(site) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def jax_suite(log, out: Path, root: Path, client_env, base_env: dict) -> list[tuple[str, str]]:
    """JAX's own tests (github.com/jax-ml/jax, tests/ of the installed release:
    .carry/jax-tests/tests, or $GPUPROXY_JAX_TESTS_DIR/tests). Default files:
    random_test.py, linalg_test.py, nn_test.py, sparse_test.py (cuSPARSE) and
    lax_numpy_test.py; $GPUPROXY_JAX_TESTS names others (comma list),
    $GPUPROXY_JAX_TEST_ARGS adds pytest arguments (e.g. "-k Matmul"),
    $GPUPROXY_JAX_TEST_TIMEOUT_S bounds each file per mode (default 900).
    Both modes run with JAX_PLATFORMS=cuda (no CPU fallback) and without
    preallocation (two JAX processes share the GPU)."""
    carry = Path(os.environ.get("GPUPROXY_JAX_TESTS_DIR", str(root / ".carry" / "jax-tests")))
    tdir = carry / "tests"
    if not tdir.is_dir():
        log(f"jax suite: no JAX tests at {tdir} (scripts/fetch_test_suites.py writes them)")
        return [("jax suite", "SKIP (no tests carried)")]
    names = [t for t in os.environ.get("GPUPROXY_JAX_TESTS", "").split(",") if t] or \
        [n for n in ("random_test.py", "linalg_test.py", "nn_test.py", "sparse_test.py", "lax_numpy_test.py")
         if (tdir / n).exists()]
    env = _with_carried_wheels(dict(base_env), carry)
    env.update({"JAX_PLATFORMS": "cuda", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    args = os.environ.get("GPUPROXY_JAX_TEST_ARGS", "").split()
    return compare(log, out, "jax", tdir, names, client_env, env,
                   float(os.environ.get("GPUPROXY_JAX_TEST_TIMEOUT_S", "900")), args)


def cupy_sparse_suite(log, out: Path, root: Path, client_env, base_env: dict) -> list[tuple[str, str]]:
    """CuPy's cupyx_tests/scipy_tests/sparse_tests (github.com/cupy/cupy,
    tests/ of the installed release: .carry/cupy-tests/tests, or
    $GPUPROXY_CUPY_TESTS_DIR/tests): cuSPARSE's generic API as CuPy uses it
    (dense<->sparse, SpMV/SpMM, SpGEMM, SpSV). $GPUPROXY_CUPY_SPARSE_TESTS
    names files (default: every test_*.py there);
    $GPUPROXY_CUPY_TEST_TIMEOUT_S bounds each file per mode (default 600)."""
    carry = Path(os.environ.get("GPUPROXY_CUPY_TESTS_DIR", str(root / ".carry" / "cupy-tests")))
    tdir = carry / "tests"
    sub = "cupyx_tests/scipy_tests/sparse_tests"
    if not (tdir / sub).is_dir():
        log(f"cupy sparse suite: no CuPy tests at {tdir / sub} (scripts/fetch_test_suites.py writes them)")
        return [("cupy sparse suite", "SKIP (no tests carried)")]
    names = _names(tdir, "GPUPROXY_CUPY_SPARSE_TESTS", f"{sub}/test_*.py")
    env = dict(base_env)
    env.setdefault("CUPY_CACHE_DIR", str(out / "cupy-kernel-cache"))
    return compare(log, out, "cupy-sparse", tdir, names, client_env, env,
                   float(os.environ.get("GPUPROXY_CUPY_TEST_TIMEOUT_S", "600")))
