"""Emulated kernels of cublas_gemm.cu: none of its own. The program's work is
cuBLAS and cuBLASLt calls, which the emulated backend runs in numpy
(proxyd/emu/blas.py, docs/libraries.md); this file is its corpus entry's
emu file like every other program's."""
