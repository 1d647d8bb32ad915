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
        self.path = self.digest = path      # the note names an image by its manifest digest


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


def test_a_chunk_from_memory_that_differs_on_the_device_is_read_from_the_files():
    """The pool written behind the note's back: the device hash after the
    upload differs, so that chunk is sent again from the files; a chunk
    that did not come from memory stays an error (a corrupt image)."""
    e = Engine()
    e.from_memory = {0x1000}
    e.rstats = {"upload": {}, "from_memory_bytes": 8192}
    files = {0x1000: 11, 0x2000: 22}           # what the files hold, as hashes
    pieces = {a: Piece(a, 4096) for a in (0x1000, 0x2000)}
    pieces[0x1000].hash, pieces[0x2000].hash = 999, 998      # both differ after the upload
    sent = []

    def ring(img, refs, pcs):
        sent.extend(r.addr for r in refs)

    def hash_live(check):
        for p in check:
            p.hash = files[p.addr]
    e._upload_ring, e.hash_live = ring, hash_live
    bad = [Ref(0x1000, 4096, 11), Ref(0x2000, 4096, 22)]
    still = M.redo(e, Img("img"), bad, pieces)
    assert sent == [0x1000]                                  # only the one from memory again
    assert [r.addr for r in still] == [0x2000]               # the other is the image's own fault
    assert e.rstats["from_memory_bytes"] == 4096 and e.rstats["upload"]["from_memory_redone"] == 1


def test_pool_forget_drops_only_the_askers_notes(tmp_path, sup):
    from gpuproxy.proxyd.supervisor.pool_forget import ctl_pool_forget
    _note(tmp_path, sup, uid=1000)
    _note(tmp_path, sup, uid=1001)

    class Sup:
        host_pools = sup.pools
        asker = 1001

        def is_admin(self, uid):
            return uid == 0

        def reply(self, rid, seq, obj=None, error=None):
            self.got = error if error is not None else obj
    s = Sup()
    with sup.mu:
        ctl_pool_forget(s, b"", 0, {"uid": 1000})
        assert "permission denied" in s.got
        ctl_pool_forget(s, b"", 0, {})
        assert s.got == {"dropped": 1}
        kept = {p["uid"]: p["kept"] for p in sup.pools.stats()["pools"]}
        assert kept[1001] is None and kept[1000] is not None
        s.asker = 0
        ctl_pool_forget(s, b"", 0, {})
        assert s.got == {"dropped": 1}


# ------------------------------------------------------------ a real program, through proxyd

@pytest.mark.slow
def test_restore_from_memory_of_a_corpus_program(tmp_path):
    """Two runs of a corpus program in one proxyd: a dump's memory kept in
    the pool is not used for another image (the files are) and still serves
    its own; a dump (the session released, its worker gone) restored from
    the pool, its directory moved meanwhile: every byte from memory, and
    both programs' output equals an uninterrupted run's. With a pool too
    small for the dump, the restore reads the files."""
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
        with PacedRun(b, d) as run1, PacedRun(b, d) as run2:
            run1.step_to(1)
            run2.step_to(1)
            st1 = ctl(d, "dump", pid=run1.pid, dir=str(tmp_path / "img1"))
            assert st1["released"] and st1["kept_in_memory_bytes"] > 0, st1
            st2 = ctl(d, "dump", pid=run2.pid, dir=str(tmp_path / "img2"))    # the pool now holds img2's
            assert st2["released"] and st2["kept_in_memory_bytes"] > 0, st2
            r = ctl(d, "restore", dir=str(tmp_path / "img1"))                # another image's: the files
            assert r["from_memory_bytes"] == 0 and r["from_files_bytes"] > 0, r
            # nothing wrote to the pool meanwhile (that restore read the files by their mapping):
            # img2's note still stands
            r = ctl(d, "restore", dir=str(tmp_path / "img2"))
            assert r["from_memory_bytes"] == st2["kept_in_memory_bytes"] and r["from_files_bytes"] == 0, r
            run2.step_to(2)          # its worker holds the pool now; its next dump writes it again
            st = ctl(d, "dump", pid=run2.pid, dir=str(tmp_path / "img5"))
            assert st["kept_in_memory_bytes"] > 0, st
            assert ctl(d, "pool-forget")["dropped"] == 1                 # the explicit release
            r = ctl(d, "restore", dir=str(tmp_path / "img5"))
            assert r["from_memory_bytes"] == 0 and r["from_files_bytes"] > 0, r
            st = ctl(d, "dump", pid=run2.pid, dir=str(tmp_path / "img3"))
            assert st["kept_in_memory_bytes"] > 0, st
            # a moved image is the same image (named by its manifest): from memory, all of it
            shutil.move(str(tmp_path / "img3"), str(tmp_path / "img3-moved"))
            r = ctl(d, "restore", dir=str(tmp_path / "img3-moved"))
            assert r["from_memory_bytes"] == st["kept_in_memory_bytes"] and r["from_files_bytes"] == 0, r
            assert run1.finish() == b.program.expected_output, run1.stderr()
            assert run2.finish() == b.program.expected_output, run2.stderr()
    finally:
        d.cleanup()
    d = daemon(tmp_path, name="small", env=dict(os.environ, GPUPROXY_HOST_POOL_MB="1"))
    try:
        with PacedRun(b, d) as run:
            run.step_to(1)
            st = ctl(d, "dump", pid=run.pid, dir=str(tmp_path / "img4"))
            assert st["released"] and st["kept_in_memory_bytes"] == 0, st     # the pool cannot hold it
            r = ctl(d, "restore", dir=str(tmp_path / "img4"))
            assert r["from_memory_bytes"] == 0 and r["from_files_bytes"] > 0, r
            assert run.finish() == b.program.expected_output, run.stderr()
    finally:
        d.cleanup()
