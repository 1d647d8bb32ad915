"""A stand-in for bench/real_app.py where torch and a GPU are missing: the
same command line, control file and output files, so that the harness of
bench/real_workloads.py runs on the emulated backend (tests/test_bench_real.py).

Its state lives in device memory when it runs under the shim (cudaMalloc'd
through ctypes): every step copies the state to the host, advances it and
copies it back, and its "loss" is derived from it, so a checkpoint that
lost or reordered device memory changes the curve. Without the shim (the
uninterrupted reference) the state stays in host memory: the same curve.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import struct
import sys
import time

N = 1 << 16        # bytes of state


def cuda():
    """The shim's runtime API when it is preloaded, else None."""
    if "LD_PRELOAD" not in os.environ:
        return None
    lib = ctypes.CDLL(None)
    try:
        lib.cudaMalloc, lib.cudaMemcpy      # noqa: B018
    except AttributeError:
        return None
    return lib


def control_stop(path: str):
    try:
        w = open(path).read().split()
    except OSError:
        return None
    return int(w[1]) if len(w) == 2 and w[0] == "stop" else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", required=True)
    ap.add_argument("--steps-file", required=True)
    ap.add_argument("--loss-file", required=True)
    ap.add_argument("--control", required=True)
    ap.add_argument("--max-steps", type=int, default=100000)
    a = ap.parse_args()
    lib = cuda()
    host = ctypes.create_string_buffer(N)
    dev = ctypes.c_void_p()
    if lib is not None:
        assert lib.cudaMalloc(ctypes.byref(dev), ctypes.c_size_t(N)) == 0
        assert lib.cudaMemcpy(dev, host, ctypes.c_size_t(N), 1) == 0
    steps = open(a.steps_file, "a", buffering=1)
    losses = open(a.loss_file, "a", buffering=1)
    print("ready", flush=True)
    step = 0
    while step < a.max_steps:
        stop = control_stop(a.control)
        if stop is not None and step >= stop:
            break
        step += 1
        if lib is not None:
            assert lib.cudaMemcpy(host, dev, ctypes.c_size_t(N), 2) == 0
        digest = hashlib.sha256(host.raw + struct.pack("<q", step)).digest()
        host.raw = (digest * (N // len(digest)))[:N]
        if lib is not None:
            assert lib.cudaMemcpy(dev, host, ctypes.c_size_t(N), 1) == 0
        time.sleep(0.01)
        loss = struct.unpack("<d", digest[:8])[0]
        steps.write(f"{step} {time.monotonic_ns()}\n")
        losses.write(f"{step} {float(loss).hex()}\n")
    print(f"done steps={step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
