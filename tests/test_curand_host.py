"""cuRAND host generators (curandCreateGeneratorHost, issue 26: NVIDIA's
cuRAND samples use one after each device generator): the generator runs in
the worker, its results come back in the answer and land in the
application's host buffer before the call returns (interceptor/
lib_curand_host.c, proxyd/families/curand_host.py). On the emulated backend a host
and a device generator of the same type and seed give the same sequence,
so the host results are checked against the device ones copied back; a
second call continues the sequence; a failing call (an odd count of
normals) answers its own status at once, not at the next synchronisation.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from conftest import client_env

SCRIPT = r"""
import ctypes, json
import numpy as np
from ctypes import byref, c_void_p, c_size_t, c_float, c_double, c_ulonglong
rnd = ctypes.CDLL("libcurand.so.10")
rt = ctypes.CDLL("libcudart.so.13")
P = c_void_p
rnd.curandGenerateUniform.argtypes = [P, P, c_size_t]
rnd.curandGenerateNormalDouble.argtypes = [P, P, c_size_t, c_double, c_double]
rnd.curandGenerateNormal.argtypes = [P, P, c_size_t, c_float, c_float]
rnd.curandGeneratePoisson.argtypes = [P, P, c_size_t, c_double]
rnd.curandSetPseudoRandomGeneratorSeed.argtypes = [P, c_ulonglong]
rt.cudaMalloc.argtypes = [P, c_size_t]
rt.cudaMemcpy.argtypes = [P, P, c_size_t, ctypes.c_int]
out = {}
hg, dg = c_void_p(), c_void_p()
out["create_host"] = rnd.curandCreateGeneratorHost(byref(hg), 100)
out["create_dev"] = rnd.curandCreateGenerator(byref(dg), 100)
for g in (hg, dg):
    rnd.curandSetPseudoRandomGeneratorSeed(g, 1234)
n = 1000
host = np.zeros(2 * n, np.float32)
out["gen1"] = rnd.curandGenerateUniform(hg, host.ctypes.data, n)
out["gen2"] = rnd.curandGenerateUniform(hg, host[n:].ctypes.data, n)
d = c_void_p(); rt.cudaMalloc(byref(d), 8 * n)
rnd.curandGenerateUniform(dg, d, 2 * n)
dev = np.zeros(2 * n, np.float32)
rt.cudaMemcpy(dev.ctypes.data, d, dev.nbytes, 2)
out["same"] = bool(np.array_equal(host, dev))
out["range"] = [float(host.min()), float(host.max())]
nd = np.zeros(64, np.float64)
out["normal"] = rnd.curandGenerateNormalDouble(hg, nd.ctypes.data, 64, 2.0, 0.5)
out["normal_mean"] = float(nd.mean())
out["odd"] = rnd.curandGenerateNormal(hg, np.zeros(3, np.float32).ctypes.data, 3, 0.0, 1.0)
out["sync"] = rt.cudaDeviceSynchronize()
po = np.zeros(100, np.uint32)
out["poisson"] = rnd.curandGeneratePoisson(hg, po.ctypes.data, 100, 4.0)
out["poisson_mean"] = float(po.mean())
out["destroy"] = rnd.curandDestroyGenerator(hg)
print(json.dumps(out))
"""


def test_host_generator_results_come_back_to_host_memory(emu_daemon):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT)], env=client_env(emu_daemon),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    o = json.loads(r.stdout)
    assert o["create_host"] == 0 and o["create_dev"] == 0
    assert o["gen1"] == 0 and o["gen2"] == 0
    assert o["same"], "host results differ from the same generator's device results"
    assert 0 < o["range"][0] and o["range"][1] <= 1
    assert o["normal"] == 0 and 1.7 < o["normal_mean"] < 2.3
    assert o["odd"] == 105, "CURAND_STATUS_LENGTH_NOT_MULTIPLE, answered by the call itself"
    assert o["sync"] == 0, "a host generator's failure is not deferred to the next synchronisation"
    assert o["poisson"] == 0 and 3 < o["poisson_mean"] < 5
    assert o["destroy"] == 0
    assert "not supported" not in r.stderr.lower(), r.stderr
