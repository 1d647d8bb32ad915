"""Module images by content: the worker's store of images and their parsed
layouts, keyed by the image's SHA-256 (docs/protocol.md, "Module images by
content"; docs/pytorch.md).

The shim names a module image by its digest before it sends it; the worker
answers from this store when it can, so the bytes cross only once:

* in memory: the images this worker has seen, per client user (an LRU bounded
  in bytes, GPUPROXY_MODULE_MEM_MB, default 512) and their parsed layouts (an LRU
  bounded in entries, GPUPROXY_MODULE_PARSED, default 1024; parsing a
  libtorch fatbin takes tens of milliseconds to a second, and a program
  loads the same image on every device and again after cudaDeviceReset);
* on disk, across runs and workers: `<cache>/modules/u<uid>/`, where
  <cache> is $GPUPROXY_CACHE_DIR, else $XDG_CACHE_HOME/gpuproxy, else
  ~/.cache/gpuproxy of proxyd's user, one folder per client user (a user
  can neither read nor probe another's images). Each image is
  `<sha256>.img`, its layout `<sha256>.layout`. Bounded by
  GPUPROXY_MODULE_CACHE_MB (default 4096): the least recently used entries
  go first. GPUPROXY_MODULE_CACHE=0 turns the disk cache off.

Safety against a cache someone else changed: the folders must be proxyd's
user's and private (0700; anything else turns the disk cache off with one
log line), files are opened without following links, an image is used only
if its SHA-256 is its name, and a layout only if its HMAC-SHA256 under a key
of proxyd's user (keys.py, `module-cache.key`) checks out. A failed check
removes the entry and the image is parsed again from bytes that passed.

Locking: a worker serves one session on its main loop; the store is used
from there, and during a restore from the restore's helper threads
(modrestore.py reads and parses images ahead of the loads): `_mu` guards the
in-memory tables; parsing and file work run outside it. Several
workers share the disk folders: files are written to a temporary name and
renamed into place, so a reader sees a whole file or none.
"""
from __future__ import annotations

import collections
import hashlib
import hmac
import logging
import os
import stat
import threading
import time

import msgpack

log = logging.getLogger("proxyd")

_LAYOUT_MAGIC = b"gpuproxy module layout v1\0"


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name) or default)
    except ValueError:
        return default


