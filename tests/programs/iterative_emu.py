"""Emulated kernels of iterative.cu (int32 arithmetic)."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z7diffusePKiPiiii")
def diffuse(k):
    # (const int *src, int *dst, int w, int h, int step), 2-D launch; for x < w, y < h:
    # dst = (4*c + left + right + up + down) >> 3 with periodic boundaries,
    #       + 100 where (x*7 + y*13 + step) % 17 == 0
    w, h, step = k.param(2, "i"), k.param(3, "i"), k.param(4, "i")
    xs = min(w, k.grid[0] * k.block[0])
    ys = min(h, k.grid[1] * k.block[1])
    if xs <= 0 or ys <= 0:
        return
    src = k.array(k.param(0, "P"), w * h, "i4").reshape(h, w)
    dst = k.array(k.param(1, "P"), w * h, "i4").reshape(h, w)
    s = src.copy()
    v = (np.int32(4) * s + np.roll(s, 1, axis=1) + np.roll(s, -1, axis=1)
         + np.roll(s, 1, axis=0) + np.roll(s, -1, axis=0)) >> 3
    y = np.arange(h, dtype=np.int64)[:, None]
    x = np.arange(w, dtype=np.int64)[None, :]
    v = v + np.where((x * 7 + y * 13 + step) % 17 == 0, np.int32(100), np.int32(0)).astype(np.int32)
    dst[:ys, :xs] = v[:ys, :xs]


@kernel("_Z9bump_stepv")
def bump_step(k):
    # step_counter += 1 (launched <<<1,1>>>)
    sc = k.global_array("step_counter", 1, "i4")
    sc[0] += 1


@kernel("_Z6injectPKPiiii")
def inject(k):
    # (int *const *table, int which, int w, int h): s = step_counter; row = s % h;
    # grid-stride over x < w: table[which][row * w + x] += (s * 3 + x) & 63
    which, w, h = k.param(1, "i"), k.param(2, "i"), k.param(3, "i")
    if w <= 0:
        return
    s = int(k.global_array("step_counter", 1, "i4")[0])
    row = abs(s) % h * (1 if s >= 0 else -1)           # C remainder
    grid_ptr = int(k.array(k.param(0, "P"), which + 1, "u8")[which])
    line = k.array(grid_ptr + row * w * 4, w, "i4")
    line += ((s * 3 + np.arange(w, dtype=np.int64)) & 63).astype(np.int32)
