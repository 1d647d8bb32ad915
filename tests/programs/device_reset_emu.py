"""Emulated kernels of device_reset.cu."""
from gpuproxy.emu import kernel


@kernel("_Z4fillPii")
def fill(k):
    # i = global index; if (i < n) out[i] = 3 * i + offset
    n = k.param(1, "i")
    m = min(n, k.grid[0] * k.block[0])
    if m <= 0:
        return
    offset = int(k.global_array("offset", 1, "i4")[0])
    out = k.array(k.param(0, "P"), m, "i4")
    out[:] = [3 * i + offset for i in range(m)]


@kernel("_Z4bumpi")
def bump(k):
    # offset += by, launched <<<1, 1>>>
    k.global_array("offset", 1, "i4")[0] += k.param(0, "i")