def cache_root() -> str:
    d = os.environ.get("GPUPROXY_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "gpuproxy")
    return d


# ------------------------------------------------------------- layout codec

def encode_layout(parsed) -> bytes:
    """What a load needs of a parsed image (not the decompressed entries)."""
    return msgpack.packb({
        "format": parsed.format,
        "kernels": {n: [[p.index, p.offset, p.size] for p in k.params] for n, k in parsed.kernels.items()},
        "globals": {n: [g.size, g.init, g.space, g.managed] for n, g in parsed.globals.items()},
        "skipped": [list(x) for x in parsed.skipped],
        "ambiguous": {n: [[list(x) for x in lay] for lay in lays] for n, lays in parsed.ambiguous.items()},
    }, use_bin_type=True)


def decode_layout(raw: bytes):
    from ..core.fatbin import GlobalVar, KernelInfo, ModuleImage, ParamInfo
    d = msgpack.unpackb(raw, raw=False)
    kernels = {n: KernelInfo(name=n, params=[ParamInfo(index=int(i), offset=int(o), size=int(s)) for i, o, s in ps])
               for n, ps in d["kernels"].items()}
    globals_ = {n: GlobalVar(name=n, size=int(sz), init=None if init is None else bytes(init), space=str(space),
                             managed=bool(managed))
                for n, (sz, init, space, managed) in d["globals"].items()}
    return ModuleImage(format=str(d["format"]), entries=[], kernels=kernels, globals=globals_,
                       skipped=[tuple(x) for x in d["skipped"]],
                       ambiguous={n: [[tuple(x) for x in lay] for lay in lays] for n, lays in d["ambiguous"].items()})


# -------------------------------------------------------------------- store

class ModuleStore:
    def __init__(self, root: str | None = None, mem_bytes: int | None = None, parsed_max: int | None = None,
                 disk_bytes: int | None = None, disk: bool | None = None):
        self.mem_bytes = (mem_bytes if mem_bytes is not None else _env_int("GPUPROXY_MODULE_MEM_MB", 512) << 20)
        self.parsed_max = parsed_max if parsed_max is not None else _env_int("GPUPROXY_MODULE_PARSED", 1024)
        self.disk_bytes = (disk_bytes if disk_bytes is not None
                           else _env_int("GPUPROXY_MODULE_CACHE_MB", 4096) << 20)
        self.disk = disk if disk is not None else os.environ.get("GPUPROXY_MODULE_CACHE", "1") != "0"
        self.root = root or os.path.join(cache_root(), "modules")
        # (uid, digest) -> image: a client is answered only from its own user's
        # images (a worker serves one session, but the rule should not hang on that)
        self._images: collections.OrderedDict[tuple, bytes] = collections.OrderedDict()
        self._image_total = 0
        self._parsed: collections.OrderedDict[bytes, object] = collections.OrderedDict()
        self._key: bytes | None = None
        self._refused: set[str] = set()
        self.stats = collections.Counter()
        self._mu = threading.Lock()

    # ---------------------------------------------------------- memory
    def _remember_image(self, key: tuple, image: bytes):
        with self._mu:
            self._remember_image_locked(key, image)

    def _remember_image_locked(self, key: tuple, image: bytes):
        if key in self._images:
            self._images.move_to_end(key)
            return
        if len(image) > self.mem_bytes:
            return
        self._images[key] = image
        self._image_total += len(image)
        while self._image_total > self.mem_bytes:
            _, old = self._images.popitem(last=False)
            self._image_total -= len(old)

    def _remember_parsed(self, digest: bytes, parsed):
        with self._mu:
            self._parsed[digest] = parsed
            self._parsed.move_to_end(digest)
            while len(self._parsed) > self.parsed_max:
                self._parsed.popitem(last=False)

    # ------------------------------------------------------------ disk
    def _dir(self, uid: int | None) -> str | None:
        """The client user's folder, made private if missing; None when the
        disk cache is off or a folder on the way is not safe to use."""
        if not self.disk or uid is None:
            return None
        d = os.path.join(self.root, f"u{int(uid)}")
        if d in self._refused:
            return None
        try:
            for p in (self.root, d):
                try:
                    os.makedirs(p, mode=0o700)
                except FileExistsError:
                    pass
                st = os.lstat(p)
                if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                    raise PermissionError(f"{p} is not a folder of uid {os.geteuid()} (uid {st.st_uid})")
                if st.st_mode & 0o077:
                    os.chmod(p, 0o700)      # ours: made private rather than refused (as keys.py does)
        except OSError as e:
            self._refused.add(d)
            log.warning("module cache %s not used: %s", d, e)
            return None
        return d

    def _mac(self, digest: bytes, payload: bytes) -> bytes | None:
        if self._key is None:
            try:
                from ..core import keys
                self._key = keys.read_or_create("module-cache.key", 32, True)
            except Exception as e:    # keys.KeyError_, OSError: no key, no layout cache
                log.warning("module cache: no key (%s); layouts are not cached on disk", e)
                self._key = b""
        if not self._key:
            return None
        return hmac.new(self._key, _LAYOUT_MAGIC + digest + payload, hashlib.sha256).digest()

    @staticmethod
    def _read(path: str) -> bytes | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                return None
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read()
            os.utime(fd)          # recently used: evicted last
            return data
        except OSError:
            return None
        finally:
            os.close(fd)

    def _write(self, d: str, name: str, data: bytes):
        tmp = os.path.join(d, f".{name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, os.path.join(d, name))
        except OSError as e:
            log.warning("module cache: cannot write %s: %s", os.path.join(d, name), e)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return
        self._evict(d)

    def _evict(self, d: str):
        """Least recently used entries out until the folder fits the bound."""
        try:
            ents = []
            total = 0
            with os.scandir(d) as it:
                for e in it:
                    if e.is_file(follow_symlinks=False) and not e.name.startswith("."):
                        st = e.stat(follow_symlinks=False)
                        ents.append((st.st_mtime, e.name, st.st_size))
                        total += st.st_size
            if total <= self.disk_bytes:
                return
            for _, name, size in sorted(ents):
                try:
                    os.unlink(os.path.join(d, name))
                except OSError:
                    continue
                total -= size
                self.stats["disk_evicted"] += 1
                if total <= self.disk_bytes:
                    break
        except OSError as e:
            log.warning("module cache: cannot bound %s: %s", d, e)

    def _drop(self, d: str, name: str, why: str):
        log.warning("module cache: %s/%s removed: %s", d, name, why)
        self.stats["disk_rejected"] += 1
        try:
            os.unlink(os.path.join(d, name))
        except OSError:
            pass

    # ------------------------------------------------------------- API
    def image(self, digest: bytes, length: int, uid: int | None) -> bytes | None:
        """The image of this digest and length, from memory or the disk
        cache (checked), or None: then the client sends it."""
        with self._mu:
            img = self._images.get((uid, digest))
            if img is not None and len(img) == length:
                self._images.move_to_end((uid, digest))
                self.stats["image_memory_hits"] += 1
                return img
        d = self._dir(uid)
        if d is None:
            return None
        name = digest.hex() + ".img"
        data = self._read(os.path.join(d, name))
        if data is None:
            return None
        if len(data) != length or hashlib.sha256(data).digest() != digest:
            self._drop(d, name, "its content does not match its name")
            return None
        self.stats["image_disk_hits"] += 1
        self._remember_image((uid, digest), data)
        return data

    def add_image(self, image: bytes, uid: int | None) -> bytes:
        """Stores an image the client sent; returns its digest."""
        digest = hashlib.sha256(image).digest()
        self.stats["images_received"] += 1
        self._remember_image((uid, digest), image)
        d = self._dir(uid)
        if d is not None and not os.path.exists(os.path.join(d, digest.hex() + ".img")):
            self._write(d, digest.hex() + ".img", image)
        return digest

    def parsed(self, image: bytes, uid: int | None, digest: bytes | None = None):
        """The parsed layout of an image (fatbin.parse_image), from memory,
        the disk cache (MAC checked) or parsed now. Raises FatbinError."""
        from ..core.fatbin import parse_image
        if digest is None:
            digest = hashlib.sha256(image).digest()
        with self._mu:
            p = self._parsed.get(digest)
            if p is not None:
                self._parsed.move_to_end(digest)
                self.stats["parse_memory_hits"] += 1
                return p
        d = self._dir(uid)
        name = digest.hex() + ".layout"
        if d is not None:
            raw = self._read(os.path.join(d, name))
            if raw is not None:
                try:
                    mac, payload = raw[:32], raw[32:]
                    want = self._mac(digest, payload)
                    if want is None or not hmac.compare_digest(mac, want):
                        raise ValueError("its MAC does not check out")
                    p = decode_layout(payload)
                    self.stats["parse_disk_hits"] += 1
                except Exception as e:   # a damaged or forged entry: parse again
                    self._drop(d, name, str(e))
                    p = None
        if p is None:
            p = parse_image(image)
            self.stats["parsed"] += 1
            if d is not None:
                payload = encode_layout(p)
                mac = self._mac(digest, payload)
                if mac is not None:
                    self._write(d, name, mac + payload)
        self._remember_parsed(digest, p)
        return p


_STORE: ModuleStore | None = None
_STORE_MU = threading.Lock()


def store() -> ModuleStore:
    global _STORE
    if _STORE is None:
        with _STORE_MU:          # a restore's helper threads may ask first
            if _STORE is None:
                _STORE = ModuleStore()
    return _STORE
