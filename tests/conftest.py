"""Shared pytest set-up.

Tests marked `gpu` need an NVIDIA GPU and driver: they are skipped, visibly,
where `nvidia-smi -L` lists none (CI), unless GPUPROXY_TEST_GPU=1 forces them
(scripts/gpu-check sets it on the GPU machine). Never faked."""
import os
import shutil
import subprocess

import pytest


def _have_gpu() -> bool:
    if os.environ.get("GPUPROXY_TEST_GPU") == "1":
        return True
    if not shutil.which("nvidia-smi"):
        return False
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and "GPU" in r.stdout


def pytest_collection_modifyitems(config, items):
    if _have_gpu():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
