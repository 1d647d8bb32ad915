"""Image files are read as what they claim to be (issue 21; docs/security.md,
"Images"): every file of an image is opened without following links,
relative to the image's directory, must be a regular file of the image's
user (or root) and is size-checked before it is read or mapped. Links,
FIFOs, devices, sockets, files of other users and oversized files are
refused in one line that names only the image's own files, by `Image.open`
/ `check_restorable`, `proxy-cli inspect` (which must not hang on a FIFO)
and a restore, before anything is restored; root's images included."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from gpuproxy.proxyd.checkpoint.image import Image, ImageError  # noqa: E402
from test_image_security import ctl, ctl_error, make, short_tmp  # noqa: E402,F401

SECRET = "/etc/shadow" if os.path.exists("/etc/shadow") else "/etc/hostname"


def module_file(d: Path) -> Path:
    return next((d / "modules").iterdir())


def check(d: Path) -> str:
    """The refusal of Image.open + check_restorable, as a restore's
    precheck runs them; the test fails if the image is accepted."""
    try:
        img = Image.open(d)
        try:
            img.check_restorable()
            for sha in img.modules():
                img.module(sha)
            img.verify(deep=True)
        finally:
            img.close()
    except ImageError as e:
        return str(e)
    raise AssertionError(f"{d}: accepted")


def inspect(d: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    return subprocess.run([sys.executable, "-m", "gpuproxy.cli", "inspect", str(d)], capture_output=True, text=True,
                          timeout=60, env=env)


def replace_with_link(p: Path, target: str):
    p.unlink()
    p.symlink_to(target)


def replace_with_fifo(p: Path):
    p.unlink()
    os.mkfifo(p, 0o600)


def replace_with_device(p: Path):
    p.unlink()
    os.mknod(p, 0o600 | 0o020000, os.makedev(1, 3))     # a character device (/dev/null's numbers)


def replace_with_socket(p: Path):
    p.unlink()
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(p))
    s.close()


CASES = {
    "linked memory": (lambda d: replace_with_link(d / "memory.bin", SECRET), "memory.bin", "symbolic link"),
    "linked module": (lambda d: replace_with_link(module_file(d), SECRET), "modules/", "symbolic link"),
    "linked index": (lambda d: replace_with_link(d / "chunks.idx", SECRET), "chunks.idx", "symbolic link"),
    "linked manifest": (lambda d: replace_with_link(d / "manifest", SECRET), "manifest", "symbolic link"),
    "fifo manifest": (lambda d: replace_with_fifo(d / "manifest"), "manifest", "FIFO"),
    "fifo memory": (lambda d: replace_with_fifo(d / "memory.bin"), "memory.bin", "FIFO"),
    "fifo seal": (lambda d: replace_with_fifo(d / "seal"), "seal", "FIFO"),
    "device index": (lambda d: replace_with_device(d / "chunks.idx"), "chunks.idx", "device"),
    "device module": (lambda d: replace_with_device(module_file(d)), "modules/", "device"),
    "socket memory": (lambda d: replace_with_socket(d / "memory.bin"), "memory.bin", "socket"),
    "oversized index": (lambda d: os.truncate(d / "chunks.idx", 1 << 40), "chunks.idx", "bytes"),
    "oversized memory": (lambda d: os.truncate(d / "memory.bin", 1 << 40), "memory.bin", "bytes"),
    "oversized module": (lambda d: os.truncate(module_file(d), 1 << 40), "modules/", "bytes"),
    "oversized manifest": (lambda d: os.truncate(d / "manifest", 1 << 40), "manifest", "bytes"),
    "other user's file": (lambda d: os.chown(d / "memory.bin", 65533, 65533), "memory.bin", "owned by"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_in_one_line(tmp_path, case):
    """Root's own image: each bad file refused, naming the file and what it
    is, never what a link points to; `inspect` says the same at once."""
    if os.geteuid() != 0 and case in ("device index", "device module", "other user's file"):
        pytest.skip("needs root")
    d = tmp_path / "img"
    make(d, key=os.urandom(32)).close()
    change, names, what = CASES[case]
    change(d)
    why = check(d)
    assert names in why and what in why, why
    assert SECRET not in why and "\n" not in why, why
    r = inspect(d)
    assert r.returncode != 0, r.stdout
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and what in err and SECRET not in err and "Traceback" not in err, err


def test_linked_image_directory_refused(tmp_path):
    d = tmp_path / "img"
    make(d).close()
    (tmp_path / "link").symlink_to(d)
    why = str(pytest.raises(ImageError, Image.open, tmp_path / "link").value)
    assert "symbolic link" in why, why


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act for another user")
def test_users_image_may_not_hold_root_files(tmp_path):
    """A user's image (its folder is the user's) whose file is a hard link
    to a file of root (a second name of a root-only file) is refused; a
    parent image of another user is refused without saying whether it
    exists."""
    d = tmp_path / "img"
    make(d, owner=(65534, 65534)).close()
    secret = tmp_path / "root-only"
    secret.write_bytes(os.urandom(4096))
    secret.chmod(0o600)
    (d / "memory.bin").unlink()
    os.link(secret, d / "memory.bin")
    why = check(d)
    assert "memory.bin" in why and str(secret) not in why, why


@pytest.mark.parametrize("case", ["fifo manifest", "linked memory", "device module", "oversized index"])
def test_restore_refuses_before_anything(fresh_daemon, short_tmp, case):
    """A restore through proxyd (root) refuses the image in one line, at
    once (a FIFO does not block it), with --allow-foreign too, and proxyd
    serves on."""
    if os.geteuid() != 0 and case == "device module":
        pytest.skip("needs root")
    d = fresh_daemon(endpoint=f"ipc://{short_tmp}/p.sock")
    img = short_tmp / "img"
    make(img, key=os.urandom(32)).close()
    change, names, what = CASES[case]
    change(img)
    for foreign in (False, True):
        err = ctl_error(d, "restore", dir=str(img), allow_foreign=foreign)
        assert names in err and what in err and "\n" not in err and SECRET not in err, err
    assert ctl(d, "status")["sessions"] == []
