"""GPU-only checkpoints through proxyd's control commands (pre-dump, dump,
restore, migrate; docs/protocol.md): the GPU state alone, the process
staying alive. A library like whole_process.py: plain arguments, a control
client, dicts back (proxyd's answers), typed errors, nothing printed.
"""
from __future__ import annotations

import os

from ..image import parse_compress
from .whole_process import WholeProcessError, check_client  # noqa: F401  (WholeProcessError: callers catch it)


def check_compress(spec: str | None) -> None:
    """Refuses (ValueError, one line) a --compress value proxyd would refuse."""
    if spec:
        parse_compress(spec)


def checkpoint(client, endpoint: str, kind: str, pid: int, dir: str, *, parent: str | None = None,
               leave_running: bool = False, concurrent: bool = False, compress: str | None = None) -> dict:
    """A GPU-only "pre-dump" or "dump" of pid's session into dir; refuses
    (WholeProcessError) a pid that is not a client of this proxyd."""
    if kind not in ("pre-dump", "dump"):
        raise ValueError(f"unknown checkpoint kind {kind!r} (pre-dump or dump)")
    args = {"pid": pid, "dir": os.path.abspath(dir)}
    if compress:
        args["compress"] = compress
    if parent:
        args["parent"] = os.path.abspath(parent)
    if kind == "dump":
        args["leave_running"] = bool(leave_running or concurrent)
        args["concurrent"] = bool(concurrent)
    check_client(client, pid, endpoint)
    return client.call(kind, args)


def restore(client, dir: str, device_map: dict | None = None, allow_foreign: bool = False) -> dict:
    """The GPU state of the image at dir back into proxyd, for a process that
    is still alive (a GPU-only dump); device_map: {old device: new}."""
    return client.call("restore", {"dir": os.path.abspath(dir), "device_map": dict(device_map or {}),
                                   "allow_foreign": bool(allow_foreign)})


def migrate(client, pid: int, to_device: int) -> dict:
    """Moves pid's session to another GPU."""
    return client.call("migrate", {"pid": pid, "to_device": to_device})
