"""Checkpoint images on disk: writing, reading, checking (docs/image-format.md).

An image is a directory:

  manifest      "GPUPROXY-IMAGE 1" line, JSON body, "sha256 <hex>" line;
                written last, atomically: without it there is no image
  chunks.idx    binary index of every memory chunk of the session
  memory.bin    the chunk data stored in this image
  modules/      module images (fatbin/cubin/PTX) as <sha256>.bin

An incremental image names its parent (path and manifest digest) and stores
only the chunks that changed; its index still lists every chunk, pointing at
the ancestor that holds the bytes. Every chunk carries its gp64 hash
(hashing.py), the manifest pins chunks.idx by sha256, and each image pins its
ancestors by manifest digest, so any damage anywhere in a chain is found
before anything is restored.

    w = ImageWriter(dir, "dump", meta, parent=Image.open(parent_dir))
    sha = w.add_module(image_bytes)
    w.add_chunk(addr, data)                    # bytes that changed
    w.add_unchanged(addr, length, gp64_hash)   # bytes an ancestor holds
    img = w.finish(session_dict, stats_dict)

    img = Image.open(dir)          # manifests of the whole chain checked
    img.check_restorable()         # structure: fast, raises ImageError
    for ref in img.chunks(): img.read_chunk(ref)
    problems = img.verify()        # structure + every hash: [] when good

Thread-safety: an Image may be read from several threads (verify does);
an ImageWriter belongs to one thread.
"""
from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import mmap
import os
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from . import hashing
from .manifest_schema import SchemaError, validate_manifest
from .safe_open import MAX_SMALL, ImageDir, ImageFileError

# Version 2 (this writer): chunks may be stored zstd-compressed (FLAG_ZSTD,
# the record's `stored` length) and the manifest may carry `compression`.
# Version 1 images (no compression; the record's last field reserved, 0) are
# still read; a version-1 reader refuses version 2 by its header line.
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
MAGIC = "GPUPROXY-IMAGE"
HASH_NAME = "gp64"
KINDS = ("pre-dump", "dump")

MANIFEST = "manifest"
INDEX = "chunks.idx"
MEMORY = "memory.bin"
MODULES = "modules"
SEAL = "seal"
SEAL_ALGO = "hmac-sha256"

# Images hold a program's memory: private to their owner (docs/security.md)
DIR_MODE = 0o700
FILE_MODE = 0o600

INDEX_MAGIC = b"GPXCHUNK"
INDEX_VERSION = 2                # 1: the last u32 is reserved (0); 2: it is the stored length
INDEX_HEADER = struct.Struct("<8sII")          # magic, version, record count
INDEX_DTYPE = np.dtype([("addr", "<u8"), ("length", "<u4"), ("flags", "<u4"), ("hash", "<u8"),
                        ("offset", "<u8"), ("image", "<u4"), ("stored", "<u4")])
assert INDEX_HEADER.size == 16 and INDEX_DTYPE.itemsize == 40

# chunk flags
FLAG_GLOBAL = 1                  # contents of a __device__ variable (addr: its key), not arena memory
FLAG_ZSTD = 2                    # (format 2) the bytes are one zstd frame of `stored` bytes in memory.bin
FLAG_USER_MASK = 0xFFFF0000      # free for the engine; stored and returned as given
KNOWN_FLAGS = FLAG_GLOBAL | FLAG_ZSTD | FLAG_USER_MASK
KNOWN_FLAGS_V1 = FLAG_GLOBAL | FLAG_USER_MASK
CODECS = ("zstd",)

MAX_CHUNK = 0xFFFFFFFF           # the index stores lengths as u32
PAGE = 4096

# manifest keys the writer fills in itself (meta may not set them)
_RESERVED = ("format_version", "kind", "created", "parent", "ancestors", "chunk_size", "hash", "session",
             "memory", "stats", "files", "modules", "compression")


class ImageError(Exception):
    """An image cannot be written, read or restored; the message says what
    is wrong and where (file, chunk address, expected and actual values)."""


def _open_dir(path: str) -> ImageDir:
    """An image's folder, opened once (safe_open.py)."""
    try:
        return ImageDir(path)
    except ImageFileError as e:
        raise ImageError(str(e)) from None


@dataclass(frozen=True)
class ChunkRef:
    """One chunk of an image, resolved: its bytes are file[offset:offset+length].
    image: 0 = the image itself, k = its k-th ancestor (Image.chain[k])."""
    addr: int
    length: int
    flags: int
    hash: int
    image: int
    offset: int
    file: str
    stored: int = -1      # bytes in the file: the compressed size with FLAG_ZSTD; -1: length

    @property
    def is_global(self) -> bool:
        return bool(self.flags & FLAG_GLOBAL)

    @property
    def compressed(self) -> bool:
        return bool(self.flags & FLAG_ZSTD)

    @property
    def disk_length(self) -> int:
        return self.stored if self.stored >= 0 else self.length


def parse_compress(spec: str | None) -> tuple[str, int] | None:
    """'zstd' or 'zstd:LEVEL' -> ("zstd", level); None or '' or 'none' ->
    None. ValueError with the accepted forms otherwise."""
    if not spec or spec == "none":
        return None
    codec, _, level = str(spec).partition(":")
    if codec not in CODECS:
        raise ValueError(f"unknown compression {spec!r}: use zstd or zstd:LEVEL (LEVEL -7..19), or none")
    try:
        lv = int(level) if level else 1
    except ValueError:
        raise ValueError(f"bad zstd level in {spec!r}: an integer from -7 to 19") from None
    if not -7 <= lv <= 19:
        raise ValueError(f"zstd level {lv} out of range: -7 (fastest) .. 19")
    return codec, lv


_zlocal = threading.local()


def require_codec(spec: str | None) -> tuple[str, int] | None:
    """parse_compress, and ValueError (one line) when the codec's module is
    not installed (zstandard is an optional dependency: gpuproxy[zstd])."""
    c = parse_compress(spec)
    if c is not None:
        try:
            import zstandard  # noqa: F401
        except ImportError:
            raise ValueError(f"--compress {spec} needs the zstandard module, which is not installed where proxyd "
                             f"runs (pip install 'gpuproxy[zstd]', or zstandard); dump without --compress") \
                from None
    return c


def _zstd():
    try:
        import zstandard
    except ImportError:
        raise ImageError("this image stores zstd-compressed chunks, and the zstandard module is not installed") \
            from None
    return zstandard


def _decompress(data, length: int) -> bytes:
    """One chunk's zstd frame -> its `length` bytes (a decompressor per thread:
    they are not safe to share)."""
    d = getattr(_zlocal, "d", None)
    if d is None:
        d = _zlocal.d = _zstd().ZstdDecompressor()
    out = d.decompress(data, max_output_size=max(length, 1))
    if len(out) != length:
        raise ValueError(f"decompressed to {len(out)} bytes, expected {length}")
    return out


def _compressor(level: int):
    c = getattr(_zlocal, "c", None)
    if c is None or c[0] != level:
        c = _zlocal.c = (level, _zstd().ZstdCompressor(level=level, write_content_size=True))
    return c[1]


def _fmt_hash(h: int) -> str:
    return f"{h:#018x}"


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _create(path: str):
    """A new file (replacing any) that only its owner may read or write."""
    try:
        os.unlink(path)        # a file left by someone else keeps its mode and owner: start afresh
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    return os.fdopen(fd, "wb", buffering=0)


def _private_dir(path: str) -> None:
    os.makedirs(path, mode=DIR_MODE, exist_ok=True)
    if os.path.islink(path) or not os.path.isdir(path):
        raise ImageError(f"{path} is not a directory")
    os.chmod(path, DIR_MODE)


