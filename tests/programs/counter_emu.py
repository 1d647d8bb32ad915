"""Emulated kernels of counter.cu."""
from gpuproxy.emu import kernel


@kernel("_Z9incrementv")
def increment(k):
    # counter++ on `__device__ int counter` (initially 100). The program launches
    # <<<1,1>>>; several threads would race on a non-atomic ++, so one increment.
    counter = k.global_array("counter", 1, "i4")
    counter[0] += 1
