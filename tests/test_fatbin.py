"""Tests for proxyd/core/fatbin.py: fatbinary / cubin / PTX image parsing.

Samples are built at test time with nvcc (the module is skipped without it):
one multi-arch fatbin build with -keep (which also leaves the sm_75 / sm_90
cubins and the compute_90 PTX, byte-identical to what -cubin / -ptx give),
one host executable (-cudart shared) and one relocatable (-rdc) cubin, run in
parallel; the compression variants are then packed from the kept files with
the `fatbinary` tool, which is fast. Expected layouts are worked out by the
CUDA parameter ABI (each parameter aligned to its own alignment) and were
cross-checked with cuobjdump -elf.
"""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "proxyd" / "core"))
import fatbin  # noqa: E402
from fatbin import FatbinError, GlobalVar, ParamInfo  # noqa: E402


def _tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    p = Path("/usr/local/cuda/bin") / name
    return str(p) if p.exists() else None


NVCC = _tool("nvcc")
FATBINARY = _tool("fatbinary")
if NVCC is None:
    pytest.skip("nvcc not available", allow_module_level=True)

SOURCE = r"""
struct Pad { char c; double d; int i; };        // size 24, align 8
struct WithArr { int a[5]; short s; };          // size 24, align 4
struct Big { double d[600]; };                  // 4800 bytes: KPARAM_INFO_V2 records

__device__ int counter = 100;
__device__ float zeros[64];
__device__ double dinit[3] = {1.5, 2.5, 3.5};
__device__ int *ptr_to_counter = &counter;
__managed__ int managed_var = 7;
__constant__ float coeffs[4] = {1.0f, 2.0f, 3.0f, 4.0f};
__constant__ int czero[3];

__global__ void noparams() { counter++; }
__global__ void scalars(int a, float b, double c, char d, int *p)
{ if (p) *p = a + (int)b + (int)c + d + (int)zeros[0] + (int)coeffs[1] + czero[0] + (int)dinit[1]; }
__global__ void padded(Pad p, int *out)
{ *out = p.c + (int)p.d + p.i + *ptr_to_counter + managed_var; }
__global__ void witharr(WithArr a, char c, WithArr b) { zeros[1] = a.a[2] + c + b.s; }
__global__ void saxpy(const float *x, const float *y, float *z, int n)
{ int i = threadIdx.x; if (i < n) z[i] = x[i] + y[i]; }
template <typename T> __global__ void tmpl(T *x, T v) { *x = v; }
template __global__ void tmpl<float>(float *, float);
template __global__ void tmpl<double>(double *, double);
extern "C" __global__ void cfunc(char a, short b, long long c) { zeros[2] = a + b + c; }
extern "C" __global__ void bigparam(Big b, int *o) { *o = (int)b.d[599]; }
extern "C" __global__ void vec(float4 v, double2 w, int *o) { *o = (int)(v.x + w.y); }

int main() { noparams<<<1, 1>>>(); return 0; }
"""

# name -> [(offset, size)] by the CUDA kernel parameter ABI
EXPECTED_KERNELS = {
    "_Z8noparamsv": [],
    # int@0, float@4, double aligned to 8 -> 8, char@16, pointer aligned to 8 -> 24
    "_Z7scalarsifdcPi": [(0, 4), (4, 4), (8, 8), (16, 1), (24, 8)],
    # Pad {char; double; int} is 24 bytes with 8-byte alignment
    "_Z6padded3PadPi": [(0, 24), (24, 8)],
    # WithArr {int[5]; short} is 24 bytes, align 4; char@24, next WithArr aligned to 28
    "_Z7witharr7WithArrcS_": [(0, 24), (24, 1), (28, 24)],
    "_Z5saxpyPKfS0_Pfi": [(0, 8), (8, 8), (16, 8), (24, 4)],
    "_Z4tmplIfEvPT_S0_": [(0, 8), (8, 4)],
    "_Z4tmplIdEvPT_S0_": [(0, 8), (8, 8)],
    # char@0, short aligned to 2, long long aligned to 8
    "cfunc": [(0, 1), (2, 2), (8, 8)],
    "bigparam": [(0, 4800), (4800, 8)],
    # float4 / double2 are 16-byte aligned
    "vec": [(0, 16), (16, 16), (32, 8)],
}
EXPECTED_PARAM_SIZE = {"_Z8noparamsv": 0, "_Z7scalarsifdcPi": 32, "_Z6padded3PadPi": 32,
                       "_Z7witharr7WithArrcS_": 52, "_Z5saxpyPKfS0_Pfi": 28,
                       "_Z4tmplIfEvPT_S0_": 12, "_Z4tmplIdEvPT_S0_": 16, "cfunc": 16,
                       "bigparam": 4808, "vec": 40}

