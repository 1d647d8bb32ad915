"""Emulated kernels of cudnn_conv.cu: none. Its convolution is a cuDNN
backend-API execution, which the emulated backend runs in numpy
(proxyd/emu/cudnn.py, docs/libraries.md "cuDNN")."""
