"""gpuproxy's private key directory, and the image-seal key kept in it.

The directory is `$GPUPROXY_KEY_DIR`, else `$XDG_CONFIG_HOME/gpuproxy/keys`,
else `~/.config/gpuproxy/keys` of the user running the process (root:
/root/.config/gpuproxy/keys). It is created 0700 and every key file in it
0600; a directory or key file that other users can read, or that belongs to
someone else, is refused rather than used (docs/security.md).

image-seal.key: 32 random bytes, made on first use. proxyd seals every image
it writes with HMAC-SHA256 under this key (checkpoint/image.py), so it can
tell its own images from images made elsewhere or edited by hand.
"""
from __future__ import annotations

import hashlib
import os
import stat

SEAL_KEY_FILE = "image-seal.key"


class KeyError_(Exception):
    pass


def key_dir(create: bool = True) -> str:
    d = os.environ.get("GPUPROXY_KEY_DIR")
    if not d:
        base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
        d = os.path.join(base, "gpuproxy", "keys")
    if create:
        os.makedirs(d, mode=0o700, exist_ok=True)
    if os.path.isdir(d):
        st = os.stat(d)
        if st.st_uid != os.geteuid():
            raise KeyError_(f"key directory {d} belongs to uid {st.st_uid}, not to this user ({os.geteuid()})")
        if st.st_mode & 0o077:
            if create:
                os.chmod(d, 0o700)       # ours: make it private rather than refuse
            else:
                raise KeyError_(f"key directory {d} is accessible to other users (mode {st.st_mode & 0o777:o})")
    return d


def read_or_create(name: str, nbytes: int = 32, create: bool = True) -> bytes | None:
    """The key in key_dir()/name; made (random, 0600) if missing and create.
    None if missing and not create."""
    path = os.path.join(key_dir(create), name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        if not create:
            return None
        data = os.urandom(nbytes)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)       # first writer wins when several start at once
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        return read_or_create(name, nbytes, create=False)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise KeyError_(f"key file {path} must be a regular file of this user with mode 0600 "
                            f"(it has mode {st.st_mode & 0o777:o}, owner uid {st.st_uid})")
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    if len(data) < 16:
        raise KeyError_(f"key file {path} is too short ({len(data)} bytes)")
    return data


def seal_key(create: bool = True) -> bytes | None:
    return read_or_create(SEAL_KEY_FILE, 32, create)


def key_id(key: bytes) -> str:
    """A short public name of a key (it reveals nothing of the key)."""
    return hashlib.sha256(b"gpuproxy key id\0" + key).hexdigest()[:16]
