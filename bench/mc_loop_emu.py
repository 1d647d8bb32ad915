"""Emulated kernels of bench/mc_loop.cu (for running the harness without a GPU)."""
from gpuproxy.emu import kernel


@kernel("_Z8mc_emptyv")
def mc_empty(k):
    pass


@kernel("_Z8mc_touchPi")
def mc_touch(k):
    k.array(k.param(0, "P"), 1, "i4")[0] += 1
