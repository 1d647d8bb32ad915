"""The shim's msgpack codec (interceptor/gp_msgpack.c) against Python's msgpack.

A small C driver (tests/programs_extra/msgpack_roundtrip.c) is compiled with
gp_msgpack.c (with AddressSanitizer + UBSan where the compiler has them):

* encode:    values written with the C writers must be byte-identical to
             msgpack.packb (both pick the shortest form) and unpack to the
             same values;
* transcode: msgpack produced by Python (canonical, and hand-made longer
             forms) is read with mp_next/mp_skip/the typed getters and written
             back; the result must unpack to the same values;
* truncate:  every strict prefix of an encoded object must be rejected, with
             no read past the buffer;
* get:       the typed getters on each kind of object.

Covers integers at every size boundary (both signs), float64 (and float32
input), str/bin of lengths 0/31/32/255/256/65535/65536, ext types 1 and 2
(the protocol's FRAME and SHM references) of every length class, and nested
arrays and maps (fix/16/32 sizes). No GPU, no CUDA needed.
"""
from __future__ import annotations

import math
import os
import shutil
import struct
import subprocess
from pathlib import Path

import msgpack
import pytest

from conftest import REPO, TESTS_DIR

DRIVER = TESTS_DIR / "programs_extra" / "msgpack_roundtrip.c"
CODEC = REPO / "interceptor" / "gp_msgpack.c"

UINTS = [0, 1, 31, 32, 127, 128, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
         2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1]
NEG_INTS = [-1, -2, -31, -32, -33, -127, -128, -129, -255, -256, -32767, -32768, -32769, -65536,
            -2**31 + 1, -2**31, -2**31 - 1, -2**32, -2**53 - 1, -2**63 + 1, -2**63]
LENGTHS = [0, 1, 31, 32, 255, 256, 65535, 65536]
EXT_LENGTHS = [0, 1, 2, 3, 4, 5, 8, 16, 17, 20, 255, 256, 65535, 65536]
CONTAINER_SIZES = [0, 1, 15, 16, 65535, 65536]
FLOATS = [0.0, -0.0, 1.0, -1.5, 0.1, 1e308, -1e-308, 5e-324, 2.0**53, math.pi, math.inf, -math.inf]


def _payload(n: int, salt: int = 0) -> bytes:
    return bytes((i * 131 + salt) & 0xFF for i in range(n))


def _text(n: int) -> str:
    return "".join(chr(0x61 + (i * 7) % 26) for i in range(n))


@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> Path:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler (cc/gcc/clang)")
    out = tmp_path_factory.mktemp("msgpack") / "msgpack_roundtrip"
    base = [cc, "-std=gnu11", "-O1", "-g", "-Wall", f"-I{REPO / 'interceptor'}",
            str(DRIVER), str(CODEC), "-o", str(out)]
    sanitize = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"]
    r = subprocess.run(base[:1] + sanitize + base[1:], capture_output=True, text=True)
    if r.returncode == 0:
        probe = subprocess.run([str(out), "get", "int"], input=b"\x01", capture_output=True)
        if probe.returncode == 0:
            SANITIZED.append(True)
            return out
    # no sanitizer runtime here: the plain build still checks every value
    r = subprocess.run(base, capture_output=True, text=True)
    assert r.returncode == 0, f"cannot compile the msgpack driver:\n{' '.join(base)}\n{r.stderr}"
    return out


SANITIZED: list = []


def test_driver_runs_under_sanitizers(driver):
    """Reads past a buffer's end are caught only with AddressSanitizer."""
    if not SANITIZED:
        pytest.skip("the C compiler here has no AddressSanitizer/UBSan runtime; plain build used")


def run(driver: Path, args: list[str], data: bytes) -> bytes:
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0:abort_on_error=0")
    r = subprocess.run([str(driver), *args], input=data, capture_output=True, timeout=120, env=env)
    assert r.returncode == 0, f"{' '.join(args)} failed ({r.returncode}):\n{r.stderr.decode(errors='replace')[-4000:]}"
    return r.stdout


# --------------------------------------------------------------------------- encode (C writes, Python reads)

def commands(v) -> list[str]:
    """The driver's encode commands for a Python value."""
    if v is None:
        return ["nil"]
    if v is True or v is False:
        return ["true" if v else "false"]
    if isinstance(v, int):
        return [f"u {v}"] if v >= 0 else [f"i {v}"]
    if isinstance(v, float):
        return [f"f {struct.unpack('<Q', struct.pack('<d', v))[0]:016x}"]
    if isinstance(v, str):
        return [f"s {v.encode().hex() or '-'}"]
    if isinstance(v, bytes):
        return [f"b {v.hex() or '-'}"]
    if isinstance(v, msgpack.ExtType):
        return [f"e {v.code} {v.data.hex() or '-'}"]
    if isinstance(v, (list, tuple)):
        return [f"a {len(v)}"] + [c for x in v for c in commands(x)]
    if isinstance(v, dict):
        return [f"m {len(v)}"] + [c for k, x in v.items() for c in commands(k) + commands(x)]
    raise TypeError(type(v))


