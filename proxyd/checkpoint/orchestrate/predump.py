"""CRIU's pre-dump before a periodic (--leave-running) whole-process dump.

Without it, CRIU's dump writes all of the app's memory while the app is
parked. With it, CRIU first pre-dumps the app's tree with memory tracking
(criu(8) "pre-dump", --track-mem) while the app runs; the dump made while
parked then names the pre-dump as its parent (--prev-images-dir) and writes
only the pages changed since.

The pre-dump freezes the tree briefly (CRIU's own freeze, while it drains
the pages into pipes) without the shim knowing; nothing is parked. The
shim's segments shared with proxyd are then file-backed MAP_SHARED mappings
of /dev/shm files: CRIU's pre-dump saves private memory (and anonymous
shared memory), not the pages of file-backed shared mappings, so nothing
of proxyd's side is taken then. At the park, the shim maps fresh private
memory at those addresses (interceptor/shm_private.c); a new mapping is
soft-dirty as a whole, so the parked dump writes those pages in full, and
pages of the app that were not written since the pre-dump come from it.
The dump made while parked is therefore complete on its own plus its parent.

Where things lie (DIR the image directory): the pre-dump is written into a
staging sibling DIR.criu-pre/criu while DIR may still hold the previous
image (the GPU dump moves that into DIR/parent), and renamed to
DIR/criu-pre once the GPU dump has made DIR the new image; DIR/criu (the
parked dump) names it as ../criu-pre, relative, so the chain survives the
next dump's move into DIR/parent. The pre-dump has no parent of its own:
the new image does not depend on the previous image's CRIU pages.

Used only where the kernel tracks dirty memory (`criu check --feature
mem_dirty_track`): a pre-dump without it cannot make the dump smaller. A
pre-dump that fails is discarded and the dump goes on as a plain one; the
result says why.
"""
from __future__ import annotations

import os
import shutil
import time

from gpuproxy.proxyd.checkpoint import criu

SUBDIR = "criu-pre"
STAGE_SUFFIX = ".criu-pre"


def stage_dir(path: str) -> str:
    return os.path.abspath(path).rstrip("/") + STAGE_SUFFIX


def unusable(c: criu.Criu, leave_running: bool, wanted: bool | None) -> str | None:
    """None when a pre-dump is to be made; otherwise why not (None for
    wanted=True: forced, e.g. to see how a failure is handled)."""
    if wanted is False:
        return "turned off (--no-pre-dump)"
    if wanted is True:
        return None
    if not leave_running:
        return "the app does not run on (a final dump)"
    if not c.mem_tracking():
        return ("this kernel does not track dirty memory (`criu check --feature mem_dirty_track` fails), so a "
                "pre-dump cannot make the parked dump smaller")
    return None


def run(c: criu.Criu, pid: int, path: str) -> tuple[dict | None, str | None, float]:
    """CRIU pre-dump of pid's tree into the staging folder (the app runs on).
    Returns (record, None, ms) or (None, why it failed, ms); a failed
    pre-dump leaves only CRIU's log, as DIR.pre-dump.log (removed by the
    next pre-dump)."""
    stage = stage_dir(path)
    shutil.rmtree(stage, ignore_errors=True)      # left by an orchestrator that died
    kept = os.path.abspath(path).rstrip("/") + ".pre-dump.log"
    if os.path.lexists(kept) and not os.path.isdir(kept):
        os.unlink(kept)          # an earlier failure's log: this pre-dump has its own
    os.makedirs(stage, mode=0o700)
    t0 = time.monotonic()
    try:
        rec = criu.dump(c, pid, stage, leave_running=True, pre=True)
    except (criu.CriuError, OSError) as e:
        # keep CRIU's log for the diagnosis, beside the image
        log = os.path.join(stage, criu.SUBDIR, "pre-dump.log")
        why = str(e)
        try:
            with open(log, "rb") as f:
                data = f.read()
            if os.path.islink(kept):
                os.unlink(kept)
            fd = os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            why = why.replace(log, kept)
        except OSError:
            pass
        discard(path)
        return None, why, round((time.monotonic() - t0) * 1000.0, 3)
    return rec, None, round((time.monotonic() - t0) * 1000.0, 3)


def place(path: str) -> str:
    """Moves the staged pre-dump to DIR/criu-pre (DIR is the new image by
    now); returns that folder."""
    dst = os.path.join(os.path.abspath(path), SUBDIR)
    if os.path.lexists(dst):
        if os.path.isdir(dst) and not os.path.islink(dst):
            shutil.rmtree(dst)
        else:
            os.unlink(dst)
    os.rename(os.path.join(stage_dir(path), criu.SUBDIR), dst)
    shutil.rmtree(stage_dir(path), ignore_errors=True)
    return dst


def discard(path: str) -> None:
    """The staged pre-dump goes (a failure, or the dump that needed it failed)."""
    shutil.rmtree(stage_dir(path), ignore_errors=True)


def summary(rec: dict) -> dict:
    """What the CRIU record of the parked dump says of its pre-dump."""
    return {"dir": SUBDIR, "size": rec.get("size"), "files": rec.get("files"), "ms": rec.get("ms"),
            "frozen_ms": rec.get("frozen_ms"), "log": f"{SUBDIR}/pre-dump.log"}


def drop_placed(path: str) -> None:
    """DIR/criu-pre goes (the parked dump was made again without it)."""
    shutil.rmtree(os.path.join(os.path.abspath(path), SUBDIR), ignore_errors=True)
