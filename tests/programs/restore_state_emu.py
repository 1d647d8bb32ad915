"""Emulated kernels of restore_state.cu."""
import numpy as np

from gpuproxy.emu import kernel

SHARED_INTS = 64 * 1024 // 4


@kernel("_Z11fill_sharedPii")
def fill_shared(k):
    # Each block fills SHARED_INTS ints of dynamic shared memory; with less
    # than that reserved the GPU kernel would run off its shared memory.
    if k.shared_bytes < SHARED_INTS * 4:
        raise ValueError(f"fill_shared needs {SHARED_INTS * 4} bytes of dynamic shared memory, "
                         f"launched with {k.shared_bytes}")
    seed = k.param(1, "i")
    out = k.array(k.param(0, "P"), k.grid[0], "i4")
    i = np.arange(SHARED_INTS, dtype=np.int64)
    for b in range(k.grid[0]):
        out[b] = int(((i * 7 + seed + b) % 1000).sum() % 1000003)
    k.global_array("launches", 1, "i4")[0] += 1
