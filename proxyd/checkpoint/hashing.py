"""gp64, the chunk hash of checkpoint images, on the CPU.

Definition (docs/image-format.md): pad the n bytes with zeros to a multiple
of 8, read little-endian u64 words w[0..m-1]; modulo 2^64,

    mix(x) = splitmix64 finaliser (shifts 30/27/31, multipliers below)
    gp64   = mix( (sum over i of mix(w[i] ^ (i * 0x9E3779B97F4A7C15))) ^ n )

The words are combined by a sum, so the GPU can hash a chunk with any number
of threads (proxyd/native/gp64.cu) and get the same value as these versions:

  gp64(data) -> int                      C when available, else numpy
  gp64_many(buf, chunk_size) -> ndarray  hashes of consecutive chunks of buf
  gp64_numpy / gp64_many_numpy           the numpy versions (bounded memory)
  gp64_reference(data)                   tiny pure-Python version, for tests
  load_c_hasher(path) -> CHasher | None  gp64.c compiled into a shared
                                         library, through cffi in ABI mode

The C version is used when a compiled copy can be loaded: $GPUPROXY_GP64_LIB
if set (empty: never use C), else proxyd's helper library libgpxd.so next to
the gpuproxy.proxyd package (autogen/build.py compiles gp64.c into it). A
library that does not export gp64 or gives a wrong answer on a known-answer
test is ignored. `implementation()` says which one is in use.

Inputs may be bytes, bytearray, memoryview (C-contiguous, any format) or a
numpy array (made contiguous; hashed as its raw bytes). All functions are
thread-safe; the C and numpy versions release the GIL while they work.
"""
from __future__ import annotations

import os
import threading

import numpy as np

STEP = 0x9E3779B97F4A7C15
M1 = 0xBF58476D1CE4E5B9
M2 = 0x94D049BB133111EB
MASK = (1 << 64) - 1

# numpy works on slices of this many words at a time (512 KiB: scratch stays
# in cache and memory use is bounded whatever the input size)
SLICE_WORDS = 1 << 16


# ------------------------------------------------------------- reference

def _mix_int(x: int) -> int:
    x ^= x >> 30
    x = (x * M1) & MASK
    x ^= x >> 27
    x = (x * M2) & MASK
    x ^= x >> 31
    return x


