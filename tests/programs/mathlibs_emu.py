"""Emulated kernels of mathlibs.cu: none. All its GPU work is cuFFT, cuRAND,
cuSPARSE and cuSOLVER calls, which the emulated backend runs in numpy
(proxyd/emu/mathlibs.py, docs/libraries.md)."""
