"""Checkpoint images in a pod's checkpoint folder, and which of them may go.

The folder is the one `proxy-cli run --checkpoint-dir DIR` writes, in the
contract's layout (gpuproxy.proxyd.checkpoint.orchestrate.contract):

    DIR/ckpt-<n>/          a complete image; its job.json is written last
    DIR/latest -> ckpt-<n> the image a restore uses
    DIR/.tmp-<n>/          a dump in progress (never read or touched here)
    DIR/.lock              held by the wrapper

Each ckpt-<n> is an independent whole-process image (no parent chain). An
image counts as complete when its job.json is there and its manifest is valid
with a complete CRIU part (gpuproxy.proxyd.checkpoint.criu.state). Files are
looked at with lstat: a symlink other than `latest` is never followed.

Stated here rather than imported because the node agent must read the
folder of a wrapper whose gpuproxy may be older than its own.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import stat
from dataclasses import dataclass

from gpuproxy.proxyd.checkpoint import criu
from gpuproxy.proxyd.checkpoint.image import MANIFEST, ImageError, read_manifest

CKPT_RE = re.compile(r"ckpt-(\d+)")
JOB_FILE = "job.json"
LATEST = "latest"


@dataclass(frozen=True)
class Entry:
    path: str
    seq: int
    complete: bool
    created: str | None         # ISO 8601: job.json's time, else the manifest's
    size: int                   # bytes on disk
    problem: str | None
    stall_ms: float | None      # how long the app stood still, park to resume (job.json)
    criu_ms: float | None       # how long CRIU took (its record in the manifest)


def _lstat(p: str):
    try:
        return os.lstat(p)
    except OSError:
        return None


def _size(path: str) -> int:
    total = 0
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
        for n in files:
            st = _lstat(os.path.join(root, n))
            if st is not None and stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def _job(path: str) -> dict | None:
    p = os.path.join(path, JOB_FILE)
    st = _lstat(p)
    if st is None or not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 20:
        return None
    try:
        with open(p, "rb") as f:
            v = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return v if isinstance(v, dict) else None


def read_entry(path: str, seq: int) -> Entry:
    job = _job(path)
    size = _size(path)
    if job is None:
        return Entry(path, seq, False, None, size, f"no readable {JOB_FILE} (not published)", None, None)
    st = _lstat(os.path.join(path, MANIFEST))
    if st is None or not stat.S_ISREG(st.st_mode):
        return Entry(path, seq, False, None, size, f"no regular {MANIFEST}", None, None)
    try:
        m, _digest = read_manifest(path)
    except (ImageError, OSError) as e:
        return Entry(path, seq, False, None, size, str(e), None, None)
    cs = criu.state(path, m)
    rec = cs.get("record") or {}
    t = job.get("time")
    created = (datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="milliseconds")
               if isinstance(t, (int, float)) else m.get("created"))
    stall = job.get("stall_ms")
    return Entry(path, seq, bool(cs["complete"]), created, size, cs.get("problem"),
                 float(stall) if isinstance(stall, (int, float)) else None,
                 float(rec["ms"]) if isinstance(rec.get("ms"), (int, float)) else None)


def scan(folder: str) -> list[Entry]:
    """The ckpt-<n> images in folder, oldest (lowest n) first."""
    out = []
    st = _lstat(folder)
    if st is None or not stat.S_ISDIR(st.st_mode):
        return out
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    for n in names:
        m = CKPT_RE.fullmatch(n)
        p = os.path.join(folder, n)
        s = _lstat(p)
        if m and s is not None and stat.S_ISDIR(s.st_mode):
            out.append(read_entry(p, int(m.group(1))))
    return sorted(out, key=lambda e: e.seq)


def latest(folder: str) -> str | None:
    """The path `latest` names when it names a ckpt-<n> of folder, else None."""
    try:
        target = os.readlink(os.path.join(folder, LATEST))
    except OSError:
        return None
    if "/" in target or not CKPT_RE.fullmatch(target):
        return None
    return os.path.join(folder, target)


def newest_complete(entries: list[Entry]) -> Entry | None:
    done = [e for e in entries if e.complete]
    return max(done, key=lambda e: e.seq) if done else None


def select_for_deletion(folder: str, entries: list[Entry], keep: int) -> list[str]:
    """Paths of the complete images beyond the `keep` newest (at least one is
    kept); never the one `latest` names, never anything unpublished."""
    keep = max(1, int(keep))
    cur = latest(folder)
    done = sorted((e for e in entries if e.complete), key=lambda e: e.seq, reverse=True)
    return [e.path for e in done[keep:] if cur is None or os.path.normpath(e.path) != os.path.normpath(cur)]
