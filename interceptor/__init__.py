"""gpuproxy.interceptor: the shim (libcuda.so.1 + libcudart.so.13) built from
the C sources in this folder and the specs; see docs/protocol.md."""
import os


def lib_dir() -> str:
    """Folder holding the built shim libraries."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")


def preload_value() -> str:
    """The LD_PRELOAD value that puts the shim in front of the real CUDA libraries."""
    d = lib_dir()
    return f"{os.path.join(d, 'libcudart.so.13')}:{os.path.join(d, 'libcuda.so.1')}"


def check_built() -> None:
    for name in ("libcudart.so.13", "libcuda.so.1"):
        if not os.path.exists(os.path.join(lib_dir(), name)):
            raise FileNotFoundError(f"gpuproxy shim library {name} missing in {lib_dir()}; reinstall with `pip install .`")
