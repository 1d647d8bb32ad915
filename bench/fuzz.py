"""A long fuzzing campaign against proxyd (the CI test runs a bounded one:
tests/test_fuzz.py). Starts its own proxyd (emulated backend) unless
--endpoint names a running one, sends --count hostile messages (default one
million) on the data and control paths (tests/fuzzing.py), and reports
throughput, proxyd's memory before and after, its log size, and whether a
well-behaved client is still served afterwards.

    python3 bench/fuzz.py [--count 1000000] [--seed 1] [--endpoint E | --tcp]

--tcp starts proxyd on a keyed tcp endpoint (127.0.0.1; this user's own
CURVE keys, docs/security.md): the hostile messages then travel through
CURVE and the ZAP handler too.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fuzzing import Fuzzer  # noqa: E402
from proxy import Daemon  # noqa: E402
from wire import WireClient  # noqa: E402


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def rss(pid: int) -> int:
    """Resident memory of proxyd: the supervisor and its workers."""
    total = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) << 10
    except OSError:
        return 0
    return total + sum(rss(c) for c in _children(pid))


def open_fds(pid: int) -> int:
    """File descriptors held by the supervisor (a leak per message or per
    session would show here)."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def shm_segments() -> set[str]:
    """This process's sessions' shared-memory names (tokens end in our pid;
    other programs on the machine may have gpuproxy segments of their own)."""
    return {n for n in os.listdir("/dev/shm")
            if n.startswith("gpuproxy-") and (f"-{os.getpid()}-" in n or n.endswith(f"-{os.getpid()}"))}


def internal_errors(log: str) -> list[str]:
    """The distinct places where proxyd reported an internal error (each
    one's traceback is logged once, proxyd/core/ratelog.py): the last line of
    each traceback."""
    out, lines = [], log.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback"):
            j = i + 1
            while j < len(lines) and (lines[j].startswith(" ") or lines[j].startswith("\t")):
                j += 1
            if j < len(lines):
                out.append(lines[j][:200])
    return sorted(set(out))


def well_behaved(endpoint: str) -> bool:
    """A client that allocates, writes, reads back and frees: True if every
    answer is right."""
    with WireClient(endpoint) as c:
        c.hello()
        ctx = c.context()
        code, outs, _ = c.call("cuMemAlloc_v2", True, 1 << 20, ctx=ctx)
        if code:
            return False
        a = outs[0]
        data = os.urandom(1 << 16)
        ok = c.call("cuMemcpyHtoD_v2", a, data, len(data), ctx=ctx)[0] == 0
        code, outs, _ = c.call("cuMemcpyDtoH_v2", None, a, len(data), ctx=ctx)
        ok = ok and code == 0 and outs[0] == data and c.call("cuMemFree_v2", a, ctx=ctx)[0] == 0
        c.bye()
        return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--endpoint")
    ap.add_argument("--tcp", action="store_true", help="start proxyd on a keyed tcp endpoint")
    ap.add_argument("--keep-log", metavar="FILE", help="copy proxyd's log here (it is removed with the daemon)")
    a = ap.parse_args()
    d = None
    if a.endpoint:
        ep = a.endpoint
    else:
        endpoint = None
        if a.tcp:
            import socket
            with socket.socket() as so:
                so.bind(("127.0.0.1", 0))
                endpoint = f"tcp://127.0.0.1:{so.getsockname()[1]}"
        d = Daemon(backend="emu", endpoint=endpoint, env={**os.environ, "GPUPROXY_EMU_TOTAL_MB": "256"}).start()
        ep = d.endpoint
    try:
        rss0 = rss(d.proc.pid) if d else 0
        fds0 = open_fds(d.proc.pid) if d else 0
        shm0 = shm_segments()
        ok_before = well_behaved(ep)
        f = Fuzzer(ep, seed=a.seed)
        step = max(a.count // 20, 1)
        stats = f.run(a.count, progress=lambda n, t: n % step < f.batch and print(f"  {n}/{t}", file=sys.stderr))
        f.close()
        res = {**stats, "rate_per_s": round(stats["messages"] / max(stats["seconds"], 1e-9)),
               "served_before": ok_before, "served_after": well_behaved(ep)}
        if d:
            res.update(alive=d.proc.poll() is None, rss_before_mib=round(rss0 / 2**20, 1),
                       rss_after_mib=round(rss(d.proc.pid) / 2**20, 1), log_lines=d.log().count("\n"),
                       workers_after=len(_children(d.proc.pid)), supervisor_fds_before=fds0,
                       supervisor_fds_after=open_fds(d.proc.pid),
                       log_tracebacks=d.log().count("Traceback"), internal_errors=internal_errors(d.log()))
            if a.keep_log:
                Path(a.keep_log).write_text(d.log())
        # the fuzzer's sessions have no shared memory; anything new is a leak
        res["new_shm_segments"] = sorted(shm_segments() - shm0)
        print(json.dumps(res, indent=2))
        return 0 if res["served_after"] and res.get("alive", True) else 1
    finally:
        if d:
            d.cleanup()


if __name__ == "__main__":
    sys.exit(main())
