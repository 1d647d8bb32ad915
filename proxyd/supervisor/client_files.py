"""Small files the supervisor makes for a client in its /dev/shm (the
resume file, the park-held flag, the park lease): made afresh and handed to
the client's user.

/dev/shm is everyone's (sticky, world-writable): whatever stands at the
path is removed and the file is created with O_EXCL|O_NOFOLLOW, never
through a link another user put there, then given its mode and owner by
its descriptor (fchmod, fchown), never by path (issue 21; docs/security.md).
"""
from __future__ import annotations

import os


def write(pid: int, path: str, data: bytes, mode: int = 0o600) -> None:
    """A new file at path holding data, owned by process pid's user (when
    /proc shows it; else proxyd's). Raises OSError."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)          # whatever the umask: the client reads it
        os.write(fd, data)
        try:
            st = os.stat(f"/proc/{pid}")
            os.fchown(fd, st.st_uid, st.st_gid)
        except OSError:
            pass
    finally:
        os.close(fd)
