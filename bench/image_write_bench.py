"""Image writing and reading without a GPU: how fast ImageWriter stores a
dump's memory (the engine's path: add_chunks from one large host buffer) and
how fast a restore reads it back (Image.read_into into one staging buffer),
to a given directory (/dev/shm: host memory; a disk folder), with and
without O_DIRECT and zstd compression.

The data is what a training job's checkpoint holds, not random bytes: the
float32 parameters of a small transformer-shaped model (per-tensor init
scales) and its Adam first and second moments after a few steps with
gradients of a plausible scale; one third each.

    python bench/image_write_bench.py --gib 2 --dir /dev/shm --dir /var/tmp \\
        [--workers 1,4,8] [--compress none,zstd:1,zstd:3] [--direct 0,1]
        [--mode pwrite,mmap,pwrite+falloc,mmap+falloc] [--json OUT]

--mode: how ImageWriter stores the bytes ($GPUPROXY_IMAGE_WRITE_MODE: pwritev
jobs, or copies into a shared mapping of the file), "+falloc" with the file
allocated first in one range per writer ($GPUPROXY_IMAGE_FALLOCATE=1);
default "auto" (the writer's own choice).

Timing is reported, never checked. Each case writes a fresh image and
removes it; the page cache is not dropped (reads of a file just written
come from memory on every filesystem here).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

CHUNK = 2 << 20
META = {"backend": "emu", "driver_version": 0, "devices": []}


def model_state(nbytes: int, seed: int = 0) -> np.ndarray:
    """float32 parameters + Adam m + Adam v of a transformer-shaped model,
    nbytes in all (rounded down to whole 2 MiB chunks), as one uint8 array."""
    rng = np.random.default_rng(seed)
    n = (nbytes // CHUNK) * CHUNK // 4
    out = np.empty(n, np.float32)
    third = n // 3
    d = 1024
    o = 0
    # parameters: matrices d x 4d with init std 0.02 and layer norms near 1, trained a little
    while o < third:
        k = min(4 * d * d, third - o)
        w = rng.normal(0, 0.02, k).astype(np.float32)
        if k > 8 * d:
            w[:d] = 1.0 + rng.normal(0, 1e-3, d).astype(np.float32)       # a layer norm's gain
        out[o:o + k] = w
        o += k
    # Adam: g ~ N(0, 1e-3); m = 0.1 g after one step, then EMA; v = 0.001 g^2 likewise
    for dst, kind in ((slice(third, 2 * third), "m"), (slice(2 * third, n), "v")):
        size = out[dst].size
        o = 0
        while o < size:
            k = min(1 << 22, size - o)
            g = rng.normal(0, 1e-3, k).astype(np.float32)
            g2 = rng.normal(0, 1e-3, k).astype(np.float32)
            if kind == "m":
                val = 0.9 * (0.1 * g) + 0.1 * g2
            else:
                val = 0.999 * (0.001 * g * g) + 0.001 * g2 * g2
            out[dst][o:o + k] = val
            o += k
    return out.view(np.uint8)


def write_once(root: str, buf: np.ndarray, workers: int, compress: str | None, direct: bool) -> dict:
    from gpuproxy.proxyd.checkpoint.image import Image, ImageWriter
    path = tempfile.mkdtemp(prefix="gpximg-", dir=root)
    shutil.rmtree(path)
    try:
        base = 0x7F0000000000
        items = [(base + o, buf[o:o + CHUNK], 0, 0) for o in range(0, buf.size, CHUNK)]
        t0 = time.monotonic()
        w = ImageWriter(path, "dump", META, compress=compress, direct=direct)
        w.add_chunks(items, workers=workers)
        t1 = time.monotonic()
        img = w.finish({"token": "bench"})
        t2 = time.monotonic()
        stored = os.path.getsize(os.path.join(path, "memory.bin"))
        # read back the way a restore does: pread/decompress into a staging buffer, several threads
        from concurrent.futures import ThreadPoolExecutor
        refs = img.chunks()
        stage = np.zeros(min(buf.size, 256 << 20), np.uint8)
        stage.fill(1)         # touched once, as the restore's page-locked staging is
        slots = stage.size // CHUNK

        def rd(ik):
            i, r = ik
            o = (i % slots) * CHUNK
            img.read_into(r, stage[o:o + r.length])
        t3 = time.monotonic()
        with ThreadPoolExecutor(workers) as ex:
            list(ex.map(rd, enumerate(refs)))
        t4 = time.monotonic()
        img.close()
        # the way restores read before (gpuproxy <= 529a292): copy out of a fresh mapping of the file
        img = Image.open(path)

        def rd_map(ik):
            i, r = ik
            o = (i % slots) * CHUNK
            np.copyto(stage[o:o + r.length], np.frombuffer(img.read_chunk(r), np.uint8))
        t5 = time.monotonic()
        with ThreadPoolExecutor(workers) as ex:
            list(ex.map(rd_map, enumerate(refs)))
        t6 = time.monotonic()
        img.close()
        n = buf.size
        return {"workers": workers, "compress": compress or "none", "direct": bool(w.direct),
                "bytes": n, "stored_bytes": stored, "ratio": round(n / stored, 3),
                "write_s": round(t1 - t0, 4), "fsync_finish_s": round(t2 - t1, 4),
                "write_gbps": round(n / (t2 - t0) / 1e9, 2), "read_gbps": round(n / (t4 - t3) / 1e9, 2),
                "read_mmap_gbps": round(n / (t6 - t5) / 1e9, 2),
                "writer": w.write_stats}
    finally:
        shutil.rmtree(path, ignore_errors=True)


def with_mode(mode: str, fn):
    """fn() with the writer's mode knobs set for it (this process only)."""
    keys = ("GPUPROXY_IMAGE_WRITE_MODE", "GPUPROXY_IMAGE_FALLOCATE")
    old = {k: os.environ.get(k) for k in keys}
    base, _, falloc = mode.partition("+")
    os.environ["GPUPROXY_IMAGE_WRITE_MODE"] = base
    os.environ["GPUPROXY_IMAGE_FALLOCATE"] = "1" if falloc == "falloc" else "0"
    try:
        return fn()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(gib: float, dirs: list[str], workers: list[int], compress: list[str], direct: list[int],
        modes: list[str] = ("auto",)) -> dict:
    t = time.monotonic()
    buf = model_state(int(gib * 2**30))
    res = {"bytes": int(buf.size), "generate_s": round(time.monotonic() - t, 2), "cpu_cores": os.cpu_count(),
           "cases": []}
    for d in dirs:
        for c in compress:
            for dr in direct:
                for m in modes:
                    for wk in workers:
                        r = with_mode(m, lambda: write_once(d, buf, wk, None if c == "none" else c, bool(dr)))
                        r["dir"], r["mode"] = d, f"{r['writer'].get('mode', '?')}" + \
                            ("+falloc" if m.endswith("+falloc") else "")
                        res["cases"].append(r)
                    print(json.dumps({k: v for k, v in r.items() if k != "writer"}), flush=True)
    return res


def table(res: dict) -> str:
    lines = ["| folder | compression | O_DIRECT | write mode | writer threads | write (GB/s of memory) | stored | "
             "read back with pread / decompress (GB/s) | read back from a mapping (GB/s, the old restore path) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in res["cases"]:
        lines.append(f"| {r['dir']} | {r['compress']} | {'yes' if r['direct'] else 'no'} | {r.get('mode', '')} | "
                     f"{r['workers']} | "
                     f"{r['write_gbps']} | {r['ratio']}x smaller | {r['read_gbps']} | {r['read_mmap_gbps']} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--dir", action="append", default=None)
    ap.add_argument("--workers", default=None, help="comma list (default: 1 and the machine's cores, max 16)")
    ap.add_argument("--compress", default="none,zstd:1")
    ap.add_argument("--direct", default="0,1")
    ap.add_argument("--mode", default="auto", help="comma list of auto, pwrite, mmap, each optionally +falloc")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    cores = min(16, os.cpu_count() or 1)
    workers = [int(x) for x in a.workers.split(",")] if a.workers else sorted({1, cores})
    res = run(a.gib, a.dir or ["/dev/shm"], workers, a.compress.split(","), [int(x) for x in a.direct.split(",")],
              a.mode.split(","))
    print(table(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
