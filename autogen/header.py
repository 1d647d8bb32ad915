"""Parser for the CUDA headers.

For every function that the CUDA driver (``libcuda.so.1``) and runtime
(``libcudart.so.13``) headers declare, this module returns its normalised
prototype (return type, name, ``[(param name, param type)]``), the doxygen
group it is declared under and the header it comes from.

How it works:

* Each header is run through ``gcc -E -x c -I$CUDA_HOME/include`` (line
  markers are kept, unlike ``-P``, so that only declarations that come from
  the header itself are taken; the ones of the headers it includes are not).
  ``cuda.h`` and the other driver headers are preprocessed three ways (plain,
  ``-DCUDA_API_PER_THREAD_DEFAULT_STREAM`` for the ``_ptds``/``_ptsz``
  symbols, ``-D__CUDA_API_VERSION_INTERNAL`` for the legacy symbols), the
  runtime headers two ways (plain, per-thread); the union of the declared
  functions is taken, and a symbol that two preprocessings declare with
  different prototypes is an error.
* The doxygen group of a function is the nearest ``\\defgroup`` /
  ``\\addtogroup`` that precedes the function's declaration in the raw
  header text. Symbols are mapped to their raw declaration through their
  base name (``cuMemcpyHtoD_v2_ptds`` -> ``cuMemcpyHtoD(``), because the
  versioned and per-thread names only exist after macro expansion.
* GL/EGL/VDPAU headers include system headers that may be missing; a
  temporary directory with minimal stand-in typedefs is put on the include
  path with ``-idirafter`` so that the real headers win where present.
* The ``__cuda*`` registration/launch entry points are declared in C++-only
  headers (``crt/host_runtime.h``, ``crt/device_functions.h``); their
  prototypes are in the table ``REGISTRATION_PROTOTYPES`` below, and three
  symbols that ``libcudart.so.13`` exports without any declaration are in
  ``UNDECLARED_RUNTIME_EXPORTS``.

Type normalisation (``normalize_type``): tokens separated by single spaces,
a space before a run of ``*`` and none inside it (``const char *``,
``void **``, ``CUdeviceptr *``); attributes (``__attribute__((...))``,
``__declspec(...)``), storage classes (``extern``, ``static``, ``inline``)
and calling-convention macros (which preprocess to nothing) are dropped;
typedef names are kept as the header writes them.

Only the standard library is used.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

DEFAULT_CUDA_HOME = "/usr/local/cuda"


def cuda_home(path: Optional[str] = None) -> str:
    return path or os.environ.get("CUDA_HOME") or DEFAULT_CUDA_HOME


class HeaderError(RuntimeError):
    """Raised when the headers cannot be parsed consistently."""


# --------------------------------------------------------------------------
# Data model
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Param:
    name: str
    type: str


@dataclass
class Prototype:
    name: str
    returns: str
    params: Tuple[Param, ...]
    api: str                      # driver | runtime
    header: str                   # relative to $CUDA_HOME/include
    group: str = ""               # doxygen group
    position: int = 0             # offset of the raw declaration (for ordering)
    variants: Tuple[str, ...] = ()  # preprocessings that declared it
    declared: bool = True         # False: exported but declared in no header

    @property
    def param_types(self) -> Tuple[str, ...]:
        return tuple(p.type for p in self.params)

    def signature(self) -> Tuple[str, Tuple[str, ...]]:
        return (self.returns, self.param_types)

    def c_decl(self) -> str:
        ps = ", ".join(f"{p.type} {p.name}".replace("* ", "*") for p in self.params)
        return f"{self.returns} {self.name}({ps or 'void'})"


# --------------------------------------------------------------------------
# Header configuration
# --------------------------------------------------------------------------

VARIANT_FLAGS = {
    "plain": [],
    "ptds": ["-DCUDA_API_PER_THREAD_DEFAULT_STREAM"],
    "internal": ["-D__CUDA_API_VERSION_INTERNAL"],
}

# (header, pre-includes, variants). Pre-includes are headers that the header
# itself expects its includer to have included first.
DRIVER_HEADERS: List[Tuple[str, Tuple[str, ...], Tuple[str, ...]]] = [
    ("cuda.h", (), ("plain", "ptds", "internal")),
    ("cudaProfiler.h", ("cuda.h",), ("plain", "ptds", "internal")),
    ("cudaGL.h", ("cuda.h",), ("plain", "ptds", "internal")),
    ("cudaEGL.h", ("cuda.h",), ("plain", "ptds", "internal")),
    ("cudaVDPAU.h", ("cuda.h", "vdpau/vdpau.h"), ("plain", "ptds", "internal")),
]

RUNTIME_HEADERS: List[Tuple[str, Tuple[str, ...], Tuple[str, ...]]] = [
    ("cuda_runtime_api.h", (), ("plain", "ptds")),
    ("cuda_profiler_api.h", ("cuda_runtime_api.h",), ("plain", "ptds")),
    ("cuda_gl_interop.h", ("cuda_runtime_api.h",), ("plain", "ptds")),
    ("cuda_egl_interop.h", ("cuda_runtime_api.h",), ("plain", "ptds")),
    ("cuda_vdpau_interop.h", ("cuda_runtime_api.h",), ("plain", "ptds")),
]

# Minimal stand-ins for the window-system headers that the interop headers
# include. They are only found when the real header is missing (-idirafter).
STANDIN_HEADERS = {
    "GL/gl.h": """
