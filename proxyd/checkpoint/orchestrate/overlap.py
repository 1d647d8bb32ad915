"""The two halves of a whole-process restore at the same time (issue 23,
target 4): proxyd rebuilds the GPU state in a fresh worker while CRIU
rebuilds the process tree; the app goes on only when both are done.

Why it is safe: the restored app was dumped parked (interceptor/park.c): its
CUDA-calling threads wait inside the shim and its park thread waits for the
resume file, which only the caller writes, after both halves succeeded. So a
process CRIU brings back before its GPU state is ready makes no CUDA call.

Failures undo the other half: a GPU restore that fails ends the process CRIU
restored meanwhile (it never ran past the park: nothing of it is lost that
the image does not hold); a CRIU restore that fails releases the GPU state
(proxyd's `discard`), as before. $GPUPROXY_RESTORE_OVERLAP=0 runs them one
after the other (GPU first), for comparison; so does an image that does not
pass here the checks proxyd makes before restoring anything (precheck):
then proxyd refuses it and CRIU never starts.

Locking: the GPU half runs on one helper thread that uses only the control
client (one call, answered before the thread ends); the caller's thread
runs CRIU and joins it. No state is shared but the result slots.
"""
from __future__ import annotations

import os
import signal
import threading
import time


def enabled() -> bool:
    return os.environ.get("GPUPROXY_RESTORE_OVERLAP", "1") != "0"


def precheck(path: str, allow_foreign: bool) -> str | None:
    """The checks proxyd makes before it restores anything that can be made
    here (the image's structure, checksums of the manifest, its session
    description, the seal with this user's key): a project rule is that a
    corrupt, hostile or foreign image is refused before anything is restored,
    and CRIU would otherwise start on it. None when they pass; otherwise why
    the halves run one after the other (GPU first: proxyd then refuses the
    image with its own message and CRIU never runs)."""
    from ..image import Image, ImageError
    from ..manifest_schema import SchemaError, validate_session
    try:
        with Image.open(path) as img:
            img.check_restorable()
            validate_session(img.session, strict=True)
            if not allow_foreign:
                try:
                    from ...core import keys
                    key = keys.seal_key(create=False)
                except Exception:
                    key = None
                ours, why = img.chain_seal(key)
                if not ours:
                    return f"its seal was not checked here ({why})"
    except (ImageError, SchemaError, OSError) as e:
        return f"the image does not pass the checks here ({e})"
    return None


def run_both(gpu_call, criu_call, sequential_why: str | None = None) -> dict:
    """gpu_call() -> dict, criu_call() -> (pid, ms), concurrently (or one
    after the other when overlap is off). Returns {"gpu", "gpu_error",
    "pid", "criu_ms", "criu_error", "gpu_ms", "wall_ms", "overlapped"}: each
    half's result or its exception, never raising itself."""
    out = {"gpu": None, "gpu_error": None, "pid": None, "criu_ms": None, "criu_error": None,
           "gpu_ms": None, "overlapped": enabled() and sequential_why is None,
           "sequential_why": sequential_why if enabled() else "GPUPROXY_RESTORE_OVERLAP=0"}
    t0 = time.monotonic()

    def gpu():
        tg = time.monotonic()
        try:
            out["gpu"] = gpu_call()
        except BaseException as e:      # handed to the caller
            out["gpu_error"] = e
        out["gpu_ms"] = round((time.monotonic() - tg) * 1000.0, 3)

    if not out["overlapped"]:
        gpu()
        if out["gpu_error"] is None:
            try:
                out["pid"], out["criu_ms"] = criu_call()
            except BaseException as e:
                out["criu_error"] = e
    else:
        th = threading.Thread(target=gpu, name="gpuproxy-gpu-restore", daemon=True)
        th.start()
        try:
            out["pid"], out["criu_ms"] = criu_call()
        except BaseException as e:
            out["criu_error"] = e
        th.join()
    out["wall_ms"] = round((time.monotonic() - t0) * 1000.0, 3)
    return out


def end_restored(pids) -> list[int]:
    """Ends the processes CRIU restored (they wait parked; the GPU half
    failed, so they cannot go on). Returns the pids signalled."""
    done = []
    for p in pids:
        try:
            os.kill(int(p), signal.SIGKILL)
            done.append(int(p))
        except (ProcessLookupError, ValueError, TypeError):
            pass
        except PermissionError:
            pass
    return done
