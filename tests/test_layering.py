"""The layering contract (tests/layering.py; docs/architecture.md,
"Folders"): proxyd's layers, no cycles, the CLI as parser and printer, the
checkpoint engine apart from the families. The checker reads sources only,
so this runs in a second; the fake-package tests prove it catches what it
must (an upward import hidden in a function, a cycle, a CLI reaching into
the daemon, a forbidden pair).

Also: the table of checkpoint object kinds (core/kinds.py) that replaced the
engine's calls into the families keeps the restore order the engine had,
and every manifest field a kind writes has its schema entry.
"""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import layering  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def test_the_source_tree_keeps_the_contract():
    problems = layering.check(REPO)
    assert not problems, "layering contract broken (docs/architecture.md, \"Folders\"):\n" + "\n".join(problems)


def test_no_import_cycle_is_allowed_to_remain():
    """The families import each other one way only: a new cycle is not
    listed but broken (hooks the higher module registers, families/frees.py)."""
    assert layering.KNOWN_CYCLES == []


def test_every_source_module_is_in_a_layer():
    """A new folder must be placed in LAYERS, or it escapes the contract."""
    mods = layering.modules(layering.package_roots(REPO))
    outside = sorted(m for m in mods if layering.layer_of(m) is None and not m.startswith("gpuproxy.autogen"))
    assert not outside, f"modules in no layer of tests/layering.py: {outside}"


# ---------------------------------------------------------------- the checker on a fake package

FAKE_LAYERS = [("app", ["fake.app"]), ("mid", ["fake.mid"]), ("base", ["fake.base"])]


def fake_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools.package-dir]\n"fake" = "src"\n')
    for rel, text in {"__init__.py": "", "app/__init__.py": "", "mid/__init__.py": "",
                      "base/__init__.py": "", **files}.items():
        f = tmp_path / "src" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(textwrap.dedent(text))
    return tmp_path


def run(tree: Path, **kw) -> list[str]:
    kw.setdefault("layers", FAKE_LAYERS)
    kw.setdefault("forbidden", [])
    kw.setdefault("forbidden_except", [])
    kw.setdefault("cli_pkg", "fake.app")
    kw.setdefault("cli_may", ["fake"])
    kw.setdefault("known_cycles", [])
    return layering.check(tree, **kw)


def test_a_clean_fake_tree_passes(tmp_path):
    tree = fake_tree(tmp_path, {"app/cmd.py": "from ..mid import work\n",
                                "mid/work.py": "from ..base.table import ROWS\n",
                                "base/table.py": "ROWS = []\n"})
    assert run(tree) == []


def test_an_upward_import_inside_a_function_is_caught(tmp_path):
    tree = fake_tree(tmp_path, {"mid/work.py": "def f():\n    from ..app import cmd\n    return cmd\n",
                                "app/cmd.py": "X = 1\n"})
    problems = run(tree)
    assert len(problems) == 1 and problems[0].startswith("upward import: fake.mid.work (mid) imports fake.app.cmd")
    assert "src/mid/work.py:2" in problems[0]


def test_an_absolute_upward_import_is_caught(tmp_path):
    tree = fake_tree(tmp_path, {"base/table.py": "import fake.mid.work as W\n", "mid/work.py": ""})
    assert any("upward import: fake.base.table (base) imports fake.mid.work" in p for p in run(tree))


def test_a_cycle_within_one_layer_is_caught(tmp_path):
    tree = fake_tree(tmp_path, {"mid/a.py": "from . import b\n", "mid/b.py": "def f():\n    from .a import X\n"})
    problems = run(tree)
    assert problems == ["import cycle: fake.mid.a -> fake.mid.b"]
    # a known cycle passes exactly as listed; one that grows does not
    assert run(tree, known_cycles=[frozenset({"fake.mid.a", "fake.mid.b"})]) == []
    tree = fake_tree(tmp_path, {"mid/b.py": "from . import c\n", "mid/c.py": "from . import a\n"})
    assert run(tree, known_cycles=[frozenset({"fake.mid.a", "fake.mid.b"})]) == \
        ["import cycle: fake.mid.a -> fake.mid.b -> fake.mid.c"]


def test_a_forbidden_pair_is_caught_though_the_layers_allow_it(tmp_path):
    tree = fake_tree(tmp_path, {"mid/engine.py": "from ..base import fam\n", "base/fam.py": ""})
    problems = run(tree, forbidden=[("fake.mid.engine", "fake.base.fam", "the engine walks a table")])
    assert problems and "forbidden import: fake.mid.engine imports fake.base.fam" in problems[0]


def test_a_cli_that_reaches_into_the_daemon_is_caught(tmp_path):
    tree = fake_tree(tmp_path, {"app/cmd.py": "import zmq\nfrom ..base import table\n", "base/table.py": ""})
    problems = run(tree, cli_may=["fake.app", "fake.mid"])
    assert any(p.startswith("cli imports a daemon internal: fake.app.cmd imports fake.base.table") for p in problems)
    assert any(p.startswith("cli imports zmq directly") for p in problems)


