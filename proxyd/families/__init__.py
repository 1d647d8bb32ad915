"""One module per CUDA API family: its hand-written handlers and, where it
owns objects a checkpoint must capture, its checkpoint object kinds.
Imports proxyd.core and proxyd.backends, never the worker, supervisor or
checkpoint engine above it (docs/architecture.md, "Folders")."""

import importlib

# Every family module; load_all imports them, and importing one registers its
# handlers (core/registry.py) and checkpoint object kinds (core/kinds.py).
MODULES = ("contexts", "memory", "modules", "launches", "streams", "arrays", "vmm", "mempool", "mempool_ipc", "ipc", "hostmap", "hostfn", "modstore",
           "link", "graphs", "graph_nodes", "graph_mem", "graph_libcapture", "libraries", "cudnn",
           "sparse_generic", "curand_host", "nccl", "nccl_cut", "devnum", "graph_capture_into",
           "graph_exec_nodes", "device_vars", "graph_cond_capture", "graph_cond")


def load_all() -> None:
    for name in MODULES:
        importlib.import_module(f"{__name__}.{name}")
