"""Emulated kernels of vector_add.cu."""
from gpuproxy.emu import kernel


@kernel("_Z9vectorAddPKfS0_Pfi")
def vector_add(k):
    # i = blockDim.x * blockIdx.x + threadIdx.x; if (i < n) C[i] = A[i] + B[i]
    n = k.param(3, "i")
    m = min(n, k.grid[0] * k.block[0])
    if m <= 0:
        return
    a, b, c = (k.array(k.param(i, "P"), m, "f4") for i in range(3))
    c[:] = a + b
