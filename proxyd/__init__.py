"""gpuproxy.proxyd: the daemon that owns the GPU, runs the CUDA calls of
proxied programs and checkpoints their GPU state."""
__version__ = "0.1.0"