EXPECTED_GLOBALS = {
    "counter": GlobalVar("counter", 4, struct.pack("<i", 100), "global"),
    "zeros": GlobalVar("zeros", 256, None, "global"),
    "dinit": GlobalVar("dinit", 24, struct.pack("<3d", 1.5, 2.5, 3.5), "global"),
    # an address: the loader relocates it, the image holds a zero placeholder
    "ptr_to_counter": GlobalVar("ptr_to_counter", 8, None, "global"),
    "managed_var": GlobalVar("managed_var", 4, struct.pack("<i", 7), "global", managed=True),
    "coeffs": GlobalVar("coeffs", 16, struct.pack("<4f", 1, 2, 3, 4), "constant"),
    "czero": GlobalVar("czero", 12, None, "constant"),
}

ZSTD = fatbin.FLAG_COMPRESS_ZSTD
LZ4 = fatbin.FLAG_COMPRESS_LZ4


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def samples(tmp_path_factory):
    d = tmp_path_factory.mktemp("fatbin_samples")
    (d / "samples.cu").write_text(SOURCE)
    keep = d / "keep"
    keep.mkdir()
    jobs = {
        "multi": [NVCC, "-fatbin", "-keep", f"-keep-dir={keep}",
                  "-gencode", "arch=compute_75,code=sm_75",
                  "-gencode", "arch=compute_90,code=[sm_90,compute_90]",
                  "-o", str(d / "multi.fatbin"), "samples.cu"],
        "exe": [NVCC, "-cudart", "shared", "-o", str(d / "app"), "samples.cu"],
        "rdc": [NVCC, "-cubin", "-rdc=true", "-arch=sm_90", "-o", str(d / "rdc.cubin"),
                "samples.cu"],
    }
    procs = {k: subprocess.Popen(v, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for k, v in jobs.items()}
    for k, p in procs.items():
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, f"nvcc ({k}) failed:\n{out.decode(errors='replace')}"
    files = {
        "multi": d / "multi.fatbin",
        "exe": d / "app",
        "rdc": d / "rdc.cubin",
        "cubin75": keep / "samples.compute_75.cubin",
        "cubin90": keep / "samples.compute_90.sm_90.cubin",
        "ptx90": keep / "samples.compute_90.ptx",
    }
    for k, p in files.items():
        assert p.exists(), f"nvcc did not leave {p.name}"
    if FATBINARY:
        images = [f"--image3=kind=elf,sm=90,file={files['cubin90']}",
                  f"--image3=kind=ptx,sm=90,file={files['ptx90']}"]
        variants = {"nocompress": ["--compress=false"],
                    "zstd": ["--compress-all"],
                    "lz4": ["--compress-all", "--compress-mode=speed"]}
        for name, opts in variants.items():
            out = d / f"{name}.fatbin"
            subprocess.run([FATBINARY, f"--create={out}", "-64", *opts, *images],
                           check=True, capture_output=True)
            files[name] = out
    return {k: v.read_bytes() for k, v in files.items()}


def _need(samples, key):
    if key not in samples:
        pytest.skip(f"sample {key} not built (fatbinary tool missing)")
    return samples[key]


def _layout(kernels):
    return {n: [(p.offset, p.size) for p in k.params] for n, k in kernels.items()}


def _check_kernels(kernels):
    assert set(kernels) == set(EXPECTED_KERNELS)
    assert _layout(kernels) == EXPECTED_KERNELS
    for name, k in kernels.items():
        assert k.name == name
        assert [p.index for p in k.params] == list(range(len(k.params)))
        assert k.param_size == EXPECTED_PARAM_SIZE[name]


def _ptx_tokens(b: bytes) -> list[str]:
    text = b.split(b"\0")[0].decode()
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.S)
    return text.split()


