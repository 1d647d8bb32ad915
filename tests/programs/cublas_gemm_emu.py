"""Emulated kernels of cublas_gemm.cu. Its matrix work is cuBLAS and cuBLASLt
calls, which the emulated backend runs in numpy (proxyd/backends/emu/blas.py,
docs/libraries.md); its one kernel fills a matrix with the program's test
pattern before a cublasLtMatmul on the same stream."""
import numpy as np

from gpuproxy.emu import kernel


@kernel("_Z12fill_patternPfmi")
def fill_pattern(k):
    # (float *x, size_t n, int seed): x[i] = ((i * 7 + seed * 13) % 17 - 8) / 8
    n = min(k.param(1, "Q"), k.grid[0] * k.block[0])
    seed = k.param(2, "i")
    if n <= 0:
        return
    i = np.arange(n, dtype=np.uint64)
    x = k.array(k.param(0, "P"), n, "f4")
    x[...] = (((i * np.uint64(7) + np.uint64(seed * 13)) % np.uint64(17)).astype(np.int64) - 8).astype(np.float32) / np.float32(8.0)
