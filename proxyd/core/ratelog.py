"""Rate-limited logging for events a client can cause at will.

A hostile or broken client can send thousands of malformed messages or
failing calls a second; one log line (or traceback) per message would fill
the disk and bury everything else. A RateLog lets the first few messages of
each kind through per interval and then only counts; when the interval ends,
one line per kind says how many were suppressed:

    proxyd: malformed message from b'c:...': ...            (first 5 per second)
    proxyd: ... 19995 more 'malformed message' in the last 1.0 s (suppressed)

Tracebacks of internal errors are logged once per distinct place (exception
type, file and line where it was raised): the first one carries the
traceback, later ones are counted like any other event.

Locking: a RateLog may be used from several threads (its counters are
behind a lock); proxyd mostly uses it from the main loop.
"""
from __future__ import annotations

import logging
import threading
import time
import traceback

log = logging.getLogger("proxyd")

# per kind and interval: this many lines, then counting only
BURST = 5
INTERVAL_S = 1.0
# distinct internal-error places whose traceback is remembered as "seen"
MAX_PLACES = 1024


class RateLog:
    def __init__(self, logger: logging.Logger = log, burst: int = BURST, interval_s: float = INTERVAL_S,
                 clock=time.monotonic):
        self.logger = logger
        self.burst = burst
        self.interval_s = interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._start = clock()
        self._counts: dict[str, int] = {}      # kind -> events in this interval
        self._levels: dict[str, int] = {}
        self._places: set = set()             # internal-error places already shown with a traceback
        self.suppressed_total = 0

    def _roll(self, now: float) -> list[tuple[int, str]]:
        """Ends the interval if it is over: the summary lines to write."""
        if now - self._start < self.interval_s:
            return []
        out = []
        for kind, n in self._counts.items():
            if n > self.burst:
                out.append((self._levels.get(kind, logging.WARNING),
                            f"... {n - self.burst} more '{kind}' in the last {now - self._start:.1f} s (suppressed)"))
        self._counts.clear()
        self._start = now
        return out

    def _admit(self, kind: str, level: int) -> tuple[bool, list]:
        with self._lock:
            summary = self._roll(self.clock())
            n = self._counts.get(kind, 0) + 1
            self._counts[kind] = n
            self._levels[kind] = level
            ok = n <= self.burst
            if not ok:
                self.suppressed_total += 1
        return ok, summary

    def event(self, kind: str, msg: str, *args, level: int = logging.WARNING) -> bool:
        """Logs msg % args unless this kind already used its burst in this
        interval; True if it was written."""
        ok, summary = self._admit(kind, level)
        for lvl, line in summary:
            self.logger.log(lvl, "%s", line)
        if ok:
            self.logger.log(level, msg, *args)
        return ok

    def internal_error(self, kind: str, msg: str, exc: BaseException) -> bool:
        """An exception that should not happen (a bug in proxyd, or input it
        did not foresee): its traceback the first time this place fails, a
        one-line message within the burst afterwards, counts beyond it."""
        tb = exc.__traceback__
        last = traceback.extract_tb(tb)[-1] if tb is not None else None
        place = (type(exc).__name__, last.filename if last else "", last.lineno if last else 0)
        with self._lock:
            first = place not in self._places
            if first and len(self._places) < MAX_PLACES:
                self._places.add(place)
        ok, summary = self._admit(kind, logging.ERROR)
        for lvl, line in summary:
            self.logger.log(lvl, "%s", line)
        if first:
            self.logger.error("%s: %s: %s\n%s", msg, type(exc).__name__, exc,
                              "".join(traceback.format_exception(type(exc), exc, tb)).rstrip())
            return True
        if ok:
            self.logger.error("%s: %s: %s (traceback logged before)", msg, type(exc).__name__, exc)
        return ok

    def flush(self) -> None:
        """Writes the summary of the current interval if it is over (the main
        loop calls this now and then, so a flood's count appears even when
        the flood stops)."""
        with self._lock:
            summary = self._roll(self.clock())
        for lvl, line in summary:
            self.logger.log(lvl, "%s", line)


# proxyd's one instance: every site that a client can trigger logs through it
RATE = RateLog()