def _entry_header(b: bytes, index: int) -> int:
    """File offset of entry `index` of a fatbin."""
    off = struct.unpack_from("<H", b, 6)[0]
    for _ in range(index):
        ehs, psz = struct.unpack_from("<IQ", b, off + 4)
        off += ehs + psz
    return off


def make_fatbin(entries) -> bytes:
    """Pack entries [(kind, arch, payload, flags, compressed size, uncompressed size)]."""
    body = b""
    for kind, arch, payload, flags, csize, usize in entries:
        p = payload + bytes(-len(payload) % 8)
        body += struct.pack("<HHIQIIHHIIIQQQ", kind, 0x0101, 0x40, len(p), csize, 0,
                            8, 1, arch, 0, 0, flags, 0, usize) + p
    return struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 16, len(body)) + body


# --------------------------------------------------------------------------- containers


def test_multiarch_fatbin_entries(samples):
    b = samples["multi"]
    img = fatbin.parse_image(b)
    assert img.format == "fatbin"
    # the same three images cuobjdump -all -lelf -lptx lists (order is nvcc's)
    assert sorted((e.kind, e.arch) for e in img.entries) == [("cubin", 75), ("cubin", 90),
                                                              ("ptx", 90)]
    by = {(e.kind, e.arch): e for e in img.entries}
    # default nvcc packing: cubins stored as they are, PTX zstd-compressed
    assert not by["cubin", 75].compressed and not by["cubin", 90].compressed
    assert by["ptx", 90].compressed and by["ptx", 90].flags & ZSTD
    assert by["cubin", 75].data == samples["cubin75"]
    assert by["cubin", 90].data == samples["cubin90"]
    # fatbinary stores PTX with comments dropped and whitespace squeezed
    assert _ptx_tokens(by["ptx", 90].data) == _ptx_tokens(samples["ptx90"])
    assert b"\0" not in by["ptx", 90].data
    assert by["ptx", 90].version == (9, 0) and by["cubin", 90].version == (1, 8)
    for e in img.entries:
        assert e.flags & fatbin.FLAG_64BIT and e.flags & fatbin.FLAG_HOST_LINUX
    _check_kernels(img.kernels)
    assert img.globals == EXPECTED_GLOBALS
    assert fatbin.fatbin_size(b) == len(b)


@pytest.mark.parametrize("variant,method", [("nocompress", 0), ("zstd", ZSTD), ("lz4", LZ4)])
def test_compression_variants(samples, variant, method):
    b = _need(samples, variant)
    img = fatbin.parse_image(b)
    assert [(e.kind, e.arch) for e in img.entries] == [("cubin", 90), ("ptx", 90)]
    for e in img.entries:
        assert e.compressed == bool(method)
        assert e.flags & (ZSTD | LZ4) == method
    assert img.entries[0].data == samples["cubin90"]
    assert _ptx_tokens(img.entries[1].data) == _ptx_tokens(samples["ptx90"])
    _check_kernels(img.kernels)
    assert img.globals == EXPECTED_GLOBALS


def test_all_variants_decode_to_same_bytes(samples):
    got = [fatbin.parse_image(_need(samples, v)).entries for v in ("nocompress", "zstd", "lz4")]
    for entries in got[1:]:
        assert [e.data for e in entries] == [e.data for e in got[0]]


def test_cubin_only(samples):
    for key, arch in (("cubin90", 90), ("cubin75", 75)):
        img = fatbin.parse_image(samples[key])
        assert img.format == "cubin"
        assert [(e.kind, e.arch, e.compressed) for e in img.entries] == [("cubin", arch, False)]
        _check_kernels(img.kernels)
        assert img.globals == EXPECTED_GLOBALS


def test_ptx_only(samples):
    ptx = samples["ptx90"]
    for data in (ptx, ptx + b"\0", ptx + b"\0garbage after the terminator", memoryview(ptx)):
        img = fatbin.parse_image(data)
        assert img.format == "ptx"
        assert [(e.kind, e.arch) for e in img.entries] == [("ptx", 90)]
        _check_kernels(img.kernels)
        assert img.globals == EXPECTED_GLOBALS


