"""One process using several GPUs: cudaSetDevice / cuDeviceGet, allocations
and launches on each device, in one session. Runs on the emulated backend
with two devices (CI); scripts/gpu-check runs it on every GPU of the GPU
machine as well (marked gpu variant)."""
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import corpus  # noqa: E402
from proxy import Daemon, run_proxied  # noqa: E402

SRC = r'''
#include <cstdio>
#include <cuda_runtime.h>
#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("FAIL %s: %s\n", #x, cudaGetErrorName(e)); return 1; } } while (0)
__global__ void mark(int *p, int n, int base) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = base + i; }
int main() {
  int n = 0; CHECK(cudaGetDeviceCount(&n));
  if (n < 2) { printf("devices %d: need 2\n", n); return 2; }
  const int N = 1000; int *d[2]; int h[N];
  for (int dev = 0; dev < 2; dev++) {
    CHECK(cudaSetDevice(dev));
    int cur = -1; CHECK(cudaGetDevice(&cur)); if (cur != dev) { printf("FAIL device %d\n", cur); return 1; }
    CHECK(cudaMalloc(&d[dev], N * sizeof(int)));
    mark<<<(N + 255) / 256, 256>>>(d[dev], N, 1000 * (dev + 1));
    CHECK(cudaGetLastError());
  }
  for (int dev = 0; dev < 2; dev++) {
    CHECK(cudaSetDevice(dev));
    CHECK(cudaMemcpy(h, d[dev], sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; i++) if (h[i] != 1000 * (dev + 1) + i) { printf("FAIL dev %d i %d = %d\n", dev, i, h[i]); return 1; }
    cudaPointerAttributes a; CHECK(cudaPointerGetAttributes(&a, d[dev]));
    printf("device %d ok (pointer on device %d)\n", dev, a.device);
    CHECK(cudaFree(d[dev]));
  }
  printf("PASS multidevice\n");
  return 0;
}
'''

EMU = '''
from gpuproxy.emu import kernel
import numpy as np

@kernel("_Z4markPiii")
def mark(k):
    n, base = k.param(1, "i"), k.param(2, "i")
    m = min(n, k.grid[0] * k.block[0])
    k.array(k.param(0, "P"), m, "i4")[:] = base + np.arange(m, dtype=np.int32)
'''


@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    nvcc = corpus.nvcc_path()
    if not nvcc:
        pytest.skip("nvcc not found")
    d = tmp_path_factory.mktemp("md")
    (d / "md.cu").write_text(SRC)
    (d / "md_emu.py").write_text(EMU)
    subprocess.run([nvcc, "-cudart", "shared", f"-arch={corpus.nvcc_arch()}", "-o", str(d / "md"), str(d / "md.cu")],
                   check=True)
    return d


def test_two_devices_in_one_session(exe):
    with Daemon(backend="emu", emu_kernels=[exe / "md_emu.py"], extra_args=["--emu-devices", "2"]) as d:
        r = run_proxied([str(exe / "md")], d)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.endswith("PASS multidevice\n")
    assert "device 1 ok (pointer on device 1)" in r.stdout


@pytest.mark.gpu
def test_two_gpus_in_one_session(exe):
    """The same program on a machine with two or more GPUs (cuda backend)."""
    from gpuproxy.proxyd.backends.cuda import CudaBackend
    if CudaBackend().device_count() < 2:
        pytest.skip("needs two GPUs")
    with Daemon(backend="cuda") as d:
        r = run_proxied([str(exe / "md")], d)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.endswith("PASS multidevice\n")
    assert "device 1 ok (pointer on device 1)" in r.stdout
