"""The shim's layers hold (issue 20): no cycle among interceptor/*.c and no
call or #include from a lower layer to a higher one.

The layers are declared once, in interceptor/LAYERS; scripts/shim_layers.py
compiles every interceptor/*.c and every generated source (-O0, in a
temporary folder) and reads with `nm` which global symbols each object
defines and which it uses. A failure names the files and the symbols.
No GPU needed; the compile takes some seconds.
"""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

spec = importlib.util.spec_from_file_location("shim_layers", REPO / "scripts" / "shim_layers.py")
shim_layers = importlib.util.module_from_spec(spec)
sys.modules["shim_layers"] = shim_layers
spec.loader.exec_module(shim_layers)

needs_tools = pytest.mark.skipif(not (shutil.which("cc") and shutil.which("nm")),
                                 reason="needs a C compiler (cc) and nm")


def _compile(folder: Path, sources: dict[str, str]) -> dict[str, Path]:
    objects = {}
    for name, text in sources.items():
        (folder / name).write_text(text)
    for name in sources:
        if name.endswith(".c"):
            o = folder / (name[:-2] + ".o")
            subprocess.run(["cc", "-O0", "-c", str(folder / name), "-o", str(o)], check=True, cwd=folder)
            objects[name] = o
    return objects


def _analyse(tmp_path: Path, sources: dict[str, str], layers: str):
    (tmp_path / "LAYERS").write_text(layers)
    objects = _compile(tmp_path, sources)
    return shim_layers.analyse(objects, src_dir=tmp_path, layers_path=tmp_path / "LAYERS")


@needs_tools
def test_checker_finds_a_cycle_of_two_files(tmp_path):
    nodes, edges, probs = _analyse(tmp_path, {
        "a.c": "int b_fn(void);\nint a_fn(void) { return b_fn() + 1; }\n",
        "b.c": "int a_fn(void);\nint b_fn(void) { return 0; }\nint b_other(void) { return a_fn(); }\n",
    }, "one: a.c b.c\n")
    assert edges[("a.c", "b.c")] == {"b_fn"}
    assert edges[("b.c", "a.c")] == {"a_fn"}
    cycles = [p for p in probs if p.startswith("cycle")]
    assert len(cycles) == 1 and "a.c b.c" in cycles[0], probs


@needs_tools
def test_checker_finds_an_upward_call_and_include(tmp_path):
    _nodes, _edges, probs = _analyse(tmp_path, {
        "top.h": "int top_fn(void);\n",
        "low.c": '#include "top.h"\nint low_fn(void) { return top_fn(); }\n',
        "top.c": "int top_fn(void) { return 1; }\n",
    }, "# bottom first\nlow: low.c\ntop: top.h\n    top.c\n")
    up = sorted(p for p in probs if p.startswith("upward"))
    assert up == ["upward: low.c (low) -> top.c (top): top_fn",
                  "upward: low.c (low) -> top.h (top): #include"], probs
    assert len(probs) == 2, probs


@needs_tools
def test_checker_accepts_a_clean_layering_and_flags_unplaced_files(tmp_path):
    _nodes, edges, probs = _analyse(tmp_path, {
        "low.c": "int low_fn(void) { return 1; }\n",
        "top.c": "int low_fn(void);\nint top_fn(void) { return low_fn(); }\n",
        "stray.c": "int stray_fn(void) { return 2; }\n",
    }, "low: low.c gone.c\ntop: top.c\n")
    assert edges == {("top.c", "low.c"): {"low_fn"}}
    assert sorted(probs) == ["LAYERS names gone.c, which does not exist", "stray.c: in no layer of LAYERS"]


@needs_tools
@pytest.mark.slow
def test_interceptor_has_no_cycle_and_no_upward_use(tmp_path):
    build = shim_layers._autogen()
    try:
        build.cuda_include()
    except build.BuildError as e:
        pytest.skip(f"the shim cannot be compiled here: {e}")
    objects = shim_layers.build_objects(tmp_path)
    hand = {p.name for p in (REPO / "interceptor").glob("*.c")}
    assert hand <= set(objects)
    assert any(n.startswith("gen/") for n in objects)
    nodes, edges, probs = shim_layers.analyse(objects)
    # the graph is real: the arrows everyone relies on are seen
    assert "gp_op_begin" in edges[("driver.c", "transport.c")]
    assert "gp_ctx_current" in edges[("transport.c", "context.c")]
    assert ("gen/gp_driver_stubs.c", "gp_transport.h") in edges     # generated includes are checked too
    assert not probs, "the shim's layering is broken (interceptor/LAYERS):\n" + "\n".join(probs)
