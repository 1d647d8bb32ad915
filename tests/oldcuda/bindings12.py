"""NVIDIA's cuda.bindings 12.x (its CUDA 12 runtime linked in) under the
proxy: the device's properties through the runtime, in CUDA 12's layout,
and a copy to the device and back. Prints one "name value" line each;
tests/test_oldcuda.py compares them with the emulated device."""
import numpy as np
from cuda.bindings import runtime as rt

err, ver = rt.cudaRuntimeGetVersion()
assert err == rt.cudaError_t.cudaSuccess, err
print("runtime", ver)
err, p = rt.cudaGetDeviceProperties(0)
assert err == rt.cudaError_t.cudaSuccess, err
print("name", p.name.split(b"\0")[0].decode())
for f in ("multiProcessorCount", "clockRate", "memoryClockRate", "l2CacheSize", "maxThreadsPerMultiProcessor",
          "warpSize", "major", "minor", "totalGlobalMem"):
    print(f, getattr(p, f))
a = np.arange(1 << 16, dtype=np.uint32)
b = np.zeros_like(a)
err, d = rt.cudaMalloc(a.nbytes)
assert err == rt.cudaError_t.cudaSuccess, err
H2D, D2H = rt.cudaMemcpyKind.cudaMemcpyHostToDevice, rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
assert rt.cudaMemcpy(d, a.ctypes.data, a.nbytes, H2D)[0] == rt.cudaError_t.cudaSuccess
assert rt.cudaMemset(d + 4, 0xff, 4)[0] == rt.cudaError_t.cudaSuccess
assert rt.cudaMemcpy(b.ctypes.data, d, b.nbytes, D2H)[0] == rt.cudaError_t.cudaSuccess
a[1] = 0xffffffff
print("roundtrip", "same" if (a == b).all() else "different")
print("free", int(rt.cudaFree(d)[0]))
