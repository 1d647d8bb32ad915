"""Restore from host memory (proxyd/checkpoint/memory_restore.py; issue 23,
target 4): a dump's memory left in the supervisor's shared host pool is
uploaded from there by a restore of the same image, checked against the
image's manifest, and never used for another image, another user, or after
the pool was written again. On the emulated backend the pool is a memfd."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from gpuproxy.proxyd.backends import shared_pool
from gpuproxy.proxyd.checkpoint import memory_restore as M

sys.path.insert(0, str(Path(__file__).parent))
from test_host_pool import FakeBackend, sup  # noqa: E402,F401  (the fixture)


class Ref:
    def __init__(self, addr, length, hash):
        self.addr, self.length, self.hash = addr, length, hash


class Piece:
    def __init__(self, addr, n, dev=0, chunk=0):
        self.addr, self.n, self.dev, self.chunk = addr, n, dev, chunk


class Img:
    def __init__(self, path):
        self.path = path


class Device(FakeBackend):
    """Enough of a backend for memory_restore.upload: records what reaches
    the 'device'."""
    spans_mappings = False

    def __init__(self):
        self.mem: dict[int, bytes] = {}
        self.pool = None

    def adopt_host_pool(self, pool):
        self.pool = pool

    def write_device_async(self, dev, addr, data, lane=0):
        self.mem[addr] = bytes(data)

    def sync_copies(self, dev):
        pass


class Engine:
    LANES = 2

    def __init__(self):
        self.backend = Device()


def _note(tmp_path, sup, uid=1000, hashes=(11, 22)):
    """A worker of uid dumps 'img' (two 4 KiB chunks at 0x1000, 0x2000) into
    the pool and notes it, then exits."""
    sup.worker("dumper", uid)
    p = shared_pool.lease(FakeBackend(), 1 << 20)
    p.view[0:4096] = b"a" * 4096
    p.view[4096:8192] = b"b" * 4096
    note = {"image": str(tmp_path / "img"), "runs": [[0x1000, 0, 8192]],
            "digest": M.digest([(0x1000, 4096, hashes[0]), (0x2000, 4096, hashes[1])])}
    assert p.note(note)
    p.free()
    sup.gone("dumper")
    return note


def _restore(tmp_path, refs, path="img"):
    e = Engine()
    pieces = {r.addr: Piece(r.addr, r.length) for r in refs}
    rest, st = M.upload(e, Img(str(tmp_path / path)), refs, pieces)
    return e, rest, st


def test_the_kept_memory_goes_to_a_restore_of_that_image(tmp_path, sup):
    _note(tmp_path, sup)
    assert sup.pools.stats()["pools"][0]["kept"]["bytes"] == 8192
    sup.worker("restorer", 1000)
    refs = [Ref(0x1000, 4096, 11), Ref(0x2000, 4096, 22), Ref(0x9000, 4096, 33)]
    e, rest, st = _restore(tmp_path, refs)
    assert [r.addr for r in rest] == [0x9000]                  # not in the pool: from the files
    assert st["bytes"] == 8192 and "refused" not in st
    assert e.backend.mem == {0x1000: b"a" * 4096 + b"b" * 4096}    # one copy of the contiguous run
    assert e.from_memory == {0x1000, 0x2000}
    assert sup.pools.stats()["pools"][0]["kept"] is None      # taken: the next restore reads the files


def test_a_manifest_that_differs_is_not_used(tmp_path, sup):
    _note(tmp_path, sup)
    sup.worker("restorer", 1000)
    refs = [Ref(0x1000, 4096, 11), Ref(0x2000, 4096, 99)]     # the image's second chunk is not what was kept
    e, rest, st = _restore(tmp_path, refs)
    assert rest == refs and "other contents" in st["refused"] and e.backend.mem == {}


def test_chunks_cut_differently_are_not_used(tmp_path, sup):
    _note(tmp_path, sup)
    sup.worker("restorer", 1000)
    refs = [Ref(0x1000, 8192, 11)]
    e, rest, st = _restore(tmp_path, refs)
    assert rest == refs and "refused" in st and e.backend.mem == {}


def test_another_image_or_another_user_gets_nothing(tmp_path, sup):
    _note(tmp_path, sup)
    refs = [Ref(0x1000, 4096, 11), Ref(0x2000, 4096, 22)]
    sup.worker("other-image", 1000)
    e, rest, st = _restore(tmp_path, refs, path="copy-of-img")
    assert rest == refs and st is None and e.backend.pool is None
    sup.gone("other-image")
    sup.worker("other-user", 1001)
    e, rest, st = _restore(tmp_path, refs)
    assert rest == refs and st is None and e.backend.pool is None
    assert sup.pools.stats()["pools"][0]["kept"] is not None   # still there for its own restore


def test_a_write_to_the_pool_drops_the_note(tmp_path, sup):
    note = _note(tmp_path, sup)
    sup.worker("next-dump", 1000)                  # another dump of the user borrows the pool
    p = shared_pool.lease(FakeBackend(), 1 << 20)
    assert sup.pools.stats()["pools"][0]["kept"] is None
    assert p.note(note)                            # its holder notes, then writes again:
    p.touch()
    assert sup.pools.stats()["pools"][0]["kept"] is None
    p.free()


def test_malformed_notes_are_refused(tmp_path, sup):
    sup.worker("w", 1000)
    p = shared_pool.lease(FakeBackend(), 1 << 20)
    assert not p.note({"image": "x", "digest": b"d", "runs": [[0, p.size, 1]]})    # beyond the pool
    assert not p.note({"image": "x", "digest": "d", "runs": [[0, 0, 1]]})
    assert not p.note({"image": "x", "digest": b"d", "runs": []})
    assert sup.pools.stats()["pools"][0]["kept"] is None
    p.free()


# ------------------------------------------------------------ a real program, through proxyd

@pytest.mark.slow
def test_restore_from_memory_of_a_corpus_program(tmp_path):
    """Dump (the session released, its worker gone), restore from the pool:
    the program's output equals an uninterrupted run's; a copy of the image
    elsewhere is restored from its files; with a pool too small for the
    dump, the restore reads the files."""
    import corpus
    from paced import PacedRun
    from test_checkpoint import BACKEND, ctl, daemon
    if BACKEND != "emu":
        pytest.skip("the GPU run is gpu_check_restlat's (pool part)")
    if not corpus.nvcc_path():
        pytest.skip("nvcc not found")
    b = corpus.build(corpus.get_program("globals_table"), corpus.default_build_dir())
    d = daemon(tmp_path, env=dict(os.environ, GPUPROXY_HOST_POOL_MB="64"))
    try:
        with PacedRun(b, d) as run:
            run.step_to(1)
            st = ctl(d, "dump", pid=run.pid, dir=str(tmp_path / "img1"))
            assert st["released"] and st["kept_in_memory_bytes"] > 0, st
            r = ctl(d, "restore", dir=str(tmp_path / "img1"))
            assert r["from_memory_bytes"] == st["kept_in_memory_bytes"], r
            assert r["from_files_bytes"] == 0, r
            run.step_to(2)
            st = ctl(d, "dump", pid=run.pid, dir=str(tmp_path / "img2"))
            assert st["kept_in_memory_bytes"] > 0, st
            shutil.copytree(tmp_path / "img2", tmp_path / "img2-copy")
            r = ctl(d, "restore", dir=str(tmp_path / "img2-copy"))     # another image: the files
            assert r["from_memory_bytes"] == 0 and r["from_files_bytes"] > 0, r
            out = run.finish()
            assert out == b.program.expected_output, run.stderr()
    finally:
        d.cleanup()
    d = daemon(tmp_path, name="small", env=dict(os.environ, GPUPROXY_HOST_POOL_MB="1"))
    try:
        with PacedRun(b, d) as run:
            run.step_to(1)
            st = ctl(d, "dump", pid=run.pid, dir=str(tmp_path / "img3"))
            assert st["released"] and st["kept_in_memory_bytes"] == 0, st     # the pool cannot hold it
            r = ctl(d, "restore", dir=str(tmp_path / "img3"))
            assert r["from_memory_bytes"] == 0 and r["from_files_bytes"] > 0, r
            assert run.finish() == b.program.expected_output, run.stderr()
    finally:
        d.cleanup()
