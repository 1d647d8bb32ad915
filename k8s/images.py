"""Checkpoint images in a pod's checkpoint folder, and which of them may go.

The folder is the one `proxy-cli run --checkpoint-dir DIR` writes. This
module does not assume how the contract names its images inside DIR: an
image is DIR itself or any direct subfolder of DIR that holds a manifest
(an incremental image keeps its parent chain inside itself, in `parent/`,
docs/checkpoint.md, so a chain is one folder and deleting a folder never
breaks another image). An image is complete when its manifest is valid and
its CRIU part is complete (gpuproxy.proxyd.checkpoint.criu.state): that is
what a restore can use.

Files are looked at with lstat (a symlink is never followed out of DIR).
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from gpuproxy.proxyd.checkpoint import criu
from gpuproxy.proxyd.checkpoint.image import MANIFEST, ImageError, read_manifest


@dataclass(frozen=True)
class Entry:
    path: str
    complete: bool
    created: str | None         # ISO 8601 from the manifest
    mtime: float                # the manifest's
    size: int                   # bytes on disk, parent chain included
    problem: str | None
    stall_ms: float | None      # the app's stall, where the writer recorded one
    criu_ms: float | None       # how long CRIU held the processes (its record)


def _is_dir(p: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(p).st_mode)
    except OSError:
        return False


def _size(path: str) -> int:
    total = 0
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
        for n in files:
            try:
                st = os.lstat(os.path.join(root, n))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def read_entry(path: str) -> Entry | None:
    """The image in path, or None when path holds no manifest."""
    mp = os.path.join(path, MANIFEST)
    try:
        st = os.lstat(mp)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return Entry(path, False, None, st.st_mtime, 0, f"{mp} is not a regular file", None, None)
    try:
        m, _digest = read_manifest(path)
    except (ImageError, OSError) as e:
        return Entry(path, False, None, st.st_mtime, _size(path), str(e), None, None)
    cs = criu.state(path, m)
    rec = cs.get("record") or {}
    stats = m.get("stats") if isinstance(m.get("stats"), dict) else {}
    stall = stats.get("stall_ms")
    return Entry(path, bool(cs["complete"]), m.get("created"), st.st_mtime, _size(path), cs.get("problem"),
                 float(stall) if isinstance(stall, (int, float)) else None,
                 float(rec["ms"]) if isinstance(rec.get("ms"), (int, float)) else None)


def scan(folder: str) -> list[Entry]:
    """Images in folder (itself and its direct subfolders, `parent` chains
    excluded), oldest first."""
    out = []
    if not _is_dir(folder):
        return out
    top = read_entry(folder)
    if top is not None:
        out.append(top)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for n in names:
        p = os.path.join(folder, n)
        if n == "parent" or not _is_dir(p):
            continue
        e = read_entry(p)
        if e is not None:
            out.append(e)
    return sorted(out, key=_age_key)


def _age_key(e: Entry):
    return (e.created or "", e.mtime)


def newest_complete(entries: list[Entry]) -> Entry | None:
    done = [e for e in entries if e.complete]
    return max(done, key=_age_key) if done else None


def select_for_deletion(folder: str, entries: list[Entry], keep: int) -> list[str]:
    """Paths of images that may be deleted, keeping the `keep` newest complete
    ones (at least one: the image a restore would use). An incomplete image
    goes only when a complete one is newer (it is a failed dump's remains, not
    one being written now). The folder itself is never selected."""
    keep = max(1, int(keep))
    done = sorted((e for e in entries if e.complete), key=_age_key, reverse=True)
    doomed = [e.path for e in done[keep:]]
    if done:
        # by the manifests' modification times: an unreadable manifest has no creation time
        doomed += [e.path for e in entries if not e.complete and e.mtime < done[0].mtime]
    top = os.path.normpath(folder)
    return [p for p in doomed if os.path.normpath(p) != top]
