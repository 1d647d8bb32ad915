"""Emulated kernels of bench/cuda_bench.cu (for trying the harness without a GPU)."""
from gpuproxy.emu import kernel


@kernel("_Z12empty_kernelv")
def empty_kernel(k):
    pass


@kernel("_Z5touchPi")
def touch(k):
    k.array(k.param(0, "P"), 1, "i4")[0] += 1
