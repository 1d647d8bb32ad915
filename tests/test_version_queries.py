"""No silent fallback (issue 26): every version and property query of the
CUDA APIs gpuproxy stands in for is answered.

Frameworks decide whether the GPU works from such queries: JAX's CUDA
plugin calls cusparseGetProperty, cublasGetVersion(NULL, ...), cufftGetVersion,
cudnnGetVersion, ... at start and runs on the CPU, quietly, when one of them
fails. So (1) no spec family may answer not-supported to a function named
like a version or property query, and each has a body on both backends (the
emulated one's method, or the generic path's declaration for NVIDIA's
library); (2) a C program calling each of them under the emulated backend
gets the values of the headers' version macros (NVIDIA's headers where
installed, GPUPROXY_LIB_INCLUDE or nvidia/cu13/include of this Python; else
the versions the emulated backend reports, proxyd/backends/emu/versions.py, which
test_emulated_versions_are_the_headers checks against those headers).
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import client_env

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "autogen"))

import libbootstrap  # noqa: E402
import specload  # noqa: E402

# VersionCheck: cuDNN's sub-library checks (cudnnOpsVersionCheck, ...), which
# cuDNN's frontend calls before using that part (JAX's convolutions on the
# H100 printed 39 of each as not-supported and differed from native)
QUERY = re.compile(r"GetVersion|GetProperty|GetCudartVersion|getVersion|VersionCheck|"
                   r"^nvmlSystemGet(Driver|NVML|CudaDriver)Version")
LIBRARY_APIS = ("cublas", "cublaslt", "nvml", "cudnn", "cufft", "curand", "cusparse", "cusolver")


def _queries():
    specs = specload.load_specs(REPO / "specs")
    return [f for f in specs.functions + specs.libraries
            if QUERY.search(f.name) and getattr(f, "declared", True) is not False]


def test_every_version_query_is_supported_with_a_body_on_both_backends():
    from gpuproxy.proxyd._generated import LIBRARY_CDEF
    from gpuproxy.emu.cudnn import EmuCudnn
    from gpuproxy.emu.blas import EmuLibrary
    from gpuproxy.emu.mathlibs import CLASSES
    found = _queries()
    names = {f.name for f in found}
    # the ones JAX's plugin and PyTorch call at start must be among them
    assert {"cusparseGetProperty", "cublasGetVersion_v2", "cufftGetVersion", "cudnnGetVersion",
            "cusolverGetVersion", "cudaRuntimeGetVersion", "cuDriverGetVersion",
            "nvmlSystemGetDriverVersion"} <= names
    problems = []
    for f in found:
        if not f.supported:
            problems.append(f"{f.name} ({f.file}) answers not-supported")
            continue
        if f.api not in LIBRARY_APIS or f.shim == "override":
            continue        # driver/runtime: remoted or answered in the shim; overrides: C bodies
        emu = EmuCudnn if f.api == "cudnn" else CLASSES.get(f.api, EmuLibrary)
        if not hasattr(emu, "f_" + f.name):
            problems.append(f"{f.name}: no emulated body ({emu.__name__}.f_{f.name})")
        if not re.search(rf"\b{f.name}\(", LIBRARY_CDEF[f.api][1]):
            problems.append(f"{f.name}: no declaration for NVIDIA's library (the generic path)")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------ header values

_MACROS = {  # api -> (header, macro prefix)
    "cublas": ("cublas_api.h", "CUBLAS_VER_"), "cusparse": ("cusparse.h", "CUSPARSE_VER_"),
    "curand": ("curand.h", "CURAND_VER_"), "cufft": ("cufft.h", "CUFFT_VER_"),
    "cusolver": ("cusolver_common.h", "CUSOLVER_VER_"), "cudnn": ("cudnn_version.h", "CUDNN_"),
}
_PARTS = {"cudnn": ("MAJOR", "MINOR", "PATCHLEVEL")}


def _header_versions() -> dict[str, tuple[int, int, int]]:
    """(major, minor, patch) from each installed NVIDIA header's macros."""
    dirs = libbootstrap.default_includes()
    out = {}
    for api, (hdr, prefix) in _MACROS.items():
        path = libbootstrap.find_file(dirs, hdr)
        if path is None:
            continue
        text = Path(path).read_text(errors="replace")
        vals = []
        for part in _PARTS.get(api, ("MAJOR", "MINOR", "PATCH")):
            m = re.search(rf"#\s*define\s+{prefix}{part}\s+(\d+)", text)
            if not m:
                break
            vals.append(int(m.group(1)))
        if len(vals) == 3:
            out[api] = tuple(vals)
    return out


def test_emulated_versions_are_the_headers():
    from gpuproxy.emu import versions
    hv = _header_versions()
    if not hv:
        pytest.skip("NVIDIA's library headers are not installed (set GPUPROXY_LIB_INCLUDE, e.g. to "
                    "nvidia/cu13/include of a PyTorch install)")
    for api, v in hv.items():
        assert versions.PROPERTIES[api] == v, f"{api}: emulated {versions.PROPERTIES[api]}, header {v}"


def _encoded(api, v):
    major, minor, patch = v
    return major * (10000 if api in ("cublas", "cudnn") else 1000) + minor * 100 + patch


def test_version_queries_program_under_emu(emu_daemon, tmp_path):
    from gpuproxy.emu import versions
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    want = dict(versions.PROPERTIES)
    want.update(_header_versions())     # the macros, where the headers are installed
    defs = [f"-DWANT_CUDART={versions.CUDART_VERSION}"]
    for api, key in (("cublas", "CUBLAS"), ("cusparse", "CUSPARSE"), ("curand", "CURAND"), ("cufft", "CUFFT"),
                     ("cusolver", "CUSOLVER"), ("cudnn", "CUDNN")):
        major, minor, patch = want[api]
        defs += [f"-DWANT_{key}_MAJOR={major}", f"-DWANT_{key}_MINOR={minor}", f"-DWANT_{key}_PATCH={patch}",
                 f"-DWANT_{key}_VERSION={_encoded(api, want[api])}"]
    exe = tmp_path / "version_queries"
    subprocess.run([cc, "-O1", "-o", str(exe), str(REPO / "tests" / "native" / "version_queries.c"), *defs, "-ldl"],
                   check=True)
    r = subprocess.run([str(exe)], env=client_env(emu_daemon), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("PASS version_queries"), r.stdout + r.stderr
    assert "FAIL" not in r.stdout
    # no query printed a not-supported line
    assert "not supported" not in r.stderr.lower(), r.stderr
