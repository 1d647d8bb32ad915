"""Checkpoint engine end to end: iterative corpus programs are checkpointed at
several points of their run, and every run must end with exactly the output
of an uninterrupted run. The process stays alive throughout (no CRIU here):
it waits while its session is dumped, proxyd is killed and a fresh one
restores the image.

Runs on the emulated backend in CI; with GPUPROXY_TEST_BACKEND=cuda (as
scripts/gpu-check sets for its GPU pass) the same tests run on the GPU.
"""
from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import corpus  # noqa: E402
from paced import PacedRun  # noqa: E402
from conftest import short_dir  # noqa: E402
from proxy import Daemon  # noqa: E402

BACKEND = os.environ.get("GPUPROXY_TEST_BACKEND", "emu")
pytestmark = [pytest.mark.gpu] if BACKEND == "cuda" else []


@pytest.fixture(scope="module")
def programs(nvcc, shim_installed):     # skips without nvcc or the installed shim
    return {n: corpus.build(corpus.get_program(n), corpus.default_build_dir()) for n in ("iterative", "iterative_streams")}


def kernels():
    return [str(corpus.PROGRAMS_DIR / p.emu) for p in corpus.load_corpus() if p.emu]   # cublas_gemm has no kernels


def daemon(tmp, name="proxyd", extra=(), env=None):
    d = Daemon(backend=BACKEND, emu_kernels=kernels() if BACKEND == "emu" else (),
               endpoint=f"ipc://{tmp}/proxyd.sock", log_path=str(Path(tmp) / f"{name}.log"), extra_args=extra,
               env=env)
    return d.start()


def ctl(d, cmd, **args):
    from gpuproxy.proxyd.client import ControlClient
    return ControlClient(d.endpoint, timeout_s=120).call(cmd, args)


def ctl_error(d, cmd, **args) -> str:
    from gpuproxy.proxyd.client import ControlError
    with pytest.raises(ControlError) as e:
        ctl(d, cmd, **args)
    return str(e.value)


def expected(built) -> str:
    return built.program.expected_output


@pytest.fixture
def tmp(tmp_path):
    with short_dir("gpx") as d:         # ipc paths must stay short (conftest.short_dir)
        yield d


def restart(d, tmp, name):
    d.kill()
    return daemon(tmp, name)


@pytest.mark.parametrize("name", ["iterative", "iterative_streams"])
def test_dump_restore_into_fresh_daemon_at_several_points(programs, tmp, name):
    b = programs[name]
    d = daemon(tmp)
    try:
        with PacedRun(b, d) as run:
            for i, k in enumerate((5, 17, 33)):
                run.step_to(k)
                img = tmp / f"img{k}"
                st = ctl(d, "dump", pid=run.pid, dir=str(img))
                assert st["released"] and st["bytes"] > 0
                d = restart(d, tmp, f"proxyd{i}")
                r = ctl(d, "restore", dir=str(img))
                assert r["pid"] == run.pid
            out = run.finish()
            assert out == expected(b), run.stderr()
    finally:
        d.cleanup()


def test_leave_running_and_pre_dump_chain_of_three(programs, tmp):
    b = programs["iterative"]
    d = daemon(tmp)
    chain = tmp / "chain"
    try:
        with PacedRun(b, d) as run:
            run.step_to(10)
            s1 = ctl(d, "pre-dump", pid=run.pid, dir=str(chain))
            run.step_to(20)
            s2 = ctl(d, "pre-dump", pid=run.pid, dir=str(chain))
            run.step_to(30)
            s3 = ctl(d, "dump", pid=run.pid, dir=str(chain))
            # three images nested: chain (dump) -> chain/parent -> chain/parent/parent
            assert (chain / "parent" / "parent" / "manifest").exists()
            from gpuproxy.proxyd.checkpoint.image import Image
            img = Image.open(str(chain))
            assert len(img.chain) == 3 and img.manifest["kind"] == "dump"
            assert s3["changed_bytes"] <= s3["bytes"]
            d = restart(d, tmp, "proxyd2")
            ctl(d, "restore", dir=str(chain))
            run.step_to(40)
            # a dump that leaves the app running changes nothing for it
            st = ctl(d, "dump", pid=run.pid, dir=str(tmp / "live"), leave_running=True)
            assert not st.get("released")
            out = run.finish()
            assert out == expected(b), run.stderr()
        assert s1["kind"] == "pre-dump" and s2["kind"] == "pre-dump"
    finally:
        d.cleanup()


def test_incremental_dump_stores_only_changed_chunks(programs, tmp):
    """iterative_streams keeps part of its memory constant: after a pre-dump,
    a dump at the same point stores nothing new, and later ones store less
    than everything."""
    b = programs["iterative"]
    d = daemon(tmp)
    try:
        with PacedRun(b, d) as run:
            run.step_to(12)
            ctl(d, "pre-dump", pid=run.pid, dir=str(tmp / "c"))
            st = ctl(d, "dump", pid=run.pid, dir=str(tmp / "c"), leave_running=True)
            assert st["changed_bytes"] == 0, st
            out = run.finish()
            assert out == expected(b)
    finally:
        d.cleanup()


