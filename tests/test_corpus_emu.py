"""The corpus (tests/programs) under the shim, against proxyd's emulated backend.

Every program must print exactly its .expected output and exit 0; the
counter program (a UDP server) must answer "101\\n", "102\\n" and be visible
in `proxy-cli status` while it runs; the `unsupported` program must get one
stderr line per unsupported call. No GPU needed.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time

import pytest

import corpus
from conftest import client_env, unexpected_stderr

PROGRAMS = corpus.load_corpus()


def _describe(r: subprocess.CompletedProcess, daemon) -> str:
    return (f"exit {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
            f"\n--- proxyd log (tail)\n{daemon.log()[-3000:]}")


@pytest.mark.parametrize("name", [p.name for p in PROGRAMS])
def test_program_output_under_emu(name, corpus_built, request):
    built = corpus_built[name]
    if built.program.devices > 1:       # a daemon with that many emulated GPUs
        emu_daemon = request.getfixturevalue("fresh_daemon")(
            extra_args=["--emu-devices", str(built.program.devices)])
    else:
        emu_daemon = request.getfixturevalue("emu_daemon")
    expected = built.program.expected_output
    if built.program.driver == "udp_counter":
        replies = corpus.run_udp_counter(built.argv(), env=client_env(emu_daemon), timeout=30)
        assert "".join(replies) == expected, f"replies {replies!r}\n{emu_daemon.log()[-3000:]}"
        return
    r = corpus.run_program(built, env=client_env(emu_daemon), timeout=120)
    assert r.returncode == 0, _describe(r, emu_daemon)
    assert r.stdout == expected, _describe(r, emu_daemon)
    if name != "unsupported":
        # a passing program under the shim prints nothing of the shim's on stderr
        extra = [l for l in unexpected_stderr(r.stderr)
                 if not any(x in l for x in built.program.expected_errors)]
        assert extra == [], _describe(r, emu_daemon)


def test_unsupported_calls_warn_once_each(corpus_built, emu_daemon):
    built = corpus_built["unsupported"]
    r = corpus.run_program(built, env=client_env(emu_daemon), timeout=60)
    assert r.returncode == 0, _describe(r, emu_daemon)
    assert r.stdout == built.program.expected_output, _describe(r, emu_daemon)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    for fn in ("cudaDeviceFlushGPUDirectRDMAWrites", "cuDeviceGetByPCIBusId"):
        naming = [line for line in lines if re.search(rf"\b{fn}\b", line)]
        assert len(naming) == 1, f"expected exactly one stderr line naming {fn}:\n{r.stderr}"
    assert len(lines) == 2, f"expected exactly two stderr lines (one per unsupported call):\n{r.stderr}"


# --------------------------------------------------------------------------- counter + proxy-cli status

def _udp_request(sock: socket.socket, port: int, proc: subprocess.Popen, first: bool, timeout: float = 20.0) -> str:
    """Sends one "hello" datagram to the counter and returns its reply. Before
    the first request, waits until the program has bound its port."""
    deadline = time.monotonic() + timeout
    if first:
        while corpus._udp_port_bound(port) is False:
            assert proc.poll() is None, f"counter exited with {proc.returncode}"
            assert time.monotonic() < deadline, f"counter did not bind UDP port {port}"
            time.sleep(0.05)
    sock.send(b"hello\n")
    while True:
        assert proc.poll() is None, f"counter exited with {proc.returncode}"
        assert time.monotonic() < deadline, "no reply from counter"
        try:
            return sock.recv(4096).decode()
        except socket.timeout:
            continue


def _status(proxy_cli, daemon, *args) -> subprocess.CompletedProcess:
    env = client_env(daemon)
    env.pop("LD_PRELOAD", None)         # proxy-cli is an ordinary client of proxyd
    return subprocess.run(proxy_cli + ["status", *args], env=env, capture_output=True, text=True, timeout=60)


def test_counter_replies_and_status_shows_its_session(corpus_built, fresh_daemon, proxy_cli):
    built = corpus_built["counter"]
    d = fresh_daemon()
    port = corpus.free_udp_port()
    proc = subprocess.Popen(built.argv() + [str(port)], env=client_env(d), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.connect(("127.0.0.1", port))
        sock.settimeout(0.2)
        assert _udp_request(sock, port, proc, first=True) == "101\n"

        r = _status(proxy_cli, d)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines and lines[0].startswith("proxyd ") and d.endpoint in lines[0], r.stdout
        assert "backend emu" in lines[0], r.stdout
        header = next((line for line in lines if line.split()[:1] == ["PID"]), None)
        assert header is not None, f"no session table:\n{r.stdout}"
        for col in ("WORKER", "DEVICE MEM", "CTX", "MOD", "FUNC", "STRM", "EVT", "ALLOC", "CALLS", "STATE", "PROGRAM"):
            assert col in header, f"column {col} missing:\n{r.stdout}"
        rows = [line.split() for line in lines if line.split()[:1] == [str(proc.pid)]]
        assert len(rows) == 1, f"pid {proc.pid} not shown exactly once:\n{r.stdout}"
        row = rows[0]
        # PID, WORKER, DEVICE MEM (value + unit), CTX MOD FUNC STRM EVT ALLOC, CALLS, STATE, PROGRAM
        assert len(row) == 13, row
        assert int(row[1]) not in (proc.pid, d.proc.pid), row      # the session's own worker process
        row = row[:1] + row[2:]
        assert re.fullmatch(r"\d+(\.\d)?", row[1]) and row[2] in ("B", "KiB", "MiB", "GiB", "TiB"), row
        ctx, mod, func, strm, evt, alloc, calls = (int(x) for x in row[3:10])
        assert ctx == 1 and mod >= 1 and func >= 1, row     # cudaFree(0) + the increment kernel's module
        assert calls > 0 and row[10] == "running" and row[11] == os.path.realpath(built.binary), row

        j = _status(proxy_cli, d, "--json")
        assert j.returncode == 0, j.stderr
        st = json.loads(j.stdout)
        sess = [s for s in st["sessions"] if s["pid"] == proc.pid]
        assert len(sess) == 1, st
        o = sess[0]["objects"]
        assert [o["context"], o["module"], o["function"], o["stream"], o["event"], o["allocation"]] == \
               [ctx, mod, func, strm, evt, alloc], (row, o)
        assert isinstance(sess[0]["device_memory"], int) and sess[0]["device_memory"] >= 0

        assert _udp_request(sock, port, proc, first=False) == "102\n"
    finally:
        sock.close()
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate(timeout=30)
    assert unexpected_stderr(err) == [], err


def test_killed_client_session_is_released(corpus_built, fresh_daemon, proxy_cli):
    """A client killed without saying goodbye disappears from `status` (the
    daemon reaps sessions whose process is gone)."""
    built = corpus_built["counter"]
    d = fresh_daemon()
    port = corpus.free_udp_port()
    proc = subprocess.Popen(built.argv() + [str(port)], env=client_env(d), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.connect(("127.0.0.1", port))
        sock.settimeout(0.2)
        assert _udp_request(sock, port, proc, first=True) == "101\n"
    finally:
        sock.close()
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 15
    while True:
        st = json.loads(_status(proxy_cli, d, "--json").stdout)
        if not any(s["pid"] == proc.pid for s in st["sessions"]):
            break
        assert time.monotonic() < deadline, f"session of killed pid {proc.pid} still listed: {st['sessions']}"
        time.sleep(0.5)


def test_status_without_daemon_fails_clearly(proxy_cli, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["GPUPROXY_ENDPOINT"] = f"ipc://{tmp_path}/nobody.sock"
    t = time.monotonic()
    r = subprocess.run(proxy_cli + ["--timeout", "0.5", "status"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert f"ipc://{tmp_path}/nobody.sock" in r.stderr and "proxyd" in r.stderr, r.stderr
    assert time.monotonic() - t < 10


def test_dead_clients_are_reaped_and_their_shared_memory_removed(corpus_built, fresh_daemon):
    """A client killed without saying goodbye: proxyd notices (same pid
    namespace), ends its session and removes its /dev/shm segments; with
    shared memory off too."""
    import glob
    d = fresh_daemon(emu_kernels=[str(corpus.PROGRAMS_DIR / "counter_emu.py")])
    from gpuproxy.proxyd.client import ControlClient
    for extra in ({}, {"GPUPROXY_SHM": "0"}):
        port = corpus.free_udp_port()
        argv = corpus_built["counter"].argv() + [str(port)]
        p = subprocess.Popen(argv, env=client_env(d, extra), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            end = time.monotonic() + 20
            while True:
                ss = ControlClient(d.endpoint).call("status")["sessions"]
                if ss and ss[0]["state"] == "running":
                    break
                assert time.monotonic() < end, "the counter never opened a session"
                time.sleep(0.05)
            sess = ss[0]
            assert "token" not in sess, "status must not show a session's token (its identity)"
            assert sess["pid"] == p.pid and sess["worker_pid"] not in (None, p.pid)
        finally:
            p.kill()
            p.wait()
        end = time.monotonic() + 15
        while ControlClient(d.endpoint).call("status")["sessions"]:
            assert time.monotonic() < end, f"session of a killed client not reaped ({extra})"
            time.sleep(0.2)
        assert glob.glob(f"/dev/shm/gpuproxy-*-{p.pid}-*") == []
