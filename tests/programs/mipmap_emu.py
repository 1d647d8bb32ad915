"""Emulated kernel of mipmap.cu: tex2DLod through the emulated backend's
mipmapped texture objects (proxyd/backends/emu/textures.py: point sampling, point
mipmap filtering)."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z10read_levelyPfiii")
def read_level(k):
    # (cudaTextureObject_t tex, float *out, int w, int h, int level)
    tex, out = k.param(0, "Q"), k.param(1, "P")
    w, h, level = k.param(2, "i"), k.param(3, "i"), k.param(4, "i")
    n = min(w * h, k.grid[0] * k.block[0])
    if n <= 0:
        return
    i = np.arange(n)
    x, y = i % w, i // w
    o = k.array(out, n, "f4")
    o[:] = k.tex2dlod(tex, (x + 0.5) / w, (y + 0.5) / h, float(level))[:, 0]
