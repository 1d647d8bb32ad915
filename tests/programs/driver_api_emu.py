"""Emulated kernels of driver_api_kernels.cu (loaded by driver_api.cu with
cuModuleLoadData; extern "C", so the names are not mangled)."""
import numpy as np

from gpuproxy.emu import kernel


def _wrap32(a):
    return ((np.asarray(a, dtype=np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)


@kernel("scale_add")
def scale_add(k):
    # (int *data, int n, int add): i < n: data[i] = data[i] * dev_scale + add
    n = k.param(1, "i")
    m = min(n, k.grid[0] * k.block[0])
    if m <= 0:
        return
    scale = int(k.global_array("dev_scale", 1, "i4")[0])
    data = k.array(k.param(0, "P"), m, "i4")
    data[:] = _wrap32(data.astype(np.int64) * scale + k.param(2, "i"))


@kernel("mix")
def mix(k):
    # (int *data, int n, char c, long long big); params at 0, 8, 12, 16
    # i < n: data[i] += c + (int)(big % 1000)   (C remainder: sign of the dividend)
    n = k.param(1, "i")
    c = k.param(2, "b")
    big = k.param(3, "q")
    rem = abs(big) % 1000 * (1 if big >= 0 else -1)
    m = min(n, k.grid[0] * k.block[0])
    if m <= 0:
        return
    data = k.array(k.param(0, "P"), m, "i4")
    data[:] = _wrap32(data.astype(np.int64) + c + rem)


@kernel("fill_seq")
def fill_seq(k):
    # (int *data, int n, int base, int step): grid-stride, data[i] = base + i * step
    n = k.param(1, "i")
    if n <= 0:
        return
    base, step = k.param(2, "i"), k.param(3, "i")
    data = k.array(k.param(0, "P"), n, "i4")
    data[:] = _wrap32(base + np.arange(n, dtype=np.int64) * step)
