"""The installed distribution, the gpuproxy.emu kernel API, and the arena.

* `pip install .` installs one distribution whose Python parts import as
  gpuproxy.<part>; nothing lands in site-packages under a generic top-level
  name (cli, autogen, proxyd, emu, interceptor);
* the emulated-kernel API (gpuproxy.emu), exercised directly with a fake
  device memory, as external kernel files use it;
* proxyd's arena (gpuproxy.proxyd.core.arena) hands out addresses as a pure
  function of the allocation history, and describe() + rebuild() reproduce
  that history's state and its future.
"""
from __future__ import annotations

import importlib
import importlib.metadata as md
import random
import struct
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO

PARTS = ("proxyd", "cli", "autogen", "emu", "interceptor")
GENERIC_TOP_LEVEL = {"cli", "autogen", "proxyd", "emu", "interceptor"}


# --------------------------------------------------------------------------- the installed distribution

@pytest.fixture(scope="module")
def site_dir(shim_installed) -> Path:
    """The folder that holds the installed `gpuproxy` package."""
    return Path(shim_installed.__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dist(site_dir):
    """The installed gpuproxy distribution (its RECORD), not a stray
    gpuproxy.egg-info of the source tree that happens to be on sys.path."""
    found = list(md.distributions(name="gpuproxy", path=[str(site_dir)]))
    assert len(found) == 1, f"expected one gpuproxy distribution in {site_dir}, found {len(found)}"
    d = found[0]
    assert d.files, "the installed distribution has no RECORD"
    return d


def test_parts_import_as_gpuproxy_subpackages(site_dir):
    for part in PARTS:
        mod = importlib.import_module(f"gpuproxy.{part}")
        path = Path(mod.__file__).resolve()
        assert path.is_relative_to(site_dir / "gpuproxy" / part), \
            f"gpuproxy.{part} imported from {path}, not from the installed package in {site_dir}"
        assert not path.is_relative_to(REPO), f"gpuproxy.{part} imported from the source tree ({path})"


def test_no_generic_top_level_modules_installed(dist, site_dir):
    files = [str(f) for f in dist.files]
    tops = {f.split("/")[0] for f in files if not f.startswith("../")}   # ../../../bin/ are the scripts
    assert tops == {"gpuproxy", f"gpuproxy-{dist.version}.dist-info"}, f"top-level entries in RECORD: {sorted(tops)}"
    top_level = (dist.read_text("top_level.txt") or "").split()
    assert top_level == ["gpuproxy"], top_level
    for name in GENERIC_TOP_LEVEL:
        owned = [f for f in files if f.split("/")[0] == name]
        assert not owned, f"the distribution installs a top-level {name}/: {owned[:5]}"
    # one copy of each part: gpuproxy.emu is not also installed inside gpuproxy.proxyd
    assert not [f for f in files if f.startswith(("gpuproxy/proxyd/emu/", "gpuproxy/proxyd/backends/emu/"))]


def test_record_holds_the_built_parts(dist):
    files = {str(f) for f in dist.files}
    for f in ("gpuproxy/interceptor/lib/libcuda.so.1", "gpuproxy/interceptor/lib/libcudart.so.13",
              "gpuproxy/proxyd/_generated.py", "gpuproxy/emu/__init__.py", "gpuproxy/emu/kernels.py",
              "gpuproxy/cli/main.py", "gpuproxy/autogen/build.py", "gpuproxy/proxyd/main.py"):
        assert f in files, f"{f} missing from the installed RECORD"
    assert any(f.startswith("gpuproxy/interceptor/lib/libzmq") for f in files), "libzmq not shipped with the shim"


def test_console_scripts(dist, site_dir):
    eps = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
    assert eps == {"proxyd": "gpuproxy.proxyd.main:main", "proxy-cli": "gpuproxy.cli.main:main",
                   # the Kubernetes node agent and admission webhook (docs/kubernetes.md)
                   "gpuproxy-k8s-agent": "gpuproxy.k8s.agent:main",
                   "gpuproxy-k8s-webhook": "gpuproxy.k8s.webhook:main"}, eps
    for ep in dist.entry_points:
        assert callable(ep.load())
    scripts = [f for f in dist.files if str(f).startswith("../") and Path(str(f)).name in eps]
    assert len(scripts) == len(eps), [str(f) for f in dist.files if str(f).startswith("../")]
    for s in scripts:
        assert Path(dist.locate_file(s)).resolve().exists(), s


def test_installed_python_matches_the_source_tree(site_dir):
    """A stale install makes every other test meaningless: the installed
    Python sources must be those of this checkout (re-run `pip install .`)."""
    src_dirs = {"proxyd": REPO / "proxyd", "emu": REPO / "proxyd" / "backends" / "emu", "cli": REPO / "cli",
                "autogen": REPO / "autogen", "interceptor": REPO / "interceptor"}
    stale = []
    for sub in ("core", "backends", "families", "worker", "supervisor", "checkpoint", "checkpoint/orchestrate"):
        src_dirs[f"proxyd/{sub}"] = REPO / "proxyd" / sub
    for part, src in src_dirs.items():
        for f in sorted(src.glob("*.py")):
            inst = site_dir / "gpuproxy" / part / f.name
            if not inst.exists() or inst.read_bytes() != f.read_bytes():
                stale.append(str(f.relative_to(REPO)))
    assert not stale, f"installed copies differ from the source tree (run `pip install .` in {REPO}): {stale}"


# --------------------------------------------------------------------------- gpuproxy.emu API

class FakeMemory:
    """Device memory for KernelLaunch: one numpy buffer at a fixed address."""

    def __init__(self, base: int = 0x7F00_0000_0000, size: int = 1 << 16):
        self.base = base
        self.buf = np.zeros(size, np.uint8)

    def __call__(self, addr: int, n: int) -> np.ndarray:
        off = addr - self.base
        if off < 0 or off + n > self.buf.size:
            raise IndexError(f"{addr:#x}+{n} outside the fake memory")
        return self.buf[off:off + n]


def _params(items):
    """Packs (offset, fmt, value) items into a kernel parameter buffer; returns
    the bytes and the layout [(offset, size)]."""
    size = max(off + struct.calcsize("@" + fmt) for off, fmt, _ in items)
    buf = bytearray(size)
    layout = []
    for off, fmt, value in items:
        vals = value if isinstance(value, tuple) else (value,)
        struct.pack_into("@" + fmt, buf, off, *vals)
        layout.append((off, struct.calcsize("@" + fmt)))
    return bytes(buf), layout


@pytest.fixture
def emu(shim_installed):
    import gpuproxy.emu as emu
    before = dict(emu.KERNELS)
    yield emu
    emu.KERNELS.clear()
    emu.KERNELS.update(before)


def test_emu_exports_one_kernel_registry(emu):
    assert set(emu.__all__) >= {"kernel", "KernelLaunch", "KERNELS", "load_kernel_file"}
    from gpuproxy.emu import backend, kernels
    assert backend.KERNELS is kernels.KERNELS is emu.KERNELS, "the backend must see the kernels that files register"


def test_kernel_decorator_registers(emu):
    @emu.kernel("_Z4testPfi")
    def k(launch):
        return launch.name

    assert emu.KERNELS["_Z4testPfi"] is k      # the function itself, unchanged
    assert k.__name__ == "k"


def test_kernel_launch_params_arrays_globals(emu):
    mem = FakeMemory()
    a, b, c = mem.base, mem.base + 4096, mem.base + 8192
    mem(a, 16).view(np.float32)[:] = [1, 2, 3, 4]
    mem(b, 16).view(np.float32)[:] = [10, 20, 30, 40]
    counter = mem.base + 0x8000
    mem(counter, 4).view(np.int32)[0] = 100
    # (const float *a, const float *b, float *c, int n, double scale, struct {int i; float f;} s, char ch)
    params, layout = _params([(0, "P", a), (8, "P", b), (16, "P", c), (24, "i", 4), (32, "d", 0.5),
                              (40, "if", (7, 2.5)), (48, "b", -3)])

    @emu.kernel("_Z3addPKfS0_Pfidc")
    def add(k):
        n = k.param(3, "i")
        x, y, z = (k.array(k.param(i, "P"), n, "f4") for i in range(3))
        z[:] = (x + y) * k.param(4, "d")
        k.global_array("counter", 1, "i4")[0] += 1

    launch = emu.KernelLaunch("_Z3addPKfS0_Pfidc", (2, 1, 1), [32, 1, 1], 64, params, layout, mem,
                              {"counter": (counter, 4)})
    assert launch.grid == (2, 1, 1) and launch.block == (32, 1, 1) and launch.shared_bytes == 64
    assert isinstance(launch.block, tuple)
    assert launch.param(0, "P") == a and launch.param(3, "i") == 4 and launch.param(3, "<i") == 4
    assert launch.param(4, "d") == 0.5
    assert launch.param(5, "if") == (7, 2.5)             # a struct parameter: a tuple
    assert launch.param(6, "b") == -3
    emu.KERNELS["_Z3addPKfS0_Pfidc"](launch)
    assert list(mem(c, 16).view(np.float32)) == [5.5, 11, 16.5, 22]
    assert mem(counter, 4).view(np.int32)[0] == 101
    # views are writable and alias device memory
    v = launch.array(a, 4, np.float32)
    v[0] = 42
    assert mem(a, 4).view(np.float32)[0] == 42
    assert launch.array(a, 2, "i8").dtype == np.int64


def test_kernel_launch_errors(emu):
    from gpuproxy.emu.kernels import KernelError
    mem = FakeMemory()
    params, layout = _params([(0, "i", 1), (8, "P", mem.base)])
    k = emu.KernelLaunch("_Z1kiPv", (1, 1, 1), (1, 1, 1), 0, params, layout, mem, {"g": (mem.base, 8)})
    with pytest.raises(KernelError, match="out of range"):
        k.param(2, "i")
    with pytest.raises(KernelError, match="out of range"):
        k.param(-1, "i")
    with pytest.raises(KernelError, match="needs 8 bytes"):
        k.param(0, "q")                                  # an int parameter read as 8 bytes
    with pytest.raises(KernelError, match="no __device__ variable"):
        k.global_array("missing", 1, "i4")
    with pytest.raises(KernelError, match="exceeds"):
        k.global_array("g", 3, "i4")                     # 12 bytes of an 8-byte variable
    assert k.global_array("g", 2, "i4").shape == (2,)


def test_load_kernel_file(emu, tmp_path):
    f = tmp_path / "my_kernels.py"
    f.write_text("from gpuproxy.emu import kernel\n"
                 "LOADS = []\n"
                 "@kernel('_Z6squarePii')\n"
                 "def square(k):\n"
                 "    n = k.param(1, 'i')\n"
                 "    x = k.array(k.param(0, 'P'), n, 'i4')\n"
                 "    x[:] = x * x\n")
    emu.load_kernel_file(str(f))
    assert "_Z6squarePii" in emu.KERNELS
    mem = FakeMemory()
    mem(mem.base, 12).view(np.int32)[:] = [2, -3, 4]
    params, layout = _params([(0, "P", mem.base), (8, "i", 3)])
    emu.KERNELS["_Z6squarePii"](emu.KernelLaunch("_Z6squarePii", (1, 1, 1), (3, 1, 1), 0, params, layout, mem, {}))
    assert list(mem(mem.base, 12).view(np.int32)) == [4, 9, 16]
    # loading the same file again does not run it again
    emu.KERNELS.pop("_Z6squarePii")
    emu.load_kernel_file(str(f))
    assert "_Z6squarePii" not in emu.KERNELS
    with pytest.raises(FileNotFoundError):
        emu.load_kernel_file(str(tmp_path / "nope.py"))


# --------------------------------------------------------------------------- arena

BASE = 0x2000_0000_0000 + 5 * 0x100_0000_0000
SLOT = 0x100_0000_0000
MiB = 1 << 20


class Backing:
    """Records map/unmap calls of an arena."""

    def __init__(self):
        self.mapped: dict[int, tuple[int, int]] = {}     # handle -> (addr, size)
        self.log: list = []
        self.next = 1

    def map_chunk(self, dev, addr, size):
        h = self.next
        self.next += 1
        self.mapped[h] = (addr, size)
        self.log.append(("map", dev, addr, size))
        return h

    def unmap_chunk(self, h):
        addr, size = self.mapped.pop(h)
        self.log.append(("unmap", addr, size))


def new_arena(backing=None):
    from gpuproxy.proxyd.core.arena import Arena
    backing = backing or Backing()
    return Arena(BASE, SLOT, backing.map_chunk, backing.unmap_chunk), backing


def run_ops(arena, ops, live=None):
    """Applies ("alloc", size, dev) / ("free", index into live) ops; returns the addresses."""
    live = [] if live is None else live
    out = []
    for op in ops:
        if op[0] == "alloc":
            a = arena.alloc(op[1], op[2])
            live.append(a)
            out.append(a)
        else:
            out.append(("free", arena.free(live.pop(op[1] % len(live))).addr))
    return out


def random_ops(seed: int, n: int):
    rng = random.Random(seed)
    ops, live = [], 0
    for _ in range(n):
        if live and rng.random() < 0.4:
            ops.append(("free", rng.randrange(1 << 30)))
            live -= 1
        else:
            size = rng.choice([1, 7, 256, 257, 4000, 65536, 100000, MiB - 1, MiB, 3 * MiB + 5, 9 * MiB])
            ops.append(("alloc", size, rng.choice([0, 0, 0, 1])))
            live += 1
    return ops


def check_invariants(arena):
    from gpuproxy.proxyd.core.arena import ALIGN, GRANULARITY
    chunks = sorted(arena.chunks.values(), key=lambda c: c.start)
    for c1, c2 in zip(chunks, chunks[1:]):
        assert c1.end <= c2.start, "chunks overlap"
    for c in chunks:
        assert arena.base <= c.start and c.end <= arena.base + arena.size
        assert c.start % GRANULARITY == 0 and c.size % GRANULARITY == 0
    allocs = sorted(arena.allocs.values(), key=lambda a: a.addr)
    for a1, a2 in zip(allocs, allocs[1:]):
        assert a1.addr + a1.extent <= a2.addr, "allocations overlap"
    for a in allocs:
        assert a.addr % ALIGN == 0
        c = arena.chunk_at(a.addr)
        assert c is a.chunk and a.addr + a.size <= c.end
        assert arena.find(a.addr + a.size - 1) == (a, a.size - 1)


def test_arena_layout_is_as_documented(shim_installed):
    arena, backing = new_arena()
    a = arena.alloc(100)                       # small: first 2 MiB chunk, at its start
    b = arena.alloc(300)                       # next 256-byte-aligned slot
    big = arena.alloc(3 * MiB)                 # large: a chunk of its own, rounded to 2 MiB
    c = arena.alloc(1000)                      # small again: back in the first chunk
    assert (a, b, big, c) == (BASE, BASE + 256, BASE + 2 * MiB, BASE + 768)
    assert backing.log == [("map", 0, BASE, 2 * MiB), ("map", 0, BASE + 2 * MiB, 4 * MiB)]
    assert arena.bytes_in_use() == 100 + 300 + 3 * MiB + 1000
    assert arena.bytes_mapped() == 6 * MiB


def test_arena_is_deterministic(shim_installed):
    ops = random_ops(1, 400)
    a1, _ = new_arena()
    a2, _ = new_arena()
    assert run_ops(a1, ops) == run_ops(a2, ops)
    assert a1.describe() == a2.describe()
    check_invariants(a1)


def test_arena_reuses_freed_ranges(shim_installed):
    arena, backing = new_arena()
    small = [arena.alloc(1000) for _ in range(4)]
    arena.free(small[1])
    assert arena.alloc(1000) == small[1]       # the lowest free range that fits
    arena.free(small[2])
    assert arena.alloc(200) == small[2]        # a smaller one fits there too
    big1 = arena.alloc(4 * MiB)
    big2 = arena.alloc(4 * MiB)
    arena.free(big1)
    assert backing.log[-1] == ("unmap", big1, 4 * MiB)   # a large allocation's chunk goes back at once
    assert arena.alloc(4 * MiB) == big1
    arena.free(big2)
    # the lowest free address range that fits is taken
    assert arena.alloc(2 * MiB) == big2
    # a small chunk whose last allocation is freed is unmapped, and its range reused
    for s in arena.allocs.copy():
        if arena.allocs[s].chunk.small:
            arena.free(s)
    assert not any(c.small for c in arena.chunks.values())
    assert arena.alloc(16) == BASE
    check_invariants(arena)


def test_arena_errors(shim_installed):
    from gpuproxy.proxyd.core.arena import ArenaError
    arena, _ = new_arena()
    with pytest.raises(ArenaError) as e:
        arena.alloc(0)
    assert e.value.code == 1
    a = arena.alloc(512)
    with pytest.raises(ArenaError) as e:
        arena.free(a + 256)                    # not the start of an allocation
    assert e.value.code == 1
    arena.free(a)
    with pytest.raises(ArenaError):
        arena.free(a)                          # twice
    with pytest.raises(ArenaError) as e:
        arena.alloc(SLOT + 1)                  # more than the session's address space
    assert e.value.code == 2


@pytest.mark.parametrize("seed", [2, 3, 4])
def test_arena_describe_rebuild_reproduces_state_and_future(seed, shim_installed):
    ops = random_ops(seed, 500)
    past, future = ops[:300], ops[300:]
    original, _ = new_arena()
    live: list[int] = []
    run_ops(original, past, live)
    desc = original.describe()

    rebuilt, backing = new_arena()
    rebuilt.rebuild(desc)
    assert rebuilt.describe() == desc
    # every chunk is mapped again at its recorded address, with its device
    assert sorted(backing.log) == sorted(("map", dev, start, size) for start, size, dev, _small in desc["chunks"])
    assert rebuilt.bytes_in_use() == original.bytes_in_use()
    check_invariants(rebuilt)
    # the same future gives the same addresses
    assert run_ops(rebuilt, future, list(live)) == run_ops(original, future, list(live))
    assert rebuilt.describe() == original.describe()
    check_invariants(rebuilt)


def test_arena_rebuild_needs_an_empty_arena(shim_installed):
    from gpuproxy.proxyd.core.arena import ArenaError
    arena, _ = new_arena()
    arena.alloc(64)
    with pytest.raises(ArenaError):
        arena.rebuild(arena.describe())


def test_arena_release_all(shim_installed):
    arena, backing = new_arena()
    run_ops(arena, random_ops(5, 100))
    arena.release_all()
    assert not backing.mapped and not arena.chunks and not arena.allocs
    # a released arena starts over exactly like a new one
    fresh, _ = new_arena()
    ops = random_ops(6, 100)
    assert run_ops(arena, ops) == run_ops(fresh, ops)
