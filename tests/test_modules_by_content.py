"""Module images by content (proxyd/families/modstore.py, interceptor/driver.c
gp_module_load_image, docs/protocol.md "Module images by content"):

* the shim's SHA-256 (interceptor/sha256.c) is hashlib's;
* the worker's store: parsed layouts in an LRU bounded in entries, images in
  one bounded in bytes, and the disk cache across runs, which checks every
  entry (an image whose hash is not its name, a layout whose MAC does not
  check out, a folder that is a link) and stays within its size bound;
* end to end on the emulated backend: the first run of a program sends its
  module image, a second run (a new worker) sends only the digest, a damaged
  cache entry costs a resend and nothing else.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess

import pytest

from conftest import client_env
from proxy import Daemon


def _ptx(i: int, pad: int = 0) -> bytes:
    # a distinct, parseable module image per i (PTX text), pad bytes of comment-free filler
    filler = "".join(f".visible .global .align 4 .u32 filler{i}_{j};\n" for j in range(pad))
    return (f".version 8.0\n.target sm_90\n.address_size 64\n{filler}"
            f".visible .global .align 4 .u32 counter{i} = {i};\n"
            f".visible .entry k{i}(.param .u64 k{i}_param_0, .param .u32 k{i}_param_1)\n{{ ret; }}\n").encode()


@pytest.fixture
def modstore():
    from gpuproxy.proxyd.families import modstore
    return modstore


# ----------------------------------------------------------------- the hash


def test_shim_sha256_is_sha256(shim_installed):
    lib = ctypes.CDLL(shim_installed.preload_value().split(":")[1])
    f = lib.gp_sha256
    f.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p]
    # every padding case: one or two final blocks, lengths around 56 and 64
    for n in (0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 128, 1000, 1 << 20):
        data = os.urandom(n)
        out = ctypes.create_string_buffer(32)
        f(data, n, out)
        assert out.raw == hashlib.sha256(data).digest(), n


# ---------------------------------------------------------------- the store


def test_parsed_layouts_are_an_lru_of_bounded_size(modstore, tmp_path):
    s = modstore.ModuleStore(root=str(tmp_path), parsed_max=2, disk=False)
    imgs = [_ptx(i) for i in range(3)]
    for img in imgs:
        p = s.parsed(img, None)
        assert [k for k in p.kernels] == [f"k{imgs.index(img)}"]
    assert s.stats["parsed"] == 3 and len(s._parsed) == 2
    s.parsed(imgs[2], None)                 # the most recent: still there
    assert s.stats["parse_memory_hits"] == 1
    s.parsed(imgs[0], None)                 # the least recent went first: parsed again
    assert s.stats["parsed"] == 4 and len(s._parsed) == 2


def test_images_in_memory_are_bounded_in_bytes(modstore, tmp_path):
    big = [_ptx(i, pad=200) for i in range(4)]
    s = modstore.ModuleStore(root=str(tmp_path), mem_bytes=2 * len(big[0]) + 100, disk=False)
    digests = [s.add_image(b, None) for b in big]
    assert s._image_total <= s.mem_bytes and len(s._images) == 2
    assert s.image(digests[0], len(big[0]), None) is None           # evicted
    assert s.image(digests[3], len(big[3]), None) == big[3]
    assert s.image(digests[3], len(big[3]) + 1, None) is None       # the length is part of the name


def test_disk_cache_serves_a_new_store_and_checks_entries(modstore, tmp_path):
    uid = os.geteuid()
    img = _ptx(5)
    a = modstore.ModuleStore(root=str(tmp_path))
    digest = a.add_image(img, uid)
    pa = a.parsed(img, uid, digest)
    folder = tmp_path / f"u{uid}"
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert sorted(p.name for p in folder.iterdir()) == [digest.hex() + ".img", digest.hex() + ".layout"]
    assert all(p.stat().st_mode & 0o077 == 0 for p in folder.iterdir())

    b = modstore.ModuleStore(root=str(tmp_path))                # another worker, a later run
    assert b.image(digest, len(img), uid) == img
    pb = b.parsed(img, uid, digest)
    assert b.stats["image_disk_hits"] == 1 and b.stats["parse_disk_hits"] == 1 and b.stats["parsed"] == 0
    assert pb.kernels == pa.kernels and pb.globals == pa.globals

    # another user's folder is not this one: nothing found there
    assert b.image(digest, len(img), uid + 1) is None

    # an image whose content is not its name: refused and removed
    (folder / (digest.hex() + ".img")).write_bytes(img.replace(b"ret;", b"trap;"))
    c = modstore.ModuleStore(root=str(tmp_path))
    assert c.image(digest, len(img), uid) is None
    assert not (folder / (digest.hex() + ".img")).exists() and c.stats["disk_rejected"] == 1

    # a layout edited in place: its MAC fails, the image is parsed again
    lay = folder / (digest.hex() + ".layout")
    raw = bytearray(lay.read_bytes())
    raw[-1] ^= 1
    lay.write_bytes(bytes(raw))
    d = modstore.ModuleStore(root=str(tmp_path))
    pd = d.parsed(img, uid, digest)
    assert d.stats["disk_rejected"] == 1 and d.stats["parsed"] == 1 and pd.kernels == pa.kernels
    # ... and the rewritten entry is good again
    e = modstore.ModuleStore(root=str(tmp_path))
    e.parsed(img, uid, digest)
    assert e.stats["parse_disk_hits"] == 1


def test_layout_made_under_another_key_is_refused(modstore, tmp_path, monkeypatch):
    uid = os.geteuid()
    img = _ptx(6)
    a = modstore.ModuleStore(root=str(tmp_path))
    a._key = b"k" * 32                          # someone else's key
    a.parsed(img, uid)
    b = modstore.ModuleStore(root=str(tmp_path))
    b.parsed(img, uid)
    assert b.stats["disk_rejected"] == 1 and b.stats["parsed"] == 1


def test_a_linked_folder_turns_the_disk_cache_off(modstore, tmp_path):
    uid = os.geteuid()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    (root / f"u{uid}").symlink_to(elsewhere)
    s = modstore.ModuleStore(root=str(root))
    s.add_image(_ptx(7), uid)
    assert list(elsewhere.iterdir()) == []
    assert s.image(hashlib.sha256(_ptx(7)).digest(), len(_ptx(7)), uid) == _ptx(7)   # memory still works


def test_disk_cache_stays_within_its_bound(modstore, tmp_path):
    uid = os.geteuid()
    imgs = [_ptx(i, pad=100) for i in range(10)]
    s = modstore.ModuleStore(root=str(tmp_path), disk_bytes=4 * len(imgs[0]))
    for i, img in enumerate(imgs):
        s.add_image(img, uid)
        os.utime(tmp_path / f"u{uid}" / (hashlib.sha256(img).hexdigest() + ".img"), (1000 + i, 1000 + i))
    files = list((tmp_path / f"u{uid}").iterdir())
    assert sum(f.stat().st_size for f in files) <= 4 * len(imgs[0])
    assert (tmp_path / f"u{uid}" / (hashlib.sha256(imgs[-1]).hexdigest() + ".img")).exists()
    assert s.stats["disk_evicted"] >= 6


# --------------------------------------------------------------- end to end


def test_second_run_sends_only_the_digest(corpus_built, shim_installed, tmp_path):
    built = corpus_built["vector_add"]
    env = dict(os.environ, GPUPROXY_CACHE_DIR=str(tmp_path / "cache"))
    d = Daemon(backend="emu", emu_kernels=[built.program.emu_path], endpoint=f"ipc://{tmp_path}/p.sock", env=env)
    d.start()
    try:
        def run(extra=None):
            r = subprocess.run(built.argv(), capture_output=True, text=True, timeout=60,
                               env=client_env(d, {"GPUPROXY_DEBUG": "1", **(extra or {})}))
            assert r.returncode == 0 and r.stdout == built.program.expected_output, r.stdout + r.stderr
            return [ln for ln in r.stderr.splitlines() if "sent whole" in ln]

        assert len(run()) == 1               # first run: the worker had never seen the image
        assert run() == []                   # a new worker, the disk cache: the digest was enough
        assert run({"GPUPROXY_MODULES_BY_CONTENT": "0"}) == []   # bytes every time, on request
        # a damaged cache entry: refused, the image is sent again, the program does not notice
        imgs = list((tmp_path / "cache" / "modules").rglob("*.img"))
        assert len(imgs) == 1
        imgs[0].write_bytes(b"\0" * imgs[0].stat().st_size)
        assert len(run()) == 1
        assert "removed: its content does not match its name" in d.log()
    finally:
        d.cleanup()
