"""NCCL across processes under the proxy (issue 22, parts 2 and 5).

tests/programs_extra/nccl_ranks.cu forks N ranks, each an application of
its own (its own session and worker); they meet through the unique id and
check every collective's values themselves (all-reduce, all-gather,
broadcast, reduce-scatter, a send/receive ring in a group, a split). On the
emulated backend the collectives are proxyd/backends/emu/collectives.py's; on a GPU
machine (marked gpu) NVIDIA's NCCL runs in the workers, and the native run
is the reference.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import corpus  # noqa: E402
from conftest import call_profile  # noqa: E402
from proxy import Daemon  # noqa: E402

EXTRA = Path(__file__).parent / "programs_extra"


@pytest.fixture(scope="module")
def ranks_prog(shim_installed, nvcc):
    src = EXTRA / "nccl_ranks.cu"
    prog = corpus.Program(name="nccl_ranks", source=src.name, link=("-lnccl",), cubins=(), args=(), emu=None,
                          expected="", driver=None, pace=False, proxy_only=False, source_path=src)
    return corpus.build(prog, corpus.default_build_dir() / "programs_extra")


def expected(n: int) -> str:
    return "".join(f"rank {r} ok\n" for r in range(n)) + f"PASS nccl_ranks {n}\n"


@pytest.mark.parametrize("n", [2, 4])
def test_ranks_meet_and_collectives_are_exact_under_emu(ranks_prog, n):
    with Daemon(backend="emu", extra_args=["--emu-devices", "2"]) as d:
        r = subprocess.run(ranks_prog.argv() + [str(n)], env=d.env_for_client(), capture_output=True, text=True,
                           timeout=180)
        log = d.log()
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{log[-3000:]}"
    assert r.stdout == expected(n), r.stdout + r.stderr
    assert r.stderr == "", r.stderr


def test_a_rank_that_dies_fails_the_others_instead_of_hanging(ranks_prog, tmp_path):
    """Rank 1 of 2 is killed before it joins: rank 0's communicator init
    must not wait forever (GPUPROXY_NCCL_TIMEOUT_S)."""
    with Daemon(backend="emu", extra_args=["--emu-devices", "2"],
                env={**os.environ, "GPUPROXY_NCCL_TIMEOUT_S": "3"}) as d:
        # a one-rank job whose id says two ranks: the missing rank never comes
        src = tmp_path / "lonely.cu"
        src.write_text(r'''
#include <cstdio>
#include "nccl_decls.h"
int main() {
  cudaSetDevice(0);
  ncclUniqueId id; ncclComm_t c;
  if (ncclGetUniqueId(&id) != ncclSuccess) return 2;
  ncclResult_t r = ncclCommInitRank(&c, 2, id, 0);
  printf("init: %d\n", (int)r);
  return r == ncclSuccess ? 1 : 0;
}
''')
        prog = corpus.Program(name="nccl_lonely", source=src.name, link=("-lnccl",), cubins=(), args=(), emu=None,
                              expected="", driver=None, pace=False, proxy_only=False, source_path=src,
                              compile_flags=(f"-I{EXTRA}",))
        b = corpus.build(prog, tmp_path / "build")
        t = time.monotonic()
        r = subprocess.run(b.argv(), env=d.env_for_client(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("init: 6"), r.stdout     # ncclRemoteError
    assert time.monotonic() - t < 60


SINGLE_EXPECTED = ("nonblocking init: 0\n"
                   "one-rank all-reduce: ok\n"
                   "no-color split on a nonblocking parent: 0\n"
                   "parent after the split: 0\n"
                   "no-color split gives NULL\n"
                   "rank 3 of 2: 4\n"
                   "blocking communicator polled 2000 times: 2000 without error\n")


@pytest.fixture(scope="module")
def single_prog(shim_installed, nvcc):
    src = EXTRA / "nccl_single.cu"
    prog = corpus.Program(name="nccl_single", source=src.name, link=("-lnccl",), cubins=(), args=(), emu=None,
                          expected="", driver=None, pace=False, proxy_only=False, source_path=src)
    return corpus.build(prog, corpus.default_build_dir() / "programs_extra")


def test_nonblocking_config_split_nocolor_and_bad_rank(single_prog):
    with Daemon(backend="emu") as d:
        r = subprocess.run(single_prog.argv(), env=d.env_for_client(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == SINGLE_EXPECTED + "PASS nccl_single\n", r.stdout + r.stderr


def test_a_ready_blocking_communicator_is_not_asked_at_every_poll(single_prog, tmp_path):
    """ncclCommGetAsyncError of a blocking communicator the worker last found
    without error is answered by the stand-in for GPUPROXY_NCCL_ERROR_POLL_MS
    (PyTorch's watchdog asks at every collective; each was a round trip that
    held the shim's lock): nccl_single's 2000 polls of its blocking
    communicator cost a few round trips instead of 2000, and 0 turns that
    off. The polls that wait for a communicator to be made (the stand-in's
    and the application's of its nonblocking one) always go to the worker;
    how many there are depends on the machine's load, hence the margin."""
    fid = 47018       # specs/nccl: ncclCommGetAsyncError
    got = {}
    for ms in ("100000", "0"):
        prof = tmp_path / f"prof-{ms}"
        with Daemon(backend="emu") as d:
            r = subprocess.run(single_prog.argv(), capture_output=True, text=True, timeout=120,
                               env=d.env_for_client({"GPUPROXY_PROFILE": str(prof),
                                                     "GPUPROXY_NCCL_ERROR_POLL_MS": ms}))
        assert r.returncode == 0 and r.stdout == SINGLE_EXPECTED + "PASS nccl_single\n", r.stdout + r.stderr
        got[ms] = call_profile(prof).get(fid, (0, 0))[1]
    assert got["0"] >= 2000, got                    # every poll a round trip
    assert got["100000"] < got["0"] // 4, got       # the blocking communicator asked about once


def test_a_session_holding_a_communicator_is_not_dumped(single_prog, tmp_path):
    """Until the consistent cut exists, a dump says why it cannot take a
    session with a communicator, and the program goes on unharmed."""
    from gpuproxy.proxyd.client import ControlClient, ControlError
    with Daemon(backend="emu") as d:
        p = subprocess.Popen(single_prog.argv() + ["wait"], env=d.env_for_client(), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            lines = []
            while not lines or lines[-1] != "ready\n":
                line = p.stdout.readline()
                assert line, f"program ended early: {''.join(lines)} {p.stderr.read()}"
                lines.append(line)
            st = ControlClient(d.endpoint, timeout_s=60).call("status", {})
            rows = [x for x in st["sessions"] if x["pid"] == p.pid]
            assert len(rows) == 1 and len(rows[0].get("nccl", [])) == 1, st["sessions"]
            c = rows[0]["nccl"][0]
            # one rank of one; the all-reduce and the split were its two collectives
            assert (c["nranks"], c["rank"], c["seq"], c["state"]) == (1, 0, 2, "ready"), c
            with pytest.raises(ControlError) as e:
                ControlClient(d.endpoint, timeout_s=60).call("dump", {"pid": p.pid, "dir": str(tmp_path / "img")})
            assert "NCCL communicator" in str(e.value) and "consistent cut" in str(e.value), str(e.value)
            out, err = p.communicate("go\n", timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
    assert p.returncode == 0, out + err
    assert "".join(lines) + out == SINGLE_EXPECTED + "ready\nPASS nccl_single\n", out + err


@pytest.fixture(scope="module")
def initall_prog(shim_installed, nvcc):
    src = EXTRA / "nccl_initall.cu"
    prog = corpus.Program(name="nccl_initall", source=src.name, link=("-lnccl",), cubins=(), args=(), emu=None,
                          expected="", driver=None, pace=False, proxy_only=False, source_path=src)
    return corpus.build(prog, corpus.default_build_dir() / "programs_extra")


def test_single_process_init_all_and_a_group_over_two_devices(initall_prog):
    """ncclCommInitAll (a group of ncclCommInitRank, one per device, in one
    process and so one worker) and a group of collectives over both."""
    with Daemon(backend="emu", extra_args=["--emu-devices", "2"]) as d:
        r = subprocess.run(initall_prog.argv(), env=d.env_for_client(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == "PASS nccl_initall\n" and r.stderr == "", r.stdout + r.stderr


def _gpus() -> int:
    from gpuproxy.proxyd.backends.cuda import CudaBackend
    return CudaBackend().device_count()


@pytest.mark.gpu
@pytest.mark.parametrize("n", [2, 4])
def test_ranks_on_gpus_native_and_proxied(ranks_prog, n):
    if _gpus() < n:
        pytest.skip(f"needs {n} GPUs")
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    env.pop("LD_PRELOAD", None)
    nat = subprocess.run(ranks_prog.argv() + [str(n)], env=env, capture_output=True, text=True, timeout=300)
    assert nat.returncode == 0 and nat.stdout == expected(n), nat.stdout + nat.stderr
    with Daemon(backend="cuda", env={**os.environ, "GPUPROXY_SESSION_PRIMARY": "1"}) as d:
        r = subprocess.run(ranks_prog.argv() + [str(n)], env=d.env_for_client({"NCCL_NVLS_ENABLE": "0"}),
                           capture_output=True, text=True, timeout=300)
        log = d.log()
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{log[-3000:]}"
    assert r.stdout == nat.stdout


@pytest.mark.gpu
def test_init_all_on_gpus_native_and_proxied(initall_prog):
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    env.pop("LD_PRELOAD", None)
    nat = subprocess.run(initall_prog.argv(), env=env, capture_output=True, text=True, timeout=300)
    assert nat.returncode == 0 and nat.stdout == "PASS nccl_initall\n", nat.stdout + nat.stderr
    with Daemon(backend="cuda", env={**os.environ, "GPUPROXY_SESSION_PRIMARY": "1"}) as d:
        r = subprocess.run(initall_prog.argv(), env=d.env_for_client({"NCCL_NVLS_ENABLE": "0"}),
                           capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout == nat.stdout, r.stdout + r.stderr


@pytest.mark.gpu
def test_single_rank_on_gpu_native_and_proxied(single_prog):
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    env.pop("LD_PRELOAD", None)
    nat = subprocess.run(single_prog.argv(), env=env, capture_output=True, text=True, timeout=300)
    assert nat.returncode == 0 and nat.stdout == SINGLE_EXPECTED + "PASS nccl_single\n", nat.stdout + nat.stderr
    with Daemon(backend="cuda", env={**os.environ, "GPUPROXY_SESSION_PRIMARY": "1"}) as d:
        r = subprocess.run(single_prog.argv(), env=d.env_for_client({"NCCL_NVLS_ENABLE": "0"}),
                           capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout == nat.stdout, r.stdout + r.stderr
