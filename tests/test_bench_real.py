"""The real-workload benchmark's harness (bench/real_workloads.py) on the
emulated backend with tests/real_app_emu.py standing in for the PyTorch app:
periodic whole-process dumps (plain, concurrent + zstd, incremental), a
final dump and a restore; the app's curve must equal the uninterrupted one
and the figures must be there. No timing is checked."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import real_workloads as RW  # noqa: E402


@pytest.mark.slow
def test_real_workload_harness_on_emu(usable_criu, shim_installed, tmp_path):
    RW.use_emu()
    r = RW.suite(["small"], tmp_path, tmp_path / "images", 300)
    s = r["small"]
    g = s["gpuproxy"]
    assert "error" not in g and "skipped" not in g, g
    assert s["curves"] == {"gpuproxy": f"identical ({s['reference']['steps']} steps)"}
    for k in ("periodic_leave_running", "periodic_concurrent_zstd", "final"):
        assert g[k]["cli_app_stopped_ms"] is not None, g[k]
        assert "criu_dump" in g[k]["stages_ms"]
    for k in ("periodic_leave_running", "periodic_concurrent_zstd"):
        # the app's own largest gap around the dump covers the stall its shim reported
        assert g[k]["largest_step_gap_ms"] >= g[k]["cli_app_stopped_ms"] - 1, g[k]
        assert "gpu_write_after_resume" in g[k]["stages_ms"]
    z = g["periodic_concurrent_zstd"]
    assert z["compression"] == "zstd:1" and z["compression_ratio"] > 1
    assert g["restore"]["first_step_after_s"] is not None
    assert s["native"] == {"skipped": "needs the GPU"}
    assert "identical" in RW.table(r)
