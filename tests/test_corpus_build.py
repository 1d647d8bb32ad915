"""The test corpus (tests/programs) is consistent and every program compiles.

* the manifest lists every .cu of tests/programs (as a program or as a cubin
  source) and every file it names exists;
* every program compiles (nvcc -cudart shared, 2 parallel jobs; skipped
  without nvcc);
* every emu file imports with a stand-in gpuproxy.emu and registers exactly the
  kernels that the program's binary and cubins contain.
"""
from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402

PROGRAMS = corpus.load_corpus()
BY_NAME = {p.name: p for p in PROGRAMS}


# --------------------------------------------------------------------------- manifest


def test_manifest_lists_every_source():
    listed = set()
    for p in PROGRAMS:
        listed.add(p.source_path.resolve())
        listed.update(c.resolve() for c in p.cubin_paths)
    on_disk = {f.resolve() for f in corpus.PROGRAMS_DIR.glob("*.cu")}
    assert on_disk - listed == set(), "not in corpus.yaml"
    assert listed - on_disk == set(), "listed but missing"


def test_manifest_files_exist():
    for p in PROGRAMS:
        assert p.source_path.is_file(), p.source
        assert p.expected_path.is_file(), p.expected
        # a program without device code of its own (memsets, copies only)
        # needs no emulated companion: emu null in corpus.yaml
        assert (p.emu_path is not None and p.emu_path.is_file()) or \
            (p.emu is None and not _KERNEL_DECL.findall(p.source_path.read_text())), p.name
        for c in p.cubin_paths:
            assert c.is_file(), c
        for arg in p.args:
            for stem in re.findall(r"\{cubin:([^}]*)\}", arg):
                assert stem in p.cubin_stems, (p.name, arg)


def test_manifest_fields():
    names = [p.name for p in PROGRAMS]
    assert len(names) == len(set(names))
    for p in PROGRAMS:
        assert p.driver in corpus.DRIVERS
        assert isinstance(p.pace, bool) and isinstance(p.proxy_only, bool)
        assert p.source_path.suffix == ".cu"
    assert BY_NAME["counter"].driver == "udp_counter"
    assert BY_NAME["unsupported"].proxy_only
    assert {p.name for p in PROGRAMS if p.pace} == {"iterative", "iterative_streams", "stream_state", "launch_variants",
                                                  "restore_state", "hostmem", "host_callbacks", "mempool_async",
                                                  "vmm_app", "graph_capture", "graph_explicit", "cublas_gemm",
                                                  "cudnn_conv", "textures", "mathlibs", "graph_memory",
                                                  "graph_pageable", "linalg", "memset2d", "mipmap", "peer_copy",
                                                  "globals_table", "graph_conditional", "graph_cond_capture"}
    for p in PROGRAMS:
        assert all(isinstance(k, int) and k > 0 for k in p.checkpoints) and (p.pace or not p.checkpoints), p.name


def test_expected_outputs_end_with_pass():
    for p in PROGRAMS:
        text = p.expected_output
        assert text.endswith("\n"), p.name
        if p.driver == "udp_counter":
            assert text == "101\n102\n"
        else:
            assert text.splitlines()[-1] == f"PASS {p.name}", p.name


# --------------------------------------------------------------------------- emu files


def _import_emu(path: Path) -> dict:
    """Import an emu file against a stand-in gpuproxy.emu; return {kernel name: function}."""
    registered: dict = {}

    def kernel(name):
        def deco(fn):
            assert name not in registered, f"{path.name}: {name} registered twice"
            assert callable(fn)
            registered[name] = fn
            return fn

        return deco

    fake_pkg = types.ModuleType("gpuproxy")
    fake_pkg.__path__ = []
    fake_emu = types.ModuleType("gpuproxy.emu")
    fake_emu.kernel = kernel
    fake_pkg.emu = fake_emu
    saved = {k: sys.modules.get(k) for k in ("gpuproxy", "gpuproxy.emu")}
    sys.modules["gpuproxy"] = fake_pkg
    sys.modules["gpuproxy.emu"] = fake_emu
    try:
        spec = importlib.util.spec_from_file_location(f"_corpus_emu_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return registered


_PTX_ENTRY = re.compile(r"\.entry\s+(\w+)")
_KERNEL_DECL = re.compile(r"__global__\s+void\s+(\w+)\s*\(")


WITH_EMU = [p.name for p in PROGRAMS if p.emu is not None]


@pytest.mark.parametrize("name", WITH_EMU)
def test_emu_imports_and_covers_source_kernels(name):
    """Without nvcc: the emu file imports and has one kernel per __global__ of the sources."""
    p = BY_NAME[name]
    registered = _import_emu(p.emu_path)
    sources = [p.source_path] if "c++" not in p.compile_flags else []
    sources += list(p.cubin_paths)
    declared = set()
    for src in sources:
        declared.update(_KERNEL_DECL.findall(src.read_text()))
    # kernels a program carries as PTX text (jit_link.cu links them at run time)
    declared.update(_PTX_ENTRY.findall(p.source_path.read_text()))
    # mangled names start with _Z<len><name>; extern "C" names are the plain name
    short = set()
    for k in registered:
        m = re.match(r"_Z(\d+)", k)
        short.add(k[m.end():m.end() + int(m.group(1))] if m else k)
    assert short == declared


def test_emu_imports_with_real_gpuproxy():
    try:
        import gpuproxy.emu  # noqa: F401
    except Exception:
        pytest.skip("gpuproxy.emu is not importable")
    for p in (BY_NAME[n] for n in WITH_EMU):
        spec = importlib.util.spec_from_file_location(f"_corpus_real_emu_{p.name}", p.emu_path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


# --------------------------------------------------------------------------- build


@pytest.fixture(scope="module")
def built():
    if corpus.nvcc_path() is None:
        pytest.skip("nvcc not found")
    return {b.name: b for b in corpus.build_all(corpus.default_build_dir(), jobs=2)}


def test_build_all(built):
    assert set(built) == set(BY_NAME)
    for b in built.values():
        assert b.binary.is_file()
        for stem, path in b.cubins.items():
            assert path.is_file(), path
        for a in b.args():
            assert "{cubin:" not in a
        assert b.argv()[0] == str(b.binary)


def test_build_is_cached(built):
    again = corpus.build(BY_NAME["vector_add"], corpus.default_build_dir())
    assert again.binary == built["vector_add"].binary


@pytest.mark.parametrize("name", WITH_EMU)
def test_emu_registers_binary_kernels(built, name):
    b = built[name]
    in_binary = corpus.kernel_names(b)
    assert in_binary, f"{name}: no kernels found in the binary/cubins"
    registered = set(_import_emu(b.program.emu_path))
    assert registered == in_binary, (
        f"missing: {sorted(in_binary - registered)}, unknown: {sorted(registered - in_binary)}")


def test_driver_program_has_no_runtime(built):
    """driver_api is built as plain C++: it registers no fat binary and needs no cudart."""
    data = built["driver_api"].binary.read_bytes()
    assert b"__cudaRegisterFatBinary" not in data
    assert b"libcudart" not in data
    assert b"libcuda.so.1" in data
