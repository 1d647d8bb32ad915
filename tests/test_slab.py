"""Small allocations placed by the shim (interceptor/slab.c; issue 13,
target 4; docs/architecture.md, "Small allocations placed by the shim").

The scenarios run in tests/slab_client.py, a driver-API client of the
shim's libcuda.so.1 (ctypes), against the emulated backend. Each checks
device contents read back through the worker; the shim's call profile
(GPUPROXY_PROFILE) shows which calls crossed to the worker, so that "no
round trip per small allocation" and "a free synchronises only after
queued work" are counted, not timed.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from conftest import call_profile, client_env  # noqa: E402
from proxy import Daemon  # noqa: E402

CLIENT = Path(__file__).parent / "slab_client.py"
# GPUPROXY_TEST_BACKEND=cuda (scripts/gpu-check's pytest step): the same
# tests against the GPU, where the fence against a running kernel is real
BACKEND = os.environ.get("GPUPROXY_TEST_BACKEND", "emu")
pytestmark = [pytest.mark.gpu] if BACKEND == "cuda" else []
FID_CTX_SYNC = 49           # cuCtxSynchronize (specs/driver/context.yaml)
FID_MEM_ALLOC = 106         # cuMemAlloc_v2 (specs/driver/memory.yaml)
FID_MEM_FREE = 110          # cuMemFree_v2


def run_client(daemon, scenario, tmp_path, extra=None, timeout=300):
    prof = tmp_path / f"profile-{scenario}"
    env = client_env(daemon, {"GPUPROXY_PROFILE": str(prof), **(extra or {})})
    r = subprocess.run([sys.executable, str(CLIENT), scenario], env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, f"{scenario}: rc {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.splitlines()[-1] == "done", r.stdout
    return r.stdout, r.stderr, call_profile(prof)


def lines(out: str) -> list[str]:
    return out.splitlines()


@pytest.fixture(scope="module")
def slab_daemon(shim_installed, emu_kernel_files):
    d = Daemon(backend=BACKEND, emu_kernels=emu_kernel_files if BACKEND == "emu" else ())
    try:
        d.start()
        yield d
    finally:
        d.cleanup()


@pytest.mark.parametrize("slab", ["on", "off"])
def test_many_small_allocations(slab, slab_daemon, tmp_path):
    extra = {"GPUPROXY_SLAB": "0"} if slab == "off" else {}
    out, err, prof = run_client(slab_daemon, "patterns", tmp_path, extra)
    got = lines(out)
    # the same answers with and without slabs: the driver's behaviour
    assert got == ["aligned True", "disjoint True", "bad after fill 0", "ranges 30 30", "attributes True True",
                   "crossing True" if slab == "on" else got[5],
                   "double free 1", "interior free 1", "range of freed 500", "free async of a block 0",
                   "bad after frees 0", "disjoint after reuse True", "reused True", "bad at end 0", "done"], out
    allocs = prof.get(FID_MEM_ALLOC, (0, 0))[0]
    if slab == "on":
        # 2102 allocations (1500 + 2 + 600) in a few 2 MiB slabs, not one round trip each
        assert 0 < allocs <= 60, prof
    else:
        assert allocs == 2102, prof


def test_free_synchronises_only_after_queued_work(slab_daemon, tmp_path):
    out, err, prof = run_client(slab_daemon, "fence", tmp_path)
    assert lines(out) == ["reuse True True"] * 10 + ["done"], out
    # one slab; 101 malloc/free pairs with nothing in between cost no op;
    # the first free (after the context's setup) and the 20 frees that
    # follow queued or synchronous work each synchronise the context first;
    # the 5 frees right after the application's own cuCtxSynchronize do not
    assert prof[FID_MEM_ALLOC][0] == 1, prof
    assert prof[FID_CTX_SYNC][0] == 21 + 5, prof
    assert FID_MEM_FREE not in prof, prof


@pytest.mark.skipif(BACKEND != "emu", reason="needs the emulated device's configurable memory size")
def test_out_of_memory_is_reported_by_the_allocation(fresh_daemon, emu_kernel_files, tmp_path):
    d = fresh_daemon(env=dict(os.environ, GPUPROXY_EMU_TOTAL_MB="64"))
    out, err, prof = run_client(d, "oom", tmp_path)
    # CUDA_ERROR_OUT_OF_MEMORY from the cuMemAlloc that needed a new slab, the
    # blocks placed before it usable, a freed block placed again
    assert lines(out) == ["oom 2 True", "last block True", "after free 0 True", "done"], out
    assert "out of memory" in err, err
    # 32 slabs of 2 MiB fill 64 MiB; then the failed slab and the failed direct request
    assert prof[FID_MEM_ALLOC][0] == 34, prof


def test_threads_share_the_slabs(slab_daemon, tmp_path):
    out, _, prof = run_client(slab_daemon, "threads", tmp_path)
    assert lines(out) == ["thread errors 0", "done"], out


def test_forked_child_forgets_the_parents_slabs(slab_daemon, tmp_path):
    # the child's block is in a session of its own: placed from the parent's
    # slabs, its memset would fail (the address is not the child's)
    out, _, _ = run_client(slab_daemon, "fork", tmp_path)
    assert lines(out) == ["child 0", "bad in parent 0", "done"], out


def test_runtime_allocations_use_the_slabs(slab_daemon, tmp_path):
    out, _, prof = run_client(slab_daemon, "runtime", tmp_path)
    # cudaErrorInvalidValue for the double free, cudaErrorMemoryAllocation
    # for the impossible request; the pitched allocation is one block
    assert lines(out) == ["runtime blocks 64 True", "pitched 512 0 True True", "double cudaFree 1", "oom 2",
                          "done"], out
    assert prof[FID_MEM_ALLOC][0] == 2, prof      # one slab, the impossible request


def test_bad_threshold_is_named(slab_daemon, tmp_path):
    out, err, prof = run_client(slab_daemon, "fence", tmp_path, {"GPUPROXY_SLAB_MAX": "lots"})
    assert "GPUPROXY_SLAB_MAX=lots is not a byte count; using 262144" in err, err
    assert prof[FID_MEM_ALLOC][0] == 1, prof


def test_threshold_sends_larger_requests_to_the_worker(slab_daemon, tmp_path):
    # with a 1 KiB threshold, the fence scenario's 4 KiB blocks are the
    # worker's allocations (its 256-byte ones stay in the slab)
    out, _, prof = run_client(slab_daemon, "fence", tmp_path, {"GPUPROXY_SLAB_MAX": "1k"})
    assert lines(out) == ["reuse True True"] * 10 + ["done"], out
    assert prof[FID_MEM_ALLOC][0] == 1 + 20 + 5, prof
    assert prof[FID_MEM_FREE][0] == 20 + 5, prof


# ----------------------------------------------------------------- checkpoint

EXTRA = Path(__file__).parent / "programs_extra"


@pytest.fixture(scope="module")
def slab_program(nvcc, shim_installed):
    """tests/programs_extra/slab_ckpt.cu, built like the corpus (nvcc -cudart shared)."""
    import corpus
    src = EXTRA / "slab_ckpt.cu"
    prog = corpus.Program(name="slab_ckpt", source=src.name, link=(), cubins=(), args=(), emu=None, expected="",
                          driver=None, pace=True, proxy_only=False, source_path=src)
    return corpus.build(prog, corpus.default_build_dir() / "programs_extra")


def _ctl(d, cmd, **args):
    from gpuproxy.proxyd.client import ControlClient
    return ControlClient(d.endpoint, timeout_s=120).call(cmd, args)


def test_checkpoint_restores_blocks_and_allocator(slab_program, emu_kernel_files, tmp_path):
    """slab_ckpt's blocks (placed in slabs, a third freed each step) are
    dumped twice mid-run (the session released), proxyd killed and the image
    restored into a fresh proxyd each time: the run ends with the output of
    an uninterrupted run, which checks every block's bytes against the
    host's pattern and that blocks placed after a restore (the shim's
    allocator state, kept in the live process) never overwrite live ones."""
    from paced import PacedRun
    tmp = Path(f"/tmp/gpx-slab-{os.getpid()}-{time.monotonic_ns() % 10**9}")    # short ipc path
    tmp.mkdir()
    endpoint = f"ipc://{tmp}/proxyd.sock"
    kernels = [*emu_kernel_files, str(EXTRA / "slab_ckpt_emu.py")] if BACKEND == "emu" else []

    def start(name):
        return Daemon(backend=BACKEND, emu_kernels=kernels, endpoint=endpoint, log_path=str(tmp / f"{name}.log")).start()

    if BACKEND == "cuda":
        # natively first: the program's own checks (its fence check is real on a GPU)
        r = subprocess.run(slab_program.argv(), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and r.stdout.splitlines()[-1] == "PASS slab_ckpt", r.stdout + r.stderr
    d = start("first")
    try:
        r = subprocess.run(slab_program.argv(), env=client_env(d, {"GPUPROXY_PROFILE": str(tmp_path / "prof")}),
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        whole = r.stdout
        assert whole.splitlines()[-2:] == ["fence steps 12 of 12 reused the freed block", "PASS slab_ckpt"], whole
        # 3600 small allocations in slabs: a few dozen round trips, not one each
        assert call_profile(tmp_path / "prof")[FID_MEM_ALLOC][0] <= 100
        with PacedRun(slab_program, d) as run:
            for i, k in enumerate((3, 8)):
                run.step_to(k)
                st = _ctl(d, "dump", pid=run.pid, dir=str(tmp / f"img{k}"))
                assert st["released"] and st["bytes"] > 0
                d.kill()
                d = start(f"restored{i}")
                assert _ctl(d, "restore", dir=str(tmp / f"img{k}"))["pid"] == run.pid
            out = run.finish()
        assert out == whole, run.stderr()
    finally:
        d.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
