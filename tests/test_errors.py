"""proxyd answers with the API's own error codes: out of memory, copies
past their allocation, memory that is not the session's; an internal error
answers CUDA_ERROR_UNKNOWN (docs/protocol.md, "Errors") and is logged once
with its traceback; floods of failures are rate-limited (ratelog.py)."""
from __future__ import annotations

import logging
import os

import pytest

from proxy import Daemon
from wire import FID, WireClient

# GPUPROXY_TEST_BACKEND=cuda (scripts/gpu-check): the same checks on the GPU
BACKEND = os.environ.get("GPUPROXY_TEST_BACKEND", "emu")
pytestmark = [pytest.mark.gpu] if BACKEND == "cuda" else []

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_UNKNOWN = 999
TiB = 1 << 40


@pytest.fixture(scope="module")
def daemon(request):
    if BACKEND == "cuda":
        d = Daemon(backend="cuda").start()
        yield d
        d.cleanup()
    else:
        yield request.getfixturevalue("emu_daemon")


@pytest.fixture
def client(daemon):
    with WireClient(daemon.endpoint) as c:
        c.hello()
        c.ctx = c.context()
        yield c
        c.bye()


def alloc(c, n) -> int:
    code, outs, msg = c.call("cuMemAlloc_v2", True, n, ctx=c.ctx)
    assert code == 0, msg
    return outs[0]


@pytest.mark.parametrize("size", [TiB, TiB + 1, (1 << 63) - 1])
def test_out_of_memory(client, size, daemon):
    code, outs, msg = client.call("cuMemAlloc_v2", True, size, ctx=client.ctx)
    assert code == CUDA_ERROR_OUT_OF_MEMORY, (code, msg)
    assert "out of memory" in msg or "exhausted" in msg, msg
    assert "Traceback" not in daemon.log()
    # the session is unharmed: a sensible allocation still works
    alloc(client, 4096)


@pytest.mark.skipif(BACKEND != "emu", reason="sets the emulated device's memory size")
def test_oom_through_the_device_limit(fresh_daemon):
    """Allocations that each fit but together exceed the emulated device's
    memory (64 MiB here): the one that does not fit gets OUT_OF_MEMORY,
    freeing makes room again."""
    import os
    d = fresh_daemon(env={**os.environ, "GPUPROXY_EMU_TOTAL_MB": "64"})
    with WireClient(d.endpoint) as c:
        c.hello()
        c.ctx = c.context()
        got = [alloc(c, 24 << 20), alloc(c, 24 << 20)]
        code, _, msg = c.call("cuMemAlloc_v2", True, 24 << 20, ctx=c.ctx)
        assert code == CUDA_ERROR_OUT_OF_MEMORY, msg
        assert c.call("cuMemFree_v2", got.pop(), ctx=c.ctx)[0] == 0
        got.append(alloc(c, 24 << 20))
        for a in got:
            assert c.call("cuMemFree_v2", a, ctx=c.ctx)[0] == 0
        c.bye()


def test_copies_are_bounds_checked(client):
    a = alloc(client, 1024)
    b = alloc(client, 1024)
    pattern = bytes(range(256)) * 4
    assert client.call("cuMemcpyHtoD_v2", a, pattern, 1024, ctx=client.ctx)[0] == 0
    code, outs, _ = client.call("cuMemcpyDtoH_v2", None, a, 1024, ctx=client.ctx)
    assert code == 0 and outs[0] == pattern
    # 1 MiB out of a 1 KiB allocation: invalid value, not success
    code, outs, msg = client.call("cuMemcpyDtoH_v2", None, a, 1 << 20, ctx=client.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE and "past the end" in msg, (code, msg)
    code, _, msg = client.call("cuMemcpyHtoD_v2", a + 512, b"x" * 1024, 1024, ctx=client.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE, msg
    code, _, msg = client.call("cuMemcpyDtoD_v2", b, a, 4096, ctx=client.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE, msg
    # a memset past the end: asynchronous, so its error is reported as the
    # asynchronous error of an answer (async_code, docs/protocol.md)
    rep = client.request(1, [[FID["cuMemsetD8_v2"], client.ctx, a, 7, 1 << 20]])
    assert rep[1] == 0 and rep[3] == CUDA_ERROR_INVALID_VALUE and "past the end" in rep[5], rep
    # nothing was written past the allocation: b is intact
    code, outs, _ = client.call("cuMemcpyDtoH_v2", None, a, 1024, ctx=client.ctx)
    assert outs[0] == pattern


def test_foreign_addresses_are_refused(client):
    """Addresses outside the session's allocations are never read or
    written, and another session's memory is out of reach: each session has
    a worker process of its own, so the same address names the session's
    own memory (every worker's arena starts at the same base)."""
    a = alloc(client, 4096)
    with WireClient(client.endpoint) as other:
        other.hello()
        other.ctx = other.context()
        b = alloc(other, 4096)
        assert other.call("cuMemcpyHtoD_v2", b, b"secret" * 10, 60, ctx=other.ctx)[0] == 0
        code, outs, msg = client.call("cuMemcpyDtoH_v2", None, b, 60, ctx=client.ctx)
        if b == a:
            assert code == 0 and b"secret" not in bytes(outs[0]), (code, outs, msg)
        else:
            assert code == CUDA_ERROR_INVALID_VALUE and outs is None, msg
        other.bye()
    code, _, msg = client.call("cuMemcpyDtoH_v2", None, a + (64 << 20), 16, ctx=client.ctx)
    assert code == CUDA_ERROR_INVALID_VALUE, msg


def test_type_confused_arguments_answer_an_error(client):
    """Arguments of the wrong type never crash proxyd nor succeed."""
    for args in ([b"x", 10], [None, "ten"], [True, [1, 2]], [{"a": 1}, 3.5]):
        code, _, msg = client.call("cuMemAlloc_v2", *args, ctx=client.ctx)
        assert code in (CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_UNKNOWN), (args, code, msg)
    code, _, msg = client.call("cuMemcpyDtoH_v2", b"no", "x", None, ctx=client.ctx)
    assert code != 0
    alloc(client, 64)


# ----------------------------------------------------------- rate limiting

class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_ratelog_counts_floods(caplog):
    from gpuproxy.proxyd.core.ratelog import RateLog
    clock = Clock()
    lg = logging.getLogger("ratelog-test")
    r = RateLog(lg, burst=3, interval_s=1.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="ratelog-test"):
        for i in range(10000):
            r.event("malformed message", "bad message %d", i)
        clock.t = 1.5
        r.flush()
    lines = [rec.getMessage() for rec in caplog.records]
    assert lines == ["bad message 0", "bad message 1", "bad message 2",
                     "... 9997 more 'malformed message' in the last 1.5 s (suppressed)"]
    assert r.suppressed_total == 9997


def test_ratelog_traceback_once_per_place(caplog):
    from gpuproxy.proxyd.core.ratelog import RateLog
    clock = Clock()
    lg = logging.getLogger("ratelog-test2")
    r = RateLog(lg, burst=2, interval_s=1.0, clock=clock)

    def fail(x):
        return {}[x]

    with caplog.at_level(logging.INFO, logger="ratelog-test2"):
        for i in range(50):
            try:
                fail(i)
            except KeyError as e:
                r.internal_error("internal", "call failed", e)
    text = [rec.getMessage() for rec in caplog.records]
    assert sum("Traceback" in t for t in text) == 1
    assert len(text) == 2            # the traceback, then one more line within the burst
