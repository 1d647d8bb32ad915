"""Parser for the module images CUDA programs hand to the driver.

An image is one of
 * a fatbinary container (magic 0xBA55ED50) holding cubin (ELF) and PTX
   entries, each possibly compressed (zstd, or LZ4 with
   ``-compress-mode=speed``);
 * a cubin: an ELF file for one GPU architecture;
 * PTX text, possibly NUL-terminated.

From an image we learn what the daemon needs without a GPU: the kernels with
their parameter layouts (offset and size of every parameter in the launch
parameter buffer) and the ``__device__`` / ``__constant__`` variables with
their sizes and initial values.

The formats are described in docs/fatbin-notes.md. The module has no imports
from the rest of the project; ``zstandard`` is imported lazily, only when a
zstd-compressed entry is met.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

__all__ = [
    "FatbinError", "ParamInfo", "KernelInfo", "GlobalVar", "Entry", "ModuleImage",
    "parse_image", "fatbin_size", "extract_host_fatbins",
    "parse_cubin", "parse_ptx", "lz4_block_decompress",
    "FATBIN_MAGIC", "FATBIN_WRAPPER_MAGIC",
]

# --------------------------------------------------------------------------- constants

FATBIN_MAGIC = 0xBA55ED50           # first u32 of a fatbinary container
FATBIN_WRAPPER_MAGIC = 0x466243B1   # host-side struct in .nvFatBinSegment
FATBIN_HEADER_SIZE = 16

# entry kinds (u16 at entry+0)
ENTRY_KIND_PTX = 1
ENTRY_KIND_ELF = 2
ENTRY_KIND_NVVM = 8                 # LTO IR (-gencode code=lto_XX); not used here
_KIND_NAMES = {ENTRY_KIND_PTX: "ptx", ENTRY_KIND_ELF: "cubin"}

# entry flags (u64 at entry+0x28)
FLAG_64BIT = 0x1
FLAG_DEBUG = 0x2
FLAG_HOST_LINUX = 0x10
FLAG_COMPRESS_LZ4 = 0x2000
FLAG_COMPRESS_ZSTD = 0x8000
FLAG_ARCH_A = 0x100000              # sm_XXa (architecture-specific)
FLAG_ARCH_F = 0x200000              # sm_XXf (family-specific)
FLAG_COMPAT_INFO = 0x1000000        # options area: empty string, then binary compat records
_ENTRY_MIN_HEADER = 0x40

# ELF
_SHT_SYMTAB = 2
_SHT_NOBITS = 8
_SHT_RELA = 4
_STT_OBJECT = 1
_STT_CUDA_OBJECT = 13              # objects in relocatable (-rdc) cubins
_STT_FUNC = 2
_STO_CUDA_ENTRY = 0x10              # st_other bit set on kernel entry symbols
_STO_MANAGED = 0x04                 # st_other bit set on __managed__ variables
_SHN_UNDEF = 0
_SHN_LORESERVE = 0xFF00

# .nv.info record formats
EIFMT_NVAL = 0x01
EIFMT_BVAL = 0x02
EIFMT_HVAL = 0x03
EIFMT_SVAL = 0x04
EIATTR_PARAM_CBANK = 0x0A
EIATTR_KPARAM_INFO = 0x17
EIATTR_CBANK_PARAM_SIZE = 0x19
EIATTR_KPARAM_INFO_V2 = 0x45


class FatbinError(ValueError):
    """A module image is malformed or uses something this parser cannot read."""


# --------------------------------------------------------------------------- results


@dataclass
class ParamInfo:
    index: int
    offset: int
    size: int


@dataclass
class KernelInfo:
    name: str
    params: list[ParamInfo] = field(default_factory=list)

    @property
    def param_size(self) -> int:
        """End of the last parameter in the parameter buffer (0 if none)."""
        return max((p.offset + p.size for p in self.params), default=0)


@dataclass
class GlobalVar:
    name: str
    size: int
    init: bytes | None      # None: zero-filled
    space: str              # 'global' or 'constant'
    managed: bool = False   # __managed__ (cubin st_other bit 0x4, PTX .attribute(.managed))


@dataclass
class Entry:
    kind: str               # 'cubin' | 'ptx'
    arch: int               # 90 for sm_90 / compute_90
    data: bytes             # decompressed; PTX without its NUL terminator
    compressed: bool
    # container details (defaults for bare cubin / PTX images)
    flags: int = 0
    variant: str = ""       # 'a' (sm_90a) or 'f' (sm_100f) or ''
    version: tuple[int, int] = (0, 0)   # (major, minor): ELF ABI or PTX ISA
    identifier: str = ""    # source file name, present with -G / -lineinfo
    options: str = ""       # ptxas options recorded for a PTX entry


@dataclass
class ModuleImage:
    format: str             # 'fatbin' | 'cubin' | 'ptx'
    entries: list[Entry]
    kernels: dict[str, KernelInfo]
    globals: dict[str, GlobalVar]
    # fatbin entries of kinds we do not use (e.g. LTO IR): (kind code, arch)
    skipped: list[tuple[int, int]] = field(default_factory=list)
    # kernels whose parameter layout differs between entries: name -> the
    # layouts seen ((offset, size) lists); see _image_from_entries
    ambiguous: dict[str, list[list[tuple[int, int]]]] = field(default_factory=dict)


# --------------------------------------------------------------------------- helpers


def _as_bytes(data) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise FatbinError(f"image must be bytes-like, not {type(data).__name__}")


def _u32(b: bytes, off: int) -> int:
    return struct.unpack_from("<I", b, off)[0]


def _cstr(b: bytes, off: int, what: str) -> str:
    if off < 0 or off >= len(b):
        raise FatbinError(f"{what}: string offset {off:#x} outside its table ({len(b):#x} bytes)")
    end = b.find(b"\0", off)
    if end < 0:
        raise FatbinError(f"{what}: unterminated string at offset {off:#x}")
    return b[off:end].decode("utf-8", "replace")


def _zero_to_none(b: bytes | None) -> bytes | None:
    if b is None or not any(b):
        return None
    return b


# --------------------------------------------------------------------------- decompression


def lz4_block_decompress(src: bytes, out_size: int, where: str = "LZ4 block") -> bytes:
    """Decode one raw LZ4 block (no frame header) of known decompressed size."""
    out = bytearray()
    n = len(src)
    i = 0
    while True:
        if i >= n:
            raise FatbinError(f"{where}: LZ4 data ends before a sequence token (at {i:#x})")
        token = src[i]
        i += 1
        lit = token >> 4
        if lit == 15:
            while True:
                if i >= n:
                    raise FatbinError(f"{where}: LZ4 literal length runs past the end")
                b = src[i]
                i += 1
                lit += b
                if b != 255:
                    break
        if i + lit > n:
            raise FatbinError(f"{where}: LZ4 literals run past the end of the data "
                              f"({i:#x}+{lit:#x} > {n:#x})")
        out += src[i:i + lit]
        i += lit
        if i == n:                      # last sequence: literals only
            break
        if i + 2 > n:
            raise FatbinError(f"{where}: LZ4 match offset truncated at {i:#x}")
        moff = src[i] | (src[i + 1] << 8)
        i += 2
        mlen = token & 15
        if mlen == 15:
            while True:
                if i >= n:
                    raise FatbinError(f"{where}: LZ4 match length runs past the end")
                b = src[i]
                i += 1
                mlen += b
                if b != 255:
                    break
        mlen += 4
        if moff == 0 or moff > len(out):
            raise FatbinError(f"{where}: LZ4 match offset {moff} invalid at output "
                              f"position {len(out):#x}")
        start = len(out) - moff
        if moff >= mlen:
            out += out[start:start + mlen]
        else:                           # overlapping copy: repeat the pattern
            pat = bytes(out[start:])
            reps, rest = divmod(mlen, moff)
            out += pat * reps + pat[:rest]
        if len(out) > out_size:
            raise FatbinError(f"{where}: LZ4 output exceeds the declared size {out_size:#x}")
    if len(out) != out_size:
        raise FatbinError(f"{where}: LZ4 output is {len(out):#x} bytes, header says {out_size:#x}")
    return bytes(out)


def _zstd_decompress(src: bytes, out_size: int, where: str) -> bytes:
    try:
        import zstandard
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise FatbinError(f"{where}: entry is zstd-compressed but the 'zstandard' "
                          f"package is not installed") from e
    try:
        dobj = zstandard.ZstdDecompressor().decompressobj()
        out = dobj.decompress(src)
        eof = dobj.eof
    except zstandard.ZstdError as e:
        raise FatbinError(f"{where}: corrupt zstd data: {e}") from e
    if not eof:
        raise FatbinError(f"{where}: zstd data is truncated (frame does not end)")
    if len(out) != out_size:
        raise FatbinError(f"{where}: zstd output is {len(out):#x} bytes, "
                          f"header says {out_size:#x}")
    return out


# --------------------------------------------------------------------------- fatbin container


def fatbin_size(data) -> int:
    """Total size (header + payload) of the fatbinary starting at data[0].

    Only the 16-byte header has to be present."""
    b = bytes(data[:FATBIN_HEADER_SIZE]) if not isinstance(data, bytes) else data
    if len(b) < FATBIN_HEADER_SIZE:
        raise FatbinError(f"fatbin header truncated: {len(b)} of {FATBIN_HEADER_SIZE} bytes")
    magic, _version, hsize, psize = struct.unpack_from("<IHHQ", b, 0)
    if magic != FATBIN_MAGIC:
        if magic == FATBIN_WRAPPER_MAGIC:
            raise FatbinError("this is a fatbin wrapper (magic 0x466243b1, the struct passed "
                              "to __cudaRegisterFatBinary), not a fatbinary: follow its data "
                              "pointer at offset 8")
        raise FatbinError(f"bad fatbin magic {magic:#010x} at offset 0 "
                          f"(expected {FATBIN_MAGIC:#010x})")
    if hsize < FATBIN_HEADER_SIZE:
        raise FatbinError(f"fatbin header size field {hsize} is smaller than {FATBIN_HEADER_SIZE}")
    return hsize + psize


def _parse_fatbin_entries(b: bytes, base: int = 0) -> tuple[list[Entry], list[tuple[int, int]]]:
    total = fatbin_size(b)
    if total > len(b):
        raise FatbinError(f"fatbin truncated: header declares {total:#x} bytes "
                          f"(payload {total - FATBIN_HEADER_SIZE:#x}), only {len(b):#x} present")
    hsize = struct.unpack_from("<H", b, 6)[0]
    version = struct.unpack_from("<H", b, 4)[0]
    if version != 1:
        raise FatbinError(f"unsupported fatbin version {version} (only 1 is known)")
    entries: list[Entry] = []
    skipped: list[tuple[int, int]] = []
    off = hsize
    idx = 0
    while off < total:
        where = f"fatbin entry {idx} at offset {base + off:#x}"
        if total - off < _ENTRY_MIN_HEADER:
            # tolerate zero padding at the very end of the payload
            if not any(b[off:total]):
                break
            raise FatbinError(f"{where}: entry header truncated "
                              f"({total - off} bytes left, need {_ENTRY_MIN_HEADER})")
        (kind, _attr, ehsize, psize, csize, opt_off, minor, major, arch, name_off,
         name_len, flags) = struct.unpack_from("<HHIQIIHHIIIQ", b, off)
        usize = struct.unpack_from("<Q", b, off + 0x38)[0]
        if kind == 0 and ehsize == 0 and not any(b[off:total]):
            break
        if ehsize < _ENTRY_MIN_HEADER:
            raise FatbinError(f"{where}: entry header size {ehsize:#x} is smaller than "
                              f"{_ENTRY_MIN_HEADER:#x}")
        end = off + ehsize + psize
        if end > total:
            raise FatbinError(f"{where}: entry (header {ehsize:#x} + payload {psize:#x}) runs "
                              f"past the end of the fatbin ({base + total:#x})")
        hdr = b[off:off + ehsize]
        payload = b[off + ehsize:end]
        kname = _KIND_NAMES.get(kind)
        if kname is None:
            skipped.append((kind, arch))
            off = end
            idx += 1
            continue
        method = flags & (FLAG_COMPRESS_LZ4 | FLAG_COMPRESS_ZSTD)
        if method:
            if csize == 0 or csize > psize:
                raise FatbinError(f"{where}: compressed size {csize:#x} does not fit the "
                                  f"payload size {psize:#x}")
            comp = payload[:csize]
            if method == FLAG_COMPRESS_ZSTD:
                data = _zstd_decompress(comp, usize, where)
            elif method == FLAG_COMPRESS_LZ4:
                data = lz4_block_decompress(comp, usize, where)
            else:
                raise FatbinError(f"{where}: both LZ4 and zstd compression flags set "
                                  f"(flags {flags:#x})")
        else:
            data = payload
        if kind == ENTRY_KIND_PTX:
            nul = data.find(b"\0")
            if nul >= 0:
                data = data[:nul]
        else:
            data = bytes(data)
        identifier = ""
        if name_len and name_off + name_len <= ehsize:
            raw_name = hdr[name_off:name_off + name_len].split(b"\0")[0]
            identifier = raw_name.decode("utf-8", "replace")
        options = ""
        if opt_off and opt_off + 8 <= ehsize and not (flags & FLAG_COMPAT_INFO):
            s_off, s_len = struct.unpack_from("<II", hdr, opt_off)
            if s_len and s_off + s_len <= ehsize:
                options = hdr[s_off:s_off + s_len].split(b"\0")[0].decode("utf-8", "replace")
        variant = "a" if flags & FLAG_ARCH_A else ("f" if flags & FLAG_ARCH_F else "")
        entries.append(Entry(kind=kname, arch=arch, data=data, compressed=bool(method),
                             flags=flags, variant=variant, version=(major, minor),
                             identifier=identifier, options=options))
        off = end
        idx += 1
    return entries, skipped


# --------------------------------------------------------------------------- ELF


class _Section:
    __slots__ = ("index", "name", "type", "flags", "addr", "offset", "size", "link", "info",
                 "entsize")

    def __init__(self, index, name_off, type_, flags, addr, offset, size, link, info, entsize):
        self.index = index
        self.name = name_off
        self.type = type_
        self.flags = flags
        self.addr = addr
        self.offset = offset
        self.size = size
        self.link = link
        self.info = info
        self.entsize = entsize


class _Elf:
    """Just enough of an ELF64 little-endian reader for cubins and host binaries."""

    def __init__(self, b: bytes, what: str = "ELF"):
        self.b = b
        self.what = what
        if len(b) < 64:
            raise FatbinError(f"{what}: ELF header truncated ({len(b)} of 64 bytes)")
        if b[:4] != b"\x7fELF":
            raise FatbinError(f"{what}: bad ELF magic {b[:4]!r}")
        if b[4] != 2:
            raise FatbinError(f"{what}: only 64-bit ELF is supported (EI_CLASS={b[4]})")
        if b[5] != 1:
            raise FatbinError(f"{what}: only little-endian ELF is supported (EI_DATA={b[5]})")
        (self.e_type, self.e_machine, _ver, _entry, _phoff, shoff, self.e_flags, _ehsize,
         _phentsize, _phnum, shentsize, shnum, shstrndx) = struct.unpack_from(
            "<HHIQQQIHHHHHH", b, 16)
        self.sections: list[_Section] = []
        if shoff == 0:
            return
        if shentsize < 64:
            raise FatbinError(f"{what}: section header entry size {shentsize} < 64")
        if shoff + 64 > len(b):
            raise FatbinError(f"{what}: section header table at {shoff:#x} lies outside the "
                              f"file ({len(b):#x} bytes)")
        if shnum == 0:          # extended numbering: count in section 0's sh_size
            shnum = struct.unpack_from("<Q", b, shoff + 32)[0]
        if shstrndx == 0xFFFF:
            shstrndx = struct.unpack_from("<I", b, shoff + 40)[0]
        if shoff + shnum * shentsize > len(b):
            raise FatbinError(f"{what}: section header table ({shnum} entries at {shoff:#x}) "
                              f"runs past the end of the file ({len(b):#x} bytes)")
        for i in range(shnum):
            (name, type_, flags, addr, offset, size, link, info, _align,
             entsize) = struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize)
            if type_ != _SHT_NOBITS and size and offset + size > len(b):
                raise FatbinError(f"{what}: section {i} ({offset:#x}+{size:#x}) runs past the "
                                  f"end of the file ({len(b):#x} bytes)")
            self.sections.append(_Section(i, name, type_, flags, addr, offset, size, link, info,
                                          entsize))
        if not 0 <= shstrndx < shnum:
            raise FatbinError(f"{what}: section name table index {shstrndx} out of range")
        strtab = self.data(self.sections[shstrndx])
        for s in self.sections:
            s.name = _cstr(strtab, s.name, f"{what}: section {s.index} name") if s.index else ""
        self.by_name = {}
        for s in self.sections:
            self.by_name.setdefault(s.name, s)

    def data(self, s: _Section) -> bytes:
        if s.type == _SHT_NOBITS:
            return b""
        return self.b[s.offset:s.offset + s.size]

    def symbols(self):
        """Yield (name, value, size, info, other, shndx) for each .symtab symbol."""
        for s in self.sections:
            if s.type != _SHT_SYMTAB:
                continue
            if s.entsize not in (0, 24):
                raise FatbinError(f"{self.what}: symbol table entry size {s.entsize} != 24")
            if s.size % 24:
                raise FatbinError(f"{self.what}: symbol table size {s.size:#x} is not a "
                                  f"multiple of 24")
            if s.link >= len(self.sections):
                raise FatbinError(f"{self.what}: symbol table links to missing string table "
                                  f"{s.link}")
            strtab = self.data(self.sections[s.link])
            for i, (name, info, other, shndx, value, size) in enumerate(
                    struct.iter_unpack("<IBBHQQ", self.data(s))):
                if i == 0:
                    continue
                yield (_cstr(strtab, name, f"{self.what}: symbol {i} name"), value, size, info,
                       other, shndx)


# --------------------------------------------------------------------------- cubin


def _iter_nv_info(b: bytes, where: str):
    """Yield (format, attribute, value) for each record of a .nv.info section.

    value is an int for NVAL (0) / BVAL / HVAL records and bytes for SVAL."""
    off = 0
    n = len(b)
    while off < n:
        if n - off < 4:
            if not any(b[off:]):
                return
            raise FatbinError(f"{where}: record header truncated at offset {off:#x}")
        fmt, attr, val = b[off], b[off + 1], struct.unpack_from("<H", b, off + 2)[0]
        if fmt == EIFMT_SVAL:
            if off + 4 + val > n:
                raise FatbinError(f"{where}: record attr {attr:#x} at offset {off:#x} declares "
                                  f"{val} bytes, only {n - off - 4} left")
            yield fmt, attr, b[off + 4:off + 4 + val]
            off += 4 + val
        elif fmt in (EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL):
            yield fmt, attr, val
            off += 4
        else:
            raise FatbinError(f"{where}: unknown record format {fmt:#x} at offset {off:#x}")


def _kernel_params(info: bytes, where: str) -> list[ParamInfo]:
    params: dict[int, ParamInfo] = {}
    for fmt, attr, val in _iter_nv_info(info, where):
        if attr not in (EIATTR_KPARAM_INFO, EIATTR_KPARAM_INFO_V2):
            continue
        if fmt != EIFMT_SVAL or len(val) < 12:
            raise FatbinError(f"{where}: KPARAM_INFO record (attr {attr:#x}) is malformed "
                              f"(format {fmt:#x}, {len(val) if isinstance(val, bytes) else 0} "
                              f"value bytes, need 12)")
        if attr == EIATTR_KPARAM_INFO:
            # u32 index, u16 ordinal, u16 offset, u32 packed: bits 0-7 pointee log2
            # alignment, 8-11 space, 12-16 cbank, 17 param-space flag, 18-31 size
            _index, ordinal, offset, packed = struct.unpack_from("<IHHI", val, 0)
            size = packed >> 18
        else:
            # V2 (kernels with > 4 KiB of parameters): u32 index, u16 ordinal,
            # u16 offset, u16 size, u8 pointee log2 alignment, u8 space
            _index, ordinal, offset, size = struct.unpack_from("<IHHH", val, 0)
        p = ParamInfo(index=ordinal, offset=offset, size=size)
        if ordinal in params and params[ordinal] != p:
            raise FatbinError(f"{where}: two different KPARAM_INFO records for parameter "
                              f"{ordinal}")
        params[ordinal] = p
    out = [params[k] for k in sorted(params)]
    if out and [p.index for p in out] != list(range(len(out))):
        raise FatbinError(f"{where}: parameter ordinals {[p.index for p in out]} are not "
                          f"0..{len(out) - 1}")
    return out


_CONST_BANK_RE = re.compile(r"\.nv\.constant(\d+)$")


def parse_cubin(data, what: str = "cubin") -> tuple[dict[str, KernelInfo], dict[str, GlobalVar]]:
    """Kernels and variables of one cubin."""
    b = _as_bytes(data)
    elf = _Elf(b, what)
    if elf.e_machine != 190:
        raise FatbinError(f"{what}: ELF machine {elf.e_machine} is not EM_CUDA (190)")
    secs = elf.sections
    kernels: dict[str, KernelInfo] = {}
    globals_: dict[str, GlobalVar] = {}
    for name, value, size, info, other, shndx in elf.symbols():
        stype = info & 0xF
        if shndx == _SHN_UNDEF or shndx >= _SHN_LORESERVE or shndx >= len(secs):
            continue
        sec = secs[shndx]
        if stype == _STT_FUNC:
            if sec.name != ".text." + name:
                continue
            if not (other & _STO_CUDA_ENTRY) and (".nv.constant0." + name) not in elf.by_name:
                continue        # a device function in its own section (-rdc)
            info_sec = elf.by_name.get(".nv.info." + name)
            params = (_kernel_params(elf.data(info_sec), f"{what}: section .nv.info.{name}")
                      if info_sec is not None else [])
            kernels[name] = KernelInfo(name=name, params=params)
        elif stype in (_STT_OBJECT, _STT_CUDA_OBJECT):
            space = None
            if sec.name == ".nv.global.init":
                space = "global"
            elif sec.name == ".nv.global":
                space = "global"
            else:
                m = _CONST_BANK_RE.match(sec.name)
                if m and m.group(1) != "0":
                    space = "constant"
            if space is None:
                continue
            init = None
            if sec.type != _SHT_NOBITS:
                if value + size > sec.size:
                    raise FatbinError(f"{what}: variable {name} ({value:#x}+{size:#x}) lies "
                                      f"outside its section {sec.name} ({sec.size:#x} bytes)")
                init = _zero_to_none(b[sec.offset + value:sec.offset + value + size])
            globals_[name] = GlobalVar(name=name, size=size, init=init, space=space,
                                       managed=space == "global" and bool(other & _STO_MANAGED))
    return dict(sorted(kernels.items())), dict(sorted(globals_.items()))


def cubin_arch(data) -> int:
    """SM number of a cubin, from e_flags bits 8..15."""
    b = _as_bytes(data)
    if len(b) < 52 or b[:4] != b"\x7fELF":
        raise FatbinError("cubin: not an ELF file")
    return (_u32(b, 48) >> 8) & 0xFF


# --------------------------------------------------------------------------- PTX

_PTX_COMMENT_RE = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/', re.S)
_PTX_TYPES = {
    "b8": 1, "u8": 1, "s8": 1,
    "b16": 2, "u16": 2, "s16": 2, "f16": 2, "bf16": 2,
    "b32": 4, "u32": 4, "s32": 4, "f32": 4, "f16x2": 4, "bf16x2": 4, "tf32": 4,
    "b64": 8, "u64": 8, "s64": 8, "f64": 8,
    "b128": 16,
}
_PTX_IDENT = r"[A-Za-z_$%][\w$]*"
_PTX_FUNC_RE = re.compile(r"\.(entry|func)\b")
_PTX_HEAD_END_RE = re.compile(r"[{;]")
_PTX_BRACE_RE = re.compile(r"[{}]")
_PTX_ENTRY_HEAD_RE = re.compile(r"\.entry\s+(" + _PTX_IDENT + r")\s*(\()?")
_PTX_PARAM_RE = re.compile(r"^\.param\s+((?:\.[\w]+\s*(?:\d+\s*)?)*?)\s*(" + _PTX_IDENT +
                           r")\s*((?:\[\s*\d*\s*\]\s*)*)$")
_PTX_VAR_RE = re.compile(
    r"^((?:\.(?:visible|extern|weak|common)\s+)*)\.(global|const)\s+(.*?)\s*(" + _PTX_IDENT +
    r")\s*((?:\[\s*\d*\s*\]\s*)*)(?:=\s*(.*))?$", re.S)
_PTX_VAR_STMT_RE = re.compile(
    r"((?:\.(?:visible|extern|weak|common)\s+)*\.(?:global|const)\s[^;]*);")
_PTX_TOKEN_RE = re.compile(r"\.attribute\s*\([^)]*\)|\.\w+|\d+|\S")
_PTX_MAX_ELEMS = 1 << 34
_PTX_DIM_RE = re.compile(r"\[\s*(\d*)\s*\]")


def _strip_ptx_comments(text: str) -> str:
    # string literals (only in .file directives) are emptied too, so that a
    # path such as "a.entry.cu" cannot look like a directive
    def repl(m):
        return '""' if m.group(0)[0] == '"' else " "
    return _PTX_COMMENT_RE.sub(repl, text)


def _split_ptx_toplevel(text: str, where: str) -> tuple[str, list[tuple[str, str]]]:
    """Return (top-level text without function bodies, [(entry name, param text)])."""
    pieces = []
    entries = []
    pos = 0
    n = len(text)
    for m in _PTX_FUNC_RE.finditer(text):
        if m.start() < pos:
            continue
        # find the end of the header: the first '{' or ';' (headers hold neither)
        hm_end = _PTX_HEAD_END_RE.search(text, m.end())
        j = hm_end.start() if hm_end else n
        if j >= n:
            raise FatbinError(f"{where}: .{m.group(1)} at offset {m.start()} has no body or ';'")
        head = text[m.start():j]
        if m.group(1) == "entry":
            hm = _PTX_ENTRY_HEAD_RE.match(head)
            if not hm:
                raise FatbinError(f"{where}: cannot read .entry header {head[:80]!r}")
            params = ""
            if hm.group(2):
                close = head.find(")", hm.end())
                if close < 0:
                    raise FatbinError(f"{where}: .entry {hm.group(1)} has an unclosed "
                                      f"parameter list")
                params = head[hm.end():close]
            entries.append((hm.group(1), params))
        # statement start: back up to the beginning of the directive line so that
        # '.visible .entry' prefixes are not parsed as a variable statement
        pieces.append(text[pos:m.start()])
        if text[j] == ";":
            pos = j + 1
            pieces.append(";")
            continue
        depth = 0
        k = n
        for bm in _PTX_BRACE_RE.finditer(text, j):
            if bm.group() == "{":
                depth += 1
            else:
                depth -= 1
                if depth == 0:
                    k = bm.start()
                    break
        if depth:
            raise FatbinError(f"{where}: body of .{m.group(1)} at offset {m.start()} is not "
                              f"closed")
        pos = k + 1
        pieces.append(";")
    pieces.append(text[pos:])
    return "".join(pieces), entries


def _ptx_decl(tokens: list[str], where: str):
    """Read directive tokens; return (type name, vector count, explicit align or None)."""
    tname = None
    vec = 1
    align = None
    ptr = False
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t == ".align":
            if i + 1 >= len(tokens) or not tokens[i + 1].isdigit():
                raise FatbinError(f"{where}: .align without a number")
            if not ptr:
                align = int(tokens[i + 1])
            i += 2
            continue
        if t == ".ptr":
            ptr = True
        elif t in (".v2", ".v4", ".v8"):
            vec = int(t[2:])
        elif t.startswith(".") and t[1:] in _PTX_TYPES:
            tname = t[1:]
        elif t in (".texref", ".surfref", ".samplerref"):
            tname = "u64"
        i += 1
    if tname is None:
        raise FatbinError(f"{where}: no data type in {' '.join(tokens)!r}")
    return tname, vec, align


def _ptx_dims(s: str, where: str) -> int:
    count = 1
    for d in _PTX_DIM_RE.findall(s or ""):
        if d == "" or len(d) > 12:
            raise FatbinError(f"{where}: unsized or absurd array dimension [{d[:20]}]")
        count *= int(d)
    if count > _PTX_MAX_ELEMS:
        raise FatbinError(f"{where}: array of {count} elements is too large")
    return count


def _ptx_entry_params(name: str, ptext: str, where: str) -> list[ParamInfo]:
    params = []
    off = 0
    ptext = ptext.strip()
    if not ptext:
        return params
    for i, decl in enumerate(ptext.split(",")):
        decl = " ".join(decl.split())
        m = _PTX_PARAM_RE.match(decl)
        if not m:
            raise FatbinError(f"{where}: cannot read parameter {i} of .entry {name}: {decl!r}")
        tokens = _PTX_TOKEN_RE.findall(m.group(1))
        tname, vec, align = _ptx_decl(tokens, f"{where}: .entry {name} param {i}")
        esize = _PTX_TYPES[tname] * vec
        size = esize * _ptx_dims(m.group(3), f"{where}: .entry {name} param {i}")
        if align is None:
            align = esize
        if align <= 0 or align & (align - 1):
            raise FatbinError(f"{where}: .entry {name} param {i}: alignment {align} is not a "
                              f"power of two")
        off = (off + align - 1) & -align
        params.append(ParamInfo(index=i, offset=off, size=size))
        off += size
    return params


_PTX_ADDR_RE = re.compile(r"^(?:generic\s*\(\s*" + _PTX_IDENT + r"\s*\)|" + _PTX_IDENT +
                          r")(?:\s*[+-]\s*\d+)?$")


_PTX_HEXF_RE = re.compile(r"^([+-]?)0([fFdD])([0-9a-fA-F]+)$")


def _ptx_value(tok: str, tname: str, where: str) -> bytes:
    """Encode one initialiser element as the little-endian bytes of type tname."""
    size = _PTX_TYPES[tname]
    t = tok.strip()
    if not t:
        raise FatbinError(f"{where}: empty initialiser element")
    m = _PTX_HEXF_RE.match(t)
    if m:                                   # 0fXXXXXXXX (f32 bits) / 0dXXXXXXXXXXXXXXXX (f64)
        neg, letter, digits = m.groups()
        single = letter in "fF"
        if len(digits) != (8 if single else 16):
            raise FatbinError(f"{where}: bad hexadecimal float literal {t!r}")
        bits = int(digits, 16)
        width = 4 if single else 8
        if tname == ("f32" if single else "f64") or size == width:
            # same width: keep the bit pattern exactly (NaN payloads included)
            return _int_bytes(bits ^ ((1 << (8 * width - 1)) if neg else 0), width)
        f = struct.unpack("<f" if single else "<d",
                          struct.pack("<I" if single else "<Q", bits))[0]
        if neg:
            f = -f
        if tname == "f64":
            return struct.pack("<d", f)
        if tname == "f32":
            return struct.pack("<f", f)
        raise FatbinError(f"{where}: float literal {t!r} for a .{tname} variable")
    if _PTX_ADDR_RE.match(t) and not re.match(r"^[+-]?\d", t):
        return bytes(size)                  # an address: relocated at load, placeholder 0
    try:
        v = int(t.rstrip("uU"), 0)
    except ValueError:
        v = None
        if re.match(r"^[+-]?0[0-7]+[uU]?$", t):   # PTX octal: leading 0
            v = int(t.rstrip("uU"), 8)
    if v is not None:
        if tname == "f32":
            return struct.pack("<f", float(v))
        if tname == "f64":
            return struct.pack("<d", float(v))
        return _int_bytes(v, size)
    try:
        f = float(t)
    except ValueError:
        raise FatbinError(f"{where}: cannot read initialiser value {t!r}") from None
    if tname == "f32":
        return struct.pack("<f", f)
    if tname == "f64":
        return struct.pack("<d", f)
    raise FatbinError(f"{where}: decimal float {t!r} for a .{tname} variable")


def _int_bytes(v: int, size: int) -> bytes:
    return (v & ((1 << (8 * size)) - 1)).to_bytes(size, "little")


_PTX_INIT_TOKEN_RE = re.compile(r"\s*([{},]|[^{},]+)")


def _ptx_parse_init(s: str, where: str):
    """Parse an initialiser into nested lists of element strings ('5' -> '5')."""
    toks = [t.strip() for t in _PTX_INIT_TOKEN_RE.findall(s)]
    toks = [t for t in toks if t]
    pos = 0

    def value():
        nonlocal pos
        if pos >= len(toks):
            raise FatbinError(f"{where}: initialiser ends early")
        t = toks[pos]
        pos += 1
        if t == "{":
            items = []
            if pos < len(toks) and toks[pos] == "}":
                pos += 1
                return items
            while True:
                items.append(value())
                if pos >= len(toks):
                    raise FatbinError(f"{where}: unbalanced '{{' in initialiser")
                t = toks[pos]
                pos += 1
                if t == "}":
                    return items
                if t != ",":
                    raise FatbinError(f"{where}: expected ',' or '}}' in initialiser, "
                                      f"got {t!r}")
        if t in ("}", ","):
            raise FatbinError(f"{where}: unexpected {t!r} in initialiser")
        return t

    v = value()
    if pos != len(toks):
        raise FatbinError(f"{where}: unexpected {toks[pos]!r} after initialiser")
    return v


def _ptx_init_bytes(init, dims: list[int], vec: int, tname: str, where: str) -> bytes:
    """Encode a parsed initialiser for an array of shape dims (+ vector width),
    padding every short brace level with zeros."""
    esize = _PTX_TYPES[tname]
    shape = dims + ([vec] if vec > 1 else [])

    def enc(v, level: int) -> bytes:
        n_elems = 1
        for d in shape[level:]:
            n_elems *= d
        total = n_elems * esize
        if isinstance(v, str):
            if level == len(shape):
                return _ptx_value(v, tname, where)
            # a scalar where an aggregate is expected: fills the first slot
            return enc([v], level)
        if level == len(shape):
            if len(v) != 1:
                raise FatbinError(f"{where}: braces hold {len(v)} values for one scalar")
            return enc(v[0], level)
        if level == 0 and len(shape) > 1 and all(isinstance(x, str) for x in v):
            # a flat list for a multi-dimensional array fills it in order
            flat = b"".join(_ptx_value(x, tname, where) for x in v)
        else:
            if len(v) > shape[level]:
                raise FatbinError(f"{where}: {len(v)} initialiser elements for "
                                  f"{shape[level]} slots")
            flat = b"".join(enc(x, level + 1) for x in v)
        if len(flat) > total:
            raise FatbinError(f"{where}: initialiser has more elements than the variable")
        return flat + bytes(total - len(flat))

    return enc(init, 0)


def parse_ptx(data, what: str = "PTX") -> tuple[dict[str, KernelInfo], dict[str, GlobalVar]]:
    """Kernels (layout by the CUDA parameter ABI) and variables of PTX text."""
    if isinstance(data, str):
        text = data
    else:
        b = _as_bytes(data)
        nul = b.find(b"\0")
        if nul >= 0:
            b = b[:nul]
        try:
            text = b.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FatbinError(f"{what}: not valid UTF-8 text at byte {e.start}") from e
    text = _strip_ptx_comments(text)
    top, entries = _split_ptx_toplevel(text, what)
    kernels: dict[str, KernelInfo] = {}
    for name, ptext in entries:
        k = KernelInfo(name=name, params=_ptx_entry_params(name, ptext, what))
        if name in kernels and kernels[name] != k:
            raise FatbinError(f"{what}: .entry {name} declared twice with different parameters")
        kernels[name] = k
    globals_: dict[str, GlobalVar] = {}
    for sm in _PTX_VAR_STMT_RE.finditer(top):
        stmt = " ".join(sm.group(1).split())
        m = _PTX_VAR_RE.match(stmt)
        if not m:
            raise FatbinError(f"{what}: cannot read variable declaration {stmt[:120]!r}")
        if "extern" in m.group(1):
            continue
        name = m.group(4)
        vwhere = f"{what}: variable {name}"
        tokens = _PTX_TOKEN_RE.findall(m.group(3))
        if any(t in (".texref", ".surfref", ".samplerref") for t in tokens):
            continue
        tname, vec, _align = _ptx_decl(tokens, vwhere)
        esize = _PTX_TYPES[tname]
        count = vec * _ptx_dims(m.group(5), vwhere)
        size = esize * count
        init = None
        if m.group(6) is not None:
            dims = [int(x) for x in _PTX_DIM_RE.findall(m.group(5) or "")]
            parsed = _ptx_parse_init(m.group(6), vwhere)
            init = _zero_to_none(_ptx_init_bytes(parsed, dims, vec, tname, vwhere))
        space = "global" if m.group(2) == "global" else "constant"
        managed = any(t.startswith(".attribute") and ".managed" in t for t in tokens)
        globals_[name] = GlobalVar(name=name, size=size, init=init, space=space,
                                   managed=managed)
    return dict(sorted(kernels.items())), dict(sorted(globals_.items()))


# --------------------------------------------------------------------------- merge


def _image_from_entries(fmt: str, entries: list[Entry], skipped) -> ModuleImage:
    """Kernels and variables of an image: the union over its entries.

    The driver loads one entry per device (the cubin for its architecture, or
    PTX it compiles), so entries need not agree: libtorch's fatbins hold
    kernels that exist only in the sm_90a cubin (guarded by __CUDA_ARCH__
    feature macros) and compiler-internal variables ($str, __unnamed_N) that
    differ per architecture. A kernel whose parameter layout differs between
    entries is left out of `kernels` and listed in `ambiguous`: its layout
    must then come from the driver (cuFuncGetParamInfo), which knows which
    entry it loaded. A variable whose size or initial value differs keeps the
    largest size and no initial value (only the emulated backend uses these,
    to place the variable; a GPU's driver places the real one)."""
    kernels: dict[str, KernelInfo] = {}
    globals_: dict[str, GlobalVar] = {}
    ambiguous: dict[str, list[list[tuple[int, int]]]] = {}
    cubins = [e for e in entries if e.kind == "cubin"]
    source = cubins if cubins else [e for e in entries if e.kind == "ptx"]
    for e in source:
        what = f"{e.kind} entry for arch {e.arch}{e.variant}"
        if e.kind == "cubin":
            k, g = parse_cubin(e.data, what)
        else:
            k, g = parse_ptx(e.data, what)
        for name, ki in k.items():
            layout = [(p.offset, p.size) for p in ki.params]
            if name in ambiguous:
                if layout not in ambiguous[name]:
                    ambiguous[name].append(layout)
            elif name not in kernels:
                kernels[name] = ki
            elif kernels[name] != ki:
                old = kernels.pop(name)
                ambiguous[name] = [[(p.offset, p.size) for p in old.params], layout]
        for name, gv in g.items():
            old = globals_.get(name)
            if old is None:
                globals_[name] = gv
            elif old != gv:
                globals_[name] = GlobalVar(name=name, size=max(old.size, gv.size), init=None,
                                           space=old.space, managed=old.managed or gv.managed)
    return ModuleImage(format=fmt, entries=entries, kernels=dict(sorted(kernels.items())),
                       globals=dict(sorted(globals_.items())), skipped=list(skipped), ambiguous=ambiguous)


def _looks_like_ptx(b: bytes) -> bool:
    head = b[:65536]
    return b".version" in head or b".target" in head or b".entry" in head


def parse_image(data) -> ModuleImage:
    """Parse a fatbinary, a cubin or PTX text (detected from the first bytes)."""
    b = _as_bytes(data)
    if len(b) >= 4 and _u32(b, 0) == FATBIN_MAGIC:
        entries, skipped = _parse_fatbin_entries(b)
        return _image_from_entries("fatbin", entries, skipped)
    if len(b) >= 4 and _u32(b, 0) == FATBIN_WRAPPER_MAGIC:
        fatbin_size(b)          # raises with an explanation
    if b[:4] == b"\x7fELF":
        elf = _Elf(b, "cubin")
        if elf.e_machine != 190:
            raise FatbinError(f"ELF image has machine {elf.e_machine}, not EM_CUDA (190): a host "
                              f"binary? use extract_host_fatbins()")
        arch = (elf.e_flags >> 8) & 0xFF
        entries = [Entry(kind="cubin", arch=arch, data=b, compressed=False, flags=elf.e_flags)]
        return _image_from_entries("cubin", entries, [])
    nul = b.find(b"\0")
    text = b[:nul] if nul >= 0 else b
    if text and _looks_like_ptx(text):
        m = re.search(rb"\.target\s+(?:sm|compute)_(\d+)([af]?)", text)
        arch = int(m.group(1)) if m else 0
        variant = m.group(2).decode() if m else ""
        entries = [Entry(kind="ptx", arch=arch, data=text, compressed=False, variant=variant)]
        return _image_from_entries("ptx", entries, [])
    if len(b) < 4:
        raise FatbinError(f"image too short to identify ({len(b)} bytes)")
    raise FatbinError(f"unrecognised image: first bytes {b[:8].hex()} are neither the fatbin "
                      f"magic (50ed55ba), an ELF header (7f454c46) nor PTX text")


# --------------------------------------------------------------------------- host binaries

_LINKED_SECTION = ".nv_fatbin"          # fatbins the CUDA runtime registers
_RELOCATABLE_SECTION = "__nv_relfatbin"  # -rdc inputs kept for later device links


def _split_fatbins(sec: bytes, base: int, sname: str) -> list[tuple[int, bytes]]:
    out = []
    off = 0
    n = len(sec)
    while off < n:
        if n - off < FATBIN_HEADER_SIZE or _u32(sec, off) != FATBIN_MAGIC:
            step = 8 - (off % 8)
            if not any(sec[off:off + step]):    # alignment padding between fatbins
                off += step
                continue
            raise FatbinError(f"{sname}: no fatbin magic at section offset {off:#x} "
                              f"(file offset {base + off:#x})")
        size = fatbin_size(sec[off:off + FATBIN_HEADER_SIZE])
        if off + size > n:
            raise FatbinError(f"{sname}: fatbin at section offset {off:#x} declares {size:#x} "
                              f"bytes, runs past the section end ({n:#x})")
        out.append((base + off, sec[off:off + size]))
        off += size
    return out


def extract_host_fatbins(elf_bytes, include_relocatable: bool = False) -> list[bytes]:
    """The fatbinaries embedded in a host executable, shared library or object.

    Reads the .nv_fatbin section, which holds the fatbinaries back to back,
    and the .nvFatBinSegment wrappers (magic 0x466243b1), whose data pointers
    may name fatbinaries placed elsewhere. With include_relocatable, the
    __nv_relfatbin section of -rdc programs (device code kept for later
    device links, not registered at run time) is read too. Returned in file
    order, each once."""
    b = _as_bytes(elf_bytes)
    elf = _Elf(b, "host ELF")
    found: dict[int, bytes] = {}
    rel_ranges = []
    for s in elf.sections:
        if s.type == _SHT_NOBITS:
            continue
        if s.name == _RELOCATABLE_SECTION:
            rel_ranges.append((s.offset, s.offset + s.size))
        if s.name == _LINKED_SECTION or (include_relocatable and s.name == _RELOCATABLE_SECTION):
            for off, fb in _split_fatbins(elf.data(s), s.offset, s.name):
                found[off] = fb
    seg = elf.by_name.get(".nvFatBinSegment")
    if seg is not None and seg.type != _SHT_NOBITS:
        relocs = _relative_relocs(elf)
        data = elf.data(seg)
        for i in range(0, len(data) - 23, 24):
            magic, _ver, ptr = struct.unpack_from("<IIQ", data, i)
            if magic != FATBIN_WRAPPER_MAGIC:
                continue
            ptr = relocs.get(seg.addr + i + 8, ptr)
            off = _vaddr_to_offset(elf, ptr)
            if off is None or off in found:
                continue
            if not include_relocatable and any(lo <= off < hi for lo, hi in rel_ranges):
                continue
            if off + FATBIN_HEADER_SIZE <= len(b) and _u32(b, off) == FATBIN_MAGIC:
                size = fatbin_size(b[off:off + FATBIN_HEADER_SIZE])
                if off + size > len(b):
                    raise FatbinError(f"host ELF: fatbin at file offset {off:#x} runs past the "
                                      f"end of the file")
                found[off] = b[off:off + size]
    return [found[k] for k in sorted(found)]


def _relative_relocs(elf: _Elf) -> dict[int, int]:
    """R_*_RELATIVE addends by target address (for PIE executables / shared libs)."""
    out = {}
    for s in elf.sections:
        if s.type != _SHT_RELA or s.entsize not in (0, 24):
            continue
        for r_off, r_info, r_add in struct.iter_unpack("<QQq", elf.data(s)[:s.size - s.size % 24]):
            rtype = r_info & 0xFFFFFFFF
            if rtype in (8, 1027):      # R_X86_64_RELATIVE, R_AARCH64_RELATIVE
                out[r_off] = r_add
    return out


def _vaddr_to_offset(elf: _Elf, addr: int) -> int | None:
    for s in elf.sections:
        if s.addr and s.type != _SHT_NOBITS and s.addr <= addr < s.addr + s.size:
            return s.offset + (addr - s.addr)
    return None
