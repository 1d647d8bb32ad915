"""Module variables' addresses in the application (interceptor/hostmem.c,
gp_note_device_range): the shim keeps them all and holds their pages.

The app gets a variable's address from the worker's driver, whose context
lies where that process's mmaps go, as this process's do; natively, with
unified addressing, no host memory is ever at a device address. So the shim
holds the pages of every variable it learns of, and a host mapping made
afterwards cannot land there; memory the app had mapped there before is
ambiguous, said once. (The corpus program many_globals checks that all of
1536 variables are known as device memory.) Emulated backend: its variables
start at GLOBALS_BASE."""
from __future__ import annotations

import subprocess
import sys

import pytest

import corpus
from conftest import client_env

from gpuproxy.emu.backend import GLOBALS_BASE

SCRIPT = r"""
import ctypes, json, sys
from ctypes import byref, c_int, c_size_t, c_uint64, c_void_p
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = c_void_p
libc.mmap.argtypes = [c_void_p, c_size_t, c_int, c_int, c_int, ctypes.c_long]
PROT_RW, MAP_PRIVATE_ANON, FIXED_NOREPLACE = 3, 0x22, 0x100000
pre = int(sys.argv[2])
out = {}
if pre:     # the app's own memory where the variables will be, before CUDA starts
    p = libc.mmap(pre, 16 << 20, PROT_RW, MAP_PRIVATE_ANON | FIXED_NOREPLACE, -1, 0)
    out["premapped"] = p == pre
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
dev, ctx, mod = c_int(), c_void_p(), c_void_p()
cu.cuDeviceGet(byref(dev), 0)
assert cu.cuDevicePrimaryCtxRetain(byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0
assert cu.cuModuleLoadData(byref(mod), open(sys.argv[1], "rb").read()) == 0
addr, size = c_uint64(), c_size_t()
assert cu.cuModuleGetGlobal_v2(byref(addr), byref(size), mod, b"g177") == 0
out["addr"] = addr.value
page = addr.value & ~4095
# a host mapping asked for at the variable's page: refused (EEXIST) unless it was the app's before
q = libc.mmap(page, 4096, PROT_RW, MAP_PRIVATE_ANON | FIXED_NOREPLACE, -1, 0)
out["new_mapping_there"] = q == page
out["errno"] = ctypes.get_errno()
held = ""
for line in open("/proc/self/maps"):
    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
    if lo <= addr.value < hi:
        held = line.split()[1]
out["maps_perms"] = held
t = ctypes.c_uint()
rc = cu.cuPointerGetAttribute(byref(t), 2, c_uint64(addr.value))   # CU_POINTER_ATTRIBUTE_MEMORY_TYPE
out["memtype"] = [rc, t.value]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def cubin(nvcc, shim_installed) -> str:
    b = corpus.build(corpus.get_program("globals_table"), corpus.default_build_dir())
    return str(b.cubins["globals_table_kernels"])


def _run(emu_daemon, cubin: str, premap: int) -> tuple[dict, str]:
    import json
    r = subprocess.run([sys.executable, "-c", SCRIPT, cubin, str(premap)], capture_output=True, text=True,
                       timeout=60, env=client_env(emu_daemon))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r.stderr


def test_a_variables_page_is_held_in_the_app(emu_daemon, cubin):
    o, err = _run(emu_daemon, cubin, 0)
    assert o["addr"] >= GLOBALS_BASE
    assert not o["new_mapping_there"] and o["errno"] == 17, o      # EEXIST: the shim holds the page
    assert o["maps_perms"] == "---p", o                            # inaccessible, as device memory is to the host
    assert o["memtype"] == [0, 2], o                               # CU_MEMORYTYPE_DEVICE
    assert err.strip() == "", err


def test_the_apps_own_memory_there_is_said_once(emu_daemon, cubin):
    o, err = _run(emu_daemon, cubin, GLOBALS_BASE)
    assert o["premapped"], "the emulated variables' region was already taken in this process"
    assert GLOBALS_BASE <= o["addr"] < GLOBALS_BASE + (16 << 20), o
    assert o["maps_perms"] == "rw-p", o                            # the app's memory is left as it is
    assert o["memtype"] == [0, 2], o                               # the address the app was given: the device's
    lines = [ln for ln in err.splitlines() if "module variable" in ln]
    assert len(lines) == 1 and "already mapped" in lines[0], err