def test_ptx_layout_equals_cubin_layout(samples):
    from_ptx = fatbin.parse_ptx(samples["ptx90"])
    from_cubin = fatbin.parse_cubin(samples["cubin90"])
    assert from_ptx == from_cubin


def test_relocatable_cubin(samples):
    # -rdc objects mark variables with symbol type 13 instead of STT_OBJECT
    img = fatbin.parse_image(samples["rdc"])
    _check_kernels(img.kernels)
    assert img.globals == EXPECTED_GLOBALS


def test_host_executable(samples):
    fbs = fatbin.extract_host_fatbins(samples["exe"])
    assert fbs
    imgs = [fatbin.parse_image(fb) for fb in fbs]
    for fb in fbs:
        assert fatbin.fatbin_size(fb) == len(fb)
    # CUDA 13 also embeds a (near-empty) device-linked image; one holds our kernels
    with_kernels = [im for im in imgs if im.kernels]
    assert len(with_kernels) == 1
    img = with_kernels[0]
    assert [(e.kind, e.arch) for e in img.entries] == [("cubin", 75), ("ptx", 75)]
    _check_kernels(img.kernels)
    assert img.globals == EXPECTED_GLOBALS
    with pytest.raises(FatbinError, match="EM_CUDA"):
        fatbin.parse_image(samples["exe"])


def test_fatbin_size(samples):
    b = samples["multi"]
    assert fatbin.fatbin_size(b[:16]) == len(b)
    assert fatbin.fatbin_size(memoryview(b)) == len(b)
    assert fatbin.fatbin_size(bytearray(b) + b"trailing") == len(b)
    with pytest.raises(FatbinError, match="truncated"):
        fatbin.fatbin_size(b[:15])
    with pytest.raises(FatbinError, match="magic"):
        fatbin.fatbin_size(samples["cubin90"])
    wrapper = struct.pack("<IIQQ", fatbin.FATBIN_WRAPPER_MAGIC, 1, 0x1000, 0)
    with pytest.raises(FatbinError, match="wrapper"):
        fatbin.fatbin_size(wrapper)
    with pytest.raises(FatbinError, match="wrapper"):
        fatbin.parse_image(wrapper)


def test_trailing_bytes_after_fatbin_are_ignored(samples):
    b = samples["multi"]
    assert fatbin.parse_image(b + bytes(64)) == fatbin.parse_image(b)


def test_deterministic(samples):
    a = fatbin.parse_image(samples["multi"])
    b = fatbin.parse_image(bytearray(samples["multi"]))
    assert a == b
    assert list(a.kernels) == sorted(a.kernels)
    assert list(a.globals) == sorted(a.globals)


def test_unknown_entry_kind_is_skipped(samples):
    cubin = samples["cubin90"]
    b = make_fatbin([(8, 90, b"opaque LTO IR", 0x11, 0, 0),
                     (2, 90, cubin, 0x11, 0, 0)])
    img = fatbin.parse_image(b)
    assert img.skipped == [(8, 90)]
    assert [(e.kind, e.arch) for e in img.entries] == [("cubin", 90)]
    assert img.entries[0].data == cubin
    _check_kernels(img.kernels)


def test_large_fatbin_is_fast(samples):
    # a 50 MB uncompressed cubin entry (trailing bytes after the ELF's sections)
    big = samples["cubin90"] + bytes(50 << 20)
    b = make_fatbin([(2, 90, big, 0x11, 0, 0), (2, 75, samples["cubin75"], 0x11, 0, 0)])
    t0 = time.perf_counter()
    img = fatbin.parse_image(b)
    elapsed = time.perf_counter() - t0
    _check_kernels(img.kernels)
    assert elapsed < 1.0, f"parsing a 50 MB fatbin took {elapsed:.2f}s"


# --------------------------------------------------------------------------- PTX details


