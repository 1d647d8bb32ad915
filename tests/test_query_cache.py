"""Queries the shim answers from what it knows (interceptor/query_cache.c):
cuInit after a success, the primary context's state until this process
changes it, device attributes per worker. Each is checked two ways: the
answers are the ones proxyd gives (state changes are seen at once), and the
shim's own call profile (GPUPROXY_PROFILE) shows how many reached proxyd.
Emulated backend (CI)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from conftest import call_profile, client_env

SCRIPT = r"""
import ctypes, json
from ctypes import byref, c_int, c_uint, c_void_p
cu = ctypes.CDLL("libcuda.so.1")
out = {"init": [cu.cuInit(0) for _ in range(5)]}

def state():
    f, a = c_uint(99), c_int(99)
    rc = cu.cuDevicePrimaryCtxGetState(0, byref(f), byref(a))
    return [rc, f.value, a.value]

out["s0"] = [state() for _ in range(4)]
ctx = c_void_p()
out["retain"] = cu.cuDevicePrimaryCtxRetain(byref(ctx), 0)
out["s1"] = [state() for _ in range(3)]
out["setflags"] = cu.cuDevicePrimaryCtxSetFlags_v2(0, 4)     # CU_CTX_SCHED_BLOCKING_SYNC
out["s2"] = state()
out["release"] = cu.cuDevicePrimaryCtxRelease_v2(0)
out["s3"] = state()
vals = []
for _ in range(10):
    v = c_int(-1)
    vals.append([cu.cuDeviceGetAttribute(byref(v), 16, 0), v.value])    # MULTIPROCESSOR_COUNT
out["sm"] = vals
v = c_int(-1)
out["cc"] = [cu.cuDeviceGetAttribute(byref(v), 75, 0), v.value]        # COMPUTE_CAPABILITY_MAJOR
out["bad_dev"] = cu.cuDeviceGetAttribute(byref(v), 16, 99)
print(json.dumps(out))
"""


def test_repeated_queries_answered_in_the_shim(emu_daemon, tmp_path):
    prof = tmp_path / "q.prof"
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPT)], capture_output=True, text=True, timeout=60,
                       env=client_env(emu_daemon, {"GPUPROXY_PROFILE": str(prof)}))
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout)
    assert o["init"] == [0] * 5
    assert o["s0"] == [[0, 0, 0]] * 4, "no primary context yet"
    assert o["retain"] == 0 and o["s1"] == [[0, 0, 1]] * 3, "the retain is seen at once"
    assert o["setflags"] == 0 and o["s2"] == [0, 4, 1], "so is a change of flags"
    assert o["release"] == 0 and o["s3"][0] == 0 and o["s3"][2] == 0, "and the release"
    assert all(x == o["sm"][0] for x in o["sm"]) and o["sm"][0][0] == 0 and o["sm"][0][1] > 0
    assert o["cc"][0] == 0 and o["cc"][1] > 0
    assert o["bad_dev"] == 101, "an invalid device is still proxyd's to judge (CUDA_ERROR_INVALID_DEVICE)"
    from gpuproxy.proxyd._generated import NAMES
    ids = {n: i for i, n in NAMES.items()}
    rows = {fid: sync_calls for fid, (_calls, sync_calls) in call_profile(prof).items()}
    assert rows[ids["cuInit"]] == 1
    # four answers before the retain, one after it, one after set-flags, one after release
    assert rows[ids["cuDevicePrimaryCtxGetState"]] == 4
    # multiprocessor count once, compute capability once, the bad device once
    assert rows[ids["cuDeviceGetAttribute"]] == 3
