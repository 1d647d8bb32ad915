"""Which tree a whole-process dump of a job named by its ranks' pids takes
(proxyd/checkpoint/orchestrate/job_tree.py), on real process trees: a
shell with three children stands for a launcher and its ranks; proxyd's
status (which pids are gpuproxy clients) is given by the test. Refusals
are one line each; the dump end to end is tests/test_nccl_cut_wp.py -k
pids."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from gpuproxy.proxyd.checkpoint.orchestrate import job_tree
from gpuproxy.proxyd.checkpoint.orchestrate.multirank import JobError


class _Status:
    def __init__(self, pids):
        self.pids = pids

    def __call__(self, timeout_s):
        return self

    def call(self, cmd, args):
        assert cmd == "status"
        return {"sessions": [{"pid": p, "state": "running"} for p in self.pids]}


@pytest.fixture
def launcher():
    """A shell (the launcher) with three sleeping children (its ranks)."""
    p = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & sleep 60 & wait"])
    try:
        t = time.monotonic()
        while True:
            kids = sorted(q for q in _children(p.pid))
            if len(kids) == 3:
                break
            assert time.monotonic() - t < 20, kids
            time.sleep(0.02)
        yield p.pid, kids
    finally:
        for q in _children(p.pid):
            try:
                os.kill(q, 9)
            except OSError:
                pass
        p.kill()
        p.wait()


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def test_the_ranks_common_parent_is_their_launcher(launcher):
    root, kids = launcher
    assert job_tree.parent(kids[0]) == root and job_tree.ancestry(kids[0])[:2] == [kids[0], root]
    assert job_tree.common_parent(kids) == root
    assert job_tree.common_parent([kids[0]]) == kids[0]
    assert job_tree.common_parent([root, kids[1]]) == root
    assert job_tree.root_of_pids(_Status(kids), kids) == root


def test_a_tree_with_clients_not_named_is_refused(launcher):
    root, kids = launcher
    with pytest.raises(JobError) as e:
        job_tree.root_of_pids(_Status(kids), kids[:2])
    msg = str(e.value)
    assert f"pid {root}" in msg and str(kids[2]) in msg and f"--job {root}" in msg and "\n" not in msg


def test_a_common_parent_that_runs_the_caller_is_refused(launcher):
    root, kids = launcher
    me = os.getpid()        # the test stands for proxy-cli: the launcher is its child
    with pytest.raises(JobError) as e:
        job_tree.root_of_pids(_Status(kids + [me]), [kids[0], me])
    assert "runs this proxy-cli" in str(e.value) and "--gpu-only" in str(e.value), e.value


def test_pids_without_a_common_parent_below_init_are_refused(launcher):
    root, kids = launcher
    with pytest.raises(JobError) as e:
        job_tree.root_of_pids(_Status(kids + [1]), [kids[0], 1])
    assert "no common parent below init" in str(e.value), e.value
    with pytest.raises(JobError) as e:
        job_tree.root_of_pids(_Status(kids), [kids[0], 999999999])
    assert "999999999" in str(e.value), e.value
