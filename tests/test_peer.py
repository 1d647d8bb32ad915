"""Several GPUs in one process (issue 22, part 1), beyond the corpus program
peer_copy (tests/programs, run by test_corpus_emu and test_corpus_checkpoint):

- a checkpoint of a two-device session restored with --device-map onto other
  devices (swapped, and onto devices 2 and 3), which must finish with the
  program's exact output;
- virtual memory management over two devices: cuMemSetAccess with a
  descriptor per device, a copy between mappings of different devices, and
  one cuMemUnmap over both mappings.

Emulated backend in CI; GPUPROXY_TEST_BACKEND=cuda runs the same on a
machine with enough GPUs (scripts/gpu-check --multigpu).
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
import corpus  # noqa: E402
from paced import PacedRun  # noqa: E402
from proxy import Daemon  # noqa: E402

BACKEND = os.environ.get("GPUPROXY_TEST_BACKEND", "emu")
pytestmark = [pytest.mark.gpu] if BACKEND == "cuda" else []
EXTRA = Path(__file__).parent / "programs_extra"


def _gpus() -> int:
    if BACKEND == "emu":
        return 4
    from gpuproxy.proxyd.backends.cuda import CudaBackend
    return CudaBackend().device_count()


def _daemon(tmp: Path, name: str, devices: int) -> Daemon:
    kernels = [str(corpus.PROGRAMS_DIR / p.emu) for p in corpus.load_corpus() if p.emu] if BACKEND == "emu" else ()
    extra = ["--emu-devices", str(devices)] if BACKEND == "emu" else []
    return Daemon(backend=BACKEND, emu_kernels=kernels, endpoint=f"ipc://{tmp}/proxyd.sock", extra_args=extra,
                  log_path=str(tmp / f"{name}.log")).start()


def _ctl(d, cmd, **args):
    from gpuproxy.proxyd.client import ControlClient
    return ControlClient(d.endpoint, timeout_s=120).call(cmd, args)


@pytest.fixture
def tmp():
    d = Path(f"/tmp/gpp-{os.getpid()}-{time.monotonic_ns() % 10**9}")   # ipc paths must stay short
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("dmap", [{0: 1, 1: 0}, {0: 2, 1: 3}], ids=["swapped", "onto-2-3"])
def test_two_device_session_restored_onto_other_devices(dmap, tmp, shim_installed, nvcc):
    """Dump peer_copy mid-run, restart proxyd, restore with a device map;
    its own checks (host-recomputed values of every copy and kernel) and
    its exact output must hold."""
    need = max(dmap.values()) + 1
    if _gpus() < need:
        pytest.skip(f"needs {need} GPUs")
    prog = corpus.get_program("peer_copy")
    b = corpus.build(prog, corpus.default_build_dir())
    d = _daemon(tmp, "proxyd", need)
    try:
        with PacedRun(b, d) as run:
            run.step_to(5)
            st = _ctl(d, "dump", pid=run.pid, dir=str(tmp / "img"))
            assert st["released"], st
            d.kill()
            d = _daemon(tmp, "proxyd2", need)
            r = _ctl(d, "restore", dir=str(tmp / "img"), device_map={str(k): v for k, v in dmap.items()})
            assert r["pid"] == run.pid
            sess = [s for s in _ctl(d, "status")["sessions"] if s["pid"] == run.pid]
            assert len(sess) == 1, sess
            run.step_to(9)
            # a second dump and restore, mapping back where it came from
            st = _ctl(d, "dump", pid=run.pid, dir=str(tmp / "img2"))
            assert st["released"], st
            back = {v: k for k, v in dmap.items()}
            r = _ctl(d, "restore", dir=str(tmp / "img2"), device_map={str(k): v for k, v in back.items()})
            assert r["pid"] == run.pid
            out = run.finish()
            assert out == prog.expected_output, f"{out}\n--- stderr\n{run.stderr()}\n--- proxyd\n{d.log()[-3000:]}"
            assert run.stderr() == "", run.stderr()
    finally:
        d.cleanup()


def test_image_records_both_devices(tmp, shim_installed, nvcc):
    """The image of a two-device session holds memory and a context of each
    device (a restore that dropped one would fail the test above only
    through the program's checks)."""
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    from gpuproxy.proxyd.checkpoint.image import Image
    b = corpus.build(corpus.get_program("peer_copy"), corpus.default_build_dir())
    d = _daemon(tmp, "proxyd", 2)
    try:
        with PacedRun(b, d) as run:
            run.step_to(2)
            _ctl(d, "dump", pid=run.pid, dir=str(tmp / "img"), leave_running=True)
            desc = Image.open(str(tmp / "img")).session
            assert {c["device"] for c in desc["contexts"]} == {0, 1}, desc["contexts"]
            assert {c[2] for c in desc["arena"]["chunks"]} == {0, 1}, desc["arena"]["chunks"]
            out = run.finish()
            assert out == corpus.get_program("peer_copy").expected_output, run.stderr()
    finally:
        d.cleanup()


@pytest.fixture(scope="module")
def vmm_multi(shim_installed, nvcc):
    src = EXTRA / "vmm_multi.cu"
    prog = corpus.Program(name="vmm_multi", source=src.name, link=("-lcuda",), cubins=(), args=(), emu=None,
                          expected="", driver=None, pace=False, proxy_only=False, source_path=src)
    return corpus.build(prog, corpus.default_build_dir() / "programs_extra")


VMM_EXPECTED = ("device 1 access to device 0's half: 3\n"
                "copies across the two mappings ok\n"
                "mapped again: last word 7\n"
                "PASS vmm_multi\n")


def test_vmm_over_two_devices(vmm_multi, tmp):
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    if BACKEND == "cuda":       # the reference: the same program without the proxy
        r = subprocess.run(vmm_multi.argv(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout == VMM_EXPECTED, r.stdout + r.stderr
    d = _daemon(tmp, "proxyd", 2)
    try:
        r = subprocess.run(vmm_multi.argv(), env=d.env_for_client(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr + d.log()[-2000:]
        assert r.stdout == VMM_EXPECTED, r.stdout + r.stderr
        assert r.stderr == "", r.stderr
    finally:
        d.cleanup()


DEVNUM_EXPECTED = ("current device 1, ctx device 1, contexts distinct\n"
                   "pointer devices 0 1\n"
                   "device 1 reaches device 0: 1\n"
                   "peer copy of the data from before: equal\n"
                   "created context: device 1, memory on device 1\n")


@pytest.mark.parametrize("dmap", [{0: 1, 1: 0}, {0: 2, 1: 3}], ids=["swapped", "onto-2-3"])
def test_device_numbers_are_the_apps_after_a_restore_onto_other_devices(dmap, tmp, shim_installed, nvcc):
    """After a restore with a device map, calls that name a device keep the
    application's numbering (families/devnum.py): a device first used after
    the restore is a device of its own, not the one its old number now
    lands on, and every answer is in the program's numbers; the image of a
    later dump records where each context really is."""
    need = max(dmap.values()) + 1
    if _gpus() < need:
        pytest.skip(f"needs {need} GPUs")
    src = Path(__file__).parent / "programs_extra" / "devnum.cu"
    prog = corpus.Program(name="devnum", source=src.name, link=("-lcuda",), cubins=(), args=(), emu=None,
                          expected="", driver=None, pace=False, proxy_only=False, source_path=src)
    b = corpus.build(prog, corpus.default_build_dir() / "programs_extra")
    d = _daemon(tmp, "proxyd", need)
    try:
        ref = subprocess.run(b.argv(), env=d.env_for_client(), capture_output=True, text=True, timeout=120)
        assert ref.returncode == 0 and ref.stdout == DEVNUM_EXPECTED + "PASS devnum\n", ref.stdout + ref.stderr
        p = subprocess.Popen(b.argv() + ["wait"], env=d.env_for_client(), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline() == "ready\n"
            st = _ctl(d, "dump", pid=p.pid, dir=str(tmp / "img"))
            assert st["released"], st
            d.kill()
            d = _daemon(tmp, "proxyd2", need)
            _ctl(d, "restore", dir=str(tmp / "img"), device_map={str(k): v for k, v in dmap.items()})
            p.stdin.write("go\n")
            p.stdin.flush()
            lines = [p.stdout.readline() for _ in range(6)]
            assert "".join(lines[:5]) == DEVNUM_EXPECTED and lines[5] == "ready again\n", "".join(lines)
            _ctl(d, "dump", pid=p.pid, dir=str(tmp / "img2"), leave_running=True)
            out, err = p.communicate("go\n", timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 0 and out == "PASS devnum\n", out + err
        from gpuproxy.proxyd.checkpoint.image import read_manifest
        sess = read_manifest(str(tmp / "img2"))[0]["session"]
        devices = sorted(c["device"] for c in sess["contexts"])
        assert devices == sorted(dmap[x] for x in (0, 1)), sess["contexts"]
        assert {int(k): v for k, v in sess["dev_map"].items() if int(k) in (0, 1)} == dmap, sess["dev_map"]
    finally:
        d.cleanup()


DEVLOC_EXPECTED = ("vmm allocation on device 1, access device 0: 3, device 1: 3\n"
                   "pool access device 0: 3, device 1: 3\n"
                   "new vmm allocation on device 1, access device 1: 3, granularity ok\n"
                   "new pool access device 0: 0, device 1: 3\n")


def _chunk_device(arena: dict, addr: int) -> int:
    for start, size, dev, _small in arena["chunks"]:
        if start <= addr < start + size:
            return dev
    raise AssertionError(f"{addr:#x} is in no chunk of the image")


def test_device_locations_in_structures_after_a_swapped_restore(tmp, shim_installed, nvcc):
    """VMM memory and a memory pool on device 1, dumped, restored with
    --device-map 0=1,1=0: the structures that name a device
    (CUmemAllocationProp, CUmemAccessDesc, CUmemLocation, cudaMemPoolProps)
    keep the program's numbering (families/devnum.py). The program computes
    what it computes uninterrupted, every answer is in its numbers, and the
    image the worker writes afterwards puts every handle, pool and their
    memory -- the old ones and those made after the restore -- on physical
    device 0, which now stands for the program's device 1."""
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    dmap = {0: 1, 1: 0}
    src = EXTRA / "devloc.cu"
    prog = corpus.Program(name="devloc", source=src.name, link=("-lcuda",), cubins=(), args=(), emu=None,
                          expected="", driver=None, pace=False, proxy_only=False, source_path=src)
    b = corpus.build(prog, corpus.default_build_dir() / "programs_extra")
    if BACKEND == "cuda":       # the program's own answers natively
        r = subprocess.run(b.argv(), capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout.startswith(DEVLOC_EXPECTED), r.stdout + r.stderr
    d = _daemon(tmp, "proxyd", 2)
    try:
        ref = subprocess.run(b.argv(), env=d.env_for_client(), capture_output=True, text=True, timeout=120)
        assert ref.returncode == 0 and ref.stdout.startswith(DEVLOC_EXPECTED), ref.stdout + ref.stderr
        result = ref.stdout.splitlines()[4]
        assert result.startswith("result equal, checksum ") and ref.stdout.endswith("PASS devloc\n"), ref.stdout
        p = subprocess.Popen(b.argv() + ["wait"], env=d.env_for_client(), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline() == "ready\n"
            st = _ctl(d, "dump", pid=p.pid, dir=str(tmp / "img"))
            assert st["released"], st
            d.kill()
            d = _daemon(tmp, "proxyd2", 2)
            _ctl(d, "restore", dir=str(tmp / "img"), device_map={str(k): v for k, v in dmap.items()})
            p.stdin.write("go\n")
            p.stdin.flush()
            lines = [p.stdout.readline() for _ in range(6)]
            assert "".join(lines[:4]) == DEVLOC_EXPECTED, "".join(lines) + d.log()[-2000:]
            assert lines[4] == result + "\n" and lines[5] == "ready again\n", "".join(lines)
            _ctl(d, "dump", pid=p.pid, dir=str(tmp / "img2"), leave_running=True)
            out, err = p.communicate("go\n", timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
        assert p.returncode == 0 and out == "PASS devloc\n", out + err
        # where the worker put everything: the image it wrote after the restore
        from gpuproxy.proxyd.checkpoint.image import read_manifest
        sess = read_manifest(str(tmp / "img2"))[0]["session"]
        phys1 = dmap[1]
        handles = sess["mem_handles"]
        assert len(handles) == 2 and all(h["device"] == phys1 for h in handles), handles
        for h in handles:
            assert _chunk_device(sess["arena"], h["mapped"]) == phys1, (h, sess["arena"]["chunks"])
            # the prop it keeps names the physical device too (cuMemGetAllocationPropertiesFromHandle
            # answers the program's number: checked above)
            assert int.from_bytes(bytes.fromhex(h["prop"])[12:16], "little") == phys1, h
        assert sorted(h.get("access", []) for h in handles) == sorted([[], [[dmap[0], 3]]]), handles
        pools = [p for p in sess["mem_pools"] if not p["default"]]
        assert len(pools) == 2 and all(p["device"] == phys1 for p in pools), pools
        assert sorted((p["access"] for p in pools), key=len) == [{}, {str(dmap[0]): 3}], pools
        allocs = [a for p in pools for a, _n in p["allocs"]]
        assert len(allocs) == 2 and all(_chunk_device(sess["arena"], a) == phys1 for a in allocs), (allocs, sess)
    finally:
        d.cleanup()
