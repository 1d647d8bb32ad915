"""Third-party test suites natively and under gpuproxy, compared test by test
(scripts/gpu_check_python.py steps `jaxsuite` and `cupysparse`, issue 26).

The tests are not part of this repository: they are fetched from the
projects' public repositories at the release installed on the GPU machine and
carried there in .carry/ (scripts/fetch_test_suites.py writes them; never
committed). The chosen files run with pytest -v twice, natively and proxied,
at the same time (separate processes: each proxied one has its own proxyd
worker), in one pytest per mode (one interpreter start) or one per file;
the outcomes printed are compared test by test. A test that passes
natively and not proxied is a regression; one that fails in both is the
machine's (a missing optional package, a tolerance), not the proxy's. A
run that reaches its time limit is stopped and the tests both modes
finished are compared (the result says "partial" and how many). Results:
<label>.json in the output folder (counts per mode, the regressions), and
one PASS/FAIL row per run.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
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


_VERBOSE = re.compile(r"^(\S+::\S.*?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
_OUTCOME = {"PASSED": "passed", "XPASS": "passed", "FAILED": "failed", "ERROR": "failed", "SKIPPED": "skipped",
            "XFAIL": "skipped"}


def verbose_outcomes(text: str) -> dict[str, str]:
    """Per-test outcomes from pytest -v output ("path::test[params] PASSED
    [ 3%]"), as far as the run got: a run stopped for time still counts
    the tests it finished. A test reported twice (an error in teardown
    after a pass) keeps the worse outcome."""
    res: dict[str, str] = {}
    for line in text.splitlines():
        m = _VERBOSE.match(line)
        if m:
            v = _OUTCOME[m.group(2)]
            if res.get(m.group(1)) != "failed":
                res[m.group(1)] = v
    return res


def compare(log, out: Path, label: str, tdir: Path, names: list[str], client_env, base_env: dict,
            limit_s: float, pytest_args: list[str] = (), together: bool = False) -> list[tuple[str, str]]:
    """Runs each of `names` (paths relative to tdir; with together=True all
    of them in one pytest per mode: one interpreter start) natively
    (base_env) and proxied (client_env(base_env)) at the same time, and
    compares the outcomes test by test; returns (check, PASS/FAIL) rows.
    A run that runs out of time is stopped: the tests both modes finished
    are compared, and the row says how many (PASS (partial ...))."""
    summary, results = {}, []
    groups = [names] if together else [[n] for n in names]
    for group in groups:
        key = " ".join(group)
        tag = group[0].replace("/", "-").removesuffix(".py") + (f"-and-{len(group) - 1}" if len(group) > 1 else "")
        procs = {}
        for mode in ("native", "proxied"):
            env = dict(base_env) if mode == "native" else client_env(dict(base_env))
            log_f = open(out / f"{label}-{tag}-{mode}.log", "w+")
            # a file that fails to import must not stop the others of its run
            procs[mode] = (subprocess.Popen([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                                             "--continue-on-collection-errors", *pytest_args, *group], stdout=log_f,
                                            stderr=subprocess.STDOUT, env=env, cwd=tdir), log_f)
        deadline = time.monotonic() + limit_s
        runs, timed_out = {}, []
        for mode, (pr, log_f) in procs.items():
            try:
                pr.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pr.kill()
                pr.wait()
                timed_out.append(mode)
            log_f.seek(0)
            runs[mode] = verbose_outcomes(log_f.read())
            log_f.close()
        count = lambda r, s: sum(1 for v in r.values() if v == s)  # noqa: E731
        nat, prx = runs["native"], runs["proxied"]
        rec = {m: {s: count(runs[m], s) for s in ("passed", "failed", "skipped")} for m in runs}
        both = set(nat) & set(prx)
        # with a run stopped for time, only the tests both modes finished say anything
        judged = both if timed_out else set(nat)
        regress = sorted(n for n in judged if nat[n] == "passed" and prx.get(n) != "passed")
        rec["pass_natively_not_proxied"] = regress
        rec["pass_proxied_not_natively"] = sorted(n for n in judged if prx.get(n) == "passed" and nat[n] != "passed")
        if timed_out:
            rec["timed_out"] = timed_out
            rec["compared"] = len(both)
        summary[key] = rec
        name = f"{label} {key if len(group) == 1 else f'{len(group)} files'}"
        if not nat or not prx:      # nothing ran: a missing file or a collection error, not a pass
            log(f"{name}: no test ran ({'native' if not nat else 'proxied'}; see {label}-{tag}-*.log)")
            results.append((name, "FAIL (no test ran)"))
            continue
        part = f" (stopped at {limit_s:g} s in {', '.join(timed_out)}: {len(both)} tests compared)" if timed_out else ""
        log(f"{name}: native {rec['native']} proxied {rec['proxied']}; {len(regress)} pass natively only{part}")
        verdict = "PASS" if not regress else f"FAIL ({len(regress)})"
        if timed_out:
            verdict += f" (partial: {len(both)} compared)"
        results.append((f"{name} proxied >= native", verdict))
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


# JAX's test files run by default (issue 26): what the proxy remotes for JAX:
# cuSOLVER (eigh incl. the batched 64-bit API, svd), cuFFT, XLA's training
# code (stax, optimizers), iterative solvers (while loops), cuSPARSE; each
# test's generated cases cut to one (JAX_NUM_GENERATED_CASES=1) so the part
# runs in about a minute natively
JAX_DEFAULT = ("eigh_test.py", "svd_test.py", "fft_test.py", "stax_test.py", "optimizers_test.py",
               "lax_scipy_sparse_test.py", "sparse_test.py")
# CuPy's sparse test files run by default: construction, dense <-> sparse,
# DIA/COO, extraction (cusparse generic API); the large CSR/CSC/linalg files
# take minutes and run when named ($GPUPROXY_CUPY_SPARSE_TESTS)
CUPY_SPARSE_DEFAULT = ("test_base.py", "test_extract.py", "test_construct.py", "test_dia.py", "test_coo.py")


def jax_suite(log, out: Path, root: Path, client_env, base_env: dict) -> list[tuple[str, str]]:
    """JAX's own tests (github.com/jax-ml/jax, tests/ of the installed release:
    .carry/jax-tests/tests, or $GPUPROXY_JAX_TESTS_DIR/tests): the files of
    JAX_DEFAULT in one pytest per mode, or those $GPUPROXY_JAX_TESTS names
    (comma list); $GPUPROXY_JAX_TEST_ARGS adds pytest arguments (e.g. "-k
    Eigh"); $GPUPROXY_JAX_TEST_TIMEOUT_S bounds the run (default 90: what
    finished in both modes by then is compared); $JAX_NUM_GENERATED_CASES
    (default 1) how many generated cases each test runs. Both modes run
    with JAX_PLATFORMS=cuda (no CPU fallback) and without preallocation (two
    JAX processes share the GPU)."""
    carry = Path(os.environ.get("GPUPROXY_JAX_TESTS_DIR", str(root / ".carry" / "jax-tests")))
    tdir = carry / "tests"
    if not tdir.is_dir():
        log(f"jax suite: no JAX tests at {tdir} (scripts/fetch_test_suites.py writes them)")
        return [("jax suite", "SKIP (no tests carried)")]
    names = [t for t in os.environ.get("GPUPROXY_JAX_TESTS", "").split(",") if t] or \
        [n for n in JAX_DEFAULT if (tdir / n).exists()]
    env = _with_carried_wheels(dict(base_env), carry)
    env.update({"JAX_PLATFORMS": "cuda", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    env.setdefault("JAX_NUM_GENERATED_CASES", os.environ.get("JAX_NUM_GENERATED_CASES", "1"))
    args = os.environ.get("GPUPROXY_JAX_TEST_ARGS", "").split()
    return compare(log, out, "jax", tdir, names, client_env, env,
                   float(os.environ.get("GPUPROXY_JAX_TEST_TIMEOUT_S", "90")), args, together=True)


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
    names = [t for t in os.environ.get("GPUPROXY_CUPY_SPARSE_TESTS", "").split(",") if t] or \
        [f"{sub}/{n}" for n in CUPY_SPARSE_DEFAULT if (tdir / sub / n).exists()]
    env = dict(base_env)
    env.setdefault("CUPY_CACHE_DIR", str(out / "cupy-kernel-cache"))
    args = os.environ.get("GPUPROXY_CUPY_SPARSE_TEST_ARGS", "").split()
    return compare(log, out, "cupy-sparse", tdir, names, client_env, env,
                   float(os.environ.get("GPUPROXY_CUPY_TEST_TIMEOUT_S", "60")), args, together=True)
