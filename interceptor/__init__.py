"""gpuproxy.interceptor: the shim (libcuda.so.1 + libcudart.so.13) built from
the C sources in this folder and the specs; see docs/protocol.md."""
import os


def lib_dir() -> str:
    """Folder holding the built shim libraries."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")


# The shim's libraries, in LD_PRELOAD order: the runtime and the driver, then
# the library stand-ins (docs/libraries.md), which forward NVIDIA's math
# libraries and NVML to the worker. Preloaded under their sonames, they are
# what a program's DT_NEEDED (libtorch's libcublas.so.13) resolves to.
LIBRARIES = ("libcudart.so.13", "libcuda.so.1", "libcublas.so.13", "libcublasLt.so.13", "libnvidia-ml.so.1",
             "libcudnn.so.9", "libcufft.so.12", "libcurand.so.10", "libcusparse.so.12", "libcusolver.so.12",
             "libnccl.so.2",
             # older majors of the libraries (specs/abi/library_majors.yaml, issue 24),
             # after 13's so that an unversioned symbol binds to the 13 stand-in (the
             # same code); a program's DT_NEEDED libcublas.so.12 resolves to its own
             "libcublas.so.12", "libcublasLt.so.12", "libcublas.so.11", "libcublasLt.so.11",
             "libcufft.so.11", "libcufft.so.10", "libcusolver.so.11", "libcusparse.so.11")


def shim_dir() -> str:
    """Folder of the shim that programs get: $GPUPROXY_SHIM_DIR when set (on a
    Kubernetes node, the node's copy in the host folder, which matches the
    node's proxyd: docs/kubernetes.md), else this package's own."""
    return os.environ.get("GPUPROXY_SHIM_DIR") or lib_dir()


def preload_value() -> str:
    """The LD_PRELOAD value that puts the shim in front of the real CUDA libraries."""
    d = shim_dir()
    return ":".join(os.path.join(d, n) for n in LIBRARIES)


def check_built() -> None:
    d = shim_dir()
    for name in LIBRARIES:
        if not os.path.exists(os.path.join(d, name)):
            how = "$GPUPROXY_SHIM_DIR" if d != lib_dir() else "reinstall with `pip install .`"
            raise FileNotFoundError(f"gpuproxy shim library {name} missing in {d}; {how}")
