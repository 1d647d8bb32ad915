"""JAX natively and under gpuproxy, digest by digest (issue 26): step `jax` of
scripts/gpu_check_python.py.

scripts/pyframeworks/jax_check.py (JAX on the GPU with no CPU fallback, a
jit/grad training loop, matmul, FFT, random, solve/eigh, conv, sparse) runs
natively and proxied in each of three settings: with XLA's command buffers
(CUDA graphs, XLA's default), without them (XLA_FLAGS=
--xla_gpu_enable_command_buffer=) and without autotuning
(--xla_gpu_autotune_level=0); the default setting's native run twice. All
seven run at the same time (one GPU, no preallocation).

Written to the output folder: jax-digests.json,
  {"command_buffers" | "no_command_buffers":
     {"checks": {check: {"native": ..., "proxied": ...}},
      "digests": {name: {"native": hex, "proxied": hex, "identical": bool}},
      "not_supported": [the proxied run's "not supported" lines]}}
and one result row per setting: PASS when every digest the native run
produced is bit-identical proxied, else FAIL naming the digests that differ.
Then the TMA descriptors XLA's Hopper kernels take (TENSOR_MAPS): encoded
natively and proxied with the same arguments, they must be the same bytes
(tensor-maps.json).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "pyframeworks" / "jax_check.py"
# autotune_off: XLA picks GEMM and convolution algorithms by timing the
# candidates (autotuning), so which kernel runs, and the last bits of its
# result, may depend on timings, which differ between runs and under the
# proxy; level 0 takes the libraries' heuristics, which depend on the inputs
# only. The native run of the default setting also runs twice (native2): a
# digest that differs between two native runs cannot be asked of the proxy.
SETTINGS = (("command_buffers", {}), ("no_command_buffers", {"XLA_FLAGS": "--xla_gpu_enable_command_buffer="}),
            ("autotune_off", {"XLA_FLAGS": "--xla_gpu_autotune_level=0"}))


def _parse(stdout: str, stderr: str, rc) -> dict:
    try:
        return json.loads(stdout)
    except ValueError:
        tail = (stderr.strip().splitlines() or ["(no output)"])[-1][:300]
        return {"(script)": f"FAIL: rc={rc} {tail}"}


# TMA descriptors (cuTensorMapEncodeTiled/Im2col, which XLA's and Triton's
# Hopper kernels use) encoded natively and proxied with the same arguments:
# the driver encodes the address it is given without looking it up, so the
# same fixed address must give the same 128 bytes in both (and the same
# refusals). Printed as JSON {case: [status, hex]}.
TENSOR_MAPS = r"""
import ctypes, json
from ctypes import byref, c_int, c_uint, c_uint64, c_void_p
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
ctx = c_void_p()
assert cu.cuDevicePrimaryCtxRetain(byref(ctx), 0) == 0 and cu.cuCtxSetCurrent(ctx) == 0
raw = ctypes.create_string_buffer(192)
m = (ctypes.addressof(raw) + 63) & ~63
ADDR = 0x7F0000000000
def tiled(addr, dtype, rank, gdim, gstr, box, est, inter=0, swz=0, l2=0, oob=0):
    ctypes.memset(m, 0, 128)
    rc = cu.cuTensorMapEncodeTiled(c_void_p(m), c_int(dtype), c_uint(rank), c_void_p(addr), (c_uint64 * 5)(*gdim),
                                   (c_uint64 * 4)(*gstr), (c_uint * 5)(*box), (c_uint * 5)(*est), c_int(inter),
                                   c_int(swz), c_int(l2), c_int(oob))
    return [rc, ctypes.string_at(m, 128).hex() if rc == 0 else None]
out = {
    "f32 2d": tiled(ADDR, 7, 2, (256, 128), (1024,), (32, 16), (1, 1)),
    "bf16 3d swizzle128 l2": tiled(ADDR + 4096, 9, 3, (512, 64, 8), (1024, 65536), (64, 32, 1), (1, 1, 1), 0, 3, 2),
    "f16 nan fill": tiled(ADDR, 6, 2, (128, 128), (256,), (64, 64), (1, 1), 0, 3, 0, 1),
    "misaligned address": tiled(ADDR + 8, 7, 2, (256, 128), (1024,), (32, 16), (1, 1)),
    "box too large": tiled(ADDR, 7, 2, (256, 128), (1024,), (32, 300), (1, 1)),
}
ctypes.memset(m, 0, 128)
rc = cu.cuTensorMapEncodeIm2col(c_void_p(m), c_int(7), c_uint(4), c_void_p(ADDR), (c_uint64 * 4)(64, 16, 16, 2),
                                (c_uint64 * 3)(256, 4096, 65536), (c_int * 2)(-1, -1), (c_int * 2)(1, 1), c_uint(64),
                                c_uint(32), (c_uint * 4)(1, 1, 1, 1), c_int(0), c_int(0), c_int(0), c_int(0))
