"""Drives a paced corpus program (GPUPROXY_TEST_PACE=1) step by step, so that
tests can checkpoint it at exact points of its run.

    with PacedRun(built, daemon) as run:
        run.step_to(20)            # iterations 1..20 done, program waits
        ...checkpoint...
        out = run.finish()         # lets it run to the end; stdout without "step" lines
"""
from __future__ import annotations

import subprocess
import threading
import time


class PacedRun:
    def __init__(self, built, daemon, env: dict | None = None):
        e = {"GPUPROXY_TEST_PACE": "1"}
        e.update(env or {})
        self.proc = subprocess.Popen(built.argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=daemon.env_for_client(e), text=True, bufsize=1)
        self.lines: list[str] = []
        self.step = 0
        self.times: dict[int, float] = {}
        self.cv = threading.Condition()
        self.err: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self):
        for line in self.proc.stdout:
            with self.cv:
                self.lines.append(line)
                if line.startswith("step ") and line.rstrip().endswith(" done"):
                    self.step = int(line.split()[1])
                    self.times[self.step] = time.monotonic()
                self.cv.notify_all()
        with self.cv:
            self.cv.notify_all()

    def _read_err(self):
        for line in self.proc.stderr:
            self.err.append(line)

    def release(self, n: int = 1):
        """Lets n more iterations start, without waiting for them."""
        self.proc.stdin.write("go\n" * n)
        self.proc.stdin.flush()

    def step_to(self, k: int, timeout: float = 60.0):
        if k > self.step:
            self.release(k - self.step)
        self.wait_step(k, timeout)

    def wait_step(self, k: int, timeout: float = 60.0):
        end = time.monotonic() + timeout
        with self.cv:
            while self.step < k:
                if self.proc.poll() is not None:
                    raise AssertionError(f"program exited early ({self.proc.returncode}): {''.join(self.err)[-2000:]}")
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"step {k} not reached in {timeout} s (at {self.step}); "
                                         f"stderr: {''.join(self.err)[-2000:]}")
                self.cv.wait(min(left, 0.5))

    def finish(self, timeout: float = 120.0) -> str:
        self.proc.stdin.close()     # EOF: the program runs freely to the end
        self.proc.wait(timeout)
        time.sleep(0.05)
        return "".join(l for l in self.lines if not l.startswith("step "))

    def stderr(self) -> str:
        return "".join(self.err)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