def test_two_restores_from_one_image(programs, tmp):
    b = programs["iterative"]
    d = daemon(tmp)
    try:
        with PacedRun(b, d) as run:
            run.step_to(25)
            ctl(d, "dump", pid=run.pid, dir=str(tmp / "a"))
            d = restart(d, tmp, "p2")
            ctl(d, "restore", dir=str(tmp / "a"))
            # no step in between: release again and restore the same image a second time
            ctl(d, "dump", pid=run.pid, dir=str(tmp / "b"))
            d = restart(d, tmp, "p3")
            ctl(d, "restore", dir=str(tmp / "a"))
            out = run.finish()
            assert out == expected(b), run.stderr()
    finally:
        d.cleanup()


def test_concurrent_dump_while_the_app_writes(programs, tmp):
    """The app runs on (and writes its memory) while the snapshot drains; the
    image still holds the state at the freeze: identical to a stop-the-world
    dump taken at the same step of an identical run."""
    b = programs["iterative"]
    slow = {"GPUPROXY_TEST_DRAIN_DELAY_S": "1.5"}    # widen the drain window so the app visibly overlaps it
    env = dict(os.environ, **slow)
    d = daemon(tmp, "c1", env=env)
    try:
        with PacedRun(b, d) as run:
            run.step_to(20)
            res = {}
            t = threading.Thread(target=lambda: res.update(ctl(d, "dump", pid=run.pid, dir=str(tmp / "conc"),
                                                               concurrent=True, leave_running=True)))
            t.start()
            end = time.monotonic() + 30
            while time.monotonic() < end:    # the snapshot is taken and draining
                st = ctl(d, "status")["sessions"][0]
                if st["checkpoint"] == "draining":
                    break
                time.sleep(0.02)
            assert st["checkpoint"] == "draining" and not st["frozen"]
            run.step_to(30)          # the app keeps working during the drain
            t_steps = time.monotonic()
            t.join(60)
            t_dump = time.monotonic()
            assert res and res["stop_ms"] < res["total_ms"]
            assert t_steps < t_dump, "app did not progress while the dump drained"
            out = run.finish()
            assert out == expected(b), run.stderr()
    finally:
        d.cleanup()
    d = daemon(tmp, "c2")
    try:
        with PacedRun(b, d) as run:
            run.step_to(20)
            ctl(d, "dump", pid=run.pid, dir=str(tmp / "stw"), leave_running=True)
            run.finish()
    finally:
        d.cleanup()
    from gpuproxy.proxyd.checkpoint.image import Image
    a, s = Image.open(str(tmp / "conc")), Image.open(str(tmp / "stw"))
    base_a, base_s = a.session["arena"]["base"], s.session["arena"]["base"]
    ha = {r.addr - base_a: r.hash for r in a.chunks() if not r.flags}
    hs = {r.addr - base_s: r.hash for r in s.chunks() if not r.flags}
    assert ha and ha == hs


def data_file(img: Path) -> Path:
    """The memory.bin of the chain that holds data (a dump right after a
    pre-dump stores nothing itself)."""
    while (img / "memory.bin").stat().st_size == 0:
        img = img / "parent"
    return img / "memory.bin"


def corrupt_flip(img: Path):
    m = data_file(img)
    data = bytearray(m.read_bytes())
    data[len(data) // 2] ^= 0x40
    m.write_bytes(bytes(data))


def corrupt_truncate(img: Path):
    m = data_file(img)
    m.write_bytes(m.read_bytes()[:-1000])


@pytest.mark.parametrize("damage,words", [
    (corrupt_flip, ["corrupt", "chunk"]),
    (corrupt_truncate, ["truncated"]),
    (lambda img: shutil.rmtree(img / "parent"), ["parent"]),
])
def test_corrupt_images_are_refused_and_change_nothing(programs, tmp, damage, words):
    b = programs["iterative"]
    d = daemon(tmp)
    try:
        with PacedRun(b, d) as run:
            run.step_to(8)
            ctl(d, "pre-dump", pid=run.pid, dir=str(tmp / "img"))
            ctl(d, "dump", pid=run.pid, dir=str(tmp / "img"))
            good = tmp / "good"
            shutil.copytree(tmp / "img", good)
            damage(tmp / "img")
            d = restart(d, tmp, "p2")
            err = ctl_error(d, "restore", dir=str(tmp / "img"))
            for w in words:
                assert w in err.lower(), err
            st = ctl(d, "status")
            assert st["sessions"] == [], "a refused restore left a session behind"
            ctl(d, "restore", dir=str(good))
            out = run.finish()
            assert out == expected(b), run.stderr()
    finally:
        d.cleanup()


def test_migrate_to_another_device(programs, tmp):
    """On the emulated backend with two devices: device 0 -> 1. On a GPU
    machine with one GPU the same path runs as a move onto device 0 (dump to
    host memory, release, restore), which is what a move between GPUs does."""
    b = programs["iterative_streams"]
    if BACKEND == "emu":
        d = Daemon(backend="emu", emu_kernels=kernels(), endpoint=f"ipc://{tmp}/proxyd.sock",
                   extra_args=["--emu-devices", "2"], log_path=str(tmp / "m.log")).start()
    else:
        d = daemon(tmp, "m")
    to = 1 if d.backend == "emu" else int(os.environ.get("GPUPROXY_TEST_MIGRATE_TO", "0"))
    try:
        with PacedRun(b, d) as run:
            run.step_to(10)
            r = ctl(d, "migrate", pid=run.pid, to_device=to)
            assert r["to_device"] == to
            st = ctl(d, "status")
            assert st["sessions"][0]["pid"] == run.pid
            out = run.finish()
            assert out == expected(b), run.stderr()
    finally:
        d.cleanup()
