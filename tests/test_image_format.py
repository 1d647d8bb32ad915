"""Tests for the checkpoint image format (proxyd/checkpoint/image.py,
hashing.py, gp64.c) and `proxy-cli inspect` (cli/checkpoint_cmds.py).

Runs against the installed package (pip install . from the repo root);
test_installed_copy_is_current says when the installed copy is stale.
No GPU needed: sessions are synthetic dicts, memory is random bytes.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpuproxy.cli import checkpoint_cmds
from gpuproxy.cli.main import main as cli_main
from gpuproxy.proxyd.checkpoint import hashing as H
from gpuproxy.proxyd.checkpoint import image as I
from gpuproxy.proxyd.checkpoint.image import FLAG_GLOBAL, Image, ImageError, ImageWriter

REPO = Path(__file__).resolve().parents[1]
CHUNK = 64 << 10           # small chunks keep the tests fast; the format does not care
BASE = 0x7F1200000000


def test_installed_copy_is_current():
    for rel, mod in (("proxyd/checkpoint/image.py", I), ("proxyd/checkpoint/hashing.py", H),
                     ("cli/checkpoint_cmds.py", checkpoint_cmds)):
        src = REPO / rel
        if src.exists():
            assert Path(mod.__file__).read_bytes() == src.read_bytes(), \
                f"installed {mod.__name__} differs from {rel}: run `pip install .` in {REPO}"


# ------------------------------------------------------------------ gp64

@pytest.fixture(scope="module")
def c_lib(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("gp64") / "libgp64.so"
    subprocess.run([cc, "-O3", "-shared", "-fPIC", "-std=c99", "-Wall", "-Wextra", "-Werror",
                    str(REPO / "proxyd" / "checkpoint" / "gp64.c"), "-o", str(out)], check=True)
    h = H.load_c_hasher(str(out))
    assert h is not None, "compiled gp64.c failed to load or failed its known-answer test"
    return h


LENGTHS = [0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 255, 4095, 4096, 4097, 65536 + 5]


def test_gp64_known_values():
    # fixed points of the definition, so a change to it cannot go unnoticed
    assert H.gp64_reference(b"") == H._mix_int(0)
    assert H.gp64_reference(b"\x00" * 8) == H._mix_int(H._mix_int(0) ^ 8)
    w = int.from_bytes(b"abcdefgh", "little")
    two = (H._mix_int(w) + H._mix_int(0x69 ^ H.STEP)) & H.MASK
    assert H.gp64_reference(b"abcdefghi") == H._mix_int(two ^ 9)
    assert H.gp64_reference(b"\x01") != H.gp64_reference(b"\x01\x00")     # the length counts


def test_gp64_c_numpy_reference_agree(c_lib):
    rng = np.random.default_rng(7)
    for n in LENGTHS:
        data = rng.integers(0, 256, n, dtype=np.uint8)
        ref = H.gp64_reference(data)
        assert H.gp64_numpy(data) == ref, n
        assert c_lib(data) == ref, n
        assert H.gp64(data) == ref, n
    big = rng.integers(0, 256, (2 << 20) + 3, dtype=np.uint8)
    assert H.gp64_numpy(big) == c_lib(big) == H.gp64_reference(big)
    # slices past SLICE_WORDS, misaligned starts
    big2 = rng.integers(0, 256, 3 * H.SLICE_WORDS * 8 + 13, dtype=np.uint8)
    for off in (0, 1, 3, 8):
        assert H.gp64_numpy(big2[off:]) == c_lib(big2[off:])


def test_gp64_input_types(c_lib):
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, 1000, dtype=np.uint8).tobytes()
    want = H.gp64_reference(raw)
    arr32 = np.frombuffer(raw, dtype="<u4")
    for data in (raw, bytearray(raw), memoryview(raw), np.frombuffer(raw, np.uint8), arr32,
                 memoryview(arr32), np.frombuffer(raw, np.uint8).reshape(10, 100)):
        assert H.gp64_numpy(data) == want
        assert c_lib(data) == want
    strided = np.frombuffer(raw * 2, np.uint8)[::2]       # non-contiguous: hashed as its elements
    assert H.gp64_numpy(strided) == c_lib(strided) == H.gp64_reference(strided.tobytes())


def test_gp64_many(c_lib):
    rng = np.random.default_rng(11)
    buf = rng.integers(0, 256, 3 * 4096 + 100, dtype=np.uint8)
    for cs in (8, 16, 24, 64, 5, 13, 4096, 4096 * 3 + 100, 1 << 20):
        want = [H.gp64_reference(buf[i:i + cs]) for i in range(0, buf.size, cs)] if cs >= 4096 else \
               [H.gp64_numpy(buf[i:i + cs]) for i in range(0, buf.size, cs)]
        got_np = H.gp64_many_numpy(buf, cs)
        got_c = c_lib.many(buf, cs)
        assert got_np.dtype == np.uint64 and got_c.dtype == np.uint64
        assert [int(x) for x in got_np] == want, cs
        assert [int(x) for x in got_c] == want, cs
    assert H.gp64_many_numpy(b"", 64).size == 0 and c_lib.many(b"", 64).size == 0
    with pytest.raises(ValueError):
        H.gp64_many(b"abc", 0)


def test_c_loader_refuses_bad_libraries(tmp_path):
    assert H.load_c_hasher(str(tmp_path / "nope.so")) is None
    (tmp_path / "junk.so").write_bytes(b"not a library")
    assert H.load_c_hasher(str(tmp_path / "junk.so")) is None
    cc = shutil.which("cc")
    if cc:
        # exports the right names but computes something else: refused
        src = tmp_path / "bad.c"
        src.write_text("#include <stdint.h>\n#include <stddef.h>\n"
                       "uint64_t gp64(const void *p, size_t n) { (void)p; return n; }\n"
                       "void gp64_many(const void *p, size_t n, size_t c, uint64_t *o) { (void)p; (void)n; (void)c; (void)o; }\n")
        subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(tmp_path / "bad.so")], check=True)
        assert H.load_c_hasher(str(tmp_path / "bad.so")) is None


# ---------------------------------------------------------------- writing

def session_of(mem: dict, globals_: dict, modules: list[str], pid=4242) -> dict:
    addrs = sorted(mem)
    return {
        "token": "t-1", "pid": pid, "slot": 3, "last_seq": 77, "last_reply": None, "exe": "/usr/bin/app",
        "contexts": [{"id": 1, "device": 0, "primary": True, "flags": 0, "refcount": 1}],
        "modules": [{"id": 10 + i, "ctx": 1, "size": 100, "image": sha, "kernels": ["axpy", "reduce"],
                     "globals": {f"g{a:x}": [a, len(v)] for a, v in globals_.items()}}
                    for i, sha in enumerate(modules)],
        "functions": [{"id": 20, "ctx": 1, "module": 10, "name": "axpy", "layout": [[0, 8], [8, 4]]}],
        "streams": [{"id": 30, "ctx": 1, "create": [5, 1, [0]]}],
        "events": [],
        "arena": {"base": BASE, "size": 1 << 36,
                  "chunks": [[a, len(mem[a]), 0, False] for a in addrs],
                  "allocations": [[a, max(len(mem[a]) - 16, 1), len(mem[a])] for a in addrs]},
    }


META = {"backend": "emu", "driver_version": 12040,
        "devices": [{"index": 0, "name": "Emulated GPU", "total_memory": 16 << 30, "uuid": "GPU-0000"}]}


def write_image(path, kind, mem, globals_, modules, parent=None, stats=None):
    """Like the engine: store what changed since the parent, refer to the rest."""
    w = ImageWriter(path, kind, META, parent=parent, chunk_size=CHUNK)
    shas = [w.add_module(m) for m in modules]
    for key, flags in ((mem, 0), (globals_, FLAG_GLOBAL)):
        for addr, data in sorted(key.items()):
            h = H.gp64(data)
            if parent is not None and parent.hash_of(addr) == h:
                w.add_unchanged(addr, len(data), h, flags=flags)
            else:
                w.add_chunk(addr, data, hash=h, flags=flags)
    return w.finish(session_of(mem, globals_, shas), stats or {"total_ms": 1.25})


def rand(rng, n=CHUNK) -> bytes:
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def check_contents(img: Image, mem: dict, globals_: dict):
    refs = img.chunks()
    assert {r.addr for r in refs} == set(mem) | set(globals_)
    for r in refs:
        want = globals_[r.addr] if r.is_global else mem[r.addr]
        assert r.is_global == (r.addr in globals_)
        assert bytes(img.read_chunk(r, verify=True)) == want


MOD_A = b"\x7fELF module A" * 50
MOD_B = b"\x7fELF module B" * 70


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """Three images: full pre-dump, incremental pre-dump, incremental dump."""
    root = tmp_path_factory.mktemp("chain")
    rng = np.random.default_rng(42)
    mem = {BASE + i * CHUNK: rand(rng) for i in range(8)}
    glob = {0x10000: rand(rng, 8), 0x10100: rand(rng, 300)}
    states, stored = [], []
    img1 = write_image(root / "img1", "pre-dump", mem, glob, [MOD_A])
    states.append((dict(mem), dict(glob)))
    stored.append(set(mem) | set(glob))
    # second: chunks 1 and 3 change, chunk 7 is freed, chunk 8 is new, one global changes
    mem[BASE + 1 * CHUNK] = rand(rng)
    mem[BASE + 3 * CHUNK] = rand(rng)
    del mem[BASE + 7 * CHUNK]
    mem[BASE + 8 * CHUNK] = rand(rng, CHUNK // 2)
    glob[0x10000] = rand(rng, 8)
    img2 = write_image(root / "img2", "pre-dump", mem, glob, [MOD_A], parent=img1)
    states.append((dict(mem), dict(glob)))
    stored.append({BASE + CHUNK, BASE + 3 * CHUNK, BASE + 8 * CHUNK, 0x10000})
    # third: chunk 3 changes again, chunk 5 changes; a new module
    mem[BASE + 3 * CHUNK] = rand(rng)
    mem[BASE + 5 * CHUNK] = rand(rng)
    img3 = write_image(root / "img3", "dump", mem, glob, [MOD_A, MOD_B], parent=img2)
    states.append((dict(mem), dict(glob)))
    stored.append({BASE + 3 * CHUNK, BASE + 5 * CHUNK})
    for img in (img1, img2, img3):
        img.close()
    return root, states, stored


def fresh(chain, tmp_path) -> Path:
    """A private copy of the chain (relative parent paths survive the move)."""
    root = tmp_path / "copy"
    shutil.copytree(chain[0], root)
    return root


def test_chain_contents_and_storage(chain):
    root, states, stored = chain
    for k, name in enumerate(("img1", "img2", "img3")):
        img = Image.open(root / name)
        assert len(img.chain) == k + 1
        mem, glob = states[k]
        check_contents(img, mem, glob)
        here = {r.addr for r in img.chunks() if r.image == 0}
        assert here == stored[k]
        m = img.manifest["memory"]
        all_sizes = {**mem, **glob}
        assert m["stored_bytes"] == sum(len(all_sizes[a]) for a in stored[k])
        assert m["bytes"] == sum(len(v) for v in all_sizes.values())
        assert m["chunks"] == len(all_sizes)
        assert m["global_chunks"] == len(glob)
        size = os.path.getsize(root / name / "memory.bin")
        assert m["stored_bytes"] <= size < m["stored_bytes"] + I.PAGE * len(stored[k])
        assert img.verify() == []
        img.check_restorable(allow_pre_dump=True, deep=True)
        img.close()


def test_chain_references(chain):
    root, states, _ = chain
    img = Image.open(root / "img3")
    where = {r.addr: r.image for r in img.chunks()}
    assert where[BASE] == 2                      # unchanged since img1
    assert where[BASE + CHUNK] == 1              # written by img2
    assert where[BASE + 3 * CHUNK] == 0          # written again here
    assert where[BASE + 5 * CHUNK] == 0
    assert where[BASE + 8 * CHUNK] == 1
    assert where[0x10000] == 1 and where[0x10100] == 2
    assert BASE + 7 * CHUNK not in where         # freed: not live, not recorded
    # hash_of: the latest value in the chain; a chunk only an ancestor has is still known
    assert img.hash_of(BASE + 3 * CHUNK) == H.gp64(states[2][0][BASE + 3 * CHUNK])
    assert img.hash_of(BASE + 7 * CHUNK) == H.gp64(states[0][0][BASE + 7 * CHUNK])
    assert img.hash_of(0xDEAD000) is None
    # modules: deduplicated, found through the chain, stored where first added
    mods = img.modules()
    assert len(mods) == 2
    assert {e["image"] for e in mods.values()} == {0, 2}
    assert sorted(img.module(sha) for sha in mods) == sorted([MOD_A, MOD_B])
    assert not any((root / "img2" / "modules").iterdir())
    s = img.session
    assert s["pid"] == 4242
    assert [m["image"] for m in s["modules"]] == [hashlib.sha256(MOD_A).hexdigest(), hashlib.sha256(MOD_B).hexdigest()]
    assert img.manifest["parent"]["path"] == os.path.join("..", "img2")
    assert img.manifest["ancestors"] == [a.digest for a in img.chain[1:]]
    img.close()


def test_two_reads_agree(chain):
    root, states, _ = chain
    a, b = Image.open(root / "img3"), Image.open(root / "img3")
    assert a.digest == b.digest and a.manifest == b.manifest
    assert a.chunks() == b.chunks()
    for r in a.chunks():
        first = bytes(a.read_chunk(r))
        assert first == bytes(a.read_chunk(r)) == bytes(b.read_chunk(r))
    a.close()
    check_contents(b, *states[2])     # closing one does not disturb the other
    b.close()


def test_session_stored_verbatim(tmp_path):
    sess = {"token": "x", "nested": {"a": [1, 2, {"b": None}]}, "big": (1 << 63) + 5, "text": "naïve ✓",
            "last_reply": ["AAEC"], "f": 1.5}
    w = ImageWriter(tmp_path / "i", "dump", META)
    img = w.finish(sess, {"t": 2})
    assert img.session == sess and img.manifest["stats"] == {"t": 2}
    assert img.chunks() == [] and img.verify() == []
    img.check_restorable()
    first = (tmp_path / "i" / "manifest").read_bytes().split(b"\n")[0]
    assert first == b"GPUPROXY-IMAGE 2"


def test_writer_refusals(tmp_path, chain):
    root, _, _ = chain
    with pytest.raises(ValueError):
        ImageWriter(tmp_path / "a", "snapshot", META)
    with pytest.raises(ValueError):
        ImageWriter(tmp_path / "a", "dump", {"session": {}})
    w = ImageWriter(tmp_path / "a", "dump", META)
    w.add_chunk(0x1000, b"x" * 16)
    with pytest.raises(ImageError, match="0x1000 added twice"):
        w.add_chunk(0x1000, b"y")
    with pytest.raises(ImageError, match="needs a parent"):
        w.add_unchanged(0x2000, 16, 1)
    with pytest.raises(ValueError, match="flags"):
        w.add_chunk(0x3000, b"z", flags=2)
    w.finish({}, {})
    with pytest.raises(ImageError, match="already holds an image"):
        ImageWriter(tmp_path / "a", "dump", META)
    parent = Image.open(root / "img1")
    w = ImageWriter(tmp_path / "b", "dump", META, parent=parent)
    with pytest.raises(ImageError, match=r"chunk 0x7f1200000000 .* is in no image of the parent chain .*has it"):
        w.add_unchanged(BASE, CHUNK, 12345)
    with pytest.raises(ImageError, match="in no image"):
        w.add_unchanged(0x999000, 8, 1)
    w.abort()
    parent.close()


def test_nested_chain_like_the_engine(tmp_path):
    """The engine keeps a chain in one folder: DIR holds the newest image and
    DIR/parent the previous one (moved there whole before each new dump)."""
    rng = np.random.default_rng(5)
    d = tmp_path / "ckpt"
    mem = {BASE: rand(rng), BASE + CHUNK: rand(rng)}
    write_image(d, "pre-dump", mem, {}, [MOD_A]).close()
    for step in range(2):
        os.rename(d, str(d) + ".moving")
        os.makedirs(d)
        os.rename(str(d) + ".moving", d / "parent")
        mem[BASE + step * CHUNK] = rand(rng)
        parent = Image.open(d / "parent")
        write_image(d, "dump" if step else "pre-dump", mem, {}, [MOD_A], parent=parent).close()
    img = Image.open(d)
    assert [a.path for a in img.chain] == [str(d), str(d / "parent"), str(d / "parent" / "parent")]
    check_contents(img, mem, {})
    assert img.verify() == []
    # the whole folder can move
    os.rename(d, tmp_path / "moved")
    assert Image.open(tmp_path / "moved").verify() == []


def test_numpy_fallback_writes_same_image(tmp_path):
    rng = np.random.default_rng(9)
    mem = {BASE: rand(rng, 5000), BASE + CHUNK: rand(rng, 3)}
    saved = H.c_hasher()
    try:
        H.use_c_hasher(None)
        assert H.implementation() == "numpy"
        img = write_image(tmp_path / "n", "dump", mem, {}, [])
        hashes = [r.hash for r in img.chunks()]
    finally:
        H.use_c_hasher(saved)
    assert hashes == [H.gp64_reference(mem[a]) for a in sorted(mem)]
    assert img.verify() == []


# --------------------------------------------------------------- refusals

def refused(path, match, deep=False):
    """Image at path must be refused before any restore, naming the problem."""
    with pytest.raises(ImageError, match=match) as e:
        Image.open(path).check_restorable(allow_pre_dump=True, deep=deep)
    return str(e.value)


def test_flipped_byte_in_memory_is_named(chain, tmp_path, capsys):
    root = fresh(chain, tmp_path)
    img = Image.open(root / "img3")
    victim = next(r for r in img.chunks() if r.image == 2 and not r.is_global)
    img.close()
    mb = root / "img1" / "memory.bin"
    raw = bytearray(mb.read_bytes())
    raw[victim.offset + 1234] ^= 0x40
    mb.write_bytes(bytes(raw))
    img = Image.open(root / "img3")
    img.check_restorable()                     # structure is intact ...
    problems = img.verify()                    # ... the data is not
    assert len(problems) == 1
    assert f"chunk {victim.addr:#x}" in problems[0] and "is corrupt: gp64" in problems[0]
    assert str(mb) in problems[0] and f"index says {victim.hash:#018x}" in problems[0]
    refused(root / "img3", f"chunk {victim.addr:#x} .* is corrupt", deep=True)
    with pytest.raises(ImageError, match="corrupt"):
        img.read_chunk(victim, verify=True)
    assert cli_main(["inspect", str(root / "img3")]) == 1
    out = capsys.readouterr().out
    assert f"PROBLEM: {mb}: chunk {victim.addr:#x}" in out and "checksums: 1 problem" in out


def test_flipped_global_is_named(chain, tmp_path):
    root = fresh(chain, tmp_path)
    img = Image.open(root / "img2")
    g = img.find(0x10000)
    img.close()
    mb = root / "img2" / "memory.bin"
    raw = bytearray(mb.read_bytes())
    raw[g.offset] ^= 1
    mb.write_bytes(bytes(raw))
    refused(root / "img3", r"__device__ variable 0x10000 .* is corrupt", deep=True)


def test_truncated_memory(chain, tmp_path):
    root = fresh(chain, tmp_path)
    mb = root / "img2" / "memory.bin"
    size = mb.stat().st_size
    os.truncate(mb, size - 100)
    msg = refused(root / "img3", "memory.bin is truncated")
    assert f"{size - 100} bytes, the manifest says {size}" in msg and str(mb) in msg
    assert any("truncated" in p for p in Image.open(root / "img3").verify())


def test_missing_memory_file(chain, tmp_path):
    root = fresh(chain, tmp_path)
    os.unlink(root / "img1" / "memory.bin")
    refused(root / "img3", r"img1/memory.bin is missing")


def test_truncated_index(chain, tmp_path):
    root = fresh(chain, tmp_path)
    idx = root / "img3" / "chunks.idx"
    os.truncate(idx, idx.stat().st_size - 40)
    refused(root / "img3", r"img3/chunks.idx is truncated: \d+ bytes, the manifest says")
    assert cli_main(["inspect", str(root / "img3")]) == 1


def test_corrupt_index(chain, tmp_path):
    root = fresh(chain, tmp_path)
    idx = root / "img2" / "chunks.idx"
    raw = bytearray(idx.read_bytes())
    raw[20] ^= 0xFF
    idx.write_bytes(bytes(raw))
    refused(root / "img3", r"img2/chunks.idx is corrupt: sha256 [0-9a-f]{64}, the manifest says")


def test_missing_parent(chain, tmp_path):
    root = fresh(chain, tmp_path)
    shutil.rmtree(root / "img1")
    msg = refused(root / "img3", r"img2: parent image '../img1' is missing \(no directory ")
    assert str(root / "img1") in msg


def test_parent_manifest_changed(chain, tmp_path):
    root = fresh(chain, tmp_path)
    # a well-formed manifest, but not the one img3 was made from
    body, _ = I.read_manifest(str(root / "img2"))
    body["stats"]["total_ms"] = 99.0
    (root / "img2" / "manifest").write_bytes(I.encode_manifest(body))
    Image.open(root / "img2").check_restorable(allow_pre_dump=True)
    refused(root / "img3", r"img3: parent image .*img2 is not the one this image was made from: its manifest "
                           r"sha256 is [0-9a-f]{64}, expected [0-9a-f]{64}")


def test_replaced_grandparent(chain, tmp_path):
    """An ancestor swapped for another valid image is caught by the digests."""
    root = fresh(chain, tmp_path)
    shutil.rmtree(root / "img1")
    write_image(root / "img1", "pre-dump", {BASE: b"\0" * CHUNK}, {}, []).close()
    refused(root / "img3", "not the one this image was made from")


def test_modified_manifest(chain, tmp_path):
    root = fresh(chain, tmp_path)
    mf = root / "img3" / "manifest"
    raw = mf.read_bytes()
    assert raw.count(b'"pid": 4242') == 1
    mf.write_bytes(raw.replace(b'"pid": 4242', b'"pid": 4243'))
    refused(root / "img3", r"img3/manifest: manifest digest mismatch: the body's sha256 is [0-9a-f]{64}, its last "
                           r"line says [0-9a-f]{64}")
    mf.write_bytes(raw[:len(raw) // 2])
    refused(root / "img3", "truncated or damaged")


def test_unknown_format_version(chain, tmp_path):
    root = fresh(chain, tmp_path)
    mf = root / "img3" / "manifest"
    raw = mf.read_bytes()
    mf.write_bytes(raw.replace(b"GPUPROXY-IMAGE 2\n", b"GPUPROXY-IMAGE 3\n", 1))
    refused(root / "img3", "image format version 3, this gpuproxy reads 1 and 2")
    # a header that says 1 over a format-2 body is refused too (never misread)
    mf.write_bytes(raw.replace(b"GPUPROXY-IMAGE 2\n", b"GPUPROXY-IMAGE 1\n", 1))
    refused(root / "img3", "body says format version 2, first line says 1")
    mf.write_bytes(b"PK\x03\x04" + raw)
    refused(root / "img3", "not a gpuproxy image manifest")
    # a parent of another version is named as the parent
    mf.write_bytes(raw)
    p = root / "img2" / "manifest"
    p.write_bytes(p.read_bytes().replace(b"GPUPROXY-IMAGE 2\n", b"GPUPROXY-IMAGE 0\n", 1))
    refused(root / "img3", "img3: parent image: .*img2/manifest: image format version 0")


def test_module_files_checked(chain, tmp_path):
    root = fresh(chain, tmp_path)
    img = Image.open(root / "img3")
    a_sha = next(s for s, e in img.modules().items() if e["image"] == 2)
    img.close()
    f = root / "img1" / "modules" / (a_sha + ".bin")
    data = f.read_bytes()
    f.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    refused(root / "img3", f"module file .*{a_sha}.bin is corrupt", deep=True)
    with pytest.raises(ImageError, match="is corrupt"):
        Image.open(root / "img3").module(a_sha)
    os.unlink(f)
    refused(root / "img3", f"module file .*{a_sha}.bin is missing")


def test_restore_policy_checks(chain):
    root, _, _ = chain
    with pytest.raises(ImageError, match="is a pre-dump image"):
        Image.open(root / "img2").check_restorable()
    Image.open(root / "img3").check_restorable(gpuproxy_version=Image.open(root / "img3").manifest["gpuproxy_version"])
    with pytest.raises(ImageError, match="was written by gpuproxy .*, this is gpuproxy 9.9"):
        Image.open(root / "img3").check_restorable(gpuproxy_version="9.9")


def test_several_problems_in_one_message(chain, tmp_path):
    root = fresh(chain, tmp_path)
    os.truncate(root / "img1" / "memory.bin", 10)
    os.truncate(root / "img2" / "memory.bin", 10)
    msg = refused(root / "img3", "problems")
    assert "img1/memory.bin is truncated" in msg and "img2/memory.bin is truncated" in msg


# ------------------------------------------------------------ crash safety

def test_no_manifest_until_finish(tmp_path, monkeypatch):
    d = tmp_path / "c"
    with pytest.raises(ImageError, match="no such directory"):
        Image.open(d)
    w = ImageWriter(d, "dump", META)
    w.add_module(MOD_A)
    w.add_chunk(BASE, b"a" * CHUNK)
    assert not (d / "manifest").exists()
    with pytest.raises(ImageError, match="incomplete image, no manifest"):
        Image.open(d)
    # a crash while the manifest is written: the rename never happens
    real = I._write_file_atomic

    def crash(path, data):
        if path.endswith("manifest"):
            with open(path + ".tmp", "wb") as f:
                f.write(data[:10])
            raise OSError("disk full")
        real(path, data)
    monkeypatch.setattr(I, "_write_file_atomic", crash)
    with pytest.raises(OSError):
        w.finish({}, {})
    assert not (d / "manifest").exists()
    with pytest.raises(ImageError, match="incomplete image"):
        Image.open(d)
    monkeypatch.undo()
    # a new writer may reuse the folder of a dump that did not finish
    w = ImageWriter(d, "dump", META)
    w.add_chunk(BASE, b"b" * 100)
    img = w.finish({}, {})
    assert bytes(img.read_chunk(img.chunks()[0])) == b"b" * 100 and img.verify() == []


def test_abort_cleans_up(tmp_path):
    d = tmp_path / "ab"
    with pytest.raises(RuntimeError):
        with ImageWriter(d, "dump", META) as w:
            w.add_chunk(BASE, b"x" * 100)
            w.add_module(MOD_B)
            raise RuntimeError("copy failed")
    assert not (d / "manifest").exists() and not (d / "memory.bin").exists()
    assert not any((d / "modules").iterdir())
    with pytest.raises(ImageError, match="not a gpuproxy image"):
        Image.open(d)


# ------------------------------------------------------------ proxy-cli

def test_inspect_output(chain, capsys):
    root, states, _ = chain
    assert cli_main(["inspect", str(root / "img3")]) == 0
    out = capsys.readouterr().out
    for text in ("format     2, chunk hash gp64", "kind       dump", "backend    emu, driver 12040",
                 "0: Emulated GPU (16.0 GiB, GPU-0000)", "parent     ../img2", "ancestor 2:",
                 "contexts (1)", "modules (2)", "axpy, reduce", "functions (1)", "streams (1)",
                 "allocations (8)", f"{BASE:#x}", "module files (2)"):
        assert text in out, text
    mem, glob = states[2]
    n = len(mem) + len(glob)
    mib = (sum(map(len, mem.values())) + sum(map(len, glob.values()))) / 2 ** 20
    assert out.rstrip().endswith(f"checksums: OK ({n} chunks, {mib:.1f} MiB)")
    assert cli_main(["inspect", "--no-verify", str(root / "img1")]) == 0
    assert "not verified" in capsys.readouterr().out


def test_inspect_json(chain, capsys):
    root, states, _ = chain
    assert cli_main(["inspect", "--json", str(root / "img3")]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["ok"] and d["problems"] == [] and d["verified"]
    assert len(d["chain"]) == 3 and d["manifest"]["kind"] == "dump"
    assert {c["addr"] for c in d["chunks"]} == set(states[2][0]) | set(states[2][1])
    assert cli_main(["inspect", "--json", str(root / "nowhere")]) == 1
    d = json.loads(capsys.readouterr().out)
    assert not d["ok"] and "no such directory" in d["problems"][0]


def test_inspect_bad_image_exit_code(tmp_path, capsys):
    (tmp_path / "manifest").write_text("hello\n")
    assert cli_main(["inspect", str(tmp_path)]) == 1
    assert "not a gpuproxy image manifest" in capsys.readouterr().err


def test_inspect_entry_point(chain):
    exe = shutil.which("proxy-cli")
    if exe is None:
        pytest.skip("proxy-cli is not on PATH")
    root, _, _ = chain
    r = subprocess.run([exe, "inspect", str(root / "img2")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "checksums: OK" in r.stdout
    r = subprocess.run([sys.executable, "-m", "gpuproxy.cli", "inspect", str(root)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "not a gpuproxy image" in r.stderr
