"""A job dump's stall figures (proxyd/checkpoint/orchestrate/job_stall.py)
and how proxy-cli prints them; the figures of a real job are checked in
tests/test_nccl_cut_wp.py."""
from __future__ import annotations

from gpuproxy.cli.checkpoint_cmds import _job_stall_lines
from gpuproxy.proxyd.checkpoint.orchestrate import job_stall


def test_leave_running_takes_each_ranks_shim_figure_and_the_max():
    f = job_stall.figures([11, 12], {11: {"held_ns": 5}, 12: {"held_ns": 6}},
                          {11: {"app_stopped_ms": 40.5}, 12: {"app_stopped_ms": 61.25}}, None, 90.04)
    assert f == {"stall_ms": 90.0, "app_stopped_ms": 61.25, "ranks_app_stopped_ms": {"11": 40.5, "12": 61.25},
                 "stall_from": "app"}
    j = job_stall.for_job(f)
    assert j == {"stall_ms": 61.25, "stall_from": "app", "coordinator_stall_ms": 90.0,
                 "ranks_app_stopped_ms": {"11": 40.5, "12": 61.25}}
    line, = _job_stall_lines(dict(f, leave_running=True))
    assert "app stopped 61.2 ms" in line and "pid 11 40.5 ms" in line and "pid 12 61.2 ms" in line
    assert "all running again" in line and "90.0 ms" in line


def test_final_dump_ends_each_ranks_figure_at_criu_s_end():
    ms = 1_000_000
    f = job_stall.figures([11, 12], {11: {"held_ns": 100 * ms}, 12: {"held_ns": 130 * ms}}, None, 400 * ms, 333.0)
    assert f["ranks_app_stopped_ms"] == {"11": 300.0, "12": 270.0} and f["app_stopped_ms"] == 300.0
    assert f["stall_from"] == "app"
    assert "gone" in _job_stall_lines(dict(f, leave_running=False))[0]


def test_a_rank_without_its_own_figure_makes_the_coordinator_s_the_job_s():
    # an older shim: its park answer has no held_ns and its resume no app_stopped_ms
    f = job_stall.figures([11, 12], {11: {}, 12: {"held_ns": 1}}, {11: {"resumed": True},
                                                                 12: {"app_stopped_ms": 7.0}}, None, 50.0)
    assert f["stall_from"] == "orchestrator" and f["ranks_app_stopped_ms"] == {"11": None, "12": 7.0}
    assert f["app_stopped_ms"] == 7.0
    j = job_stall.for_job(f)
    assert j["stall_ms"] == 50.0 and j["stall_from"] == "orchestrator"
    line, = _job_stall_lines(dict(f, leave_running=True))
    assert line.startswith("  job stopped 50.0 ms") and "pid 11 unknown" in line
