"""Fetches the third-party tests and samples the GPU check compares natively
and proxied (issue 26) into .carry/ (ignored by git, carried to the GPU
machine, which has no network). Nothing fetched here is committed.

    .venv/bin/python scripts/fetch_test_suites.py [--jax-src SRC] [--jax-ref jax-v0.11.0]
                                          [--cupy-src SRC] [--cupy-ref v14.0.1]
                                          [--samples-src SRC] [--samples-ref main]
                                          [--dest .carry] [--skip ...] [--jobs 2]

SRC is a local git repository (a clone or a mirror) or a URL to clone from
(default: the projects' GitHub repositories). Pick the refs of the releases
installed on the GPU machine (`python3 -c 'import jax, cupy; print(jax.__version__,
cupy.__version__)'` there): a test file of another release may test what the
installed one does not have.

Writes:
  .carry/jax-tests/tests/          JAX's tests/ (scripts/suite_compare.py jax_suite)
  .carry/cupy-tests/tests/         CuPy's tests/ (cupy_suite and cupy_sparse_suite)
  .carry/CUDALibrarySamples/       its cuBLAS/ and cuRAND/ (public_suite.py build-libs)
  .carry/suite-site/               absl-py, unpacked (JAX's tests import it; pure Python)
  .carry/libsamples-bin/           the cuBLAS and cuRAND samples built against the headers of
                                   NVIDIA's wheels (nvidia-cublas, nvidia-curand: downloaded
                                   here, only their include/ kept) and gpuproxy's stand-ins
                                   (scripts/public_suite.py build-libs; needs nvcc and an
                                   installed gpuproxy; a few minutes per ten samples)
"""
from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def export(src: str, ref: str, paths: list[str], dest: Path) -> str:
    """`git archive` of `paths` at `ref` from a local repository, or from a
    shallow clone of a URL; returns the commit."""
    tmp = None
    if not Path(src).exists():
        tmp = tempfile.mkdtemp(prefix="gpuproxy-fetch-")
        subprocess.run(["git", "clone", "-q", "--depth", "1", "--branch", ref, src, tmp], check=True)
        src = tmp
    try:
        commit = subprocess.run(["git", "-C", src, "rev-parse", f"{ref}^{{commit}}"], check=True,
                                capture_output=True, text=True).stdout.strip()
        data = subprocess.run(["git", "-C", src, "archive", "--format=tar", commit, *paths], check=True,
                              capture_output=True).stdout
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        with tarfile.open(fileobj=io.BytesIO(data)) as t:
            t.extractall(dest, filter="data")
        (dest / "COMMIT").write_text(f"{ref} {commit}\n")
        return commit
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def absl(dest: Path) -> None:
    """absl-py as a folder on PYTHONPATH (a pure-Python wheel, unpacked)."""
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "-d", d, "absl-py"], check=True)
        whl = next(Path(d).glob("absl_py-*.whl"))
        dest.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(whl) as z:
            z.extractall(dest)


def libsamples(samples: Path, dest: Path, jobs: int) -> None:
    """NVIDIA's cuBLAS/cuRAND samples built for the public-suite run: the
    wheels' headers (include/ only, extracted to a temporary folder), then
    scripts/public_suite.py build-libs."""
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--platform", "manylinux_2_27_x86_64", "--python-version", "3.12", "-d", d,
                        "nvidia-cublas", "nvidia-curand"], check=True)
        inc = Path(d) / "inc"
        for whl in Path(d).glob("nvidia_*.whl"):
            with zipfile.ZipFile(whl) as z:
                for n in z.namelist():
                    if "/include/" in n:
                        z.extract(n, inc)
        subprocess.run([sys.executable, str(ROOT / "scripts" / "public_suite.py"), "build-libs", str(samples),
                        str(dest), "--lib-include", str(inc / "nvidia" / "cu13" / "include"), "--jobs", str(jobs)],
                       check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dest", default=str(ROOT / ".carry"))
    ap.add_argument("--jax-src", default="https://github.com/jax-ml/jax")
    ap.add_argument("--jax-ref", default="jax-v0.11.0")
    ap.add_argument("--cupy-src", default="https://github.com/cupy/cupy")
    ap.add_argument("--cupy-ref", default="v14.0.1")
    ap.add_argument("--samples-src", default="https://github.com/NVIDIA/CUDALibrarySamples")
    ap.add_argument("--samples-ref", default="main")
    ap.add_argument("--skip", default="", help="comma list of: jax,cupy,samples,absl,libsamples")
    ap.add_argument("--jobs", type=int, default=2, help="parallel builds of the library samples")
    a = ap.parse_args()
    dest, skip = Path(a.dest), set(a.skip.split(","))
    if "jax" not in skip:
        c = export(a.jax_src, a.jax_ref, ["tests"], dest / "jax-tests")
        print(f"JAX tests {a.jax_ref} ({c[:12]}) -> {dest / 'jax-tests'}")
    if "cupy" not in skip:
        c = export(a.cupy_src, a.cupy_ref, ["tests"], dest / "cupy-tests")
        print(f"CuPy tests {a.cupy_ref} ({c[:12]}) -> {dest / 'cupy-tests'}")
    if "samples" not in skip:
        c = export(a.samples_src, a.samples_ref, ["cuBLAS", "cuRAND"], dest / "CUDALibrarySamples")
        print(f"CUDALibrarySamples {a.samples_ref} ({c[:12]}) -> {dest / 'CUDALibrarySamples'}")
    if "absl" not in skip:
        absl(dest / "suite-site")
        print(f"absl-py -> {dest / 'suite-site'}")
    if "libsamples" not in skip:
        libsamples(dest / "CUDALibrarySamples", dest / "libsamples-bin", a.jobs)
        print(f"cuBLAS/cuRAND samples built -> {dest / 'libsamples-bin'}")


if __name__ == "__main__":
    main()