#ifndef GPUPROXY_STANDIN_GL_H
#define GPUPROXY_STANDIN_GL_H
typedef unsigned int GLenum;
typedef unsigned int GLuint;
typedef int GLint;
typedef int GLsizei;
#endif
""",
    "EGL/egl.h": """
#ifndef GPUPROXY_STANDIN_EGL_H
#define GPUPROXY_STANDIN_EGL_H
typedef int EGLint;
typedef unsigned int EGLBoolean;
typedef unsigned int EGLenum;
typedef void *EGLDisplay;
typedef void *EGLConfig;
typedef void *EGLContext;
typedef void *EGLSurface;
typedef void *EGLClientBuffer;
typedef void *EGLImage;
typedef void *EGLSync;
#endif
""",
    "EGL/eglext.h": """
#ifndef GPUPROXY_STANDIN_EGLEXT_H
#define GPUPROXY_STANDIN_EGLEXT_H
#include <EGL/egl.h>
typedef void *EGLImageKHR;
typedef void *EGLStreamKHR;
typedef void *EGLSyncKHR;
#endif
""",
    "vdpau/vdpau.h": """
#ifndef GPUPROXY_STANDIN_VDPAU_H
#define GPUPROXY_STANDIN_VDPAU_H
#include <stdint.h>
typedef uint32_t VdpDevice;
typedef uint32_t VdpVideoSurface;
typedef uint32_t VdpOutputSurface;
typedef uint32_t VdpChromaType;
typedef uint32_t VdpRGBAFormat;
typedef int VdpStatus;
typedef VdpStatus VdpGetProcAddress(VdpDevice device, uint32_t function_id, void **function_pointer);
#endif
""",
}

# --------------------------------------------------------------------------
# Hard-coded prototypes of the __cuda* entry points (runtime).
#
# nvcc-generated host code calls these. They are declared only in C++
# headers (crt/host_runtime.h needs templates and `extern "C"` blocks,
# crt/device_functions.h declares its entries under __CUDACC__ with C++
# default arguments), so they are written out here instead of parsed. The
# tests check that each name occurs in its header's text and that the
# parameter types agree with the raw declaration (see raw_declaration()).
# Format: name -> (header, return type, [(param name, param type)]).
# Parameter names that the header leaves out are chosen here.
# --------------------------------------------------------------------------
REGISTRATION_GROUP = "CUDART_REGISTRATION"   # synthetic doxygen group

REGISTRATION_PROTOTYPES: Dict[str, Tuple[str, str, List[Tuple[str, str]]]] = {
    "__cudaRegisterFatBinary": ("crt/host_runtime.h", "void **", [
        ("fatCubin", "void *")]),
    "__cudaRegisterFatBinaryEnd": ("crt/host_runtime.h", "void", [
        ("fatCubinHandle", "void **")]),
    "__cudaUnregisterFatBinary": ("crt/host_runtime.h", "void", [
        ("fatCubinHandle", "void **")]),
    "__cudaRegisterVar": ("crt/host_runtime.h", "void", [
        ("fatCubinHandle", "void **"), ("hostVar", "char *"),
        ("deviceAddress", "char *"), ("deviceName", "const char *"),
        ("ext", "int"), ("size", "size_t"), ("constant", "int"),
        ("global", "int")]),
    "__cudaRegisterManagedVar": ("crt/host_runtime.h", "void", [
        ("fatCubinHandle", "void **"), ("hostVarPtrAddress", "void **"),
        ("deviceAddress", "char *"), ("deviceName", "const char *"),
        ("ext", "int"), ("size", "size_t"), ("constant", "int"),
        ("global", "int")]),
    "__cudaInitModule": ("crt/host_runtime.h", "char", [
        ("fatCubinHandle", "void **")]),
    "__cudaRegisterTexture": ("crt/host_runtime.h", "void", [
        ("fatCubinHandle", "void **"),
        ("hostVar", "const struct textureReference *"),
        ("deviceAddress", "const void **"), ("deviceName", "const char *"),
        ("dim", "int"), ("norm", "int"), ("ext", "int")]),
    "__cudaRegisterSurface": ("crt/host_runtime.h", "void", [
        ("fatCubinHandle", "void **"),
        ("hostVar", "const struct surfaceReference *"),
        ("deviceAddress", "const void **"), ("deviceName", "const char *"),
        ("dim", "int"), ("ext", "int")]),
    "__cudaRegisterFunction": ("crt/host_runtime.h", "void", [
        ("fatCubinHandle", "void **"), ("hostFun", "const char *"),
        ("deviceFun", "char *"), ("deviceName", "const char *"),
        ("thread_limit", "int"), ("tid", "uint3 *"), ("bid", "uint3 *"),
        ("bDim", "dim3 *"), ("gDim", "dim3 *"), ("wSize", "int *")]),
    "__cudaPopCallConfiguration": ("crt/host_runtime.h", "cudaError_t", [
        ("gridDim", "dim3 *"), ("blockDim", "dim3 *"),
        ("sharedMem", "size_t *"), ("stream", "void *")]),
    "__cudaPushCallConfiguration": ("crt/device_functions.h", "unsigned", [
        ("gridDim", "dim3"), ("blockDim", "dim3"), ("sharedMem", "size_t"),
        ("stream", "struct CUstream_st *")]),
    "__cudaGetKernel": ("crt/device_functions.h", "cudaError_t", [
        ("kernel", "cudaKernel_t *"), ("func", "const void *")]),
    "__cudaLaunchKernel": ("crt/device_functions.h", "cudaError_t", [
        ("kernel", "cudaKernel_t"), ("gridDim", "dim3"), ("blockDim", "dim3"),
        ("args", "void **"), ("sharedMem", "size_t"),
        ("stream", "cudaStream_t")]),
    "__cudaLaunchKernel_ptsz": ("crt/device_functions.h", "cudaError_t", [
        ("kernel", "cudaKernel_t"), ("gridDim", "dim3"), ("blockDim", "dim3"),
        ("args", "void **"), ("sharedMem", "size_t"),
        ("stream", "cudaStream_t")]),
}

# Symbols that libcudart.so.13 exports but that no CUDA 13.0 header declares.
# Their prototypes are inferred and cannot be checked against a header:
#  * __cudaRegisterHostVar: called by nvcc host code for host-side variables
#    of relocatable device code; four arguments (the disassembly forwards
#    rdi, rsi, rdx, rcx).
#  * __cudaRegisterUnifiedTable: forwards five 64-bit integer-register
#    arguments (rdi..r8); the exact meaning of the arguments is undocumented.
#  * __cudaGetProcAddress: a 3-byte stub `xor eax, eax; ret`, i.e. returns
#    0/NULL and reads no arguments.
UNDECLARED_RUNTIME_EXPORTS: Dict[str, Tuple[str, List[Tuple[str, str]]]] = {
    "__cudaRegisterHostVar": ("void", [
        ("fatCubinHandle", "void **"), ("deviceName", "const char *"),
        ("hostVar", "char *"), ("size", "size_t")]),
    "__cudaRegisterUnifiedTable": ("void", [
        ("fatCubinHandle", "void **"), ("functionTable", "void *"),
        ("functionWindowSize", "size_t"), ("dataTable", "void *"),
        ("dataWindowSize", "size_t")]),
    "__cudaGetProcAddress": ("void *", []),
}

# --------------------------------------------------------------------------
# Lexical helpers
# --------------------------------------------------------------------------

_TOKEN_RE = re.compile(r"[A-Za-z_]\w*|\.\.\.|[*()\[\],;{}=&]|\S")
_ATTR_RE = re.compile(r"\b(__attribute__|__attribute|__declspec|__asm__|__asm)\s*\(")

DROP_WORDS = {
    "extern", "static", "inline", "__inline", "__inline__", "__extension__",
    "CUDAAPI", "CUDARTAPI", "__host__", "__device__", "__cudart_builtin__",
    "__CUDA_DEPRECATED", "CUDARTAPI_CDECL", "__cdecl", "__stdcall",
    "EXCLUDE_FROM_RTC", "CUDART_DEVICE",
}

TYPE_WORDS = {
    "void", "char", "short", "int", "long", "float", "double", "signed",
    "unsigned", "_Bool", "const", "volatile", "restrict", "__restrict",
    "__restrict__", "struct", "enum", "union",
}


def _match_paren(text: str, i: int) -> int:
    """Index just past the bracket that closes text[i] ('(' '[' or '{')."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = []
    j = i
    n = len(text)
    while j < n:
        c = text[j]
        if c in pairs:
            stack.append(pairs[c])
        elif c in ")]}":
            if not stack or stack.pop() != c:
                raise HeaderError(f"unbalanced bracket near: {text[i:i + 80]!r}")
            if not stack:
                return j + 1
        j += 1
    raise HeaderError(f"unterminated bracket near: {text[i:i + 80]!r}")


