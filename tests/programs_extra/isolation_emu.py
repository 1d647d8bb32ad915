"""Emulated kernels of isolation.cu (tests/test_isolation.py)."""
import time

from gpuproxy.emu import kernel



@kernel("_Z4spinx")
def spin(k):
    cycles = k.param(0, "q")
    time.sleep(min(cycles / 1.98e9, 60.0))     # the emulated clock rate is 1.98 GHz


@kernel("_Z4bumpPiii")
def bump(k):
    n = k.param(1, "i")
    r = k.param(2, "i")
    m = min(n, k.grid[0] * k.block[0])
    v = k.array(k.param(0, "P"), m, "i4")
    v[:] = v * 3 + r


@kernel("_Z4tripi")
def trip(k):
    if k.param(0, "i") != 0:
        raise RuntimeError("device-side assert: x == 0 failed")


@kernel("_Z3sayi")
def say(k):
    print(f"kernel says {k.param(0, 'i')}")
