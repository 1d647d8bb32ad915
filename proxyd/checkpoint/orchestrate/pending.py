"""A whole-process dump whose image is still being written.

A leave-running dump lets the app go on once its state is captured; the GPU
image is written afterwards (checkpoint/background.py) and the CRIU record
goes into the manifest last. Until all of that is durable, DIR is marked by
a sibling file DIR.dump-in-progress (JSON: the orchestrating pid, whether
the previous image of DIR was moved into DIR/parent). When the write fails,
or the orchestrator died mid-way (found by the next dump or restore of DIR),
the previous image is put back as DIR and the partial one goes: an
interrupted write never leaves an image that looks complete, and the last
complete one stays the latest.
"""
from __future__ import annotations

import json
import os
import shutil
import time

SUFFIX = ".dump-in-progress"


class PendingError(Exception):
    pass


def marker(path: str) -> str:
    return os.path.abspath(path).rstrip("/") + SUFFIX


def _fsync_dir(d: str) -> None:
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def begin(path: str, parent_given: bool) -> None:
    """Marks DIR before anything of the new image is written."""
    path = os.path.abspath(path)
    info = {"pid": os.getpid(), "started": time.time(),
            "previous": None if parent_given else _digest(os.path.join(path, "manifest"))}
    m = marker(path)
    tmp = m + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, m)
    _fsync_dir(os.path.dirname(m))


def _digest(manifest: str) -> str | None:
    """sha256 of a manifest file (None: there is none)."""
    import hashlib
    try:
        with open(manifest, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def end(path: str) -> None:
    """The new image is complete and durable."""
    try:
        os.unlink(marker(path))
    except FileNotFoundError:
        pass
    _fsync_dir(os.path.dirname(marker(path)))


def _read(path: str) -> dict | None:
    try:
        with open(marker(path), "rb") as f:
            info = json.loads(f.read(4096))
        return info if isinstance(info, dict) else {}
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}           # unreadable: treated as interrupted, nothing moved back


def _complete(path: str) -> bool:
    """DIR holds a whole-process image whose CRIU part was recorded."""
    from gpuproxy.proxyd.checkpoint import criu
    from gpuproxy.proxyd.checkpoint.image import ImageError, read_manifest
    try:
        m, _ = read_manifest(path)
    except (ImageError, OSError):
        return False
    return bool((m.get(criu.RECORD_KEY) or {}).get("complete"))


def rollback(path: str) -> str:
    """Drops the partial image in DIR; puts the previous one back when the
    dump had moved it into DIR/parent. Returns what happened, in words."""
    path = os.path.abspath(path)
    info = _read(path) or {}
    was = info.get("previous")
    if was and _digest(os.path.join(path, "manifest")) == was:
        said = f"nothing of the new image was written; the previous image is still {path}"
    elif was and _digest(os.path.join(path, "parent", "manifest")) == was:
        # the GPU dump moved the previous image into DIR/parent (engine._prepare_dir)
        aside = path.rstrip("/") + ".rollback"
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(path, aside)
        os.rename(os.path.join(aside, "parent"), path)
        shutil.rmtree(aside, ignore_errors=True)
        said = f"the previous image is {path} again"
    else:
        # only what a dump writes goes (DIR may hold other files of its owner);
        # the manifest first, so nothing looks like an image meanwhile
        from gpuproxy.proxyd.checkpoint import criu
        from gpuproxy.proxyd.checkpoint.image import INDEX, MANIFEST, MEMORY, MODULES, SEAL

        from . import predump
        for name in (MANIFEST, SEAL, INDEX, MEMORY, MODULES, criu.SUBDIR, predump.SUBDIR):
            p = os.path.join(path, name)
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            elif os.path.lexists(p):
                os.unlink(p)
        said = f"{path} holds no image (there was none before this dump)"
    from . import predump
    predump.discard(path)
    end(path)
    return said


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, TypeError, ValueError):
        return False
    except PermissionError:
        return True
    return True


def recover(path: str) -> str | None:
    """Before a dump or restore of DIR: an earlier dump into it that did not
    finish is undone (None when there was none). Refuses while the dump
    that marked it still runs."""
    info = _read(path)
    if info is None:
        return None
    pid = info.get("pid")
    if pid is not None and int(pid) != os.getpid() and _alive(pid):
        raise PendingError(f"a dump into {os.path.abspath(path)} is still being written (by pid {pid}); "
                           f"wait for it to finish")
    if _complete(path):
        end(path)            # it finished; only the marker's removal was lost
        return None
    return f"an earlier dump into {os.path.abspath(path)} did not finish writing: {rollback(path)}"
