# Writes tests/data/golden/v1 (a format-1 image and its parent) with the gpuproxy of
# commit 529a292, the last that wrote format 1: python make_v1.py tests/data/golden
import numpy as np, sys, os
from gpuproxy.proxyd.checkpoint.image import ImageWriter, FLAG_GLOBAL, FORMAT_VERSION
assert FORMAT_VERSION == 1
root = sys.argv[1]
def pat(seed, n):
    i = np.arange(n // 4, dtype=np.uint64)
    return (((i * np.uint64(2654435761)) + np.uint64(seed)) & np.uint64(0xFFFFFFFF)).astype("<u4").tobytes()
meta = {"backend": "emu", "driver_version": 13000, "devices": [{"index": 0, "name": "golden", "total_memory": 1 << 30}],
        "gpuproxy_version": "golden-v1"}
base = 0x7f0000000000
w = ImageWriter(os.path.join(root, "v1", "parent"), "dump", meta)
w.add_module(b"golden module bytes\0")
w.add_chunk(base, pat(1, 65536))
w.add_chunk(base + 65536, pat(2, 8192))
w.add_chunk(0x1000, pat(3, 64), flags=FLAG_GLOBAL)
w.finish({"token": "golden", "pid": 1}, {"note": "format 1 golden image"})
w = ImageWriter(os.path.join(root, "v1"), "dump", meta, parent=os.path.join(root, "v1", "parent"))
w.add_module(b"golden module bytes\0")
w.add_unchanged(base, 65536, __import__("gpuproxy.proxyd.checkpoint.hashing", fromlist=["x"]).gp64(pat(1, 65536)))
w.add_chunk(base + 65536, pat(4, 8192))
w.add_chunk(0x1000, pat(3, 64), flags=FLAG_GLOBAL)
w.finish({"token": "golden", "pid": 1}, {"note": "format 1 golden child image"})
