"""Helpers for tests and scripts: start proxyd, run programs under the shim.

    with Daemon(backend="emu", emu_kernels=[...]) as d:
        r = run_proxied([binary], d)
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import msgpack
import zmq


def preload() -> str:
    from gpuproxy.interceptor import preload_value
    return preload_value()


def children(pid: int) -> list[int]:
    """The processes whose parent is pid, whichever of its threads started
    them (a scan of /proc, parent pids from procinfo.stat_fields): a
    supervisor's workers, a namespace's first process's children."""
    from gpuproxy.proxyd.core.procinfo import stat_fields
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            rest = stat_fields(int(p))
            try:
                if rest is not None and int(rest[1]) == pid:
                    out.append(int(p))
            except (IndexError, ValueError):
                pass
    return out


def ping(endpoint: str, timeout_s: float = 0.3) -> bool:
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.ROUTING_ID, b"ctl:test-" + uuid.uuid4().hex[:8].encode())
    try:
        if endpoint.startswith("tcp://"):
            # keyed tcp (proxyd/core/curve.py): the daemon's own user's keys, which
            # it makes in the key directory before it answers
            from gpuproxy.proxyd.core import curve
            try:
                curve.secure_client(s, endpoint)
            except curve.CurveError:
                return False       # not made yet
        s.connect(endpoint)
        s.send(msgpack.packb([10, 1, "ping", {}]))
        return bool(s.poll(int(timeout_s * 1000)))
    finally:
        s.close(0)


class Daemon:
    """A proxyd process on a private ipc endpoint (or the one given)."""

    def __init__(self, backend: str = "emu", emu_kernels=(), endpoint: str | None = None, extra_args=(),
                 env: dict | None = None, log_path: str | None = None):
        self.tmp = tempfile.mkdtemp(prefix="gpuproxy-test-")
        self.endpoint = endpoint or f"ipc://{self.tmp}/proxyd.sock"
        self.backend = backend
        self.emu_kernels = [str(k) for k in emu_kernels]
        self.extra_args = list(extra_args)
        self.env = env
        self.log_path = log_path or os.path.join(self.tmp, "proxyd.log")
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 20.0):
        cmd = [sys.executable, "-m", "gpuproxy.proxyd", "--backend", self.backend, "--endpoint", self.endpoint]
        if self.emu_kernels:
            cmd += ["--emu-kernels", *self.emu_kernels]
        cmd += self.extra_args
        env = dict(os.environ if self.env is None else self.env)
        env.pop("LD_PRELOAD", None)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"proxyd exited with {self.proc.returncode}:\n{self.log()}")
            if ping(self.endpoint):
                return self
            time.sleep(0.05)
        raise RuntimeError(f"proxyd did not answer within {timeout_s} s:\n{self.log()}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()
            self._log = None

    def kill(self):
        """Ends proxyd abruptly (SIGKILL), as a crash or node failure would."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""

    def env_for_client(self, extra: dict | None = None) -> dict:
        env = dict(os.environ)
        env["LD_PRELOAD"] = preload()
        env["GPUPROXY_ENDPOINT"] = self.endpoint
        env.update(extra or {})
        return env

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.cleanup()


def run_proxied(argv: list[str], daemon: Daemon, timeout: float = 120.0, env: dict | None = None,
                input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=daemon.env_for_client(env), capture_output=True, text=True,
                          timeout=timeout, input=input)