def strip_attributes(text: str) -> str:
    """Remove __attribute__((...)), __declspec(...) and __asm__(...)."""
    out = []
    pos = 0
    for m in _ATTR_RE.finditer(text):
        if m.start() < pos:
            continue
        out.append(text[pos:m.start()])
        pos = _match_paren(text, m.end() - 1)
        out.append(" ")
    out.append(text[pos:])
    return "".join(out)


def tokens(text: str) -> List[str]:
    return _TOKEN_RE.findall(text)


def normalize_type(text_or_tokens) -> str:
    """'const  char*' -> 'const char *'; 'void * *' -> 'void **'."""
    toks = tokens(text_or_tokens) if isinstance(text_or_tokens, str) else list(text_or_tokens)
    toks = [t for t in toks if t not in DROP_WORDS]
    s = " ".join(toks)
    s = re.sub(r"\*\s+(?=\*)", "*", s)
    s = re.sub(r"\s*\[\s*", " [", s)
    s = re.sub(r"\s*\]", "]", s)
    s = re.sub(r"\(\s+", "(", s)
    s = re.sub(r"\s+\)", ")", s)
    s = re.sub(r"\s+,", ",", s)
    return s.strip()


def split_top(text: str, sep: str = ",") -> List[str]:
    parts, depth, cur = [], 0, []
    for c in text:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur))
    return parts