out["im2col f32 4d"] = [rc, ctypes.string_at(m, 128).hex() if rc == 0 else None]
print(json.dumps(out))
"""


# The pointer attributes XLA asks of its buffers (cuda.h CUpointer_attribute:
# 11 RANGE_START_ADDR, 12 RANGE_SIZE, 14 ALLOWED_HANDLE_TYPES, 16
# ACCESS_FLAGS, 18 MAPPING_SIZE, 19 MAPPING_BASE_ADDR) of an address inside a
# cuMemAlloc allocation, relative to the allocation (the addresses differ
# between the two processes). Printed as JSON {attribute: [status, value]}.
POINTER_ATTRS = r"""
import ctypes, json
from ctypes import byref, c_uint, c_uint64, c_void_p
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
ctx = c_void_p()
assert cu.cuDevicePrimaryCtxRetain(byref(ctx), 0) == 0 and cu.cuCtxSetCurrent(ctx) == 0
d = c_uint64()
assert cu.cuMemAlloc_v2(byref(d), 3 << 20) == 0
p = d.value + 12345
out = {}
for name, attr, ctype, rel in (("range start - base", 11, c_uint64, True), ("range size", 12, c_uint64, False),
                               ("allowed handle types", 14, c_uint64, False), ("access flags", 16, c_uint, False),
                               ("mapping size", 18, c_uint64, False), ("mapping base - base", 19, c_uint64, True)):
    v = ctype(0)
    rc = cu.cuPointerGetAttribute(byref(v), attr, c_uint64(p))
    out[name] = [rc, (v.value - d.value) if (rc == 0 and rel) else v.value]
print(json.dumps(out))
"""


def _native_vs_proxied(log, out: Path, client_env, base_env: dict, script: str, label: str, what: str):
    runs = {}
    for mode, env in (("native", dict(base_env)), ("proxied", client_env(dict(base_env)))):
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
        (out / f"{label}-{mode}.log").write_text(r.stdout + r.stderr)
        runs[mode] = _parse(r.stdout, r.stderr, r.returncode)
    same = runs["native"] == runs["proxied"] and "(script)" not in runs["native"]
    (out / f"{label}.json").write_text(json.dumps(runs, indent=1))
    log(f"{label}: native {runs['native']} | proxied {runs['proxied']}")
    return [(what, "PASS" if same else "FAIL")]


def tensor_maps(log, out: Path, client_env, base_env: dict) -> list[tuple[str, str]]:
    return _native_vs_proxied(log, out, client_env, base_env, TENSOR_MAPS, "tensor-maps",
                              "tensor maps encoded as natively (cuTensorMapEncodeTiled/Im2col)") + \
        _native_vs_proxied(log, out, client_env, base_env, POINTER_ATTRS, "pointer-attributes",
                           "pointer attributes 11, 12, 14, 16, 18, 19 answered as natively")


def run(log, out: Path, client_env, base_env: dict, limit_s: float | None = None) -> list[tuple[str, str]]:
    limit_s = limit_s or float(os.environ.get("GPUPROXY_JAX_CHECK_TIMEOUT_S", "150"))
    summary, results = {}, []
    # all four runs at once (16 cores, one GPU, no preallocation): the step stays within a minute or two
    procs = {}
    for label, extra in SETTINGS:
        modes = [("native", dict(base_env, **extra)), ("proxied", client_env(dict(base_env, **extra)))]
        if label == SETTINGS[0][0]:
            modes.append(("native2", dict(base_env, **extra)))
        for m, e in modes:
            # output to files, not pipes: JAX's warnings must never block a run on a full pipe
            fo, fe = open(out / f"jax-{label}-{m}.out", "w+"), open(out / f"jax-{label}-{m}.log", "w+")
            procs[label, m] = (subprocess.Popen([sys.executable, str(SCRIPT)], stdout=fo, stderr=fe, env=e), fo, fe)
    deadline = time.monotonic() + limit_s
    recs, errs = {}, {}
    for (label, m), (p, fo, fe) in procs.items():
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            fe.write(f"\n(ran out of time: {limit_s:g} s)\n")
        fo.seek(0), fe.seek(0)
        so, se = fo.read(), fe.read()
        fo.close(), fe.close()
        recs[label, m], errs[label, m] = _parse(so, se, p.returncode), se
    for label, _extra in SETTINGS:
        nat, prx = recs[label, "native"], recs[label, "proxied"]
        nd = nat.get("result digests") or {}
        pd = prx.get("result digests") or {}
        n2 = (recs.get((label, "native2")) or {}).get("result digests")
        digests = {k: {"native": v, "proxied": pd.get(k), "identical": pd.get(k) == v} for k, v in nd.items()}
        if n2 is not None:
            for k, v in digests.items():
                v["native_again"] = n2.get(k)
                v["native_runs_agree"] = n2.get(k) == v["native"]
        checks = {k: {"native": v, "proxied": prx.get(k)} for k, v in nat.items() if k != "result digests"}
        unsupported = sorted({ln.strip()[:200] for ln in errs[label, "proxied"].splitlines() if "not supported" in ln})
        summary[label] = {"checks": checks, "digests": digests, "not_supported": unsupported}
        for k, v in digests.items():
            log(f"jax ({label}) {k}: native {v['native']} proxied {v['proxied']} "
                f"{'identical' if v['identical'] else 'DIFFER'}")
        for k, v in checks.items():
            if v["native"] != v["proxied"]:
                log(f"jax ({label}) check {k}: native {v['native']} | proxied {v['proxied']}")
        for ln in unsupported:
            log(f"jax ({label}) proxied: {ln}")
        differ = [k for k, v in digests.items() if not v["identical"]]
        unstable = [k for k, v in digests.items() if v.get("native_runs_agree") is False]
        if not digests:
            results.append((f"jax digests bit-identical ({label})", "FAIL (no digest natively)"))
        else:
            note = f"; natively not reproducible: {', '.join(unstable)}" if unstable else ""
            results.append((f"jax digests bit-identical ({label}, {len(digests)})",
                            ("PASS" if not differ else f"FAIL ({', '.join(differ)})") + note))
    (out / "jax-digests.json").write_text(json.dumps(summary, indent=1))
    return results + tensor_maps(log, out, client_env, base_env)