def gp64_reference(data) -> int:
    """Straight from the definition; slow, for tests."""
    b = bytes(as_u8(data))
    n = len(b)
    b += bytes(-n % 8)
    acc = 0
    for i in range(len(b) // 8):
        w = int.from_bytes(b[8 * i:8 * i + 8], "little")
        acc = (acc + _mix_int(w ^ ((i * STEP) & MASK))) & MASK
    return _mix_int(acc ^ n)


# ----------------------------------------------------------------- numpy

_U_STEP = np.uint64(STEP)
_U_M1 = np.uint64(M1)
_U_M2 = np.uint64(M2)
_tables: dict[int, np.ndarray] = {}
_local = threading.local()


def as_u8(data) -> np.ndarray:
    """A flat read-only uint8 view of data's bytes (no copy when possible)."""
    if isinstance(data, np.ndarray):
        a = np.ascontiguousarray(data)
        return a.reshape(-1).view(np.uint8)
    mv = memoryview(data)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return np.frombuffer(mv, dtype=np.uint8)


def _index_table(m: int) -> np.ndarray:
    """i * STEP for i < m (mod 2^64)."""
    t = _tables.get(m)
    if t is None:
        t = np.arange(m, dtype=np.uint64)
        t *= _U_STEP
        _tables[m] = t
    return t


def _scratch(m: int) -> tuple[np.ndarray, np.ndarray]:
    s = getattr(_local, "scratch", None)
    if s is None or s[0].size < m:
        s = (np.empty(m, np.uint64), np.empty(m, np.uint64))
        _local.scratch = s
    return s[0][:m], s[1][:m]


def _mix_inplace(x: np.ndarray, t: np.ndarray) -> None:
    np.right_shift(x, 30, out=t)
    x ^= t
    x *= _U_M1
    np.right_shift(x, 27, out=t)
    x ^= t
    x *= _U_M2
    np.right_shift(x, 31, out=t)
    x ^= t


def _words(u8: np.ndarray) -> tuple[np.ndarray, int]:
    """Full little-endian words of u8 and the zero-padded tail word (0 if none)."""
    n = u8.size
    full = n // 8
    w = u8[:full * 8].view("<u8")
    tail = 0
    if n % 8:
        tail = int.from_bytes(u8[full * 8:].tobytes() + bytes(8 - n % 8), "little")
    return w, tail


def _sum_mixed(w: np.ndarray, first: int) -> int:
    """sum of mix(w[j] ^ ((first + j) * STEP)) over w, mod 2^64."""
    acc = 0
    base = _index_table(SLICE_WORDS)
    for s in range(0, w.size, SLICE_WORDS):
        part = w[s:s + SLICE_WORDS]
        m = part.size
        x, t = _scratch(m)
        # (first + s + j) * STEP = j * STEP + (first + s) * STEP
        np.add(base[:m], np.uint64(((first + s) * STEP) & MASK), out=x)
        x ^= part
        _mix_inplace(x, t)
        acc += int(x.sum(dtype=np.uint64))
    return acc & MASK


def gp64_numpy(data) -> int:
    u8 = as_u8(data)
    n = u8.size
    w, tail = _words(u8)
    acc = _sum_mixed(w, 0)
    if n % 8:
        acc = (acc + _mix_int(tail ^ ((w.size * STEP) & MASK))) & MASK
    return _mix_int(acc ^ n)


def gp64_many_numpy(buf, chunk_size: int) -> np.ndarray:
    u8 = as_u8(buf)
    n = u8.size
    chunk_size = _check_chunk(chunk_size)
    count = -(-n // chunk_size)
    out = np.empty(count, dtype=np.uint64)
    nfull = n // chunk_size
    cw = chunk_size // 8
    if chunk_size % 8 or cw >= SLICE_WORDS // 4 or nfull == 0:
        # big chunks (per-chunk overhead is nothing) or not word-aligned
        for j in range(count):
            out[j] = gp64_numpy(u8[j * chunk_size:(j + 1) * chunk_size])
        return out
    # small word-aligned chunks: a block of rows at a time, one row per chunk
    words = u8[:nfull * chunk_size].view("<u8").reshape(nfull, cw)
    table = _index_table(cw)
    rows = max(1, SLICE_WORDS // cw)
    for r in range(0, nfull, rows):
        blk = words[r:r + rows]
        x, t = _scratch(blk.size)
        x = x.reshape(blk.shape)
        t = t.reshape(blk.shape)
        np.bitwise_xor(blk, table, out=x)
        _mix_inplace(x, t)
        s = x.sum(axis=1, dtype=np.uint64)
        s ^= np.uint64(chunk_size)
        t1 = np.empty_like(s)
        _mix_inplace(s, t1)
        out[r:r + blk.shape[0]] = s
    if count > nfull:
        out[nfull] = gp64_numpy(u8[nfull * chunk_size:])
    return out


def _check_chunk(chunk_size) -> int:
    chunk_size = int(chunk_size)
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    return chunk_size


# --------------------------------------------------------------------- C

_CDEF = """
uint64_t gp64(const void *p, size_t n);
void gp64_many(const void *p, size_t n, size_t chunk, uint64_t *out);
"""


class CHasher:
    """gp64.c in a shared library. Call it like gp64; .many like gp64_many."""

    def __init__(self, ffi, lib, path: str):
        self._ffi, self._lib, self.path = ffi, lib, path

    def __call__(self, data) -> int:
        u8 = as_u8(data)
        if u8.size == 0:
            return int(self._lib.gp64(self._ffi.NULL, 0))
        return int(self._lib.gp64(self._ffi.from_buffer(u8), u8.size))

    def many(self, buf, chunk_size: int) -> np.ndarray:
        u8 = as_u8(buf)
        chunk_size = _check_chunk(chunk_size)
        out = np.empty(-(-u8.size // chunk_size), dtype=np.uint64)
        if u8.size:
            self._lib.gp64_many(self._ffi.from_buffer(u8), u8.size, chunk_size,
                                self._ffi.cast("uint64_t *", out.ctypes.data))
        return out

    def __repr__(self):
        return f"CHasher({self.path!r})"


def _known_answers():
    rng = np.random.default_rng(1)
    for n in (0, 1, 7, 8, 9, 63, 100):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        yield data, gp64_reference(data)


def load_c_hasher(path) -> CHasher | None:
    """The gp64 of the shared library at path, or None when it cannot be
    loaded, lacks the gp64 symbols, or fails the known-answer test."""
    if not path or not os.path.exists(path):
        return None
    try:
        from cffi import FFI
        ffi = FFI()
        ffi.cdef(_CDEF)
        lib = ffi.dlopen(os.fspath(path))
        h = CHasher(ffi, lib, os.fspath(path))
        for data, want in _known_answers():
            if h(data) != want:
                return None
        if list(h.many(bytes(range(40)), 16)) != [gp64_reference(bytes(range(16))),
                                                  gp64_reference(bytes(range(16, 32))),
                                                  gp64_reference(bytes(range(32, 40)))]:
            return None
        return h
    except Exception:      # no cffi, not a library, symbol missing, ...
        return None


def default_library_paths() -> list[str]:
    env = os.environ.get("GPUPROXY_GP64_LIB")
    if env is not None:
        return [env] if env else []
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # .../gpuproxy/proxyd
    return [os.path.join(here, "libgpxd.so")]


_c: CHasher | None = None
_c_loaded = False
_c_lock = threading.Lock()


def c_hasher() -> CHasher | None:
    """The C hasher found at the default places (loaded once), or None."""
    global _c, _c_loaded
    if not _c_loaded:
        with _c_lock:
            if not _c_loaded:
                for p in default_library_paths():
                    _c = load_c_hasher(p)
                    if _c is not None:
                        break
                _c_loaded = True
    return _c


def use_c_hasher(h: CHasher | None) -> None:
    """Makes gp64/gp64_many use h (None: numpy)."""
    global _c, _c_loaded
    with _c_lock:
        _c, _c_loaded = h, True


def implementation() -> str:
    h = c_hasher()
    return f"C ({h.path})" if h is not None else "numpy"


def gp64(data) -> int:
    """gp64 of data's bytes, as an int in [0, 2^64)."""
    h = c_hasher()
    return h(data) if h is not None else gp64_numpy(data)


def gp64_many(buf, chunk_size: int) -> np.ndarray:
    """uint64 hashes of buf[0:c], buf[c:2c], ... (the last may be shorter);
    ceil(len / chunk_size) values, none for an empty buffer."""
    h = c_hasher()
    return h.many(buf, chunk_size) if h is not None else gp64_many_numpy(buf, chunk_size)