PTX_HAND = r"""
//
// hand-written PTX: declarations and initialisers nvcc may emit
//
.version 9.0
.target sm_80
.address_size 64

.extern .global .align 4 .u32 elsewhere;
.visible .global .align 4 .u32 counter = 100;
.global .align 4 .s32 neg[3] = {-1, 2, -3};
.global .align 8 .f64 dv[2] = {0d3FF8000000000000, 0d4004000000000000};
.global .align 4 .f32 fv[2] = {0f3F800000, 0fC0000000};
.global .align 2 .u16 h[2][2] = {{1, 2}, {3}};
.global .align 8 .u64 addr[2] = {generic(counter)+8, 5};
.global .align 16 .v4 .u32 vecs[2];
.global .align 1 .b8 text[6] = {104, 105};
.const .align 4 .b8 cz[12];
/* a comment that mentions .global .u32 notavar = 1; */
.global .attribute(.managed) .align 4 .u32 mv = 7;
.global .align 4 .b8 tail[8] = {1, 0, 0, 0, 0x2};   // hex element

.func (.param .b32 rv) helper(.param .b32 x)
{
    ret;
}

.visible .entry k_ptr(
    .param .u64 .ptr .global .align 16 k_ptr_param_0,
    .param .u32 k_ptr_param_1,
    .param .align 8 .b8 k_ptr_param_2[24],
    .param .u8 k_ptr_param_3,
    .param .align 16 .b8 k_ptr_param_4[32]
)
.maxntid 128, 1, 1
{
    { .param .b32 param0; }
    ret;
}

.entry k_none()
{
    ret;
}
"""


def test_ptx_hand_written():
    kernels, globals_ = fatbin.parse_ptx(PTX_HAND.encode())
    # .ptr .align 16 is the pointee's alignment; the parameter itself is a u64
    assert _layout(kernels) == {"k_ptr": [(0, 8), (8, 4), (16, 24), (40, 1), (48, 32)],
                                "k_none": []}
    assert kernels["k_ptr"].param_size == 80
    assert "helper" not in kernels and "elsewhere" not in globals_ and "notavar" not in globals_
    g = globals_
    assert g["counter"] == GlobalVar("counter", 4, struct.pack("<I", 100), "global")
    assert g["neg"].init == struct.pack("<3i", -1, 2, -3)
    assert g["dv"].init == struct.pack("<2d", 1.5, 2.5)
    assert g["fv"].init == struct.pack("<2f", 1.0, -2.0)
    assert g["h"].size == 8 and g["h"].init == struct.pack("<4H", 1, 2, 3, 0)
    assert g["addr"].size == 16 and g["addr"].init == struct.pack("<2Q", 0, 5)
    assert g["vecs"] == GlobalVar("vecs", 32, None, "global")
    assert g["text"].init == b"hi\0\0\0\0"
    assert g["cz"] == GlobalVar("cz", 12, None, "constant")
    assert g["mv"].managed and g["mv"].init == struct.pack("<I", 7)
    assert g["tail"].init == bytes([1, 0, 0, 0, 2, 0, 0, 0])


def test_ptx_disagreeing_layouts_are_ambiguous(samples):
    # the same kernel with another layout in another entry: which one counts
    # depends on the entry the driver loads, so the image names no layout for
    # it (function_layout then asks the driver)
    ptx = samples["ptx90"]
    changed = ptx.replace(b".param .u32 _Z5saxpyPKfS0_Pfi_param_3",
                          b".param .u64 _Z5saxpyPKfS0_Pfi_param_3")
    assert changed != ptx
    b = make_fatbin([(1, 80, ptx, 0x11, 0, 0), (1, 90, changed, 0x11, 0, 0)])
    m = fatbin.parse_image(b)
    assert "_Z5saxpyPKfS0_Pfi" not in m.kernels
    assert m.ambiguous["_Z5saxpyPKfS0_Pfi"] == [[(0, 8), (8, 8), (16, 8), (24, 4)],
                                                [(0, 8), (8, 8), (16, 8), (24, 8)]]


