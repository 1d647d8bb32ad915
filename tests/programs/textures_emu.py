"""Emulated kernels of textures.cu: texture fetches and surface writes
through the emulated backend's texture objects (proxyd/backends/emu/textures.py:
point sampling, clamp addressing)."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z4stepyyiif")
def step(k):
    # (cudaTextureObject_t tex, cudaSurfaceObject_t surf, int w, int h, float kk)
    tex, surf = k.param(0, "Q"), k.param(1, "Q")
    w, h, kk = k.param(2, "i"), k.param(3, "i"), np.float32(k.param(4, "f"))
    w = min(w, k.grid[0] * k.block[0])
    h = min(h, k.grid[1] * k.block[1])
    if w <= 0 or h <= 0:
        return
    y, x = np.mgrid[0:h, 0:w]
    x, y = x.ravel(), y.ravel()
    c = k.tex2d(tex, x + 0.5, y + 0.5)[:, 0]
    r = k.tex2d(tex, x + 1.5, y + 0.5)[:, 0]
    u = k.tex2d(tex, x + 0.5, y - 0.5)[:, 0]
    v = (c + np.float32(0.5) * r + np.float32(0.25) * u + kk).astype(np.float32)
    k.surf2dwrite(surf, v.reshape(-1, 1), x * 4, y)


@kernel("_Z6read3dyPfiii")
def read3d(k):
    # (CUtexObject tex, float *out, int nx, int ny, int nz)
    tex, out = k.param(0, "Q"), k.param(1, "P")
    nx, ny, nz = k.param(2, "i"), k.param(3, "i"), k.param(4, "i")
    n = min(nx * ny * nz, k.grid[0] * k.block[0])
    if n <= 0:
        return
    i = np.arange(n)
    x, y, z = i % nx, (i // nx) % ny, i // (nx * ny)
    o = k.array(out, n, "f4")
    o[:] = np.float32(2.0) * k.tex3d(tex, x + 0.5, y + 0.5, z + 0.5)[:, 0]
