"""Emulated kernel of bench/roundtrip.cu (proxyd --backend emu)."""
from gpuproxy.emu import kernel


@kernel("_Z4bumpPi")
def bump(k):
    k.array(k.param(0, "P"), 1, "i4")[0] += 1
