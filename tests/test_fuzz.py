"""proxyd survives hostile input (tests/fuzzing.py): random, truncated,
oversized and type-confused messages on the data and control paths, and
malformed images given to `inspect` and `restore`. Afterwards it still
serves a well-behaved client with identical output, its memory stayed
bounded and its log small (rate-limited, proxyd/core/ratelog.py).

GPUPROXY_FUZZ_COUNT sets the number of messages (default 200000: about a
minute on two cores); bench/fuzz.py runs longer campaigns."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess

import pytest

from conftest import short_dir
from fuzzing import Fuzzer

COUNT = int(os.environ.get("GPUPROXY_FUZZ_COUNT", "200000"))
LOG_LINES_MAX = 2000          # whatever the count: floods are summarised per second
EMU_DEVICE_MB = 256            # the emulated device's memory: fuzzed calls really allocate it, in the worker
RSS_GROWTH_MAX = (EMU_DEVICE_MB << 20) + (256 << 20)

pytestmark = pytest.mark.slow


def rss(pid: int) -> int:
    """Resident memory of proxyd: the supervisor and its workers."""
    total = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) << 10
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                total += sum(rss(int(c)) for c in f.read().split())
    except OSError:
        pass
    return total


@pytest.fixture
def short_tmp():
    with short_dir("gpx-fz") as d:
        yield d


def run_program(built, daemon) -> str:
    from conftest import client_env
    r = subprocess.run([str(built.binary), *built.program.args], env=client_env(daemon), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_messages(fresh_daemon, corpus_built, short_tmp):
    d = fresh_daemon(endpoint=f"ipc://{short_tmp}/p.sock", env={**os.environ, "GPUPROXY_EMU_TOTAL_MB": str(EMU_DEVICE_MB)})
    prog = corpus_built["vector_add"]
    before = run_program(prog, d)
    assert before == prog.program.expected_output
    f = Fuzzer(d.endpoint, seed=int(os.environ.get("GPUPROXY_FUZZ_SEED", "1")))
    rss0 = rss(d.proc.pid)      # with the fuzzer's session (and its worker) open
    try:
        stats = f.run(COUNT)
    finally:
        f.close()
        shutil.rmtree(f.tmp, ignore_errors=True)
    print("fuzz:", stats)
    assert d.proc.poll() is None, d.log()[-3000:]
    # a well-behaved client afterwards: identical output
    assert run_program(prog, d) == before
    grew = rss(d.proc.pid) - rss0
    assert grew < RSS_GROWTH_MAX, f"proxyd grew by {grew >> 20} MiB"
    log = d.log()
    lines = log.count("\n")
    assert lines < LOG_LINES_MAX, f"{lines} log lines for {COUNT} messages:\n{log[-3000:]}"
    assert "suppressed" in log          # the floods were counted, not written


# ----------------------------------------------------------- bad images

def mutations(manifest: bytes, rng: random.Random, n: int):
    """Damaged manifests: byte flips, truncations, and well-formed JSON with
    type-confused fields under a recomputed digest (what a forger makes)."""
    from gpuproxy.proxyd.checkpoint.image import encode_manifest
    body = json.loads(manifest[manifest.index(b"\n") + 1:manifest.rindex(b"\nsha256 ")])
    weird = [None, -1, 1 << 70, "zero", "../../../../etc/passwd", [], {}, [1, 2], 1.5, True, "/dev/zero"]

    def paths(o, pre=()):
        yield pre
        if isinstance(o, dict):
            for k, v in o.items():
                yield from paths(v, pre + (k,))
        elif isinstance(o, list):
            for i, v in enumerate(o[:4]):
                yield from paths(v, pre + (i,))

    all_paths = [p for p in paths(body) if p]
    for _ in range(n):
        k = rng.randrange(3)
        if k == 0:
            b = bytearray(manifest)
            for _ in range(rng.randrange(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            yield bytes(b)
        elif k == 1:
            yield manifest[:rng.randrange(len(manifest))]
        else:
            new = json.loads(json.dumps(body))
            p = rng.choice(all_paths)
            o = new
            for key in p[:-1]:
                o = o[key]
            if isinstance(o, dict) and rng.random() < 0.2:
                o[rng.choice(weird[4:5] + ["x"])] = o.pop(p[-1])       # renamed key
            else:
                o[p[-1]] = rng.choice(weird)
            try:
                yield encode_manifest(new)
            except (TypeError, ValueError):
                continue


def test_malformed_images(fresh_daemon, corpus_built, short_tmp, capsys):
    """inspect and restore of hundreds of damaged images: every one is
    refused with one line, nothing is restored, proxyd keeps serving."""
    from gpuproxy.proxyd.client import ControlClient, ControlError
    from gpuproxy.cli.main import main
    from wire import WireClient
    d = fresh_daemon(endpoint=f"ipc://{short_tmp}/p.sock")
    ctl = ControlClient(d.endpoint, timeout_s=30)
    # a real image of a live session (this test's own wire client)
    with WireClient(d.endpoint) as c:
        c.hello()
        ctx = c.context()
        code, outs, _ = c.call("cuMemAlloc_v2", True, 3 << 20, ctx=ctx)
        assert code == 0
        assert c.call("cuMemcpyHtoD_v2", outs[0], b"z" * 4096, 4096, ctx=ctx)[0] == 0
        ctl.call("dump", {"pid": os.getpid(), "dir": str(short_tmp / "good")})
        good = (short_tmp / "good" / "manifest").read_bytes()
        rng = random.Random(7)
        bad = short_tmp / "bad"
        shutil.copytree(short_tmp / "good", bad)
        n = 0
        for m in mutations(good, rng, 300):
            (bad / "manifest").write_bytes(m)
            assert main(["inspect", "--no-verify", str(bad)]) in (0, 1)
            out = capsys.readouterr()
            assert "Traceback" not in out.err + out.out
            if m == good:
                continue
            try:
                ctl.call("restore", {"dir": str(bad), "allow_foreign": True})
            except ControlError as e:
                assert "\n" not in str(e) and "internal error" not in str(e), str(e)
                n += 1
                continue
            # a mutation that kept the manifest meaningful (e.g. in stats) may restore: then dump it again
            ctl.call("dump", {"pid": os.getpid(), "dir": str(short_tmp / f"again{n}")})
        assert n > 250
        ctl.call("restore", {"dir": str(short_tmp / "good")})
        code, outs, _ = c.call("cuMemcpyDtoH_v2", None, outs[0], 4096, ctx=ctx)
        assert code == 0 and outs[0] == b"z" * 4096
        c.bye()
    assert "Traceback" not in d.log(), d.log()[-3000:]
    assert d.log().count("\n") < 1000
