"""Background image writes of leave-running dumps (worker side).

A dump asked with `background` answers its control call as soon as the
session's state is captured (GPU memory in host staging, or in device
snapshots for a concurrent dump) and the session runs again; the image is
written afterwards on the same thread. `dump-wait` answers once that write
has finished: with the dump's full result, or with why it failed.

Until then the image directory has no manifest (ImageWriter.finish writes
it last, atomically, after fsyncing the data), so an interrupted write
never leaves something that looks like a complete image; the orchestrator
(orchestrate/pending.py) puts the previous image back in place.

Locking: one lock guards the job table; a job's fields are written once by
its dump thread before its event is set, and read only after it is set.
"""
from __future__ import annotations

import os
import threading
import time


class Job:
    def __init__(self, path: str):
        self.path = path
        self.started = time.monotonic()
        self.done = threading.Event()
        self.result: dict | None = None
        self.error: str | None = None

    def finish(self, result: dict | None, error: str | None) -> None:
        self.result, self.error = result, error
        self.done.set()


class BackgroundWrites:
    """Jobs by image directory; the newest per directory is kept until
    someone has waited for it (or the next dump into that directory)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}

    def start(self, path: str) -> Job:
        job = Job(os.path.abspath(path))
        with self._lock:
            self._jobs[job.path] = job
        return job

    def wait(self, path: str, timeout_s: float) -> tuple[dict | None, str | None]:
        """(result, None) when the write of path finished, (None, why) when
        it failed, is unknown, or did not finish within timeout_s."""
        key = os.path.abspath(path)
        with self._lock:
            job = self._jobs.get(key)
        if job is None:
            return None, f"no background write of {key} in this worker"
        if not job.done.wait(timeout_s):
            return None, f"the background write of {key} did not finish within {timeout_s:g} s"
        with self._lock:
            if self._jobs.get(key) is job:
                del self._jobs[key]
        if job.error is not None:
            return None, f"the background write of {key} failed: {job.error}"
        res = dict(job.result or {})
        res["background_write_ms"] = round((time.monotonic() - job.started) * 1000.0, 3)
        return res, None