def encode_in_c(driver, values: list) -> bytes:
    cmds = [c for v in values for c in commands(v)]
    return run(driver, ["encode"], ("\n".join(cmds) + "\n").encode())


def packb(v) -> bytes:
    return msgpack.packb(v, use_bin_type=True)


def unpack_all(data: bytes) -> list:
    u = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=0)
    u.feed(data)
    return list(u)


def nested_values() -> list:
    deep = "leaf"
    for i in range(40):
        deep = [deep, {"depth": i}]
    return [
        [],
        {},
        [1, [2, [3, [4, []]]]],
        {"a": {"b": {"c": [None, True, False, 1.5, b"\x00\x01", "x"]}}},
        {1: "int key", -5: b"neg", "s": [msgpack.ExtType(1, b"\x00\x00\x00\x02"), msgpack.ExtType(2, bytes(20))]},
        list(range(15)), list(range(16)), list(range(-20, 20)),
        {f"k{i}": i for i in range(15)}, {f"k{i}": [i] * (i % 3) for i in range(16)},
        [[[[]]]], [{}], [{"": ""}],
        deep,
    ]


def scalar_values() -> list:
    values = UINTS + NEG_INTS + FLOATS + [None, True, False]
    values += [_text(n) for n in LENGTHS] + ["é€😀"]
    values += [_payload(n, 1) for n in LENGTHS]
    values += [msgpack.ExtType(code, _payload(n, code)) for code in (1, 2) for n in EXT_LENGTHS]
    return values


def test_encode_scalars_byte_identical(driver):
    values = scalar_values()
    out = encode_in_c(driver, values)
    assert out == b"".join(packb(v) for v in values)
    assert unpack_all(out) == values


@pytest.mark.parametrize("n", CONTAINER_SIZES)
def test_encode_containers_of_every_size(driver, n):
    arr = [i % 200 - 100 for i in range(n)]
    mp = {i: (i & 1 == 0) for i in range(n)}
    out = encode_in_c(driver, [arr, mp])
    assert out == packb(arr) + packb(mp)
    assert unpack_all(out) == [arr, mp]


def test_encode_nested(driver):
    values = nested_values()
    out = encode_in_c(driver, values)
    assert out == b"".join(packb(v) for v in values)
    assert unpack_all(out) == values


def test_encode_signed_writer_for_every_int(driver):
    """mp_int also takes non-negative values (the shim sends every signed C
    integer through it): shortest form, like Python's."""
    ints = [v for v in UINTS if v < 2**63] + NEG_INTS
    out = run(driver, ["encode"], "".join(f"i {v}\n" for v in ints).encode())
    assert out == b"".join(packb(v) for v in ints)


def test_encode_other_writers(driver):
    # mp_str of a NUL-terminated string, mp_str(NULL) -> nil, mp_bin(NULL, 0) -> empty bin,
    # mp_bin_header + raw bytes
    cmds = [f"S {'hello'.encode().hex()}", "snull", "bnull", f"bh {_payload(300).hex()}", "bh -", "b -", "s -"]
    out = run(driver, ["encode"], ("\n".join(cmds) + "\n").encode())
    assert out == packb("hello") + packb(None) + packb(b"") + packb(_payload(300)) + packb(b"") + packb(b"") \
        + packb("")


def test_encode_nan(driver):
    out = encode_in_c(driver, [math.nan])
    assert out[:1] == b"\xcb" and math.isnan(msgpack.unpackb(out))


# --------------------------------------------------------------------------- transcode (Python writes, C reads)

def test_transcode_scalars(driver):
    values = scalar_values()
    data = b"".join(packb(v) for v in values)
    assert run(driver, ["transcode"], data) == data         # canonical in, canonical out


@pytest.mark.parametrize("n", CONTAINER_SIZES)
def test_transcode_containers_of_every_size(driver, n):
    values = [[i - 3 for i in range(n)], {str(i): i for i in range(n)}]
    data = b"".join(packb(v) for v in values)
    assert run(driver, ["transcode"], data) == data


def test_transcode_nested(driver):
    values = nested_values()
    data = b"".join(packb(v) for v in values)
    assert run(driver, ["transcode"], data) == data


def test_transcode_float32_input(driver):
    values = [1.5, -0.25, 3.4028234663852886e38, 1.401298464324817e-45, math.inf]
    data = b"".join(msgpack.packb(v, use_single_float=True) for v in values)
    assert data[0] == 0xCA
    out = run(driver, ["transcode"], data)
    assert out == b"".join(packb(v) for v in values)          # read as float32, written as float64
    assert unpack_all(out) == values