def parse_param(text: str, index: int) -> Param:
    """One parameter declaration -> Param (unnamed ones get argN)."""
    text = text.strip()
    # default arguments (C++ only, e.g. crt/device_functions.h): drop them
    if "=" in text:
        text = text.split("=", 1)[0].strip()
    if text == "...":
        return Param("...", "...")
    # function pointer: RET (*name)(ARGS)
    m = re.match(r"^(.*?)\(\s*\*\s*(\w*)\s*\)\s*(\(.*\))\s*$", text, re.S)
    if m:
        name = m.group(2) or f"arg{index}"
        return Param(name, normalize_type(f"{m.group(1)} (*){m.group(3)}"))
    toks = [t for t in tokens(text) if t not in DROP_WORDS]
    arrays = []
    while toks and toks[-1].startswith("[") or (toks and toks[-1] == "]"):
        # collect trailing array declarators
        if toks[-1] == "]":
            k = len(toks) - 1
            while k >= 0 and toks[k] != "[":
                k -= 1
            arrays.insert(0, "[" + " ".join(toks[k + 1:-1]) + "]")
            toks = toks[:k]
        else:
            break
    name = None
    if (len(toks) >= 2 and re.match(r"^[A-Za-z_]\w*$", toks[-1])
            and toks[-1] not in TYPE_WORDS
            and toks[-2] not in ("struct", "enum", "union")):
        name = toks[-1]
        toks = toks[:-1]
    ty = normalize_type(toks)
    if arrays:
        ty = ty + " " + "".join(arrays)
    return Param(name or f"arg{index}", ty)


def parse_params(text: str) -> Tuple[Param, ...]:
    parts = [p for p in split_top(text) if p.strip()]
    if len(parts) == 1 and normalize_type(parts[0]) == "void":
        return ()
    return tuple(parse_param(p, i) for i, p in enumerate(parts))


# --------------------------------------------------------------------------
# Preprocessing
# --------------------------------------------------------------------------

_STANDIN_DIR: Optional[str] = None


