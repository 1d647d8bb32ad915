"""The emulated GPU backend of proxyd, and the API for writing emulated kernels.

Emulated kernels are Python functions registered by the kernel's mangled name;
one call computes what the whole grid computes, with numpy, on views of the
emulated device memory:

    from gpuproxy.emu import kernel

    @kernel("_Z9vectorAddPKfS0_Pfi")
    def vector_add(k):                      # k: one launch
        n = k.param(3, "i")                 # struct-module format of parameter 3
        a, b, c = (k.array(k.param(i, "P"), n, "f4") for i in range(3))  # writable numpy views
        c[:] = a + b

    @kernel("_Z9incrementv")
    def increment(k):
        k.global_array("counter", 1, "i4")[0] += 1   # a __device__ variable of the kernel's module

Texture and surface objects (a `cudaTextureObject_t` parameter: `k.param(i, "Q")`)
are read with `k.tex1dfetch(obj, i)`, `k.tex2d(obj, x, y)`, `k.tex3d(obj, x, y, z)`
(point sampling, clamp addressing: one row of channels per coordinate) and
`k.surf2dread(obj, xbytes, y)` / `k.surf2dwrite(obj, values, xbytes, y)`;
see proxyd/backends/emu/textures.py for what is modelled.
`k.grid` and `k.block` are 3-tuples; `k.shared_bytes` is the launch's dynamic
shared memory size; `k.cluster` is the thread block cluster shape (launch
attribute, (1, 1, 1) without one) and `k.cooperative` says whether it is a
cooperative launch. Load kernel files with `proxyd --backend emu --emu-kernels FILE ...`
(or GPUPROXY_EMU_KERNELS=FILE:FILE...). This API is kept stable: tests outside
the project use it.
"""
from __future__ import annotations

from .kernels import KERNELS, KernelLaunch, kernel, load_kernel_file

__all__ = ["kernel", "KernelLaunch", "KERNELS", "load_kernel_file"]
