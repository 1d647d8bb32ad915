"""Image files read as what they claim to be (docs/security.md, "Images";
issue 21).

An image directory is opened once (O_DIRECTORY, its last component not
followed) and every file of it is opened relative to that descriptor:

 * without following links: O_PATH | O_NOFOLLOW first (which opens nothing:
   no FIFO blocks, no device driver runs), then fstat: only a regular file
   goes on, reopened for reading through /proc/self/fd (the same inode, no
   second lookup of the name);
 * owned by the image's user (the directory's owner) or by root; a root
   file in a user's image must have one name only (st_nlink 1), so a hard
   link to a root-only file is not a way in;
 * size-checked before it is read or mapped (exact sizes where the manifest
   records them, a cap elsewhere).

scan() refuses, before anything is read, an image whose folder holds a link,
FIFO, device or socket, or a file of another user. Errors name the image's
own files only (the name inside the image, never a link's target nor a path
outside it), in one line, as ImageError.

The same checks hold for root's images: --allow-foreign relaxes the seal,
never these.

Locking: an ImageDir is read-only after it is made; its descriptor is
closed by close() or when it is collected."""
from __future__ import annotations

import errno
import os
import stat

MAX_SMALL = 4096                  # seal and other small files
MODULES = "modules"


class ImageFileError(Exception):
    """Converted to ImageError by image.py (which imports this module)."""


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


class ImageDir:
    def __init__(self, path: str):
        self.path = path
        try:
            self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ImageFileError(f"{path}: no such directory") from None
        except OSError as e:
            if e.errno == errno.ENOTDIR and os.path.islink(path):
                e.errno = errno.ELOOP      # O_DIRECTORY | O_NOFOLLOW on a link says ENOTDIR
            if e.errno == errno.ELOOP:
                raise ImageFileError(f"{path} is a symbolic link; an image is opened only as its own "
                                     f"directory") from None
            if e.errno == errno.ENOTDIR:
                raise ImageFileError(f"{path}: not a directory") from None
            raise ImageFileError(f"{path}: cannot open: {e.strerror}") from None
        self.uid = os.fstat(self.fd).st_uid

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _name(self, name: str) -> str:
        return f"{self.path}/{name}"

    def _check(self, name: str, st) -> None:
        if not stat.S_ISREG(st.st_mode):
            raise ImageFileError(f"{self._name(name)} is {_kind(st.st_mode)}; image files must be regular files")
        if st.st_uid != self.uid and st.st_uid != 0:
            raise ImageFileError(f"{self._name(name)} is owned by uid {st.st_uid}, not by the image's user "
                                 f"(uid {self.uid}) or root")
        if st.st_uid != self.uid and st.st_nlink != 1:
            raise ImageFileError(f"{self._name(name)} is a second name (hard link) of a file of another user")

    def _path_fd(self, name: str) -> int:
        """An O_PATH descriptor of name (at most one folder deep), never
        following a link. FileNotFoundError when it is not there."""
        parent = self.fd
        sub = -1
        base = name
        if "/" in name:
            folder, base = name.split("/", 1)
            if folder != MODULES or "/" in base:
                raise ImageFileError(f"{self._name(name)}: not a file of an image")
            try:
                sub = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
            except OSError as e:
                if e.errno == errno.ENOENT:
                    raise FileNotFoundError(errno.ENOENT, "missing") from None
                raise ImageFileError(f"{self._name(folder)} is not a directory of the image "
                                     f"({'a symbolic link' if e.errno == errno.ELOOP else e.strerror})") from None
            parent = sub
        try:
            try:
                return os.open(base, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
            except OSError as e:
                if e.errno == errno.ENOENT:
                    raise FileNotFoundError(errno.ENOENT, "missing") from None
                raise ImageFileError(f"{self._name(name)}: cannot open: {e.strerror}") from None
        finally:
            if sub >= 0:
                os.close(sub)

    def stat(self, name: str):
        """The checked stat of a file of the image (FileNotFoundError if absent)."""
        pfd = self._path_fd(name)
        try:
            st = os.fstat(pfd)
            self._check(name, st)
            return st
        finally:
            os.close(pfd)

    def open(self, name: str, size: int | None = None, max_size: int | None = None) -> int:
        """A read-only descriptor of a regular file of the image, checked as
        above; size: it must have exactly this many bytes or fewer (a
        shorter file is the caller's "truncated"); max_size: at most this
        many. FileNotFoundError if absent."""
        pfd = self._path_fd(name)
        try:
            st = os.fstat(pfd)
            self._check(name, st)
            if size is not None and st.st_size > size:
                raise ImageFileError(f"{self._name(name)} has {st.st_size} bytes, the manifest says {size}")
            if max_size is not None and st.st_size > max_size:
                raise ImageFileError(f"{self._name(name)} has {st.st_size} bytes, more than an image's "
                                     f"{name} may have ({max_size})")
            fd = os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            os.close(pfd)
        st2 = os.fstat(fd)
        if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):      # cannot happen: the same open file
            os.close(fd)
            raise ImageFileError(f"{self._name(name)} changed while it was opened")
        return fd

    def read(self, name: str, size: int | None = None, max_size: int | None = None) -> bytes:
        fd = self.open(name, size, max_size)
        try:
            n = os.fstat(fd).st_size
            with os.fdopen(fd, "rb", closefd=False) as f:
                return f.read(n)
        finally:
            os.close(fd)

    def scan(self, sizes: dict[str, int] | None = None) -> None:
        """Refuses an image whose folder (or modules/ folder) holds anything
        but regular files of its user (and directories at the top: the
        process part), or a file larger than the manifest records (sizes:
        name -> bytes). Nothing is opened but the folders."""
        sizes = sizes or {}
        self._scan_dir(self.fd, "", sizes)
        try:
            sub = os.open(MODULES, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        except FileNotFoundError:
            return
        except OSError as e:
            raise ImageFileError(f"{self._name(MODULES)} is not a directory of the image "
                                 f"({'a symbolic link' if e.errno == errno.ELOOP else e.strerror})") from None
        try:
            self._scan_dir(sub, MODULES + "/", sizes)
        finally:
            os.close(sub)

    def _scan_dir(self, fd: int, prefix: str, sizes: dict[str, int]) -> None:
        with os.scandir(fd) as it:
            for ent in it:
                name = prefix + ent.name
                st = ent.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode) and not prefix:
                    continue
                self._check(name, st)
                want = sizes.get(name)
                if want is not None and st.st_size > want:
                    raise ImageFileError(f"{self._name(name)} has {st.st_size} bytes, the manifest says {want}")