def standin_dir() -> str:
    """Temporary include dir with stand-in window-system headers."""
    global _STANDIN_DIR
    if _STANDIN_DIR is None or not os.path.isdir(_STANDIN_DIR):
        d = tempfile.mkdtemp(prefix="gpuproxy-standin-")
        for rel, body in STANDIN_HEADERS.items():
            p = os.path.join(d, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(body)
        import atexit
        atexit.register(shutil.rmtree, d, True)
        _STANDIN_DIR = d
    return _STANDIN_DIR


def compiler() -> str:
    return os.environ.get("GPUPROXY_CC") or shutil.which("gcc") or shutil.which("cc") or "gcc"


@lru_cache(maxsize=None)
def preprocess(home: str, header: str, pre: Tuple[str, ...], variant: str) -> str:
    """Run the C preprocessor on one header; returns text with line markers."""
    inc = os.path.join(home, "include")
    src = "".join(f"#include <{h}>\n" for h in pre) + f"#include <{header}>\n"
    cmd = [compiler(), "-E", "-x", "c", "-I", inc, "-idirafter", standin_dir()]
    cmd += VARIANT_FLAGS[variant] + ["-"]
    r = subprocess.run(cmd, input=src, capture_output=True, text=True)
    if r.returncode != 0:
        raise HeaderError(f"preprocessing {header} ({variant}) failed:\n{r.stderr[-3000:]}")
    return r.stdout


_MARKER_RE = re.compile(r'^#\s*(\d+)\s+"([^"]*)"[^\n]*$', re.M)


@lru_cache(maxsize=None)
def _realpath(p: str) -> str:
    return os.path.realpath(p)


def own_text(pp: str, home: str, header: str) -> str:
    """Keep only the parts of preprocessed output that come from `header`."""
    target = _realpath(os.path.join(home, "include", header))
    out = []
    pos = 0
    keep = False
    for m in _MARKER_RE.finditer(pp):
        if keep:
            out.append(pp[pos:m.start()])
        fname = m.group(2)
        keep = (not fname.startswith("<")) and _realpath(fname) == target
        pos = m.end()
    if keep:
        out.append(pp[pos:])
    text = "\n".join(out)
    # drop any remaining directives (#pragma ...)
    return re.sub(r"^\s*#[^\n]*$", " ", text, flags=re.M)


def statements(text: str) -> Iterable[str]:
    """Top-level C statements; function bodies are skipped."""
    text = strip_attributes(text)
    i, n = 0, len(text)
    start = 0
    depth = 0
    while i < n:
        c = text[i]
        if c in "([":
            i = _match_paren(text, i)
            continue
        if c == "{":
            head = text[start:i].strip()
            if head.endswith(")") and not re.match(r"^(typedef|struct|union|enum)\b", head):
                # function definition: skip the body
                i = _match_paren(text, i)
                start = i
                continue
            i = _match_paren(text, i)
            continue
        if c == ";":
            stmt = text[start:i].strip()
            if stmt:
                yield stmt
            start = i + 1
        i += 1
    rest = text[start:].strip()
    if rest:
        yield rest


_FUNC_RE = re.compile(r"^(?P<ret>.*?)\b(?P<name>[A-Za-z_]\w*)\s*\((?P<params>.*)\)\s*$", re.S)


def function_decls(text: str) -> List[Tuple[str, str, Tuple[Param, ...]]]:
    """(name, return type, params) for each function declaration in text."""
    out = []
    for st in statements(text):
        if st.startswith("typedef") or "(" not in st or "{" in st:
            continue
        toks0 = tokens(st)
        if toks0 and toks0[0] in ("struct", "enum", "union") and "(" not in st.split("{")[0]:
            continue
        st2 = " ".join(t for t in re.split(r"(\s+)", st))
        # find the declarator: the first '(' preceded by an identifier
        m = re.search(r"([A-Za-z_]\w*)\s*\(", st2)
        if not m:
            continue
        name = m.group(1)
        if name in TYPE_WORDS or name in DROP_WORDS:
            continue
        open_i = m.end() - 1
        close_i = _match_paren(st2, open_i)
        if st2[close_i:].strip():
            continue          # not a plain function declaration
        if "=" in st2[:open_i]:
            continue
        ret = normalize_type(st2[:m.start()])
        if not ret:
            continue
        params = parse_params(st2[open_i + 1:close_i - 1])
        out.append((name, ret, params))
    return out


# --------------------------------------------------------------------------
# Raw header text: doxygen groups and declaration positions
# --------------------------------------------------------------------------

@lru_cache(maxsize=None)
def raw_text(home: str, header: str) -> str:
    with open(os.path.join(home, "include", header), encoding="utf-8", errors="replace") as f:
        return f.read()


_GROUP_RE = re.compile(r"[\\@](?:defgroup|addtogroup)\s+(\w+)")


def blank_comments_and_directives(text: str) -> str:
    """Same length as text; comments, strings and # lines become spaces."""
    out = list(text)

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
            continue
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            blank(i, min(j + 1, n))
            i = j + 1
            continue
        if line_start and c == "#":
            j = i
            while j < n:
                k = text.find("\n", j)
                if k < 0:
                    k = n
                if k > 0 and text[k - 1] == "\\":
                    j = k + 1
                    continue
                break
            blank(i, k)
            i = k
            continue
        if c == "\n":
            line_start = True
        elif not c.isspace():
            line_start = False
        i += 1
    return "".join(out)


_ALIAS_RE = re.compile(
    r"^[ \t]*#[ \t]*define[ \t]+(\w+)[ \t]+(?:\w+\(\s*)?(\w+)\s*\)?[ \t]*$", re.M)


@lru_cache(maxsize=None)
def _raw_index(home: str, header: str):
    text = raw_text(home, header)
    groups = [(m.start(), m.group(1)) for m in _GROUP_RE.finditer(text)]
    code = blank_comments_and_directives(text)
    # macro aliases: `#define cuMemAlloc cuMemAlloc_v2`,
    # `#define cuMemcpyHtoD __CUDA_API_PTDS(cuMemcpyHtoD_v2)` -> target -> [macro]
    aliases: Dict[str, List[str]] = {}
    for m in _ALIAS_RE.finditer(text):
        if m.group(1) != m.group(2):
            aliases.setdefault(m.group(2), []).append(m.group(1))
    # first `name(` of each identifier in code (not `x.name(` / `x->name(`)
    first_call: Dict[str, int] = {}
    for m in re.finditer(r"(?<![\w.>])([A-Za-z_]\w*)[ \t\r\n]*\(", code):
        first_call.setdefault(m.group(1), m.start())
    return groups, code, aliases, first_call


_SUFFIX_RE = re.compile(r"^(?P<base>.+?)(?P<ver>_v\d+)?(?P<stream>_ptds|_ptsz)?$")


def split_symbol(name: str) -> Tuple[str, int, str]:
    """'cuMemcpyHtoD_v2_ptds' -> ('cuMemcpyHtoD', 2, 'ptds'); no suffix -> 1."""
    m = _SUFFIX_RE.match(name)
    base = m.group("base")
    ver = int(m.group("ver")[2:]) if m.group("ver") else 1
    return base, ver, (m.group("stream") or "")[1:]


def declaration_position(home: str, header: str, name: str) -> Optional[int]:
    """Offset of the first declaration of `name` (or its base name) in the raw header."""
    _, code, aliases, first_call = _raw_index(home, header)
    base, _, _ = split_symbol(name)
    cands = [base, name]
    for n in (name, base):
        cands += aliases.get(n, [])
    for cand in dict.fromkeys(cands):
        if cand in first_call:
            return first_call[cand]
    return None


def group_at(home: str, header: str, pos: int) -> Optional[str]:
    groups = _raw_index(home, header)[0]
    best = None
    for gpos, gname in groups:
        if gpos < pos:
            best = gname
        else:
            break
    return best


def raw_declaration(home: str, header: str, name: str) -> Optional[Tuple[str, Tuple[Param, ...]]]:
    """Parse the declaration of `name` directly from the raw (C or C++) header
    text: returns (return type, params) or None. Used to check the hard-coded
    registration prototypes; good enough for plain declarations."""
    code = _raw_index(home, header)[1]
    for m in re.finditer(r"(?<![\w])" + re.escape(name) + r"\s*\(", code):
        # the declaration starts after the previous ';', '{', '}' or ')'
        k = m.start() - 1
        while k >= 0 and code[k] not in ";{}":
            k -= 1
        head = code[k + 1:m.start()]
        head = head.replace('extern "C"', " ")
        head = re.sub(r'\bextern\s+"C"', " ", head)
        head_toks = [t for t in tokens(strip_attributes(head)) if t not in DROP_WORDS and t != '"C"']
        head_toks = [t for t in head_toks if t not in ('"',)]
        if not head_toks or head_toks[-1] in ("(", ",", "=", "return", ")"):
            continue          # a call, not a declaration
        if "#" in head or "define" in head_toks:
            continue
        open_i = m.end() - 1
        close_i = _match_paren(code, open_i)
        after = code[close_i:].lstrip()
        if not after.startswith(";"):
            continue
        ret = normalize_type(head_toks)
        params = parse_params(code[open_i + 1:close_i - 1])
        return ret, params
    return None


# --------------------------------------------------------------------------
# Main entry points
# --------------------------------------------------------------------------

def _parse_api(home: str, api: str, configs) -> Dict[str, Prototype]:
    result: Dict[str, Prototype] = {}
    for header, pre, variants in configs:
        for variant in variants:
            text = own_text(preprocess(home, header, tuple(pre), variant), home, header)
            for name, ret, params in function_decls(text):
                proto = Prototype(name=name, returns=ret, params=params, api=api,
                                  header=header, variants=(variant,))
                old = result.get(name)
                if old is None:
                    result[name] = proto
                    continue
                if old.signature() != proto.signature():
                    raise HeaderError(
                        f"{name}: conflicting prototypes: {old.c_decl()} "
                        f"[{old.header} {','.join(old.variants)}] vs {proto.c_decl()} "
                        f"[{header} {variant}]")
                if variant not in old.variants:
                    old.variants = old.variants + (variant,)
    for name, proto in result.items():
        pos = declaration_position(home, proto.header, name)
        if pos is None:
            raise HeaderError(f"{name}: no declaration of it or its base name in {proto.header}")
        group = group_at(home, proto.header, pos)
        if group is None:
            raise HeaderError(f"{name}: no doxygen group before its declaration in {proto.header}")
        proto.position = pos
        proto.group = group
    return result


def _registration(home: str) -> Dict[str, Prototype]:
    out: Dict[str, Prototype] = {}
    for name, (hdr, ret, params) in REGISTRATION_PROTOTYPES.items():
        text = raw_text(home, hdr)
        pos = text.find(name + "(")
        if pos < 0:
            m = re.search(re.escape(name) + r"\s*\(", text)
            pos = m.start() if m else 0
        out[name] = Prototype(name=name, returns=ret,
                              params=tuple(Param(n, t) for n, t in params),
                              api="runtime", header=hdr, group=REGISTRATION_GROUP,
                              position=pos, variants=("table",))
    base = max([p.position for p in out.values()] + [0]) + 1
    for i, (name, (ret, params)) in enumerate(UNDECLARED_RUNTIME_EXPORTS.items()):
        out[name] = Prototype(name=name, returns=ret,
                              params=tuple(Param(n, t) for n, t in params),
                              api="runtime", header="",
                              group=REGISTRATION_GROUP, position=base + i,
                              variants=("undeclared",), declared=False)
    return out


@lru_cache(maxsize=None)
def _parse_all_cached(home: str) -> Tuple[Dict[str, Prototype], Dict[str, Prototype]]:
    driver = _parse_api(home, "driver", DRIVER_HEADERS)
    runtime = _parse_api(home, "runtime", RUNTIME_HEADERS)
    for name, p in _registration(home).items():
        if name in runtime:
            raise HeaderError(f"{name}: both parsed and in the registration table")
        runtime[name] = p
    return driver, runtime


def parse_driver(home: Optional[str] = None) -> Dict[str, Prototype]:
    """symbol -> Prototype for libcuda.so.1 (cuda.h + driver interop headers)."""
    return dict(_parse_all_cached(cuda_home(home))[0])


def parse_runtime(home: Optional[str] = None) -> Dict[str, Prototype]:
    """symbol -> Prototype for libcudart.so.13, including the __cuda* entries
    (declared ones, and the undeclared exports with declared=False)."""
    return dict(_parse_all_cached(cuda_home(home))[1])


def parse_all(home: Optional[str] = None) -> Dict[str, Prototype]:
    d, r = _parse_all_cached(cuda_home(home))
    both = set(d) & set(r)
    if both:
        raise HeaderError(f"symbols in both driver and runtime: {sorted(both)}")
    out = dict(d)
    out.update(r)
    return out


def cuda_version(home: Optional[str] = None) -> int:
    m = re.search(r"^#define\s+CUDA_VERSION\s+(\d+)", raw_text(cuda_home(home), "cuda.h"), re.M)
    if not m:
        raise HeaderError("CUDA_VERSION not found in cuda.h")
    return int(m.group(1))


def sort_key(p: Prototype):
    """Header order: raw declaration position, then legacy before _v2..,
    then plain before _ptds/_ptsz."""
    _, ver, stream = split_symbol(p.name)
    return (p.position, ver, stream, p.name)


# --------------------------------------------------------------------------
# Typedefs: alias resolution and the PFN typedefs of cudaTypedefs.h
# --------------------------------------------------------------------------

def typedefs_from_text(text: str) -> Dict[str, List[str]]:
    """name -> defining tokens for `typedef ... name;` statements.
    Struct/enum/union definitions map to their tag ('struct X_st') or, when
    anonymous, to nothing (left unresolved); function-type typedefs are left
    unresolved as well."""
    out: Dict[str, List[str]] = {}
    for st in statements(text):
        if not st.startswith("typedef"):
            continue
        body = st[len("typedef"):]
        if "{" in body:
            m = re.match(r"\s*(?:const\s+)?(struct|union|enum)\s*(\w*)\s*\{", body)
            close = _match_paren(body, body.index("{"))
            decl = tokens(body[close:])
            if not m:
                continue
            for d in split_top(" ".join(decl)):
                dt = tokens(d)
                if not dt:
                    continue
                name = dt[-1]
                if m.group(2):
                    out[name] = [m.group(1), m.group(2)] + dt[:-1]
            continue
        if "(" in body:
            continue       # function or function pointer type
        toks = [t for t in tokens(body) if t not in DROP_WORDS]
        if len(toks) < 2:
            continue
        name = toks[-1]
        out[name] = toks[:-1]
    return out


@lru_cache(maxsize=None)
def typedef_map(home: Optional[str] = None, api: str = "driver") -> Dict[str, Tuple[str, ...]]:
    home = cuda_home(home)
    result: Dict[str, Tuple[str, ...]] = {}
    configs = DRIVER_HEADERS if api == "driver" else RUNTIME_HEADERS
    for header, pre, variants in configs:
        variant = "internal" if "internal" in variants else variants[-1]
        pp = preprocess(home, header, tuple(pre), variant)
        text = re.sub(r"^\s*#[^\n]*$", " ", pp, flags=re.M)
        for k, v in typedefs_from_text(text).items():
            result.setdefault(k, tuple(v))
    return result


@lru_cache(maxsize=None)
def function_typedefs(home: Optional[str] = None, api: str = "driver") -> frozenset:
    """Names of typedefs of function or function-pointer type
    (CUhostFn, cudaStreamCallback_t, VdpGetProcAddress, ...)."""
    home = cuda_home(home)
    names = set()
    configs = DRIVER_HEADERS if api == "driver" else RUNTIME_HEADERS
    for header, pre, variants in configs:
        variant = "internal" if "internal" in variants else variants[-1]
        pp = preprocess(home, header, tuple(pre), variant)
        text = re.sub(r"^\s*#[^\n]*$", " ", pp, flags=re.M)
        for st in statements(text):
            if not st.startswith("typedef") or "(" not in st or "{" in st:
                continue
            m = re.search(r"\(\s*(?:\w+\s+)*\*\s*(\w+)\s*\)\s*\(", st)   # RET (*NAME)(...)
            if m:
                names.add(m.group(1))
                continue
            m = re.search(r"(\w+)\s*\(", st)                           # RET NAME(...)
            if m:
                names.add(m.group(1))
    return frozenset(names)


def resolve_type(ty: str, tmap: Dict[str, Sequence[str]]) -> str:
    """Expand typedef names until only builtin types and tags remain.
    CUdeviceptr -> unsigned long long, CUdeviceptr_v1 -> unsigned int."""
    toks = tokens(ty)
    for _ in range(50):
        changed = False
        new = []
        prev = None
        for t in toks:
            if t in tmap and prev not in ("struct", "enum", "union") and list(tmap[t]) != [t]:
                new.extend(tmap[t])
                changed = True
            else:
                new.append(t)
            prev = t
        toks = new
        if not changed:
            break
    return normalize_type(toks)


@dataclass
class PFN:
    typedef: str            # PFN_cuMemAlloc_v3020
    base: str               # cuMemAlloc
    version: int            # 3020
    stream: str             # '' | 'ptds' | 'ptsz'
    returns: str
    params: Tuple[Param, ...]
    header: str


PFN_HEADERS = ("cudaTypedefs.h", "cudaProfilerTypedefs.h", "cudaGLTypedefs.h",
               "cudaEGLTypedefs.h", "cudaVDPAUTypedefs.h")

_PFN_RE = re.compile(
    r"typedef\s+(?P<ret>[\w\s\*]+?)\s*\(\s*(?:CUDAAPI\s*)?\*\s*PFN_(?P<name>\w+?)_v(?P<ver>\d+)"
    r"(?:_(?P<stream>ptds|ptsz))?\s*\)\s*\((?P<params>[^;]*)\)\s*;")


def parse_pfn_typedefs(home: Optional[str] = None) -> List[PFN]:
    """All PFN_<base>_v<version>[_ptds|_ptsz] typedefs (raw text, all #if
    branches except _WIN32-only ones)."""
    home = cuda_home(home)
    out = []
    for hdr in PFN_HEADERS:
        path = os.path.join(home, "include", hdr)
        if not os.path.exists(path):
            continue
        code = blank_comments_and_directives(raw_text(home, hdr))
        text = raw_text(home, hdr)
        # leave out typedefs inside `#ifdef _WIN32` blocks
        win_spans = [(m.start(), text.find("#endif", m.start()))
                     for m in re.finditer(r"#if(?:def)?\s+(?:defined\()?_WIN32", text)]
        for m in _PFN_RE.finditer(code):
            if any(a <= m.start() <= b for a, b in win_spans):
                continue
            out.append(PFN(typedef=f"PFN_{m.group('name')}_v{m.group('ver')}"
                           + (f"_{m.group('stream')}" if m.group("stream") else ""),
                           base=m.group("name"), version=int(m.group("ver")),
                           stream=m.group("stream") or "",
                           returns=normalize_type(m.group("ret")),
                           params=parse_params(m.group("params")), header=hdr))
    return out


def match_pfns(protos: Dict[str, Prototype], home: Optional[str] = None):
    """Map driver symbols to PFN typedefs.

    A PFN_<base>_v<ver>[_stream] matches the symbols <base>[_vN][_stream] whose
    return and parameter types are identical after typedef resolution. When
    several PFNs and symbols of one base share a signature, they are paired in
    order (lowest version with the lowest _vN suffix); a symbol keeps the
    lowest version that reaches it.

    Returns (symbol -> PFN, [unmatched PFN])."""
    home = cuda_home(home)
    tmap = typedef_map(home, "driver")

    def sig(ret, params):
        return (resolve_type(ret, tmap), tuple(resolve_type(p.type, tmap) for p in params))

    by_key: Dict[Tuple[str, str], List[Prototype]] = {}
    for p in protos.values():
        base, ver, stream = split_symbol(p.name)
        by_key.setdefault((base, stream), []).append(p)
    psig = {p.name: sig(p.returns, p.params) for p in protos.values()}
    pfns = parse_pfn_typedefs(home)
    groups: Dict[Tuple[str, str], List[PFN]] = {}
    for f in pfns:
        groups.setdefault((f.base, f.stream), []).append(f)
    result: Dict[str, PFN] = {}
    unmatched: List[PFN] = []
    for key, flist in groups.items():
        syms = sorted(by_key.get(key, []), key=lambda p: split_symbol(p.name)[1])
        flist = sorted(flist, key=lambda f: f.version)
        by_sig: Dict[tuple, List[PFN]] = {}
        for f in flist:
            by_sig.setdefault(sig(f.returns, f.params), []).append(f)
        for s, fs in by_sig.items():
            cands = [p for p in syms if psig[p.name] == s]
            if not cands:
                unmatched.extend(fs)
                continue
            for i, f in enumerate(fs):
                p = cands[min(i, len(cands) - 1)]
                if p.name not in result or result[p.name].version > f.version:
                    result[p.name] = f
    return result, unmatched


# --------------------------------------------------------------------------
# Exported symbols of a shared library (pure-Python ELF .dynsym reader,
# equivalent to `nm -D --defined-only` restricted to functions)
# --------------------------------------------------------------------------

def elf_exported_functions(path: str) -> List[str]:
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise HeaderError(f"{path}: not a little-endian ELF64 file")
    e_shoff, = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = []
    for i in range(e_shnum):
        off = e_shoff + i * e_shentsize
        (sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link,
         sh_info, sh_addralign, sh_entsize) = struct.unpack_from("<IIQQQQIIQQ", data, off)
        sections.append((sh_type, sh_offset, sh_size, sh_link, sh_entsize))
    names = set()
    for sh_type, off, size, link, entsize in sections:
        if sh_type != 11:        # SHT_DYNSYM
            continue
        str_off = sections[link][1]
        for k in range(size // entsize):
            st_name, st_info, st_other, st_shndx, st_value, st_size = \
                struct.unpack_from("<IBBHQQ", data, off + k * entsize)
            bind, typ = st_info >> 4, st_info & 0xF
            if st_shndx == 0 or bind not in (1, 2) or typ not in (2, 10):   # FUNC, IFUNC
                continue
            end = data.index(b"\0", str_off + st_name)
            names.add(data[str_off + st_name:end].decode())
    return sorted(names)


def runtime_library(home: Optional[str] = None) -> str:
    return os.path.join(cuda_home(home), "lib64", "libcudart.so.13")


def runtime_exports(home: Optional[str] = None) -> List[str]:
    return elf_exported_functions(runtime_library(home))


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------

def report(home: Optional[str] = None, out=sys.stdout) -> None:
    home = cuda_home(home)
    d = parse_driver(home)
    r = parse_runtime(home)
    print(f"CUDA_VERSION {cuda_version(home)}", file=out)
    print(f"driver functions: {len(d)}", file=out)
    print(f"runtime functions: {len(r)}", file=out)
    lib = runtime_library(home)
    if os.path.exists(lib):
        exp = set(runtime_exports(home))
        declared_only = sorted(n for n, p in r.items() if n not in exp)
        exported_only = sorted(exp - set(r))
        print(f"runtime: declared but not exported by {os.path.basename(lib)} "
              f"({len(declared_only)}): {' '.join(declared_only)}", file=out)
        print(f"runtime: exported but in no header or table ({len(exported_only)}): "
              f"{' '.join(exported_only)}", file=out)
        print(f"runtime: exported, no header declaration (hard-coded): "
              f"{' '.join(sorted(UNDECLARED_RUNTIME_EXPORTS))}", file=out)
    m, unmatched = match_pfns(d, home)
    print(f"driver: PFN typedefs matched: {len(m)}; symbols without PFN: "
          f"{' '.join(sorted(set(d) - set(m)))}", file=out)
    if unmatched:
        print(f"driver: PFN typedefs without symbol: {' '.join(f.typedef for f in unmatched)}",
              file=out)


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cuda-home", default=None)
    ap.add_argument("--list", action="store_true", help="print every prototype")
    a = ap.parse_args()
    if a.list:
        for p in sorted(parse_all(a.cuda_home).values(), key=lambda p: (p.api, p.header, sort_key(p))):
            print(f"{p.api:7} {p.header:22} {p.group:28} {p.c_decl()}")
    report(a.cuda_home)
