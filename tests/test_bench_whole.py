"""The whole-process benchmark's harness (bench/whole_process_bench.py) on
the emulated backend, at a small size: its program keeps device memory,
host memory and its counter across a whole-process dump and restore (the
program compares checksums taken before the dump). No timing is checked."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import whole_process_bench as WB  # noqa: E402

pytestmark = pytest.mark.skipif(not __import__("shutil").which("nvcc"), reason="needs nvcc")


def test_whole_process_bench_keeps_data(usable_criu, tmp_path):
    r = WB.whole_suite("emu", tmp_path, 0.25, 0.0625, tmp_path / "images")
    g = r["gpuproxy"]
    assert "error" not in g, g.get("error")
    assert g["verify"] == "verify ok"
    assert g["dump_s"] > 0 and g["restore_s"] > 0
    # the image holds at least the device memory and the host memory
    assert g["image_bytes"] >= (0.25 + 0.0625) * 2**30
    assert r["native"] == {"skipped": "needs the GPU"}
    assert "verify ok" in WB.table(r)
