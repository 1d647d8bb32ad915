"""Round trips that the shim saves (issue 22): cuFuncGetAttribute answered
from the shim's cache of function attributes (interceptor/query_cache.c)
and cuEventCreate sent asynchronously under a handle the shim picks
(spec `ids: shim`, interceptor/ipc_event.c). tests/programs_extra/
attr_event_cache.cu runs the same work REPS times; the call profile
(GPUPROXY_PROFILE) of a run with 1 and one with 12 repetitions shows what
each repetition costs."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import corpus  # noqa: E402
from conftest import call_profile  # noqa: E402
from proxy import Daemon  # noqa: E402

EXTRA = Path(__file__).parent / "programs_extra"
FID_FUNC_GET_ATTRIBUTE = 410      # specs/driver/execution.yaml
FID_EVENT_CREATE = 369            # specs/driver/event.yaml


@pytest.fixture(scope="module")
def prog(shim_installed):
    if not corpus.nvcc_path():
        pytest.skip("nvcc not found")
    src = EXTRA / "attr_event_cache.cu"
    p = corpus.Program(name="attr_event_cache", source=src.name, link=(), cubins=(), args=(), emu=None,
                       expected="", driver=None, pace=False, proxy_only=False, source_path=src)
    return corpus.build(p, corpus.default_build_dir() / "programs_extra").binary


@pytest.fixture(scope="module")
def profiles(prog, tmp_path_factory):
    """{reps: call profile} of runs with 1 and 12 repetitions, one daemon."""
    tmp = tmp_path_factory.mktemp("attr_event_cache")
    out = {}
    with Daemon(backend="emu", emu_kernels=[EXTRA / "attr_event_cache_emu.py"]) as d:
        for reps in (1, 12):
            prof = tmp / f"profile.{reps}"
            r = subprocess.run([str(prog), str(reps)], capture_output=True, text=True, timeout=180,
                               env=d.env_for_client({"GPUPROXY_PROFILE": str(prof)}))
            assert r.returncode == 0 and r.stdout.endswith("PASS attr_event_cache\n"), \
                f"{r.stdout}\n{r.stderr}\n{d.log()[-3000:]}"
            assert os.path.exists(prof), "no call profile written"
            out[reps] = (call_profile(prof), r.stdout)
    return out


def test_repeated_func_attributes_cost_no_round_trip(profiles):
    """cudaFuncGetAttributes asks 10 cuFuncGetAttribute; 11 more calls of the
    same kernel (and the reads after each cudaFuncSetAttribute, which the
    program checks against the value set) cost what the run with one call
    costs: the answers come from the shim after the first."""
    one = profiles[1][0].get(FID_FUNC_GET_ATTRIBUTE, (0, 0))
    many = profiles[12][0].get(FID_FUNC_GET_ATTRIBUTE, (0, 0))
    assert one[1] > 0, f"the first cudaFuncGetAttributes asked proxyd nothing: {one}"
    assert many == one, f"11 more cudaFuncGetAttributes cost round trips: 1 rep {one}, 12 reps {many}"


def test_set_attribute_is_read_back(profiles):
    """The program reads maxDynamicSharedSizeBytes back after each of three
    cudaFuncSetAttribute calls and fails unless it sees the value set."""
    for reps, (_, out) in profiles.items():
        assert "set ok\n" in out, out


def test_event_create_is_not_a_round_trip(profiles):
    """24 more events created (and recorded, synchronised, queried, timed,
    destroyed: the program checks each) add no synchronous cuEventCreate;
    flags cuda.h does not allow are refused at once."""
    one = profiles[1][0].get(FID_EVENT_CREATE, (0, 0))
    many = profiles[12][0].get(FID_EVENT_CREATE, (0, 0))
    assert many[0] == one[0] + 22, f"creates sent: 1 rep {one}, 12 reps {many}"
    assert many[1] == 0 and one[1] == 0, f"synchronous creates: 1 rep {one}, 12 reps {many}"
    for _, out in profiles.values():
        assert "events ok\n" in out and "bad flags ok\n" in out, out