# ---------------------------------------------------------------- checkpoint object kinds

@pytest.fixture(scope="module")
def kinds():
    from gpuproxy.proxyd import families
    from gpuproxy.proxyd.checkpoint import engine  # noqa: F401  (registers the engine's own steps)
    from gpuproxy.proxyd.core import kinds
    families.load_all()
    return kinds


def test_restore_order_is_the_engines(kinds):
    """The order the engine called things in before the table existed
    (contexts, modules before any memory, the arena, what lives in it,
    kernels, streams and events, library objects, replayed settings,
    captured library work, the memory's contents, __device__ variables,
    what reads device memory, the client-facing state and its host memory);
    a change here is a change of behaviour."""
    order = [k.name for k in kinds.ordered() if k.rebuild is not None]
    # a restore is nothing but this walk: every kind that rebuilds has a stage
    assert all(k.stage > kinds.Stage.NONE for k in kinds.ordered() if k.rebuild is not None)
    assert order == ["contexts", "device_numbers", "modules", "globals", "arena", "mem_pools", "mem_handles", "graph_mem", "graphs", "graphs_cond",
                     "arrays", "functions", "streams_events", "context_settings", "libraries", "cudnn_backend",
                     "replay", "graph_libcapture", "nccl_comms",
                     "memory", "device_vars", "sparse_after_memory", "session_state",
                     "host_memory"]
    assert [k.name for k in kinds.ordered() if k.check is not None] == ["ipc", "link", "nccl"]
    assert [k.name for k in kinds.ordered() if k.capture is not None] == ["modules", "arrays"]
    assert [k.name for k in kinds.ordered() if k.module_images is not None] == ["modules"]
    assert [k.name for k in kinds.ordered() if k.pieces is not None] == ["memory"]
    assert set(kinds.SERVICES) == {"destroy_context"}


def test_every_manifest_field_has_an_owner_and_a_schema(kinds):
    from gpuproxy.proxyd.checkpoint.manifest_schema import SESSION
    schema = set(SESSION.fields) | set(SESSION.optional)
    owned = {}
    for k in kinds.KINDS.values():
        for key in k.keys:
            assert key not in owned, f"session.{key} claimed by kinds {owned[key]} and {k.name}"
            owned[key] = k.name
    assert not set(owned) - schema, f"fields without a schema entry (manifest_schema.SESSION): {set(owned) - schema}"
    assert not schema - set(owned), f"schema entries no kind or the engine writes: {schema - set(owned)}"


def test_a_dumps_manifest_is_the_kinds_fields(kinds):
    """The engine writes no manifest field itself: describe() is the walk of
    the kinds' describe hooks, each writing only fields it declares,
    and what it makes of a live session (emulated backend: a context, an
    allocation, a stream) passes the schema a restore applies."""
    from gpuproxy.emu.backend import EmuBackend
    from gpuproxy.proxyd.checkpoint import engine
    from gpuproxy.proxyd.checkpoint.manifest_schema import validate_session
    from gpuproxy.proxyd.core import protocol as P
    from gpuproxy.proxyd.core.arena import Arena
    from gpuproxy.proxyd.core.session import Session
    from gpuproxy.proxyd.worker.server import ARENA_BASE, SLOT_SIZE
    b = EmuBackend()
    s = Session("t-1", 1, "x", 0, Arena(ARENA_BASE, SLOT_SIZE, b.map_chunk, b.unmap_chunk))
    ctx = s.add_context(0, b.ctx_create(0, 0), primary=True)
    s.arena.alloc(1 << 16, 0)
    s.add(P.K_STREAM, 1, ctx.id, {}, create=(0, 0, []))      # as the generic create path records one
    for k in kinds.ordered():
        if k.describe is not None:
            assert set(k.describe(s)) <= set(k.keys), f"kind {k.name} writes fields it does not declare"
    desc = engine.describe(s)
    # every required field is there (optional ones: where a session has them, e.g. dev_map)
    validate_session(desc, strict=True)
    assert desc["arena"]["chunks"] and len(desc["streams"]) == 1 and desc["token"] == "t-1"


def test_a_kind_name_is_registered_once(kinds):
    with pytest.raises(ValueError, match="registered twice"):
        kinds.register(kinds.Kind("modules", kinds.Stage.MODULES, owner="somewhere.else"))


def test_a_checkpoint_without_the_families_is_refused(kinds, monkeypatch):
    """Without the families' kinds an image would silently lack their
    objects: the engine refuses to dump or restore instead."""
    from gpuproxy.proxyd.checkpoint import engine
    engine._kinds_complete()
    monkeypatch.delitem(kinds.KINDS, "modules")
    with pytest.raises(kinds.CheckpointError, match="modules.*families are not loaded"):
        engine._kinds_complete()