def _write_file_atomic(path: str, data: bytes) -> None:
    """data to path through path.tmp, fsync, rename."""
    tmp = path + ".tmp"
    with _create(tmp) as f:
        mv = memoryview(data)
        while len(mv):
            mv = mv[f.write(mv):]
        os.fsync(f.fileno())
    os.replace(tmp, path)


def seal_of(key: bytes, digest: str) -> str:
    """The seal of a manifest digest: HMAC-SHA256 under the daemon's key."""
    return hmac.new(key, b"gpuproxy image seal\0" + digest.encode(), hashlib.sha256).hexdigest()


# ---------------------------------------------------------------- manifest

def encode_manifest(body: dict) -> bytes:
    """The bytes of a manifest file holding body."""
    text = json.dumps(body, sort_keys=True, indent=1, ensure_ascii=False).encode("utf-8")
    return (f"{MAGIC} {FORMAT_VERSION}\n".encode() + text + b"\nsha256 " +
            hashlib.sha256(text).hexdigest().encode() + b"\n")


MAX_MANIFEST = 256 << 20      # bytes: a manifest larger than this is refused unread


def read_manifest(directory: str, d: "ImageDir | None" = None) -> tuple[dict, str]:
    """(body, sha256 hex of the body bytes) of directory's manifest; checks
    magic, format version and digest. d: the directory, opened (safe_open.py)."""
    path = os.path.join(directory, MANIFEST)
    try:
        if d is None:
            d = ImageDir(directory)
        raw = d.read(MANIFEST, max_size=MAX_MANIFEST)
    except ImageFileError as e:
        raise ImageError(str(e)) from None
    except FileNotFoundError:
        try:
            present = [n for n in (MEMORY, INDEX, MANIFEST + ".tmp") if _present(d, n)]
        except ImageFileError as e:
            raise ImageError(str(e)) from None
        if present:
            raise ImageError(f"{directory}: incomplete image, no manifest (the dump did not finish)") from None
        raise ImageError(f"{directory}: not a gpuproxy image (no manifest file)") from None
    except OSError as e:
        raise ImageError(f"{path}: cannot read: {e.strerror}") from None
    nl = raw.find(b"\n")
    first = raw[:nl] if nl >= 0 else raw[:64]
    word, _, ver = first.partition(b" ")
    if word != MAGIC.encode():
        raise ImageError(f"{path}: not a gpuproxy image manifest (first line {first[:40]!r}, "
                         f"expected '{MAGIC} {FORMAT_VERSION}')")
    try:
        version = int(ver.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ImageError(f"{path}: bad format version {ver[:20]!r} in the first line") from None
    if version not in READABLE_VERSIONS:
        raise ImageError(f"{path}: image format version {version}, this gpuproxy reads "
                         f"{' and '.join(map(str, READABLE_VERSIONS))}")
    rest = raw[nl + 1:]
    cut = rest.rfind(b"\nsha256 ")
    if cut < 0 or not rest.endswith(b"\n"):
        raise ImageError(f"{path}: truncated or damaged (no final 'sha256' line)")
    body, trailer = rest[:cut], rest[cut + 1:-1]
    want = trailer[len(b"sha256 "):].decode("ascii", "replace")
    got = hashlib.sha256(body).hexdigest()
    if got != want:
        raise ImageError(f"{path}: manifest digest mismatch: the body's sha256 is {got}, its last line says "
                         f"{want} (the manifest was modified or damaged)")
    try:
        m = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ImageError(f"{path}: body is not valid JSON ({e})") from None
    except RecursionError:
        raise ImageError(f"{path}: body is nested too deeply to be a manifest") from None
    if not isinstance(m, dict):
        raise ImageError(f"{path}: body is not a JSON object")
    if m.get("format_version") != version:
        raise ImageError(f"{path}: body says format version {m.get('format_version')!r}, "
                         f"first line says {version}")
    for key, typ in (("kind", str), ("files", dict), ("modules", dict), ("ancestors", list)):
        if not isinstance(m.get(key), typ):
            raise ImageError(f"{path}: body lacks '{key}' or it has the wrong type")
    if m["kind"] not in KINDS:
        raise ImageError(f"{path}: unknown image kind {m['kind']!r}")
    if m.get("hash") != HASH_NAME:
        raise ImageError(f"{path}: chunk hash {m.get('hash')!r}, this gpuproxy knows {HASH_NAME!r}")
    try:
        validate_manifest(m)
    except SchemaError as e:
        raise ImageError(f"{path}: {e}") from None
    except RecursionError:
        raise ImageError(f"{path}: body is nested too deeply to be a manifest") from None
    return m, got


def _present(d: "ImageDir", name: str) -> bool:
    try:
        d.stat(name)
        return True
    except FileNotFoundError:
        return False


def _recorded_sizes(m: dict) -> dict[str, int]:
    """name -> bytes the manifest records for the image's files (a larger
    file is refused by ImageDir.scan before anything is read)."""
    out = {}
    for name in (INDEX, MEMORY):
        size = (m["files"].get(name) or {}).get("size")
        if isinstance(size, int):
            out[name] = size
    for sha, ent in m["modules"].items():
        if isinstance(ent, dict) and ent.get("image", 0) == 0 and isinstance(ent.get("size"), int):
            out[f"{MODULES}/{sha}.bin"] = ent["size"]
    return out


# ------------------------------------------------------------------ reading

class Image:
    """An image opened for reading, with its chain of ancestors.

    chain[0] is the image itself, chain[k] its k-th ancestor. Opening reads
    and checks every manifest of the chain (magic, version, digest, each
    parent present and the very one recorded); chunk indexes and data are
    read on demand."""

    def __init__(self, path: str, manifest: dict, digest: str, parent: "Image | None",
                 dir: "ImageDir | None" = None):
        self.path = path
        self.dir = dir if dir is not None else _open_dir(path)    # every file is opened relative to it
        self.manifest = manifest
        self.digest = digest                    # sha256 of the manifest body
        self.parent = parent
        self.chain: list[Image] = [self] + (parent.chain if parent is not None else [])
        self._lock = threading.Lock()
        self._index: np.ndarray | None = None
        self._by_addr: dict[int, int] | None = None
        self._refs: list[ChunkRef] | None = None
        self._mm = None
        self._mm_addr = 0          # where _mm starts, when read_into populates it range by range
        self._mem_size: int | None = None
        self.version = int(manifest.get("format_version", 1))

    # -- opening
    @classmethod
    def open(cls, path) -> "Image":
        """Opens the image at path and its ancestors; ImageError if any
        manifest is damaged or of another format version, or a parent is
        missing or not the image the child was made from."""
        cur = os.path.abspath(os.fspath(path))
        found: list[tuple[str, dict, str]] = []
        dirs: list[ImageDir] = []
        seen = set()
        child = None
        while True:
            real = os.path.realpath(cur)
            if real in seen:
                raise ImageError(f"{child}: parent chain loops back to {cur}")
            seen.add(real)
            if child is None:
                d = _open_dir(cur)
            else:
                # a parent must be a folder of the same user: otherwise the
                # same words whether it exists or not (nothing is told about
                # folders that are not the image's user's)
                try:
                    d = ImageDir(cur)
                except ImageFileError:
                    d = None
                if d is None or d.uid != dirs[0].uid:
                    raise ImageError(f"{child}: parent image {found[-1][1]['parent']['path']!r} is missing "
                                     f"(no directory of this image's user at {cur})")
            try:
                m, digest = read_manifest(cur, d)
                d.scan(_recorded_sizes(m))
            except ImageFileError as e:
                raise (ImageError(f"{child}: parent image: {e}") if child else ImageError(str(e))) from None
            except ImageError as e:
                raise (ImageError(f"{child}: parent image: {e}") if child else e) from None
            dirs.append(d)
            if child is not None:
                want = found[-1][1]["parent"].get("manifest_sha256")
                if digest != want:
                    raise ImageError(f"{child}: parent image {cur} is not the one this image was made from: "
                                     f"its manifest sha256 is {digest}, expected {want}")
            found.append((cur, m, digest))
            p = m.get("parent")
            if p is None:
                break
            if not isinstance(p, dict) or not isinstance(p.get("path"), str):
                raise ImageError(f"{cur}/{MANIFEST}: bad 'parent' entry {p!r}")
            child = cur
            cur = os.path.normpath(os.path.join(cur, p["path"]))
        img = None
        for (cur, m, digest), d in zip(reversed(found), reversed(dirs)):
            img = cls(cur, m, digest, img, d)
            want = [a.digest for a in img.chain[1:]]
            if m["ancestors"] != want:
                raise ImageError(f"{cur}/{MANIFEST}: records ancestors {m['ancestors']}, the chain on disk "
                                 f"is {want}")
        return img

    def close(self) -> None:
        for img in self.chain:
            with img._lock:
                mm, img._mm = img._mm, None
            if mm is not None and not isinstance(mm, bytes):
                try:
                    mm.close()
                except BufferError:
                    pass         # chunks still referenced by the caller; closed when they go

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"Image({self.path!r}, {self.kind}, depth {len(self.chain) - 1})"

    # -- seal
    def seal(self, key: bytes | None) -> tuple[bool, str]:
        """(True, what) if this image carries a valid seal under key (it was
        written by a daemon holding that key and not changed since), else
        (False, why): a *foreign* image."""
        from ..core.keys import key_id
        path = self._file(SEAL)
        try:
            raw = self.dir.read(SEAL, max_size=MAX_SMALL)[:512]
        except FileNotFoundError:
            return False, "foreign image: it has no seal"
        except ImageFileError as e:
            return False, f"foreign image: {e}"
        except OSError as e:
            return False, f"foreign image: cannot read {path}: {e.strerror}"
        parts = raw.decode("ascii", "replace").split()
        if len(parts) != 3 or parts[0] != SEAL_ALGO or not raw.isascii():
            return False, f"foreign image: {path} is not a seal"
        if key is None:
            return False, f"foreign image: sealed with key {parts[1]}, and this user has no seal key"
        if parts[1] != key_id(key):
            return False, f"foreign image: sealed with key {parts[1]}, not this daemon's key {key_id(key)}"
        if not hmac.compare_digest(parts[2], seal_of(key, self.digest)):
            return False, f"foreign image: the seal does not match the manifest (edited after it was written)"
        return True, f"sealed by this daemon's key {parts[1]}"

    def chain_seal(self, key: bytes | None) -> tuple[bool, str]:
        """The seal of every image of the chain: (True, ...) only if all are ours."""
        for img in self.chain:
            ok, why = img.seal(key)
            if not ok:
                return False, why if img is self else f"{why} (ancestor {img.path})"
        return True, self.seal(key)[1]

    # -- manifest fields
    @property
    def session(self) -> dict:
        return self.manifest.get("session") or {}

    @property
    def kind(self) -> str:
        return self.manifest["kind"]

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    # -- chunk index
    def _load_index(self) -> np.ndarray:
        if self._index is not None:
            return self._index
        path = self._file(INDEX)
        want = self.manifest["files"].get(INDEX) or {}
        try:
            raw = self.dir.read(INDEX, size=want.get("size") if isinstance(want.get("size"), int) else 0)
        except FileNotFoundError:
            raise ImageError(f"{path} is missing") from None
        except ImageFileError as e:
            raise ImageError(str(e)) from None
        except OSError as e:
            raise ImageError(f"{path}: cannot read: {e.strerror}") from None
        if len(raw) < want.get("size", 0):
            raise ImageError(f"{path} is truncated: {len(raw)} bytes, the manifest says {want.get('size')}")
        if len(raw) != want.get("size"):
            raise ImageError(f"{path} has {len(raw)} bytes, the manifest says {want.get('size')}")
        got = hashlib.sha256(raw).hexdigest()
        if got != want.get("sha256"):
            raise ImageError(f"{path} is corrupt: sha256 {got}, the manifest says {want.get('sha256')}")
        if len(raw) < INDEX_HEADER.size:
            raise ImageError(f"{path} is truncated: {len(raw)} bytes, shorter than its header")
        magic, version, count = INDEX_HEADER.unpack_from(raw)
        if magic != INDEX_MAGIC:
            raise ImageError(f"{path}: bad magic {magic!r}, expected {INDEX_MAGIC!r}")
        # format 1 images have index version 1, format 2 images index version 2
        if version != (1 if self.version == 1 else INDEX_VERSION):
            raise ImageError(f"{path}: index version {version}, this gpuproxy reads "
                             f"{1 if self.version == 1 else INDEX_VERSION} in a format {self.version} image")
        need = INDEX_HEADER.size + count * INDEX_DTYPE.itemsize
        if len(raw) != need:
            raise ImageError(f"{path} is truncated: {len(raw)} bytes, its {count} records need {need}"
                             if len(raw) < need else f"{path}: {len(raw) - need} stray bytes after {count} records")
        idx = np.frombuffer(raw, dtype=INDEX_DTYPE, count=count, offset=INDEX_HEADER.size)
        with self._lock:
            self._index = idx
        return idx

    def _addr_map(self) -> dict[int, int]:
        if self._by_addr is None:
            idx = self._load_index()
            self._by_addr = {int(a): i for i, a in enumerate(idx["addr"].tolist())}
        return self._by_addr

    def memory_size(self) -> int:
        """Size of memory.bin as the manifest records it, checked against the
        file (ImageError when missing or of another size)."""
        if self._mem_size is None:
            path = self._file(MEMORY)
            want = (self.manifest["files"].get(MEMORY) or {}).get("size")
            try:
                got = self.dir.stat(MEMORY).st_size
            except FileNotFoundError:
                raise ImageError(f"{path} is missing") from None
            except ImageFileError as e:
                raise ImageError(str(e)) from None
            if want is None:
                raise ImageError(f"{self.path}/{MANIFEST}: no size recorded for {MEMORY}")
            if got < want:
                raise ImageError(f"{path} is truncated: {got} bytes, the manifest says {want}")
            if got != want:
                raise ImageError(f"{path} has {got} bytes, the manifest says {want}")
            self._mem_size = want
        return self._mem_size

    def _memory(self, populate: bool = False, by_range: bool = False):
        """memory.bin mapped read-only (once). populate: where the file is in
        host memory (tmpfs), have the kernel enter its pages before they are
        copied, several times faster than faulting them in while copying
        (measured on the dev VM: 7.7 against 3.9-5.5 GB/s for a copy out of
        a fresh mapping; reading with pread was slower still, 1.3 GB/s);
        elsewhere ask for readahead (MADV_WILLNEED). by_range (read_into,
        $GPUPROXY_IMAGE_POPULATE=1, the default): each copy populates its own
        range first (MADV_POPULATE_READ, on the copying thread) instead of
        the whole file at once: on the H100 machine one MAP_POPULATE of an
        8 GiB image took the first reader 0.4-0.5 s while the 15 others waited
        for it (5.4-8.4 thread-seconds of "reads", restores at 7 GB/s), where
        16 threads copy out of a populated tmpfs mapping at 53-70 GB/s.
        $GPUPROXY_IMAGE_POPULATE=map: the whole file at once; 0: neither."""
        mm = self._mm
        if mm is not None:
            return mm
        size = self.memory_size()
        how = os.environ.get("GPUPROXY_IMAGE_POPULATE", "1").strip().lower()
        populate = populate and how in ("1", "map")
        by_range = by_range and how == "1" and _MADV_POPULATE_READ_OK[0]
        with self._lock:
            if self._mm is None:
                if size == 0:
                    self._mm = b""
                else:
                    self._mm_addr = 0
                    in_memory = populate and _in_memory_fs(self._file(MEMORY))
                    try:
                        mfd = self.dir.open(MEMORY, size=size)     # checked again: the one that is mapped
                    except (ImageFileError, FileNotFoundError) as e:
                        raise ImageError(str(e) if isinstance(e, ImageFileError) else
                                         f"{self._file(MEMORY)} is missing") from None
                    if os.fstat(mfd).st_size != size:
                        os.close(mfd)
                        raise ImageError(f"{self._file(MEMORY)} changed size since it was checked")
                    with os.fdopen(mfd, "rb") as f:
                        if in_memory and by_range:
                            mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
                            self._mm_addr = int(np.frombuffer(mm, np.uint8).ctypes.data)
                            self._mm = mm
                        elif in_memory and hasattr(mmap, "MAP_POPULATE"):
                            self._mm = mmap.mmap(f.fileno(), size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                                                 prot=mmap.PROT_READ)
                        else:
                            self._mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
                            if populate:
                                try:
                                    self._mm.madvise(mmap.MADV_WILLNEED)
                                except (AttributeError, OSError):
                                    pass
            return self._mm

    def chunks(self) -> list[ChunkRef]:
        """Every chunk of the session, resolved, in the order written."""
        if self._refs is None:
            idx = self._load_index()
            refs = []
            files = [img._file(MEMORY) for img in self.chain]
            v1 = self.version == 1
            for a, n, fl, h, off, k, st in zip(idx["addr"].tolist(), idx["length"].tolist(), idx["flags"].tolist(),
                                                idx["hash"].tolist(), idx["offset"].tolist(), idx["image"].tolist(),
                                                idx["stored"].tolist()):
                # version 1: the field is reserved (0) and nothing is compressed
                refs.append(ChunkRef(a, n, fl, h, k, off, files[k] if k < len(files) else "?",
                                     n if v1 else st))
            self._refs = refs
        return self._refs

    def read_chunk(self, ref: ChunkRef, verify: bool = False):
        """The bytes of a chunk (a read-only memoryview into the mapped file).
        verify: also check its gp64 (ImageError on a mismatch)."""
        if not 0 <= ref.image < len(self.chain):
            raise ImageError(f"chunk {ref.addr:#x} refers to ancestor {ref.image}; the chain has "
                             f"{len(self.chain) - 1}")
        img = self.chain[ref.image]
        mm = img._memory()
        n = ref.disk_length
        if ref.offset + n > len(mm):
            raise ImageError(f"{img._file(MEMORY)}: chunk {ref.addr:#x} ({n} bytes at offset "
                             f"{ref.offset}) lies past the end of the file ({len(mm)} bytes)")
        view = memoryview(mm)[ref.offset:ref.offset + n]
        if ref.compressed:
            try:
                view = memoryview(_decompress(view, ref.length))
            except ImageError:
                raise
            except Exception as e:      # zstd's own error, or a wrong size
                raise ImageError(f"{img._file(MEMORY)}: chunk {ref.addr:#x} ({n} compressed bytes at offset "
                                 f"{ref.offset}) does not decompress: {e}") from None
        if verify:
            got = hashing.gp64(view)
            if got != ref.hash:
                raise ImageError(self._hash_problem(ref, got))
        return view

    def read_into(self, ref: ChunkRef, out, verify: bool = False) -> None:
        """A chunk's bytes into out (a writable buffer of ref.length bytes,
        e.g. a slice of page-locked staging memory): copied (numpy, several
        threads may call this at once) out of the file's mapping, populated
        at once where the file is in host memory (_memory), or decompressed
        from it. verify: also check its gp64 (ImageError on a mismatch)."""
        if not 0 <= ref.image < len(self.chain):
            raise ImageError(f"chunk {ref.addr:#x} refers to ancestor {ref.image}; the chain has "
                             f"{len(self.chain) - 1}")
        img = self.chain[ref.image]
        n = ref.disk_length
        mm = img._memory(populate=True, by_range=True)
        if ref.offset + n > len(mm):
            raise ImageError(f"{img._file(MEMORY)}: chunk {ref.addr:#x} ({n} bytes at offset "
                             f"{ref.offset}) lies past the end of the file ({len(mm)} bytes)")
        dst = np.frombuffer(out, np.uint8)
        if dst.size != ref.length:
            raise ValueError(f"read_into: buffer of {dst.size} bytes for a chunk of {ref.length}")
        if img._mm_addr:
            _populate_range(img, ref.offset, n)
        src = memoryview(mm)[ref.offset:ref.offset + n]
        if ref.compressed:
            try:
                dst[:] = np.frombuffer(_decompress(src, ref.length), np.uint8)
            except Exception as e:
                raise ImageError(f"{img._file(MEMORY)}: chunk {ref.addr:#x} ({n} compressed bytes at offset "
                                 f"{ref.offset}) does not decompress: {e}") from None
        else:
            np.copyto(dst, np.frombuffer(src, np.uint8))
        if verify:
            h = hashing.gp64(dst)
            if h != ref.hash:
                raise ImageError(self._hash_problem(ref, h))

    def _hash_problem(self, ref: ChunkRef, got: int) -> str:
        what = "__device__ variable" if ref.is_global else "chunk"
        return (f"{self.chain[ref.image]._file(MEMORY)}: {what} {ref.addr:#x} ({ref.length} bytes at offset "
                f"{ref.offset}) is corrupt: gp64 {_fmt_hash(got)}, the index says {_fmt_hash(ref.hash)}")

    def find(self, addr: int) -> ChunkRef | None:
        """This image's chunk at addr, if any."""
        i = self._addr_map().get(addr)
        return None if i is None else self.chunks()[i]

    def hash_of(self, addr: int) -> int | None:
        """The latest gp64 recorded for chunk addr in this chain (this image
        first, then its ancestors), or None if no image has it."""
        for img in self.chain:
            r = img.find(addr)
            if r is not None:
                return r.hash
        return None

    # -- modules
    def modules(self) -> dict[str, dict]:
        """sha256 -> {"size", "image" (chain index), "file"} of every module."""
        out = {}
        for sha, ent in self.manifest["modules"].items():
            k = ent.get("image", 0)
            f = os.path.join(self.chain[k].path, MODULES, sha + ".bin") if 0 <= k < len(self.chain) else "?"
            out[sha] = {"size": ent.get("size"), "image": k, "file": f}
        return out

    def module(self, sha: str) -> bytes:
        """A module image by its sha256, checked."""
        ent = self.modules().get(sha)
        if ent is None:
            raise ImageError(f"{self.path}: no module {sha} in this image")
        if ent["file"] == "?":
            raise ImageError(f"{self.path}/{MANIFEST}: module {sha} refers to ancestor {ent['image']}; the chain "
                             f"has {len(self.chain) - 1}")
        try:
            data = self.chain[ent["image"]].dir.read(f"{MODULES}/{sha}.bin", size=ent["size"])
        except FileNotFoundError:
            raise ImageError(f"module file {ent['file']} is missing") from None
        except ImageFileError as e:
            raise ImageError(str(e)) from None
        if len(data) != ent["size"]:
            raise ImageError(f"module file {ent['file']} has {len(data)} bytes, the manifest says {ent['size']}")
        got = hashlib.sha256(data).hexdigest()
        if got != sha:
            raise ImageError(f"module file {ent['file']} is corrupt: sha256 {got}")
        return data

    # -- checking
    def _structure(self) -> list[str]:
        """Every structural problem of the image and its chain (no hashing of
        chunk data): index files, file sizes, chunk references, modules."""
        problems: list[str] = []
        ok_images = set()
        for k, img in enumerate(self.chain):
            good = True
            for check in (img._load_index, img.memory_size):
                try:
                    check()
                except ImageError as e:
                    problems.append(str(e))
                    good = False
            if good:
                ok_images.add(k)
        if 0 not in ok_images:
            try:
                self._load_index()
            except ImageError:
                return problems          # nothing more can be checked
        seen: set[int] = set()
        total = stored = 0
        for r in self.chunks():
            where = f"{self._file(INDEX)}: chunk {r.addr:#x}"
            if r.addr in seen:
                problems.append(f"{where} is listed twice")
            seen.add(r.addr)
            total += r.length
            if r.flags & ~(KNOWN_FLAGS if self.version >= 2 else KNOWN_FLAGS_V1):
                problems.append(f"{where} has unknown flags {r.flags:#x}")
            if self.version >= 2 and not r.compressed and r.stored != r.length:
                problems.append(f"{where} is stored uncompressed, but its record says {r.stored} bytes stored "
                                f"for {r.length}")
            if not 0 <= r.image < len(self.chain):
                problems.append(f"{where} refers to ancestor {r.image}; the chain has {len(self.chain) - 1}")
                continue
            if r.image == 0:
                stored += r.length
            if r.image not in ok_images:
                continue                 # its file's problem is reported above
            src = self.chain[r.image]
            size = src.memory_size()
            if r.offset + r.disk_length > size:
                problems.append(f"{src._file(MEMORY)}: chunk {r.addr:#x} ({r.disk_length} bytes at offset "
                                f"{r.offset}) lies past the end of the file ({size} bytes)")
            if r.image > 0:
                own = src.find(r.addr)
                if own is None or own.image != 0 or own.offset != r.offset or own.length != r.length \
                        or own.hash != r.hash or own.disk_length != r.disk_length \
                        or own.compressed != r.compressed:
                    problems.append(f"{where} refers to ancestor {src.path}, which does not store that chunk "
                                    f"with gp64 {_fmt_hash(r.hash)} at offset {r.offset}")
        mem = self.manifest.get("memory") or {}
        if mem.get("chunks") != len(self.chunks()) or mem.get("bytes") != total or mem.get("stored_bytes") != stored:
            problems.append(f"{self._file(INDEX)} lists {len(self.chunks())} chunks, {total} bytes ({stored} "
                            f"stored here); the manifest says {mem.get('chunks')} chunks, {mem.get('bytes')} "
                            f"bytes ({mem.get('stored_bytes')} stored here)")
        for sha, ent in self.modules().items():
            if ent["file"] == "?":
                problems.append(f"{self.path}/{MANIFEST}: module {sha} refers to ancestor {ent['image']}; the "
                                f"chain has {len(self.chain) - 1}")
                continue
            try:
                size = self.chain[ent["image"]].dir.stat(f"{MODULES}/{sha}.bin").st_size
            except FileNotFoundError:
                problems.append(f"module file {ent['file']} is missing")
                continue
            except ImageFileError as e:
                problems.append(str(e))
                continue
            if size != ent["size"]:
                problems.append(f"module file {ent['file']} has {size} bytes, the manifest says {ent['size']}")
        return problems

    def check_restorable(self, gpuproxy_version: str | None = None, allow_pre_dump: bool = False,
                         deep: bool = False) -> None:
        """Checks that a restore from this image can succeed, before anything
        is restored; ImageError naming the problems otherwise. By default
        structural only (fast: no chunk data is read): manifests, parents,
        chunks.idx, file sizes, every chunk's data inside its file, module
        files present. deep: also re-hash every chunk and module (what
        verify() does; costs a read of all the image's data).
        gpuproxy_version: also refuse an image written by another version.
        A pre-dump image is refused unless allow_pre_dump: its memory was
        copied while the program ran, so it is not a consistent state."""
        problems = []
        if self.kind != "dump" and not allow_pre_dump:
            problems.append(f"{self.path} is a {self.kind} image (memory copied while the program ran); "
                            f"restore needs a dump")
        if gpuproxy_version is not None and self.manifest.get("gpuproxy_version") != gpuproxy_version:
            problems.append(f"{self.path} was written by gpuproxy {self.manifest.get('gpuproxy_version')}, "
                            f"this is gpuproxy {gpuproxy_version}")
        problems += self.verify(deep=deep)
        if problems:
            raise ImageError(_summarise(problems))

    def verify(self, deep: bool = True, progress=None, workers: int | None = None) -> list[str]:
        """Problems with the image and its chain, [] when it is sound.
        Structural checks always; deep: also re-hash every chunk this image
        uses (its own and its ancestors') and every module.
        progress(done_bytes, total_bytes) is called as chunks are hashed."""
        problems = self._structure()
        if not deep:
            return problems
        try:
            refs = self.chunks()
        except ImageError:
            return problems
        readable = []
        for r in refs:
            if 0 <= r.image < len(self.chain):
                try:
                    if r.offset + r.disk_length <= self.chain[r.image].memory_size():
                        readable.append(r)
                except ImageError:
                    pass
        total = sum(r.length for r in readable)
        done = 0

        def check(r: ChunkRef):
            try:
                got = hashing.gp64(self.read_chunk(r))
            except ImageError as e:        # a compressed chunk whose frame is damaged
                return str(e)
            return None if got == r.hash else self._hash_problem(r, got)

        workers = workers or min(8, os.cpu_count() or 1)
        with ThreadPoolExecutor(max_workers=workers) as ex:
            for r, bad in zip(readable, ex.map(check, readable)):
                if bad:
                    problems.append(bad)
                done += r.length
                if progress is not None:
                    progress(done, total)
        for sha, ent in self.modules().items():
            if ent["file"] == "?":
                continue                 # reported by _structure
            try:
                got = hashlib.sha256(self.chain[ent["image"]].dir.read(f"{MODULES}/{sha}.bin",
                                                                       size=ent["size"])).hexdigest()
            except (FileNotFoundError, ImageFileError):
                continue                 # reported by _structure
            if got != sha:
                problems.append(f"module file {ent['file']} is corrupt: sha256 {got}")
        return problems


_MEMFS = ("tmpfs", "ramfs", "hugetlbfs")


# madvise(2) MADV_POPULATE_READ (Linux 5.14): enters a range's pages for
# reading. Called through ctypes, which releases the GIL, so that reader
# threads populate in parallel. [True] until the kernel refuses it once.
_MADV_POPULATE_READ = 22
_MADV_POPULATE_READ_OK = [True]
_libc = None


def _populate_range(img: "Image", off: int, n: int):
    global _libc
    if not _MADV_POPULATE_READ_OK[0] or n <= 0:
        return
    if _libc is None:
        import ctypes
        lib = ctypes.CDLL(None, use_errno=True)
        lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.madvise.restype = ctypes.c_int
        _libc = lib
    a = img._mm_addr + off
    lo = a - a % PAGE
    hi = a + n
    if _libc.madvise(lo, hi - lo, _MADV_POPULATE_READ) != 0:
        import ctypes
        if ctypes.get_errno() in (22, 95):      # EINVAL, EOPNOTSUPP: an older kernel; copies fault pages in
            _MADV_POPULATE_READ_OK[0] = False


def _in_memory_fs(path: str) -> bool:
    """Whether path lies on a filesystem kept in host memory (tmpfs: /dev/shm),
    by the longest matching mount point of /proc/self/mountinfo."""
    try:
        real = os.path.realpath(path)
        best, fstype = "", ""
        with open("/proc/self/mountinfo") as f:
            for line in f:
                parts = line.split()
                if " - " not in line or len(parts) < 5:
                    continue
                mnt = parts[4].replace("\\040", " ")
                typ = line.split(" - ", 1)[1].split()[0]
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, fstype = mnt, typ
        return fstype in _MEMFS
    except OSError:
        return False


def _summarise(problems: list[str], limit: int = 5) -> str:
    if len(problems) == 1:
        return problems[0]
    more = f"; and {len(problems) - limit} more" if len(problems) > limit else ""
    return f"{len(problems)} problems: " + "; ".join(problems[:limit]) + more


# ------------------------------------------------------------------ writing

class ImageWriter:
    """Writes one image. Chunk data goes to memory.bin as it is added; the
    index and then the manifest are written by finish(), each through a
    temporary file, fsync and rename, so a directory whose dump did not
    finish has no manifest and is refused by Image.open.

    meta: manifest fields, usually gpuproxy_version, backend, devices,
    driver_version (others are stored too; the writer's own fields, see
    _RESERVED, may not be set). parent: the Image (or its path) this one is
    incremental on; only chunks added with add_chunk are stored here."""

    def __init__(self, path, kind: str, meta: dict | None = None, parent: "Image | str | None" = None,
                 chunk_size: int = 2 << 20, seal_key: bytes | None = None, owner: tuple[int, int] | None = None,
                 compress: str | None = None, direct: bool | None = None):
        if kind not in KINDS:
            raise ValueError(f"image kind must be one of {KINDS}, got {kind!r}")
        meta = dict(meta or {})
        bad = [k for k in meta if k in _RESERVED]
        if bad:
            raise ValueError(f"meta may not set {bad}: the writer fills them in")
        self.path = os.path.abspath(os.fspath(path))
        if parent is not None and not isinstance(parent, Image):
            parent = Image.open(parent)
        self.parent = parent
        if os.path.exists(os.path.join(self.path, MANIFEST)):
            raise ImageError(f"{self.path} already holds an image; write the new one to another directory")
        _private_dir(self.path)
        _private_dir(os.path.join(self.path, MODULES))
        self.seal_key = seal_key
        self.owner = owner          # (uid, gid) that the finished image is given (a root dump of a user's session)
        for stale in (INDEX, INDEX + ".tmp", MANIFEST + ".tmp", SEAL, SEAL + ".tmp"):
            try:
                os.unlink(os.path.join(self.path, stale))
            except FileNotFoundError:
                pass
        from .. import __version__
        self.meta = {"gpuproxy_version": __version__, "backend": None, "devices": [], "driver_version": None}
        self.meta.update(meta)
        self.kind = kind
        self.chunk_size = int(chunk_size)
        self.created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")
        self.compress = parse_compress(compress)
        self._zstats = [0, 0, 0]     # chunks compressed, their bytes, their stored bytes
        # O_DIRECT for the page-aligned bulk of memory.bin (add_chunks): no
        # copy into the page cache, which on a disk is what limits a large
        # write; None: $GPUPROXY_IMAGE_DIRECT (1/0), default off. Filesystems
        # without it (tmpfs) fall back to ordinary writes.
        if direct is None:
            direct = os.environ.get("GPUPROXY_IMAGE_DIRECT", "0") == "1"
        self.direct = bool(direct) and hasattr(os, "O_DIRECT")
        self._dfd: int | None = None
        self.write_stats: dict = {}
        self._mem = _create(os.path.join(self.path, MEMORY))
        self._off = 0
        self._records: list[tuple] = []
        self._addrs: set[int] = set()
        self._modules: dict[str, dict] = {}
        self._done = False

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()

    # -- content
    def add_module(self, data) -> str:
        """Stores a module image (once per content; an ancestor's copy is
        reused) and returns its key, the sha256 hex of its bytes."""
        self._check_open()
        data = bytes(data)
        sha = hashlib.sha256(data).hexdigest()
        if sha in self._modules:
            return sha
        if self.parent is not None:
            ent = self.parent.modules().get(sha)
            if ent is not None and ent["file"] != "?" and ent["size"] == len(data) and \
                    os.path.isfile(ent["file"]) and os.stat(ent["file"]).st_size == len(data):
                self._modules[sha] = {"size": len(data), "image": ent["image"] + 1}
                return sha
        _write_file_atomic(os.path.join(self.path, MODULES, sha + ".bin"), data)
        self._modules[sha] = {"size": len(data), "image": 0}
        return sha

    def _check_key(self, addr: int, flags: int) -> None:
        self._check_open()
        if not 0 <= addr < 1 << 64:
            raise ValueError(f"chunk address {addr:#x} does not fit in 64 bits")
        if flags & ~KNOWN_FLAGS or flags < 0:
            raise ValueError(f"chunk {addr:#x}: unknown flags {flags:#x}")
        if addr in self._addrs:
            raise ImageError(f"chunk {addr:#x} added twice")

    def add_chunk(self, addr: int, data, hash: int | None = None, flags: int = 0) -> ChunkRef:
        """Stores data (any contiguous buffer) as the chunk at addr. hash: its
        gp64 if already known (not re-checked here; verify() would find a
        wrong one), else computed."""
        self._check_key(addr, flags)
        u8 = hashing.as_u8(data)
        n = u8.size
        if n > MAX_CHUNK:
            raise ValueError(f"chunk {addr:#x}: {n} bytes, at most {MAX_CHUNK} per chunk")
        h = hashing.gp64(u8) if hash is None else int(hash)
        body, flags = self._maybe_compress(u8, flags)
        stored = len(body)
        align = PAGE if stored >= PAGE and not flags & FLAG_ZSTD else 8
        pad = -self._off % align
        if pad:
            self._write(bytes(pad))
        off = self._off
        if stored:
            self._write(memoryview(body))
        self._addrs.add(addr)
        self._records.append((addr, n, flags, h, off, 0, stored))
        return ChunkRef(addr, n, flags, h, 0, off, os.path.join(self.path, MEMORY), stored)

    # chunks smaller than this are stored as they are
    MIN_COMPRESS = 512

    def _maybe_compress(self, u8, flags: int):
        """(bytes to store, flags): the zstd frame of u8 when compression is
        on and saves at least 1/16 of it, else u8 itself (incompressible
        data costs one compression attempt, never more space or a slower
        restore)."""
        if flags & FLAG_ZSTD:
            raise ValueError("flags: FLAG_ZSTD is the writer's own; add chunks uncompressed")
        n = u8.size
        if self.compress is None or n < self.MIN_COMPRESS:
            return u8, flags
        z = _compressor(self.compress[1]).compress(memoryview(u8))
        if len(z) > n - n // 16:
            return u8, flags
        return z, flags | FLAG_ZSTD

    # a write job of add_chunks covers at most this much (several jobs in flight)
    WRITE_JOB = 16 << 20

    def add_chunks(self, items, workers: int = 4) -> list[ChunkRef]:
        """Stores many chunks at once: items of (addr, data, hash, flags).
        Missing hashes and compression are computed chunk by chunk on
        `workers` threads (gp64 and zstd release the GIL); then offsets are
        laid out and the bytes written by the same threads with pwritev, in
        jobs of up to WRITE_JOB bytes that are contiguous in the file (one
        large write instead of many small ones), page-aligned ones through
        O_DIRECT when asked for. Writing a large dump is memory-copy bound,
        and one thread leaves most of the machine idle."""
        import time as _time
        t0 = _time.monotonic()
        plan = []
        for addr, data, h, flags in items:
            self._check_key(addr, flags)
            u8 = hashing.as_u8(data)
            if u8.size > MAX_CHUNK:
                raise ValueError(f"chunk {addr:#x}: {u8.size} bytes, at most {MAX_CHUNK} per chunk")
            if flags & FLAG_ZSTD:
                raise ValueError("flags: FLAG_ZSTD is the writer's own; add chunks uncompressed")
            self._addrs.add(addr)
            plan.append((addr, u8, flags, h))

        def prep(job):
            addr, u8, flags, h = job
            h = hashing.gp64(u8) if h is None else int(h)
            body, flags = self._maybe_compress(u8, flags)
            return addr, body, u8.size, flags, h

        workers = max(1, workers)
        with ThreadPoolExecutor(workers) as ex:
            prepped = list(ex.map(prep, plan)) if (self.compress or any(j[3] is None for j in plan)) \
                else [(a, u8, u8.size, fl, int(h)) for a, u8, fl, h in plan]
            t1 = _time.monotonic()
            off = self._off
            recs, segs = [], []
            for addr, body, n, flags, h in prepped:
                stored = len(body) if not isinstance(body, np.ndarray) else body.size
                align = PAGE if stored >= PAGE and not flags & FLAG_ZSTD else 8
                off += -off % align
                recs.append((addr, n, flags, h, off, 0, stored))
                if stored:
                    segs.append((off, memoryview(body).cast("B") if not isinstance(body, np.ndarray)
                                 else memoryview(body)))
                off += stored
                if flags & FLAG_ZSTD:
                    self._zstats[0] += 1
                    self._zstats[1] += n
                    self._zstats[2] += stored
            fd = self._mem.fileno()
            os.ftruncate(fd, off)
            mode = self._write_mode()
            t_alloc = _time.monotonic()
            if os.environ.get("GPUPROXY_IMAGE_FALLOCATE", "0") == "1" and off > self._off:
                self._fallocate(ex, fd, self._off, off - self._off, workers)
            ws = self.write_stats
            ws["fallocate_ms"] = ws.get("fallocate_ms", 0) + round((_time.monotonic() - t_alloc) * 1000, 3)
            if mode == "mmap" and off > self._off:
                # a page of a mapping that finds the filesystem full is a
                # SIGBUS: reserve first, or write without a mapping (space.py)
                from . import space
                t_res = _time.monotonic()
                try:
                    space.reserve(ex, fd, self._off, off - self._off, workers, os.path.join(self.path, MEMORY), PAGE)
                except space.CannotReserve:
                    mode = "pwrite"
                except OSError:
                    self.abort()        # nothing partial stays behind that could pass for an image
                    raise
                ws["fallocate_ms"] = ws.get("fallocate_ms", 0) + round((_time.monotonic() - t_res) * 1000, 3)
            if mode == "mmap" and off > self._off:
                jobs = self._put_mapped(ex, fd, off, segs)
            else:
                jobs = self._write_jobs(segs)
                try:
                    list(ex.map(self._put, jobs))
                except OSError:
                    self.abort()        # a full disk: as above
                    raise
            ws["mode"] = mode
        self._off = off
        os.lseek(fd, off, os.SEEK_SET)
        t2 = _time.monotonic()
        ws = self.write_stats
        ws["prepare_ms"] = ws.get("prepare_ms", 0) + round((t1 - t0) * 1000, 3)
        ws["write_ms"] = ws.get("write_ms", 0) + round((t2 - t1) * 1000, 3)
        ws["written_bytes"] = ws.get("written_bytes", 0) + sum(len(m) for _, m in segs)
        ws["write_jobs"] = ws.get("write_jobs", 0) + len(jobs)
        ws["direct_jobs"] = ws.get("direct_jobs", 0) + (sum(1 for j in jobs if j[0]) if mode == "pwrite" else 0)
        ws["workers"] = workers
        out = []
        for rec in recs:
            self._records.append(rec)
            addr, n, flags, h, o, _, stored = rec
            out.append(ChunkRef(addr, n, flags, h, 0, o, os.path.join(self.path, MEMORY), stored))
        return out

    # a piece of a mapped write: the unit handed to one thread
    MAP_PIECE = 4 << 20

    def _write_mode(self) -> str:
        """How add_chunks stores bytes: "pwrite" (pwritev jobs, O_DIRECT
        where asked) or "mmap" (copies into a shared mapping of memory.bin).
        $GPUPROXY_IMAGE_WRITE_MODE: auto (default: mmap for a file in host
        memory such as /dev/shm, pwrite elsewhere), pwrite or mmap.
        Why mmap is offered: on tmpfs a write(2) holds the file's inode lock
        for the whole call (mm/shmem.c, shmem_file_write_iter), so parallel
        pwritev jobs on one file run one at a time, bound by one thread
        allocating and copying fresh pages, while page faults on a shared
        mapping allocate pages for several threads at once. Measured on the
        H100 host (16 cores, 2026-11-24, bench/checkpoint_bench.py ckptvar,
        8 GiB to /dev/shm, four pairs of runs): mmap 2.28-2.43 s against
        pwrite 3.77-4.10 s, so auto picks mmap on in-memory filesystems. On
        the 2-core dev VM faults cost more than the lock (mapped 0.6-0.9
        GB/s against pwrite 1.2-1.9 GB/s for 512 MiB); disks keep pwrite
        (and O_DIRECT where asked), not measured mapped."""
        m = os.environ.get("GPUPROXY_IMAGE_WRITE_MODE", "auto").strip().lower() or "auto"
        if m not in ("auto", "pwrite", "mmap"):
            raise ImageError(f"GPUPROXY_IMAGE_WRITE_MODE={m!r}: expected auto, pwrite or mmap")
        if m == "auto":
            m = "mmap" if _in_memory_fs(self.path) else "pwrite"
        return m

    def _put_mapped(self, ex, fd: int, size: int, segs) -> list:
        """segs copied into memory.bin through a shared mapping of the file
        (already truncated to size), in pieces of MAP_PIECE on the writer
        threads (numpy copies release the GIL); flushed (msync) where the
        file is not in host memory. Returns the pieces (jobs)."""
        # the writer's descriptor is write-only; a mapping needs one open for reading too
        rw = os.open(os.path.join(self.path, MEMORY), os.O_RDWR | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
        try:
            mm = mmap.mmap(rw, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(rw)
        try:
            jobs = [(o + k, mv[k:k + self.MAP_PIECE]) for o, mv in segs for k in range(0, len(mv), self.MAP_PIECE)]

            def put(job):
                o, mv = job
                np.copyto(np.frombuffer(mm, np.uint8, len(mv), o), np.frombuffer(mv, np.uint8))
            list(ex.map(put, jobs))
            if not _in_memory_fs(os.path.join(self.path, MEMORY)):
                mm.flush()
        finally:
            try:
                mm.close()
            except BufferError:       # a view outlived its copy; the mapping goes when it does
                pass
        return jobs

    def _fallocate(self, ex, fd: int, off: int, n: int, workers: int) -> None:
        """Allocates [off, off+n) of memory.bin before it is written
        ($GPUPROXY_IMAGE_FALLOCATE=1), in one range per writer thread: a
        measurement knob for tmpfs, where writes are bound by allocating
        fresh pages. A filesystem that cannot (EOPNOTSUPP) is left alone."""
        per = -(-n // max(1, workers))
        per += -per % PAGE

        def one(lo):
            try:
                os.posix_fallocate(fd, lo, min(per, off + n - lo))
            except OSError:
                pass
        list(ex.map(one, range(off, off + n, per)))

    def _direct_fd(self) -> int | None:
        """memory.bin opened again with O_DIRECT, or None where the
        filesystem refuses it (tmpfs: EINVAL); then writes go through the
        ordinary descriptor."""
        if not self.direct:
            return None
        if self._dfd is None:
            try:
                self._dfd = os.open(os.path.join(self.path, MEMORY), os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
            except OSError:
                self.direct = False
                return None
        return self._dfd

    def _write_jobs(self, segs):
        """(direct, file offset, [views]) jobs: runs of segments that follow
        each other in the file, cut at WRITE_JOB bytes and at 1024 views
        (IOV_MAX); with O_DIRECT, page-aligned segments (address, offset and
        length) form jobs of their own."""
        dfd = self._direct_fd()
        jobs = []
        for o, mv in segs:
            d = bool(dfd is not None and o % PAGE == 0 and len(mv) % PAGE == 0 and
                     np.frombuffer(mv, np.uint8).ctypes.data % PAGE == 0)
            if jobs:
                jd, jo, jv, jn = jobs[-1]
                if jd == d and jo + jn == o and jn + len(mv) <= self.WRITE_JOB and len(jv) < 1024:
                    jv.append(mv)
                    jobs[-1][3] = jn + len(mv)
                    continue
            jobs.append([d, o, [mv], len(mv)])
        return [(d, o, v) for d, o, v, _ in jobs]

    def _put(self, job) -> None:
        direct, o, views = job
        fd = self._dfd if direct else self._mem.fileno()
        views = list(views)
        while views:
            k = os.pwritev(fd, views, o)
            if k <= 0:
                raise ImageError(f"{self.path}/{MEMORY}: write returned {k} at offset {o}")
            o += k
            while views and k >= len(views[0]):
                k -= len(views[0])
                views.pop(0)
            if k:
                views[0] = views[0][k:]

    def _write(self, mv) -> None:
        mv = memoryview(mv)
        while len(mv):
            k = self._mem.write(mv)
            mv = mv[k:]
            self._off += k

    def add_unchanged(self, addr: int, length: int, hash: int, flags: int = 0) -> ChunkRef:
        """Records the chunk at addr as unchanged: its bytes are those an
        ancestor stores for addr with this length and gp64. ImageError if no
        image of the parent chain has it."""
        self._check_key(addr, flags)
        if self.parent is None:
            raise ImageError(f"chunk {addr:#x}: add_unchanged needs a parent image")
        hash = int(hash)
        seen = []
        for d, img in enumerate(self.parent.chain):
            r = img.find(addr)
            if r is None:
                continue
            if r.hash == hash and r.length == length:
                k = d + 1 + r.image
                flags |= r.flags & FLAG_ZSTD       # read the ancestor's bytes as it stores them
                self._addrs.add(addr)
                self._records.append((addr, length, flags, hash, r.offset, k, r.disk_length))
                return ChunkRef(addr, length, flags, hash, k, r.offset,
                                os.path.join(self.parent.chain[k - 1].path, MEMORY), r.disk_length)
            seen.append(f"{img.path} has it with {r.length} bytes, gp64 {_fmt_hash(r.hash)}")
        raise ImageError(f"chunk {addr:#x} ({length} bytes, gp64 {_fmt_hash(hash)}) is in no image of the parent "
                         f"chain" + (f" ({'; '.join(seen)})" if seen else ""))

    # -- finishing
    def _check_open(self):
        if self._done:
            raise ImageError(f"{self.path}: the image is already finished or aborted")

    def finish(self, session: dict, stats: dict | None = None) -> Image:
        """Writes chunks.idx, then the manifest, and returns the image opened."""
        self._check_open()
        recs = np.array(self._records, dtype=INDEX_DTYPE) if self._records else np.zeros(0, INDEX_DTYPE)
        index = INDEX_HEADER.pack(INDEX_MAGIC, INDEX_VERSION, len(recs)) + recs.tobytes()
        here = recs["image"] == 0
        glob = (recs["flags"] & FLAG_GLOBAL) != 0
        body = dict(self.meta)
        body.update({
            "format_version": FORMAT_VERSION,
            "kind": self.kind,
            "created": self.created,
            "parent": None,
            "ancestors": [],
            "chunk_size": self.chunk_size,
            "hash": HASH_NAME,
            "session": session,
            "stats": stats or {},
            "modules": self._modules,
            "memory": {
                "chunks": int(len(recs)),
                "bytes": int(recs["length"].sum(dtype=np.uint64)),
                "stored_chunks": int(here.sum()),
                "stored_bytes": int(recs["length"][here].sum(dtype=np.uint64)),
                "referenced_chunks": int((~here).sum()),
                "referenced_bytes": int(recs["length"][~here].sum(dtype=np.uint64)),
                "global_chunks": int(glob.sum()),
                "global_bytes": int(recs["length"][glob].sum(dtype=np.uint64)),
            },
            "files": {INDEX: {"size": len(index), "sha256": hashlib.sha256(index).hexdigest()},
                      MEMORY: {"size": self._off}},
        })
        if self.parent is not None:
            body["parent"] = {"path": os.path.relpath(self.parent.path, self.path),
                              "manifest_sha256": self.parent.digest}
            body["ancestors"] = [a.digest for a in self.parent.chain]
        try:
            manifest = encode_manifest(body)
        except (TypeError, ValueError) as e:
            raise ImageError(f"{self.path}: session or stats cannot be stored as JSON: {e}") from None
        if self.compress is not None:
            body["compression"] = {"codec": self.compress[0], "level": self.compress[1],
                                   "chunks": self._zstats[0], "bytes": self._zstats[1],
                                   "stored_bytes": self._zstats[2]}
            try:
                manifest = encode_manifest(body)
            except (TypeError, ValueError) as e:
                raise ImageError(f"{self.path}: session or stats cannot be stored as JSON: {e}") from None
        if not self._mem.closed:
            os.fsync(self._mem.fileno())
            self._mem.close()
        if self._dfd is not None:
            os.close(self._dfd)
            self._dfd = None
        _fsync_dir(os.path.join(self.path, MODULES))
        _write_file_atomic(os.path.join(self.path, INDEX), index)
        if self.seal_key is not None:
            from ..core.keys import key_id
            digest = hashlib.sha256(manifest[manifest.index(b"\n") + 1:manifest.rindex(b"\nsha256 ")]).hexdigest()
            _write_file_atomic(os.path.join(self.path, SEAL), f"{SEAL_ALGO} {key_id(self.seal_key)} "
                                                               f"{seal_of(self.seal_key, digest)}\n".encode())
        if self.owner is not None:
            self._give_away()
        _write_file_atomic(os.path.join(self.path, MANIFEST), manifest)
        if self.owner is not None:
            os.chown(os.path.join(self.path, MANIFEST), *self.owner)
        _fsync_dir(self.path)
        self._done = True
        return Image.open(self.path)

    def _give_away(self) -> None:
        """Hands this image's files to self.owner (no symlinks followed: the
        directory is ours and 0700 while we write it)."""
        uid, gid = self.owner
        for name in (MEMORY, INDEX, SEAL):
            p = os.path.join(self.path, name)
            if os.path.exists(p):
                os.chown(p, uid, gid, follow_symlinks=False)
        for sha, ent in self._modules.items():
            if ent["image"] == 0:
                os.chown(os.path.join(self.path, MODULES, sha + ".bin"), uid, gid, follow_symlinks=False)
        os.chown(os.path.join(self.path, MODULES), uid, gid, follow_symlinks=False)
        os.chown(self.path, uid, gid, follow_symlinks=False)

    def abort(self) -> None:
        """Gives up: closes and removes what was written (no manifest exists)."""
        if self._done:
            return
        self._done = True
        self._mem.close()
        if self._dfd is not None:
            os.close(self._dfd)
            self._dfd = None
        for name in (MEMORY, INDEX, INDEX + ".tmp", MANIFEST + ".tmp", SEAL, SEAL + ".tmp"):
            try:
                os.unlink(os.path.join(self.path, name))
            except FileNotFoundError:
                pass
        for sha, ent in self._modules.items():
            if ent["image"] == 0:
                try:
                    os.unlink(os.path.join(self.path, MODULES, sha + ".bin"))
                except FileNotFoundError:
                    pass
