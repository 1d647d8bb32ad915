"""What the worker's C serving loop (proxyd/native/gpxd.c, gpx_serve)
costs per message on this CPU, beside the Python path's cost for the same
message (issue 13, target 4). No GPU: the C loop runs over the stand-in
driver of tests/native/fake_cuda_serve.c (driver time ~0), the Python path
over the emulated backend, as bench/roundtrip_inproc.py does.

    python bench/native_serve_inproc.py [N]

One JSON line per case: c_us (request written into a real channel segment,
gpx_serve called, answer published; minus the same with nothing to serve,
i.e. the cffi call and the Python that writes the request), python_us
(Server.handle of the same message), the best of N/200 batches of 200.
Timing is never pass/fail.
"""
from __future__ import annotations

import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    n = int(next((a for a in args if a.isdigit()), "20000"))
    from gpuproxy.proxyd.core import channel as C
    from gpuproxy.proxyd.backends import native as nat
    from gpuproxy.proxyd.worker.native_serve import fid_classes
    from test_native_serve import FID, PyWorker, setup_session
    work = tempfile.mkdtemp()
    lib = os.path.join(work, "libfakecuda.so")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", os.path.join(HERE, "..", "tests", "native", "fake_cuda_serve.c"),
                    "-o", lib], check=True)
    fake = ctypes.CDLL(lib)
    nv = nat.Native(lib, [f for f, c in fid_classes().items() if c == 1])
    for fid, cls in fid_classes().items():
        nv.lib.gpx_add_fid_class(fid, cls)
    name = f"gpuproxy-nsbench-{os.getpid()}-chan"
    with open("/dev/shm/" + name, "wb") as f:
        f.truncate(C.SIZE)
        f.write(b"GPXCHAN1")
    ch = C.Channel(name, C.SIZE)
    py = PyWorker()
    try:
        ctx, dptr, stream, event, slot = setup_session(nv, fake, py)
        launch = [FID["cuLaunchKernel"], ctx, (3 << 32) | 9, 1, 1, 1, 1, 1, 1, 0, 0, b"\0" * 8, None]
        cases = {
            "null_call": [[FID["cuDeviceGetAttribute"], ctx, True, 16, 0]],
            "stream_query": [[FID["cuStreamQuery"], ctx, 0]],
            "dtoh_4": [[FID["cuMemcpyDtoH_v2"], ctx, None, dptr, 4]],
            "launch+dtoh_4": [launch, [FID["cuMemcpyDtoH_v2"], ctx, None, dptr, 4]],
        }
        st = nv.ffi.new("gpx_serve_state *")
        st.chan = ch.address(nv.ffi)
        st.slot = slot
        st.spin_ns = 0
        st.max_ns = 10_000_000
        mm = ch.mm
        pack_q, pack_i = struct.Struct("<Q").pack_into, struct.Struct("<I").pack_into
        serve = nv.lib.gpx_serve
        seq = [1000]

        def c_batch(raw_of, count, empty=False):
            t0 = time.thread_time()
            for _ in range(count):
                s = seq[0] + 1
                raw = raw_of(s)
                mm[C.REQ_DATA:C.REQ_DATA + len(raw)] = raw
                pack_i(mm, C.REQ_LEN, len(raw))
                pack_q(mm, C.REQ_SEQ, s)
                st.last_seq = s - 1
                if empty:
                    st.taken = s        # nothing new in the slot: the call and one look
                if serve(st) != 0:
                    raise RuntimeError("not served in C")
                if not empty:
                    seq[0] = s
            return (time.thread_time() - t0) / count * 1e6

        def py_batch(ops, count):
            t0 = time.thread_time()
            for _ in range(count):
                py.srv.handle(py.rid, [py.raw(1, ops)])
                py.seq += 1
            return (time.thread_time() - t0) / count * 1e6

        for name_, ops in cases.items():
            raw_of = lambda s, ops=ops: msgpack.packb([1, s, ops], use_bin_type=True)    # noqa: E731
            batches = max(n // 200, 5)
            c_best = min(c_batch(raw_of, 200) for _ in range(batches))
            base = min(c_batch(raw_of, 200, empty=True) for _ in range(batches))
            py_ops = ops if ops[0] is not launch else ops[1:]      # the emulated session has no such kernel
            p_best = min(py_batch(py_ops, 200) for _ in range(batches))
            print(json.dumps({"bench": name_, "c_us": round(c_best - base, 2), "c_call_overhead_us": round(base, 2),
                              "python_us": round(p_best, 2), "python_ops": len(py_ops)}))
    finally:
        nv.lib.gpx_clear_slot(slot)
        py.close()
        ch.close()
        os.unlink("/dev/shm/" + name)


if __name__ == "__main__":
    main()
