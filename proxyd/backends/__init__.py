"""The GPU backends a worker drives: the interface (base.py), the CUDA
driver through cffi (cuda.py) with its native helper and pinned staging
pool, and the emulated GPU (emu/, importable as gpuproxy.emu). Imports
only proxyd.core below it (docs/architecture.md, "Folders")."""
