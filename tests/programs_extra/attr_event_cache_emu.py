"""Emulated kernel of attr_event_cache.cu (tests/test_attr_event_cache.py)."""
from gpuproxy.emu import kernel


@kernel("_Z5scalePii")
def scale(k):
    n = k.param(1, "i")
    m = min(n, k.grid[0] * k.block[0])
    v = k.array(k.param(0, "P"), m, "i4")
    v[:] = v * 2