def test_cubin_entries_with_different_kernel_sets(samples):
    # arch-specific entries may hold kernels the others lack (libtorch's
    # sm_90a-only CUTLASS kernels): the image's kernels are the union
    c90 = samples["cubin90"]
    # rename the kernel symbol 'cfunc' (in .strtab) so it no longer names its
    # .text.cfunc section: that cubin then lacks the kernel
    strtab_hit = c90.find(b"\0cfunc\0", c90.find(b"\0.text.cfunc\0") + 12)
    assert strtab_hit > 0
    patched = c90[:strtab_hit] + b"\0cfunX\0" + c90[strtab_hit + 7:]
    assert "cfunc" not in fatbin.parse_cubin(patched)[0]
    only75 = fatbin.parse_cubin(samples["cubin75"])[0]
    assert "cfunc" in only75
    b = make_fatbin([(2, 75, samples["cubin75"], 0x11, 0, 0), (2, 90, patched, 0x11, 0, 0)])
    m = fatbin.parse_image(b)
    assert m.kernels["cfunc"] == only75["cfunc"]
    assert set(only75) <= set(m.kernels) and not m.ambiguous


# --------------------------------------------------------------------------- malformed


def test_truncated_header(samples):
    for n in (0, 3, 10, 15):
        with pytest.raises(FatbinError):
            fatbin.parse_image(samples["multi"][:n])
    with pytest.raises(FatbinError, match="truncated"):
        fatbin.parse_image(samples["multi"][:12])


