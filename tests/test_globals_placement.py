"""__device__ variables come back at their addresses (issue 23, target 5;
proxyd/families/modrestore.py, proxyd/families/placement.py).

tests/programs/globals_table.cu loads one module four times, looking up and
launching kernels of each before loading the next (as a framework loading
modules lazily does), and keeps the addresses of all 512 variables in a
table in device memory that it reads through every iteration. The driver
(and the emulated one, which places a kernel's code at its first lookup, as
lazy loading does) puts the next module's variables after the code of the
kernels looked up before: a restore that loaded every module first moved
the variables of modules 2-4. A restore replays the app's order, so none
moves and the pointers in device memory stay valid; on the GPU (marker gpu)
this is the check of the real driver."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import corpus  # noqa: E402
from paced import PacedRun  # noqa: E402
from test_checkpoint import BACKEND, ctl, daemon, tmp  # noqa: E402,F401

from gpuproxy.proxyd.families.placement import explain
from gpuproxy.proxyd.families.modrestore import placement_order

pytestmark = [pytest.mark.gpu] if BACKEND == "cuda" else []


@pytest.fixture(scope="module")
def built(nvcc, shim_installed):     # skips without nvcc or the installed shim
    return corpus.build(corpus.get_program("globals_table"), corpus.default_build_dir())


@pytest.mark.parametrize("mode", ["parallel", "serial"])
def test_globals_stay_at_their_addresses(built, tmp, mode):
    d = daemon(tmp)
    try:
        with PacedRun(built, d) as run:
            run.step_to(1)
            st = ctl(d, "dump", pid=run.pid, dir=str(tmp / "img"))
            assert st["released"]
            from gpuproxy.proxyd.checkpoint.image import Image
            sess = Image.open(str(tmp / "img")).session
            # every load and first lookup has its place in the app's order
            assert all(md.get("seq") for md in sess["modules"]) and all(f.get("seq") for f in sess["functions"])
            d.kill()
            d = daemon(tmp, "fresh", env=dict(os.environ, GPUPROXY_RESTORE_MODULES=mode))
            r = ctl(d, "restore", dir=str(tmp / "img"))
            assert r["modules_mode"] == mode and r["modules"] == 4
            assert r["functions_in_order"] == 9          # two kernels per module, gather once
            assert r["globals"] == 4 * 128, r
            assert r["moved_globals"] == [], (r["moved_globals"][:5], r.get("moved_globals_why"))
            assert r["moved_globals_why"] == []
            out = run.finish()
            assert out == built.program.expected_output, run.stderr()
    finally:
        d.cleanup()


def _mods(n, seq=True, per=2):
    return [{"id": i + 1, "ctx": 1, "globals": {f"v{j}": [0x1000 * i + 16 * j, 4] for j in range(per)},
             **({"seq": 2 * i + 1} if seq else {})} for i in range(n)]


def test_placement_order_interleaves_kernels():
    mods = _mods(2)
    funcs = [{"id": 1, "module": 1, "seq": 2}, {"id": 2, "module": 2, "seq": 4}]
    assert [(w, d["id"]) for w, d in placement_order(mods, funcs)] == [
        ("module", 1), ("function", 1), ("module", 2), ("function", 2)]
    # images from before placement numbers: modules by id, kernels at their own stage
    old = _mods(2, seq=False)
    assert [(w, d["id"]) for w, d in placement_order(old[::-1], funcs)] == [("module", 1), ("module", 2)]


def test_moved_globals_are_explained():
    mods = _mods(3)
    assert explain([], mods, "parallel") == []
    # all by one offset: the difference lies before the first load
    every = [{"name": n, "old": a, "new": a + 0x200000, "size": 4, "module": md["id"]}
             for md in mods for n, (a, _) in md["globals"].items()]
    why = explain(every, mods, "parallel")
    assert len(why) == 1 and "all 6 variables moved by the same offset (+0x200000)" in why[0]
    # from the second module on: something between the first two loads
    later = [g for g in every if g["module"] != 1]
    later[-1]["new"] += 0x100
    why = explain(later, mods, "serial")
    assert len(why) == 1 and "before module 2 stayed (2)" in why[0] and "4 moved" in why[0]
    # unordered loads and images without placement numbers say so
    assert any("no fixed order" in w for w in explain(later, mods, "unordered"))
    assert any("no placement order" in w for w in explain(later, _mods(3, seq=False), "parallel"))


def test_restore_output_counts_moved_variables_and_says_why():
    from gpuproxy.cli.checkpoint_cmds import MAX_MOVED_SHOWN, _restore_details
    moved = [{"name": f"v{i}", "old": 0x1000 + 16 * i, "new": 0x9000 + 16 * i, "size": 4, "module": 1}
             for i in range(MAX_MOVED_SHOWN + 5)]
    lines = _restore_details({"replayed": 0, "globals": 100, "moved_globals": moved,
                              "moved_globals_why": ["all 100 variables moved by the same offset (+0x8000): ..."],
                              "modules_ms": 12.5, "modules": 3, "modules_mode": "parallel"})
    text = "\n".join(lines)
    assert "100 __device__ variables checked, 25 moved" in text
    assert sum("WARNING: __device__ variable v" in x for x in lines) == MAX_MOVED_SHOWN
    assert "and 5 more __device__ variables moved" in text
    assert "why: all 100 variables moved by the same offset" in text
    assert "3 modules (parallel) in 12.5 ms" in text
