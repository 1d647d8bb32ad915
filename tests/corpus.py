"""The test corpus: small self-checking CUDA programs under tests/programs.

Used by the tests and by scripts/gpu-check:

    from corpus import load_corpus, build, build_all, run_udp_counter

    for built in build_all(out_dir, jobs=2):
        cmd = built.argv()                       # [binary, *args]
        ...compare stdout with built.program.expected_output

Programs are compiled with ``nvcc -cudart shared -arch=$GPUPROXY_NVCC_ARCH
-O2`` (default arch sm_90; a shared cudart is what the shim can stand in for).
Builds are cached under ``out_dir`` by a hash of the sources, the flags and the
nvcc version, so a repeated build is instant. Programs that link ``-lcuda`` are
linked against the CUDA toolkit's stub libcuda.so; where the toolkit has none
(a machine without the driver), a stub with the program's own ``cu*`` symbols
is generated (soname libcuda.so.1, so the binary runs against the real driver
or the shim).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

import yaml

PROGRAMS_DIR = Path(__file__).resolve().parent / "programs"
MANIFEST = PROGRAMS_DIR / "corpus.yaml"
DEFAULT_ARCH = "sm_90"
ARCH_ENV = "GPUPROXY_NVCC_ARCH"
BUILD_DIR_ENV = "GPUPROXY_CORPUS_BUILD_DIR"
PACE_ENV = "GPUPROXY_TEST_PACE"
DRIVERS = (None, "udp_counter")

_CUBIN_ARG = re.compile(r"\{cubin:([A-Za-z0-9_.-]+)\}")


class BuildError(RuntimeError):
    """nvcc (or the stub library's compiler) failed; the message holds its stderr."""


@dataclasses.dataclass(frozen=True)
class Program:
    """One manifest entry, with absolute paths resolved."""

    name: str
    source: str
    link: tuple[str, ...]
    cubins: tuple[str, ...]
    args: tuple[str, ...]
    emu: Optional[str]
    expected: str
    driver: Optional[str]
    pace: bool
    proxy_only: bool
    compile_flags: tuple[str, ...] = ()
    checkpoints: tuple[int, ...] = ()
    # substrings of the shim's stderr lines that the program provokes on
    # purpose (calls it expects to fail; the shim reports proxyd's reason)
    expected_errors: tuple[str, ...] = ()
    # GPUs the program needs (emulated: proxyd --emu-devices; on a GPU
    # machine with fewer, scripts/gpu_check.py skips it and says so)
    devices: int = 1
    # absolute paths
    source_path: Path = Path()
    cubin_paths: tuple[Path, ...] = ()
    emu_path: Optional[Path] = None
    expected_path: Path = Path()

    @property
    def cubin_stems(self) -> list[str]:
        return [Path(c).stem for c in self.cubins]

    @property
    def expected_output(self) -> str:
        """The exact expected stdout (for udp_counter: the concatenated replies)."""
        return self.expected_path.read_text()


@dataclasses.dataclass(frozen=True)
class BuiltProgram:
    program: Program
    binary: Path
    cubins: dict  # cubin stem -> Path

    @property
    def name(self) -> str:
        return self.program.name

    def args(self) -> list[str]:
        """The manifest's args with "{cubin:<stem>}" replaced by the cubin's path."""

        def subst(arg: str) -> str:
            def repl(m: re.Match) -> str:
                stem = m.group(1)
                if stem not in self.cubins:
                    raise KeyError(f"{self.program.name}: no cubin named {stem!r}")
                return str(self.cubins[stem])

            return _CUBIN_ARG.sub(repl, arg)

        return [subst(a) for a in self.program.args]

    def argv(self) -> list[str]:
        """Full command line: [binary, *args]."""
        return [str(self.binary)] + self.args()


# --------------------------------------------------------------------------- manifest


def load_corpus(manifest: Path | str = MANIFEST) -> list[Program]:
    manifest = Path(manifest)
    base = manifest.parent
    entries = yaml.safe_load(manifest.read_text())
    if not isinstance(entries, list):
        raise ValueError(f"{manifest}: expected a list of programs")
    programs = []
    seen = set()
    for e in entries:
        name = e["name"]
        if name in seen:
            raise ValueError(f"{manifest}: duplicate program {name!r}")
        seen.add(name)
        driver = e.get("driver")
        if driver not in DRIVERS:
            raise ValueError(f"{manifest}: {name}: unknown driver {driver!r}")
        cubins = tuple(e.get("cubins") or ())
        emu = e.get("emu")
        programs.append(
            Program(
                name=name,
                source=e["source"],
                link=tuple(str(x) for x in (e.get("link") or ())),
                cubins=cubins,
                args=tuple(str(x) for x in (e.get("args") or ())),
                emu=emu,
                expected=e["expected"],
                driver=driver,
                pace=bool(e.get("pace", False)),
                proxy_only=bool(e.get("proxy_only", False)),
                compile_flags=tuple(str(x) for x in (e.get("compile_flags") or ())),
                checkpoints=tuple(int(x) for x in (e.get("checkpoints") or ())),
                expected_errors=tuple(str(x) for x in (e.get("expected_errors") or ())),
                devices=int(e.get("devices", 1)),
                source_path=base / e["source"],
                cubin_paths=tuple(base / c for c in cubins),
                emu_path=(base / emu) if emu else None,
                expected_path=base / e["expected"],
            )
        )
    return programs


def get_program(name: str) -> Program:
    for p in load_corpus():
        if p.name == name:
            return p
    raise KeyError(name)


# --------------------------------------------------------------------------- toolchain


def nvcc_path() -> Optional[str]:
    """nvcc from $NVCC, PATH, $CUDA_HOME/bin or /usr/local/cuda/bin (None if absent)."""
    cand = os.environ.get("NVCC")
    if cand and Path(cand).exists():
        return cand
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").exists():
            return str(Path(home) / "bin" / "nvcc")
    return None


def nvcc_arch() -> str:
    return os.environ.get(ARCH_ENV) or DEFAULT_ARCH


def default_build_dir() -> Path:
    env = os.environ.get(BUILD_DIR_ENV)
    if env:
        return Path(env)
    return Path(tempfile.gettempdir()) / f"gpuproxy-corpus-{os.getuid()}"


_nvcc_version_cache: dict = {}


def _nvcc_version(nvcc: str) -> str:
    if nvcc not in _nvcc_version_cache:
        try:
            out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
        except OSError as exc:
            raise BuildError(f"cannot run {nvcc}: {exc}") from exc
        _nvcc_version_cache[nvcc] = out.strip()
    return _nvcc_version_cache[nvcc]


def _cuda_home(nvcc: str) -> Path:
    real = Path(nvcc).resolve()
    return real.parent.parent


def _find_libcuda_stub_dir(nvcc: str) -> Optional[Path]:
    """A directory holding a linkable libcuda.so (the toolkit's stubs), or None."""
    homes = [_cuda_home(nvcc)]
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            homes.append(Path(os.environ[env]))
    homes.append(Path("/usr/local/cuda"))
    dirs = []
    for h in homes:
        dirs += [h / "lib64" / "stubs", h / "lib" / "stubs", h / "targets" / "x86_64-linux" / "lib" / "stubs",
                 h / "targets" / "sbsa-linux" / "lib" / "stubs"]
    dirs += [Path(d) for d in os.environ.get("LIBRARY_PATH", "").split(":") if d]
    dirs += [Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib64"), Path("/usr/lib/aarch64-linux-gnu")]
    for d in dirs:
        if (d / "libcuda.so").exists():
            return d
    return None


def _run(cmd: list[str], what: str, cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=600)
    except OSError as exc:
        raise BuildError(f"{what}: cannot run {cmd[0]}: {exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"{what}: timed out: {' '.join(cmd)}") from exc
    if res.returncode != 0:
        raise BuildError(f"{what} failed (exit {res.returncode}):\n$ {' '.join(cmd)}\n{res.stderr}{res.stdout}")
    return res


def _make_libcuda_stub(obj: Path, stub_dir: Path) -> None:
    """Build stub_dir/libcuda.so (soname libcuda.so.1) defining the cu* symbols obj needs."""
    res = _run(["nm", "-u", "--format=posix", str(obj)], "nm")
    syms = sorted({line.split()[0] for line in res.stdout.splitlines()
                   if line.strip() and re.match(r"cu[A-Z]\w*$", line.split()[0])})
    stub_dir.mkdir(parents=True, exist_ok=True)
    src = stub_dir / "libcuda_stub.c"
    src.write_text("/* link-time stub only; never loaded (soname libcuda.so.1) */\n"
                   + "".join(f"int {s}(void) {{ return 999; }}\n" for s in syms))
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc") or "cc"
    _run([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub_dir / "libcuda.so"), str(src)],
         "libcuda stub")


# NVIDIA libraries a program may link (-lcublas, -lcublasLt, ...): the soname
# each -l flag stands for (CUDA 13's wheels keep cuFFT, cuRAND, cuSPARSE and
# cuSOLVER at their CUDA 12 sonames)
NVIDIA_LIBS = {"-lcublas": "libcublas.so.13", "-lcublasLt": "libcublasLt.so.13", "-lcufft": "libcufft.so.12",
               "-lcurand": "libcurand.so.10", "-lcusparse": "libcusparse.so.12",
               "-lcusolver": "libcusolver.so.12", "-lcudnn": "libcudnn.so.9", "-lnccl": "libnccl.so.2"}


def _nvidia_lib_dir(nvcc: str, soname: str) -> Optional[Path]:
    """Where NVIDIA's library is: the toolkit's lib64, $GPUPROXY_NVIDIA_LIB_DIR,
    or nvidia/cu13/lib of this Python (the nvidia-cublas wheel); None if absent."""
    import sys
    homes = [_cuda_home(nvcc), Path("/usr/local/cuda")]
    dirs = []
    for h in homes:
        dirs += [h / "lib64", h / "targets" / "x86_64-linux" / "lib", h / "targets" / "sbsa-linux" / "lib"]
    if os.environ.get("GPUPROXY_NVIDIA_LIB_DIR"):
        dirs.append(Path(os.environ["GPUPROXY_NVIDIA_LIB_DIR"]))
    dirs += [Path(p) / "nvidia" / "cu13" / "lib" for p in sys.path if p]
    dirs += [Path(p) / "nvidia" / "cudnn" / "lib" for p in sys.path if p]     # nvidia-cudnn-cu13
    dirs += [Path(p) / "nvidia" / "nccl" / "lib" for p in sys.path if p]      # nvidia-nccl-cu13
    for d in dirs:
        if (d / soname).exists():
            return d
    return None


def _library_link_flags(nvcc: str, link: list[str]) -> list[str]:
    """-lcublas and -lcublasLt: linked against NVIDIA's library (with an rpath
    to its folder, so the program also runs natively) where it is installed;
    else against gpuproxy's stand-ins, which export the same symbols and
    version nodes (docs/libraries.md) -- such a binary runs only under the
    shim, which preloads the stand-ins (CI, the emulated backend)."""
    out = []
    for flag in link:
        soname = NVIDIA_LIBS.get(flag)
        if soname is None:
            out.append(flag)
            continue
        d = _nvidia_lib_dir(nvcc, soname)
        if d is not None:
            out += [f"-L{d}", f"-l:{soname}", f"-Xlinker=-rpath={d}"]
        else:
            from gpuproxy.interceptor import lib_dir
            out += [f"-L{lib_dir()}", f"-l:{soname}"]
    return out


# --------------------------------------------------------------------------- build


CUDARTS = ("shared", "static")


def _base_flags(arch: str, cudart: str = "shared") -> list[str]:
    # "static": NVIDIA's runtime linked into the program (libcudart_static.a),
    # which reaches the shim through cuGetExportTable (interceptor/export_tables.c)
    if cudart not in CUDARTS:
        raise ValueError(f"cudart must be one of {CUDARTS}, not {cudart!r}")
    return ["-cudart", cudart, f"-arch={arch}", "-O2"]


def _cache_key(program: Program, nvcc: str, arch: str, cudart: str = "shared") -> str:
    h = hashlib.sha256()
    h.update(b"gpuproxy-corpus-v1\0")
    h.update(_nvcc_version(nvcc).encode() + b"\0")
    h.update(repr((_base_flags(arch, cudart), program.compile_flags, program.link, program.cubins)).encode() + b"\0")
    for path in (program.source_path,) + tuple(program.cubin_paths) + tuple(sorted(PROGRAMS_DIR.glob("*.h"))):
        h.update(path.name.encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    for flag in program.link:
        if flag in NVIDIA_LIBS:
            # where the library comes from (NVIDIA's or the stand-in) changes the binary
            h.update(str(_nvidia_lib_dir(nvcc, NVIDIA_LIBS[flag])).encode() + b"\0")
    return h.hexdigest()[:20]


def _built(program: Program, final: Path) -> BuiltProgram:
    return BuiltProgram(
        program=program,
        binary=final / program.name,
        cubins={Path(c).stem: final / (Path(c).stem + ".cubin") for c in program.cubins},
    )


def build(program: Program, out_dir: Path | str, cudart: str = "shared") -> BuiltProgram:
    """Compile one program (and its cubins) into out_dir/<name>/<hash>/; cached.
    cudart: "shared" (the default, what the shim stands in for) or "static".

    Raises BuildError with nvcc's stderr on failure."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise BuildError("nvcc not found (set $NVCC or put it on PATH)")
    arch = nvcc_arch()
    out_dir = Path(out_dir)
    key = _cache_key(program, nvcc, arch, cudart)
    final = out_dir / program.name / key
    if (final / ".ok").exists():
        return _built(program, final)

    (out_dir / program.name).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=out_dir / program.name))
    try:
        binary = work / program.name
        flags = _base_flags(arch, cudart)
        link = _library_link_flags(nvcc, list(program.link))
        needs_stub = "-lcuda" in link and _find_libcuda_stub_dir(nvcc) is None
        if "-lcuda" in link and not needs_stub:
            link = [f"-L{_find_libcuda_stub_dir(nvcc)}"] + link
        if needs_stub:
            obj = work / (program.name + ".o")
            _run([nvcc] + flags + list(program.compile_flags) + ["-c", "-o", str(obj), str(program.source_path)],
                 f"nvcc {program.source}")
            _make_libcuda_stub(obj, work / "stub")
            _run([nvcc] + flags + ["-o", str(binary), str(obj), f"-L{work / 'stub'}"] + link,
                 f"nvcc (link) {program.name}")
            shutil.rmtree(work / "stub")
            obj.unlink()
        else:
            _run([nvcc] + flags + list(program.compile_flags) + ["-o", str(binary), str(program.source_path)] + link,
                 f"nvcc {program.source}")
        for src in program.cubin_paths:
            _run([nvcc, "-cubin", f"-arch={arch}", "-O2", "-o", str(work / (src.stem + ".cubin")), str(src)],
                 f"nvcc -cubin {src.name}")
        (work / ".ok").write_text(key + "\n")
        try:
            work.rename(final)
        except OSError:
            # another process finished the same build first
            if not (final / ".ok").exists():
                raise
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return _built(program, final)


def build_all(out_dir: Path | str | None = None, jobs: int | None = None,
              programs: Optional[list[Program]] = None, cudart: str = "shared") -> list[BuiltProgram]:
    """Build every program (in manifest order) with `jobs` parallel nvcc's
    (default: one per core, at most 8)."""
    if jobs is None:
        jobs = min(8, os.cpu_count() or 2)
    out_dir = Path(out_dir) if out_dir is not None else default_build_dir()
    programs = load_corpus() if programs is None else programs
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(build, p, out_dir, cudart) for p in programs]
        return [f.result() for f in futures]


# --------------------------------------------------------------------------- kernels in a binary


def _elf_entry_functions(data: bytes) -> set[str]:
    """Names of the kernels (FUNC symbols with STO_CUDA_ENTRY) of a CUDA ELF (cubin)."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not a 64-bit ELF")
    end = "<" if data[5] == 1 else ">"
    e_shoff, = struct.unpack_from(end + "Q", data, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from(end + "HHH", data, 0x3A)
    sections = []
    for i in range(e_shnum):
        off = e_shoff + i * e_shentsize
        (sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, sh_info, sh_addralign,
         sh_entsize) = struct.unpack_from(end + "IIQQQQIIQQ", data, off)
        sections.append((sh_name, sh_type, sh_offset, sh_size, sh_link, sh_entsize))
    names = set()
    for sh_name, sh_type, sh_offset, sh_size, sh_link, sh_entsize in sections:
        if sh_type != 2:  # SHT_SYMTAB
            continue
        str_off = sections[sh_link][2]
        for k in range(sh_size // 24):
            st_name, st_info, st_other, st_shndx, st_value, st_size = struct.unpack_from(
                end + "IBBHQQ", data, sh_offset + k * 24)
            if st_info & 0xF == 2 and st_other & 0x10:  # STT_FUNC, STO_CUDA_ENTRY
                stop = data.index(b"\0", str_off + st_name)
                names.add(data[str_off + st_name:stop].decode())
    return names


def _elf_section(data: bytes, wanted: str) -> Optional[bytes]:
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return None
    e_shoff, = struct.unpack_from("<Q", data, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize) for i in range(e_shnum)]
    shstr_off = hdrs[e_shstrndx][4]
    for h in hdrs:
        stop = data.index(b"\0", shstr_off + h[0])
        if data[shstr_off + h[0]:stop].decode() == wanted:
            return data[h[4]:h[4] + h[5]]
    return None


def _fatbin_elves(fatbin: bytes) -> tuple[list[bytes], bool]:
    """The ELF images of a .nv_fatbin section; second item: some were compressed."""
    elves, compressed = [], False
    off = 0
    while off + 16 <= len(fatbin):
        magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", fatbin, off)
        if magic != 0xBA55ED50:
            off += 8  # containers are 8-byte aligned; skip padding
            continue
        p, stop = off + hsize, off + hsize + fsize
        while p + 16 <= stop:
            kind, _ev, ehsize, psize = struct.unpack_from("<HHIQ", fatbin, p)
            payload = fatbin[p + ehsize:p + ehsize + psize]
            if kind == 2:
                if payload[:4] == b"\x7fELF":
                    elves.append(payload)
                else:
                    compressed = True
            p += ehsize + psize
        off = stop
    return elves, compressed


def kernel_names_in_file(path: Path | str, source: Path | str | None = None) -> set[str]:
    """Kernels (mangled names) contained in a host binary or a cubin.

    Uses `cuobjdump -symbols` where available; otherwise reads the ELF itself
    (for a host binary: the uncompressed cubins of its .nv_fatbin section). If
    the fat binary's cubins are compressed and cuobjdump is missing, `source`
    is compiled to a cubin (same arch) and that is read instead."""
    path = Path(path)
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:
        res = subprocess.run([cuobjdump, "-symbols", str(path)], capture_output=True, text=True)
        if res.returncode == 0:
            return {line.split()[-1] for line in res.stdout.splitlines()
                    if "STT_FUNC" in line and "STO_ENTRY" in line}
        if "does not contain device code" in (res.stderr + res.stdout):
            return set()
    data = path.read_bytes()
    if data[:4] == b"\x7fELF" and data[7] == 0x41:  # ELFOSABI_CUDA: a cubin
        return _elf_entry_functions(data)
    section = _elf_section(data, ".nv_fatbin")
    if section is None:
        return set()
    elves, compressed = _fatbin_elves(section)
    names = set()
    for elf in elves:
        names |= _elf_entry_functions(elf)
    if compressed:
        if source is None:
            raise RuntimeError(f"{path}: compressed fat binary and no cuobjdump")
        nvcc = nvcc_path()
        with tempfile.TemporaryDirectory() as tmp:
            cubin = Path(tmp) / "k.cubin"
            _run([nvcc, "-cubin", f"-arch={nvcc_arch()}", "-O2", "-o", str(cubin), str(source)], "nvcc -cubin")
            names |= _elf_entry_functions(cubin.read_bytes())
    return names


def kernel_names(built: BuiltProgram) -> set[str]:
    """All kernels of a built program: those of its binary and of its cubins."""
    p = built.program
    names = set()
    if "c++" not in p.compile_flags:  # a plain C++ source has no device code
        names |= kernel_names_in_file(built.binary, p.source_path)
    for src in p.cubin_paths:
        names |= kernel_names_in_file(built.cubins[src.stem], src)
    # kernels the program carries as PTX text and JIT-links at run time (jit_link.cu)
    names |= set(re.findall(r"\.entry\s+(\w+)", p.source_path.read_text()))
    return names


# --------------------------------------------------------------------------- running


def free_udp_port() -> int:
    """A UDP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _udp_port_bound(port: int) -> Optional[bool]:
    """Whether some socket is bound to UDP 127.0.0.1:port (or *:port); None if unknown."""
    try:
        lines = Path("/proc/net/udp").read_text().splitlines()[1:]
    except OSError:
        return None
    want = f"{port:04X}"
    for line in lines:
        fields = line.split()
        if len(fields) > 1:
            addr, _, p = fields[1].partition(":")
            if p == want and addr in ("0100007F", "00000000"):
                return True
    return False


def run_udp_counter(argv: list[str], env: Optional[dict] = None, port: Optional[int] = None,
                    requests: int = 2, timeout: float = 10.0) -> list[str]:
    """Run the counter program and return its replies to `requests` datagrams.

    argv is the program's command line (e.g. BuiltProgram.argv(), possibly
    behind a launcher); the port is appended as its last argument unless argv
    already ends with it. Each request is a "hello\\n" datagram to
    127.0.0.1:port; the replies are returned exactly as received (e.g.
    "101\\n"), so "".join(replies) is compared with counter.expected.

    The first request waits (up to `timeout` s) until the program has bound
    its port, seen in /proc/net/udp; where that cannot be read, a request
    answered by "port unreachable" is sent again every 0.1 s. A datagram that
    reached the program is never sent twice, so the counter is incremented
    exactly once per request. Each reply is awaited up to `timeout` s. The
    program is killed before returning; RuntimeError (with the program's
    output) if it exits or a reply does not come."""
    if port is None:
        port = free_udp_port()
    cmd = list(argv)
    if not cmd or cmd[-1] != str(port):
        cmd.append(str(port))
    outlog = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=outlog, stderr=subprocess.STDOUT)
    replies: list[str] = []
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def fail(msg: str):
        outlog.seek(0)
        out = outlog.read().decode(errors="replace")
        raise RuntimeError(f"counter: {msg} (exit status {proc.poll()}); output:\n{out}")

    try:
        sock.connect(("127.0.0.1", port))
        sock.settimeout(0.1)
        for r in range(requests):
            deadline = time.monotonic() + timeout
            sent = False
            while True:
                if time.monotonic() > deadline:
                    fail(f"no reply to request {r + 1} within {timeout} s")
                if proc.poll() is not None:
                    fail("the program exited")
                if not sent:
                    if r == 0 and _udp_port_bound(port) is False:
                        time.sleep(0.05)
                        continue
                    try:
                        sock.send(b"hello\n")
                        sent = True
                    except ConnectionRefusedError:  # reported from an earlier try
                        time.sleep(0.1)
                        continue
                try:
                    data = sock.recv(4096)
                except socket.timeout:
                    continue  # queued at the program: wait, never send it again
                except ConnectionRefusedError:
                    if r != 0:
                        fail(f"request {r + 1} refused: the port is closed")
                    sent = False  # the port was not bound yet: that datagram was dropped
                    time.sleep(0.1)
                    continue
                replies.append(data.decode(errors="replace"))
                break
    finally:
        sock.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        outlog.close()
    return replies


def run_program(built: BuiltProgram, env: Optional[dict] = None, timeout: float = 120.0,
                input: Optional[str] = None, launcher: Optional[list[str]] = None) -> subprocess.CompletedProcess:
    """Run a (non-udp) program: [*launcher, *built.argv()]; stdout/stderr captured as text."""
    cmd = list(launcher or []) + built.argv()
    return subprocess.run(cmd, env=env, input=input if input is not None else "", capture_output=True,
                          text=True, timeout=timeout)
