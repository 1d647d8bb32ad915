"""Emulated kernel of tests/pycuda_features.py."""
from gpuproxy.emu import kernel


@kernel("add_to")
def add_to(k):
    # if (i < n) a[i] += v; if (i == 0) counter[0] += 1
    k.global_array("counter", 4, "i4")[0] += 1   # thread 0 always runs
    n = min(k.param(2, "i"), k.grid[0] * k.block[0])
    if n > 0:
        a = k.array(k.param(0, "P"), n, "f4")
        a += a.dtype.type(k.param(1, "f"))
