"""Image format 2 (docs/image-format.md): zstd-compressed chunks, reading
format-1 images (the golden images in tests/data/golden, written by the
gpuproxy that wrote format 1), pread-based reads (Image.read_into) and the
writer's parallel, O_DIRECT-capable bulk path.

No GPU needed. Data: float32 weights and Adam moments of a small model
(what a training job's checkpoint holds), random bytes where
incompressible data is the point.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from gpuproxy.cli.main import main as cli_main
from gpuproxy.proxyd.checkpoint import hashing as H
from gpuproxy.proxyd.checkpoint.image import (FLAG_GLOBAL, FLAG_ZSTD, Image, ImageError, ImageWriter,
                                              parse_compress)

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"
META = {"backend": "emu", "driver_version": 13000,
        "devices": [{"index": 0, "name": "test", "total_memory": 1 << 30}]}
BASE = 0x7F3400000000
CH = 256 << 10


def golden_pattern(seed: int, n: int) -> bytes:
    """The data make_v1.py stored (its formula, written out again here)."""
    i = np.arange(n // 4, dtype=np.uint64)
    return (((i * np.uint64(2654435761)) + np.uint64(seed)) & np.uint64(0xFFFFFFFF)).astype("<u4").tobytes()


def model_state(nbytes: int, seed: int = 0) -> bytes:
    """Weights (normal, std 0.02), Adam first moments (small, mostly near 0)
    and second moments (tiny, positive) of a model, as float32, one third each."""
    rng = np.random.default_rng(seed)
    k = nbytes // 12
    w = rng.normal(0, 0.02, k).astype(np.float32)
    m = (rng.normal(0, 1e-3, k) * (rng.random(k) < 0.5)).astype(np.float32)
    v = np.square(rng.normal(0, 1e-3, k)).astype(np.float32)
    out = np.concatenate([w, m, v]).tobytes()
    return out + bytes(nbytes - len(out))


def test_parse_compress():
    assert parse_compress(None) is None and parse_compress("none") is None
    assert parse_compress("zstd") == ("zstd", 1)
    assert parse_compress("zstd:-3") == ("zstd", -3)
    for bad, msg in (("lz4", "unknown compression"), ("zstd:x", "bad zstd level"), ("zstd:40", "out of range")):
        with pytest.raises(ValueError, match=msg):
            parse_compress(bad)


def test_golden_format1_images_still_read(tmp_path):
    root = tmp_path / "g"
    shutil.copytree(GOLDEN, root)
    img = Image.open(root / "v1")
    assert img.version == 1 and img.parent.version == 1
    assert img.verify() == []
    img.check_restorable()
    refs = {r.addr: r for r in img.chunks()}
    want = {0x7F0000000000: golden_pattern(1, 65536), 0x7F0000010000: golden_pattern(4, 8192),
            0x1000: golden_pattern(3, 64)}
    assert set(refs) == set(want)
    assert refs[0x7F0000000000].image == 1 and refs[0x1000].flags == FLAG_GLOBAL
    for a, data in want.items():
        assert bytes(img.read_chunk(refs[a])) == data
        buf = bytearray(len(data))
        img.read_into(refs[a], buf, verify=True)
        assert bytes(buf) == data
    # a format-2 image continues the format-1 chain
    w = ImageWriter(root / "v2", "dump", META, parent=img, compress="zstd")
    w.add_unchanged(0x7F0000000000, 65536, refs[0x7F0000000000].hash)
    w.add_chunk(0x7F0000010000, bytes(8192))
    child = w.finish({"token": "t"})
    assert child.version == 2 and child.verify() == []
    r = child.find(0x7F0000000000)
    assert r.image == 2 and bytes(child.read_chunk(r)) == want[0x7F0000000000]
    assert bytes(child.read_chunk(child.find(0x7F0000010000))) == bytes(8192)
    # the record is format 1's: a 'stored' value there is refused as a reserved field
    idx = root / "v1" / "chunks.idx"
    assert idx.read_bytes()[16 + 36:16 + 40] == bytes(4)
    img.close()
    child.close()


def test_compressed_model_state_roundtrip(tmp_path):
    data = model_state(8 * CH, seed=1)
    noise = np.random.default_rng(2).integers(0, 256, CH, dtype=np.uint8).tobytes()
    w = ImageWriter(tmp_path / "z", "dump", META, chunk_size=CH, compress="zstd:3")
    items = [(BASE + i * CH, memoryview(data)[i * CH:(i + 1) * CH], None, 0) for i in range(8)]
    items.append((BASE + 8 * CH, noise, None, 0))
    w.add_chunks(items, workers=3)
    w.add_chunk(0x2000, model_state(4096, seed=3), flags=FLAG_GLOBAL)
    img = w.finish({"token": "t"})
    z = img.manifest["compression"]
    assert z["codec"] == "zstd" and z["level"] == 3
    # float32 weights and moments compress (the exponent bytes repeat); random bytes do not
    assert z["chunks"] >= 8 and z["stored_bytes"] < 0.95 * z["bytes"]
    refs = {r.addr: r for r in img.chunks()}
    assert not refs[BASE + 8 * CH].compressed and refs[BASE + 8 * CH].disk_length == CH
    assert refs[BASE].compressed and refs[BASE].disk_length < CH
    assert (tmp_path / "z" / "memory.bin").stat().st_size < len(data) + CH
    assert img.verify() == []
    for i in range(8):
        r = refs[BASE + i * CH]
        assert bytes(img.read_chunk(r)) == data[i * CH:(i + 1) * CH]
        out = np.zeros(CH, np.uint8)
        img.read_into(r, out, verify=True)
        assert out.tobytes() == data[i * CH:(i + 1) * CH]
    assert bytes(img.read_chunk(refs[BASE + 8 * CH])) == noise
    assert cli_main(["inspect", str(tmp_path / "z")]) == 0
    # an incremental child refers to the parent's compressed bytes as stored
    w = ImageWriter(tmp_path / "z" / "c", "dump", META, parent=img, compress="zstd")
    w.add_unchanged(BASE, CH, refs[BASE].hash)
    w.add_chunk(BASE + CH, bytes(CH))
    child = w.finish({"token": "t"})
    r = child.find(BASE)
    assert r.image == 1 and r.flags & FLAG_ZSTD and r.disk_length == refs[BASE].disk_length
    assert child.verify() == [] and bytes(child.read_chunk(r)) == data[:CH]
    child.close()
    img.close()


def test_damaged_compressed_chunk_is_found(tmp_path, capsys):
    data = model_state(2 * CH)
    w = ImageWriter(tmp_path / "z", "dump", META, compress="zstd")
    w.add_chunks([(BASE, data[:CH], None, 0), (BASE + CH, data[CH:], None, 0)])
    img = w.finish({"token": "t"})
    r = img.find(BASE + CH)
    assert r.compressed
    img.close()
    mem = tmp_path / "z" / "memory.bin"
    raw = bytearray(mem.read_bytes())
    raw[r.offset + r.disk_length // 2] ^= 0x5A        # inside the frame: bad data or a bad frame
    mem.write_bytes(bytes(raw))
    img = Image.open(tmp_path / "z")
    problems = img.verify()
    assert len(problems) == 1 and f"{BASE + CH:#x}" in problems[0], problems
    assert "corrupt" in problems[0] or "does not decompress" in problems[0]
    with pytest.raises(ImageError):
        img.check_restorable(deep=True)
    with pytest.raises(ImageError):
        img.read_into(r, bytearray(CH), verify=True)
    assert cli_main(["inspect", str(tmp_path / "z")]) == 1
    capsys.readouterr()
    img.close()


def test_compressed_record_past_the_file_is_refused(tmp_path):
    w = ImageWriter(tmp_path / "z", "dump", META, compress="zstd")
    w.add_chunk(BASE, model_state(CH))
    w.finish({"token": "t"}).close()
    mem = tmp_path / "z" / "memory.bin"
    mem.write_bytes(mem.read_bytes()[:-7])
    with pytest.raises(ImageError, match="truncated"):
        Image.open(tmp_path / "z").check_restorable()


@pytest.mark.parametrize("direct", [False, True])
def test_bulk_writer_large_jobs(tmp_path, direct):
    """add_chunks writes runs contiguous in the file as one job (and with
    direct, page-aligned ones through O_DIRECT where the filesystem allows);
    whatever path, the bytes read back are the bytes given."""
    buf = np.frombuffer(model_state(40 * CH, seed=5), np.uint8).copy()
    odd = np.arange(1000, dtype=np.uint8)              # unaligned length: written without O_DIRECT
    w = ImageWriter(tmp_path / "d", "dump", META, direct=direct)
    items = [(BASE + i * CH, buf[i * CH:(i + 1) * CH], None, 0) for i in range(40)]
    items.append((BASE + 40 * CH, odd, None, 0))
    w.add_chunks(items, workers=4)
    ws = w.write_stats
    assert ws["written_bytes"] == 40 * CH + 1000
    assert ws["write_jobs"] < 41                          # coalesced
    img = w.finish({"token": "t"})
    assert img.verify() == []
    for i in (0, 17, 39):
        assert bytes(img.read_chunk(img.find(BASE + i * CH))) == buf[i * CH:(i + 1) * CH].tobytes()
    assert bytes(img.read_chunk(img.find(BASE + 40 * CH))) == odd.tobytes()
    img.close()


def test_gp64_of_read_into_matches_hash_recorded(tmp_path):
    """read_into on a stored chunk gives exactly what the writer hashed
    (reference hash from the pure-Python definition)."""
    data = model_state(3 * 4096 + 8)
    w = ImageWriter(tmp_path / "h", "dump", META)
    ref = w.add_chunk(BASE, data)
    img = w.finish({"token": "t"})
    out = bytearray(len(data))
    img.read_into(img.find(BASE), out)
    assert bytes(out) == data and H.gp64_reference(out) == ref.hash
    img.close()


def test_cli_refuses_a_bad_compress_option(capsys):
    # refused before proxyd or CRIU is asked anything
    assert cli_main(["dump", "--pid", "1", "--dir", "/nonexistent/x", "--gpu-only", "--compress", "lz4"]) == 2
    assert "unknown compression 'lz4'" in capsys.readouterr().err
    assert cli_main(["pre-dump", "--pid", "1", "--dir", "/nonexistent/x", "--compress", "zstd:99"]) == 2
    assert "out of range" in capsys.readouterr().err


@pytest.mark.parametrize("how", ["1", "map", "0"])
def test_reads_of_an_image_in_host_memory_under_each_populate_mode(how, monkeypatch):
    """An image on an in-memory filesystem read by several threads at once
    (the restore ring's readers) gives the stored bytes whichever way its
    pages come in ($GPUPROXY_IMAGE_POPULATE: 1, each read populates its own
    range, the default; map, the whole file at once; 0, page faults). With
    the default, nothing populates the whole file up front."""
    from concurrent.futures import ThreadPoolExecutor
    from gpuproxy.proxyd.checkpoint import image as I
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm")
    monkeypatch.setenv("GPUPROXY_IMAGE_POPULATE", how)
    root = Path("/dev/shm") / f"gpx-populate-{how}-{np.random.randint(1 << 30)}"
    try:
        chunks = {BASE + i * CH: model_state(CH, seed=i) for i in range(12)}
        w = ImageWriter(root, "dump", META)
        for a, data in chunks.items():
            w.add_chunk(a, data)
        w.finish({"token": "t"}).close()
        img = Image.open(root)

        def read(a):
            out = bytearray(CH)
            img.read_into(img.find(a), out, verify=True)
            return a, bytes(out)

        with ThreadPoolExecutor(4) as ex:
            got = dict(ex.map(read, list(chunks)[::-1]))
        assert got == chunks
        by_range = how == "1" and I._MADV_POPULATE_READ_OK[0]
        assert bool(img._mm_addr) == by_range
        img.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_compress_without_zstandard_is_refused_clearly(monkeypatch):
    """zstandard is optional (gpuproxy[zstd]): a dump asking for it where it
    is missing is refused with the reason, before anything is frozen."""
    from gpuproxy.proxyd.checkpoint.image import require_codec
    assert require_codec(None) is None and require_codec("zstd:3") == ("zstd", 3)
    monkeypatch.setitem(sys.modules, "zstandard", None)      # import raises ImportError
    with pytest.raises(ValueError, match="needs the zstandard module.*gpuproxy\\[zstd\\]"):
        require_codec("zstd")
    assert require_codec("none") is None