NON_CANONICAL = [
    # (bytes as another writer may produce them, the value)
    (b"\xcc\x05", 5), (b"\xcd\x00\x05", 5), (b"\xce\x00\x00\x00\x05", 5), (b"\xcf" + (5).to_bytes(8, "big"), 5),
    (b"\xd0\x05", 5), (b"\xd0\xff", -1), (b"\xd1\xff\xff", -1), (b"\xd2\xff\xff\xff\xff", -1),
    (b"\xd3" + (-1 & 2**64 - 1).to_bytes(8, "big"), -1), (b"\xd1\x7f\xff", 32767),
    (b"\xd9\x01a", "a"), (b"\xda\x00\x01a", "a"), (b"\xdb\x00\x00\x00\x01a", "a"),
    (b"\xc5\x00\x01x", b"x"), (b"\xc6\x00\x00\x00\x01x", b"x"),
    (b"\xdc\x00\x01\x01", [1]), (b"\xdd\x00\x00\x00\x01\x01", [1]),
    (b"\xde\x00\x01\x01\x02", {1: 2}), (b"\xdf\x00\x00\x00\x01\x01\x02", {1: 2}),
    (b"\xc7\x01\x01\xaa", msgpack.ExtType(1, b"\xaa")), (b"\xc8\x00\x04\x02" + bytes(4), msgpack.ExtType(2, bytes(4))),
    (b"\xc9\x00\x00\x00\x02\x01\xab\xcd", msgpack.ExtType(1, b"\xab\xcd")),
]


@pytest.mark.parametrize("data,value", NON_CANONICAL, ids=[d.hex() for d, _ in NON_CANONICAL])
def test_transcode_longer_forms(driver, data, value):
    assert msgpack.unpackb(data, raw=False, strict_map_key=False) == value
    out = run(driver, ["transcode"], data)
    assert out == packb(value)


@pytest.mark.parametrize("data", [b"\xc1", b"\xc1\x00", b"\x92\x01\xc1"], ids=["c1", "c1-00", "array-with-c1"])
def test_reserved_byte_is_an_error(driver, data):
    r = subprocess.run([str(driver), "transcode"], input=data, capture_output=True, timeout=60,
                       env=dict(os.environ, ASAN_OPTIONS="detect_leaks=0"))
    assert r.returncode == 1 and b"mp_" in r.stderr, r.stderr


# --------------------------------------------------------------------------- truncation

TRUNCATED = [2**64 - 1, -2**63, 1.5, _text(40), _payload(300), msgpack.ExtType(2, bytes(20)),
             msgpack.ExtType(1, _payload(3)), msgpack.ExtType(1, _payload(300)), list(range(20)),
             {"key": [1, {"x": b"yz"}], 7: None}, [_payload(70000)]]


@pytest.mark.parametrize("value", TRUNCATED, ids=[f"v{i}" for i in range(len(TRUNCATED))])
def test_every_prefix_is_rejected(driver, value):
    data = packb(value)
    assert run(driver, ["truncate"], data).decode() == f"ok {len(data)}\n"


# --------------------------------------------------------------------------- typed getters

def _get(driver, kind: str, data: bytes) -> tuple[str, int, int]:
    out = run(driver, ["get", kind], data).decode().split()
    return out[0], int(out[1].split("=")[1]), int(out[2].split("=")[1])


@pytest.mark.parametrize("v", [v for v in UINTS if v < 2**63] + NEG_INTS)
def test_get_int(driver, v):
    assert _get(driver, "int", packb(v) + b"\xc0") == (str(v), 0, 1)


@pytest.mark.parametrize("v", UINTS)
def test_get_uint(driver, v):
    assert _get(driver, "uint", packb(v)) == (str(v), 0, 0)


def test_get_f64(driver):
    for v in (1.5, -2.25, 1e300):
        got, err, rest = _get(driver, "f64", packb(v))
        assert float(got) == v and err == 0 and rest == 0
    got, err, _ = _get(driver, "f64", packb(7))          # an integer where a double is read
    assert float(got) == 7.0 and err == 0


def test_get_containers_and_bytes(driver):
    assert _get(driver, "array", packb(list(range(70000))))[:2] == ("70000", 0)
    assert _get(driver, "map", packb({i: i for i in range(17)}))[:2] == ("17", 0)
    assert _get(driver, "bytes", packb(b"\x01\x02")) == ("0102", 0, 0)
    assert _get(driver, "bytes", packb("hi")) == ("6869", 0, 0)
    assert _get(driver, "bytes", packb(b"")) == ("-", 0, 0)
    assert _get(driver, "bytes", packb(None)) == ("NULL", 0, 0)


@pytest.mark.parametrize("kind,data", [
    ("int", packb("str")), ("int", packb([1])), ("uint", packb(b"b")), ("f64", packb("x")),
    ("array", packb({1: 2})), ("map", packb([1])), ("bytes", packb(5)), ("bytes", packb([b"x"])),
    ("int", b""), ("array", b"\xdc\x00"),
])
def test_getter_type_mismatch_sets_error(driver, kind, data):
    got, err, _ = _get(driver, kind, data)
    assert err == 1
    assert got in ("0", "NULL", "0.0", "0")
