"""Registry of emulated kernels and the launch object they receive."""
from __future__ import annotations

import importlib.util
import os
import struct
from typing import Callable

import numpy as np

KERNELS: dict[str, Callable] = {}


def kernel(name: str):
    """Registers the decorated function as the emulation of kernel `name`
    (its mangled name, or the plain name of an extern "C" kernel)."""
    def deco(fn):
        KERNELS[name] = fn
        return fn
    return deco


_loaded: set[str] = set()


def load_kernel_file(path: str) -> None:
    """Imports a Python file that registers kernels with @kernel."""
    path = os.path.abspath(path)
    if path in _loaded:
        return
    if not os.path.exists(path):
        raise FileNotFoundError(f"emulated kernel file {path} does not exist")
    modname = "gpuproxy_emu_kernels_" + str(len(_loaded))
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _loaded.add(path)


class KernelError(Exception):
    pass


class KernelLaunch:
    """One launch of an emulated kernel (the `k` argument)."""

    def __init__(self, name: str, grid, block, shared_bytes: int, params: bytes, layout, memory, module_globals,
                 cluster=(1, 1, 1), cooperative: bool = False):
        self.name = name
        self.grid = tuple(grid)
        self.block = tuple(block)
        self.shared_bytes = shared_bytes
        # thread block cluster dimensions (launch attribute) and whether the
        # launch is cooperative; one call computes the whole grid, so grid-
        # and cluster-wide synchronisation hold by construction
        self.cluster = tuple(cluster)
        self.cooperative = cooperative
        self._params = params
        self._layout = layout
        self._memory = memory
        self._globals = module_globals
        self._textures = None       # the backend's texture/surface objects (emu/textures.py)

    def param(self, index: int, fmt: str):
        """Parameter `index` unpacked with struct format `fmt` (native
        alignment); a single value is returned as a scalar."""
        if not 0 <= index < len(self._layout):
            raise KernelError(f"{self.name}: parameter {index} out of range ({len(self._layout)} parameters)")
        off, size = self._layout[index]
        if fmt[:1] in "@=<>!":
            f = fmt
        else:
            f = "@" + fmt
        need = struct.calcsize(f)
        if need > size:
            raise KernelError(f"{self.name}: format {fmt!r} needs {need} bytes, parameter {index} has {size}")
        vals = struct.unpack_from(f, self._params, off)
        return vals[0] if len(vals) == 1 else vals

    def array(self, ptr: int, n: int, dtype) -> np.ndarray:
        """A writable view of n elements of `dtype` at device address ptr."""
        dt = np.dtype(dtype)
        return self._memory(int(ptr), int(n) * dt.itemsize).view(dt)

    # Texture and surface objects (a kernel parameter of type
    # cudaTextureObject_t / cudaSurfaceObject_t: read it with param(i, "Q")).
    # What is and is not modelled: proxyd/backends/emu/textures.py.
    def tex1dfetch(self, obj: int, i) -> np.ndarray:
        """tex1Dfetch over integer indices i: one row of channels per index."""
        from .textures import fetch_linear
        return fetch_linear(self._textures.get(obj), i)

    def tex2d(self, obj: int, x, y) -> np.ndarray:
        """tex2D, point sampling, clamp addressing: texels at (x, y)."""
        from .textures import fetch
        return fetch(self._textures.get(obj), x, y)

    def tex3d(self, obj: int, x, y, z) -> np.ndarray:
        from .textures import fetch
        return fetch(self._textures.get(obj), x, y, z)

    def tex2dlod(self, obj: int, x, y, lod: float) -> np.ndarray:
        """tex2DLod: as tex2d, from the mipmap level nearest to lod (one lod per call)."""
        from .textures import fetch
        return fetch(self._textures.get(obj), x, y, lod=lod)

    def surf2dread(self, obj: int, xbytes, y) -> np.ndarray:
        """surf2Dread: elements at byte column xbytes, row y."""
        from .textures import surf_index
        el, xi, yi = surf_index(self._textures.get(obj), xbytes, y)
        return el[0, yi, xi]

    def surf2dwrite(self, obj: int, values, xbytes, y) -> None:
        """surf2Dwrite of values (one row of channels per coordinate)."""
        from .textures import surf_index
        el, xi, yi = surf_index(self._textures.get(obj), xbytes, y)
        el[0, yi, xi] = np.asarray(values).reshape(el[0, yi, xi].shape)

    def set_conditional(self, handle: int, value: int) -> None:
        """cudaGraphSetConditional(handle, value): sets the condition a
        conditional graph node reads (emu/conditionals.py)."""
        from . import conditionals
        try:
            conditionals.set_value(handle, value)
        except KeyError:
            raise KernelError(f"{self.name}: cudaGraphSetConditional of unknown handle {int(handle):#x}") from None

    def global_address(self, name: str) -> int:
        """The device address of the __device__ variable `name` of the
        kernel's module (what `&name` is in the kernel)."""
        g = self._globals.get(name)
        if g is None:
            raise KernelError(f"{self.name}: module has no __device__ variable {name}")
        return int(g[0])

    def global_array(self, name: str, n: int, dtype) -> np.ndarray:
        """A view of the __device__ variable `name` of the kernel's module."""
        g = self._globals.get(name)
        if g is None:
            raise KernelError(f"{self.name}: module has no __device__ variable {name}")
        addr, size = g
        dt = np.dtype(dtype)
        if int(n) * dt.itemsize > size:
            raise KernelError(f"{self.name}: {n} x {dt} exceeds variable {name} ({size} bytes)")
        return self.array(addr, n, dt)