def test_truncated_payload(samples):
    b = samples["multi"]
    with pytest.raises(FatbinError, match=r"fatbin truncated: header declares"):
        fatbin.parse_image(b[:len(b) // 2])


def test_truncated_entry_header(samples):
    b = samples["multi"]
    second = _entry_header(b, 1)
    # shrink the declared payload so it ends 20 bytes into the second entry header
    cut = bytearray(b[:second + 20])
    struct.pack_into("<Q", cut, 8, len(cut) - 16)
    with pytest.raises(FatbinError, match=r"entry 1 at offset .*header truncated"):
        fatbin.parse_image(bytes(cut))


def test_entry_past_end(samples):
    b = bytearray(samples["multi"])
    first = _entry_header(b, 0)
    struct.pack_into("<Q", b, first + 8, 1 << 40)
    with pytest.raises(FatbinError, match=r"entry 0 .*runs past the end"):
        fatbin.parse_image(bytes(b))


def test_bad_magic(samples):
    b = bytearray(samples["multi"])
    b[0] ^= 0xFF
    with pytest.raises(FatbinError, match="unrecognised image"):
        fatbin.parse_image(bytes(b))
    with pytest.raises(FatbinError, match="bad fatbin magic"):
        fatbin.fatbin_size(bytes(b))
    with pytest.raises(FatbinError):
        fatbin.parse_image(b"\x01\x02\x03\x04 not anything")


def test_bad_version(samples):
    b = bytearray(samples["multi"])
    struct.pack_into("<H", b, 4, 7)
    with pytest.raises(FatbinError, match="version 7"):
        fatbin.parse_image(bytes(b))


def test_corrupted_zstd_payload(samples):
    b = bytearray(_need(samples, "zstd"))
    off = _entry_header(b, 0)
    ehs = struct.unpack_from("<I", b, off + 4)[0]
    csize = struct.unpack_from("<I", b, off + 0x10)[0]
    start = off + ehs
    assert b[start:start + 4] == b"\x28\xb5\x2f\xfd"        # zstd frame magic
    for i in range(start + 8, start + csize - 8):
        b[i] ^= 0x5A
    with pytest.raises(FatbinError, match="zstd"):
        fatbin.parse_image(bytes(b))
    # a cut-short frame
    b2 = bytearray(samples["zstd"])
    struct.pack_into("<I", b2, off + 0x10, csize // 2)
    with pytest.raises(FatbinError, match="zstd"):
        fatbin.parse_image(bytes(b2))


def test_corrupted_lz4_payload(samples):
    b = bytearray(_need(samples, "lz4"))
    off = _entry_header(b, 0)
    # claim a different decompressed size
    usize = struct.unpack_from("<Q", b, off + 0x38)[0]
    struct.pack_into("<Q", b, off + 0x38, usize + 8)
    with pytest.raises(FatbinError, match="LZ4"):
        fatbin.parse_image(bytes(b))
    b = bytearray(samples["lz4"])
    csize = struct.unpack_from("<I", b, off + 0x10)[0]
    struct.pack_into("<I", b, off + 0x10, csize - 3)
    with pytest.raises(FatbinError, match="LZ4"):
        fatbin.parse_image(bytes(b))


def test_both_compression_flags(samples):
    b = bytearray(_need(samples, "zstd"))
    off = _entry_header(b, 0)
    flags = struct.unpack_from("<Q", b, off + 0x28)[0]
    struct.pack_into("<Q", b, off + 0x28, flags | LZ4 | ZSTD)
    with pytest.raises(FatbinError, match="both LZ4 and zstd"):
        fatbin.parse_image(bytes(b))


def test_malformed_cubin(samples):
    c = samples["cubin90"]
    with pytest.raises(FatbinError, match="ELF header truncated"):
        fatbin.parse_image(c[:40])
    with pytest.raises(FatbinError, match="section header table"):
        fatbin.parse_image(c[:len(c) // 2])
    bad = bytearray(c)
    bad[4] = 1                                              # ELFCLASS32
    with pytest.raises(FatbinError, match="64-bit"):
        fatbin.parse_image(bytes(bad))


def test_malformed_nv_info(samples):
    c = bytearray(samples["cubin90"])
    elf = fatbin._Elf(bytes(c))
    sec = elf.by_name[".nv.info._Z5saxpyPKfS0_Pfi"]
    # find the first KPARAM_INFO record and make it claim more bytes than remain
    data = elf.data(sec)
    pos = 0
    while data[pos + 1] != fatbin.EIATTR_KPARAM_INFO:
        pos += 4 + (struct.unpack_from("<H", data, pos + 2)[0] if data[pos] == 4 else 0)
    struct.pack_into("<H", c, sec.offset + pos + 2, 0x7FFF)
    with pytest.raises(FatbinError, match=r"\.nv\.info\._Z5saxpyPKfS0_Pfi"):
        fatbin.parse_image(bytes(c))


def test_malformed_ptx():
    bad = PTX_HAND.replace(".param .u8 k_ptr_param_3", ".param .wat k_ptr_param_3")
    with pytest.raises(FatbinError, match="k_ptr"):
        fatbin.parse_image(bad.encode())
    unclosed = PTX_HAND.replace("ret;\n}\n\n.entry k_none", "ret;\n\n.entry k_none")
    with pytest.raises(FatbinError, match="not closed"):
        fatbin.parse_image(unclosed.encode())
    with pytest.raises(FatbinError, match="UTF-8"):
        fatbin.parse_image(b".version 9.0\n.target sm_80\n\xff\xfe")
    with pytest.raises(FatbinError, match="initialiser"):
        fatbin.parse_image(b".version 9.0\n.target sm_80\n.global .u32 x = banana + ;\n")


def test_fuzzed_inputs_raise_only_fatbin_error(samples):
    import random
    rng = random.Random(1234)
    bases = [samples["multi"], samples["cubin90"], samples["ptx90"], _need(samples, "lz4")]
    for base in bases:
        for _ in range(60):
            b = bytearray(base)
            r = rng.random()
            if r < 0.3:
                b = b[:rng.randrange(len(b))]
            else:
                for _ in range(rng.randint(1, 6)):
                    i = rng.randrange(min(len(b), 0x400)) if rng.random() < 0.7 else \
                        rng.randrange(len(b))
                    b[i] = rng.randrange(256)
            try:
                fatbin.parse_image(bytes(b))
            except FatbinError:
                pass


def test_lz4_block_decoder():
    # literals only; then a literal + overlapping match (run-length)
    assert fatbin.lz4_block_decompress(b"\x30abc", 3) == b"abc"
    assert fatbin.lz4_block_decompress(b"\x16a\x01\x00\x10z", 12) == b"a" * 11 + b"z"
    with pytest.raises(FatbinError, match="offset"):
        fatbin.lz4_block_decompress(b"\x10a\x05\x00\x00", 10)


def test_param_info_dataclasses():
    k = fatbin.KernelInfo("k", [ParamInfo(0, 0, 4), ParamInfo(1, 8, 8)])
    assert k.param_size == 16
    assert fatbin.KernelInfo("k", []).param_size == 0
