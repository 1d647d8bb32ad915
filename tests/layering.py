"""The layering contract of gpuproxy's Python parts, and its checker
(docs/architecture.md, "Folders"; run by tests/test_layering.py).

The checker reads the sources (no import runs) and collects every import
between gpuproxy modules, those inside functions included: a lazy import is
an import. It reports

* an upward import: a module of a lower layer importing one of a higher
  layer (LAYERS, top first; modules of one layer may import each other);
* a forbidden import (FORBIDDEN: pairs of packages kept apart even though
  the layers would allow it, e.g. the checkpoint engine and the families);
* a module of `cli` importing anything but what CLI_MAY_IMPORT lists, or a
  third-party module CLI_NO_THIRD_PARTY names (the CLI parses arguments and
  prints; everything else is a library);
* an import cycle among the layered modules: a strongly connected set of
  modules (KNOWN_CYCLES, kept for the checker's self-test, is empty).

Why a checker of our own rather than import-linter: no dependency for CI,
the same walk gives the CLI and the cycle rules, and the self-test
(tests/test_layering.py) runs it on a small fake package.
"""
from __future__ import annotations

import ast
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from sccs import strongly_connected  # noqa: E402  (Tarjan, shared with scripts/shim_layers.py)
sys.path.pop(0)

# Top first. A module belongs to the layer of the longest prefix that names
# it; a module no prefix names is outside the contract (autogen, build time).
LAYERS: list[tuple[str, list[str]]] = [
    # consumers of the library beside the CLI: the Kubernetes agent, webhook and controller
    ("k8s", ["gpuproxy.k8s"]),
    ("cli", ["gpuproxy.cli"]),
    ("orchestration", ["gpuproxy.proxyd.checkpoint.orchestrate", "gpuproxy.proxyd.client"]),
    ("supervisor", ["gpuproxy.proxyd.supervisor", "gpuproxy.proxyd.main", "gpuproxy.proxyd.__main__"]),
    ("worker", ["gpuproxy.proxyd.worker"]),
    ("checkpoint", ["gpuproxy.proxyd.checkpoint"]),
    ("families", ["gpuproxy.proxyd.families"]),
    ("backends", ["gpuproxy.proxyd.backends", "gpuproxy.emu"]),
    ("core", ["gpuproxy.proxyd.core", "gpuproxy.proxyd._generated", "gpuproxy.proxyd",
              "gpuproxy.interceptor"]),
]

# (importer prefix, imported prefix, why): kept apart although the layers allow it
FORBIDDEN: list[tuple[str, str, str]] = [
    ("gpuproxy.proxyd.checkpoint", "gpuproxy.proxyd.families",
     "the checkpoint engine walks the object-kind registry (core/kinds.py) and imports no family"),
] + [(sup, low, "the supervisor never touches the GPU: it starts workers, it does not load their code")
     for sup in ("gpuproxy.proxyd.supervisor", "gpuproxy.proxyd.main")
     for low in ("gpuproxy.proxyd.worker", "gpuproxy.proxyd.families", "gpuproxy.proxyd.backends", "gpuproxy.emu")]
# ...except the importer modules named here (a prefix of the importer that the rule does not cover)
FORBIDDEN_EXCEPT = ["gpuproxy.proxyd.checkpoint.orchestrate"]

CLI_MAY_IMPORT = [
    "gpuproxy.cli",
    "gpuproxy.proxyd.checkpoint.orchestrate",   # whole-process and GPU checkpoints as a library
    "gpuproxy.proxyd.client",                   # the control client (status, ping, ...)
    "gpuproxy.proxyd.core.protocol",            # endpoint names and defaults
    "gpuproxy.proxyd.core.keys",                # keygen: where keys live
    "gpuproxy.proxyd.core.curve",               # keygen: the CURVE key pair
    "gpuproxy.proxyd._generated",               # `version`: the spec tables' size
    "gpuproxy.interceptor",                     # `env`: where the shim's libraries are
]
CLI_NO_THIRD_PARTY = {"zmq", "cffi", "msgpack"}

# Cycles allowed to remain, each exactly as the checker finds it; none is
# (tests/test_layering.py asserts the list stays empty). The last one, among
# graphs, graph memory, pools and IPC, went with hooks the higher family
# registers into the lower one (families/frees.py, ipc.register_sharing_check)
# and the graph memory nodes' markers kept with the other nodes.
KNOWN_CYCLES: list[frozenset[str]] = []


@dataclass(frozen=True)
class Import:
    src: str        # importing module
    dst: str        # imported module (or package)
    path: str       # file of the importer
    line: int


def package_roots(repo: Path) -> dict[str, Path]:
    """{package: its directory}, from pyproject.toml's [tool.setuptools.package-dir]."""
    text = (repo / "pyproject.toml").read_text()
    sec = re.search(r"^\[tool\.setuptools\.package-dir\]\n(.*?)(?:^\[|\Z)", text, re.S | re.M)
    if not sec:
        raise ValueError("pyproject.toml has no [tool.setuptools.package-dir]")
    out = {}
    for m in re.finditer(r'^"([\w.]+)"\s*=\s*"([^"]+)"', sec.group(1), re.M):
        out[m.group(1)] = repo / m.group(2)
    return out


def modules(roots: dict[str, Path]) -> dict[str, Path]:
    """{module name: file} of every .py under the roots; a folder that is
    the root of another package belongs to that one (gpuproxy.emu)."""
    owned = {p.resolve(): pkg for pkg, p in roots.items()}
    out: dict[str, Path] = {}
    for pkg, root in roots.items():
        for dp, dns, fns in os.walk(root):
            d = Path(dp)
            if d.resolve() in owned and owned[d.resolve()] != pkg:
                dns[:] = []
                continue
            dns[:] = [n for n in dns if n != "__pycache__"]
            for f in fns:
                if not f.endswith(".py"):
                    continue
                rel = (d / f).relative_to(root).with_suffix("")
                parts = [p for p in rel.parts]
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                out[".".join([pkg] + parts)] = d / f
    return out


def _resolve(node: ast.ImportFrom, mod: str, is_pkg: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    if node.level > 1:
        base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(mods: dict[str, Path], prefix: str) -> tuple[list[Import], list[Import]]:
    """(imports between the modules, third-party imports) of every module,
    top-level and in functions alike."""
    inner, outer = [], []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node, mod, is_pkg)
                for a in node.names:
                    full = f"{base}.{a.name}"
                    targets.append(full if full in mods else base)
            for t in targets:
                if t == prefix or t.startswith(prefix + "."):
                    inner.append(Import(mod, t, str(path), node.lineno))
                else:
                    outer.append(Import(mod, t, str(path), node.lineno))
    return inner, outer


def _under(mod: str, prefix: str) -> bool:
    return mod == prefix or mod.startswith(prefix + ".")


def layer_of(mod: str, layers=None) -> int | None:
    best, best_len = None, -1
    for i, (_name, prefixes) in enumerate(layers or LAYERS):
        for p in prefixes:
            if _under(mod, p) and len(p) > best_len:
                best, best_len = i, len(p)
    return best


def cycles(edges: list[Import], mods) -> list[frozenset[str]]:
    """Strongly connected sets of more than one module (Tarjan: scripts/
    sccs.py, shared with the shim's check, scripts/shim_layers.py)."""
    pairs = {(e.src, e.dst) for e in edges if e.dst in mods and e.src in mods and e.dst != e.src}
    return [frozenset(c) for c in strongly_connected(mods, pairs)]


def check(repo: Path, layers=None, forbidden=None, forbidden_except=None, cli_may=None,
          cli_pkg: str = "gpuproxy.cli", known_cycles=None, roots=None) -> list[str]:
    """Every breach of the contract in the tree at repo, one line each
    (empty: the contract holds)."""
    layers = LAYERS if layers is None else layers
    forbidden = FORBIDDEN if forbidden is None else forbidden
    forbidden_except = FORBIDDEN_EXCEPT if forbidden_except is None else forbidden_except
    cli_may = CLI_MAY_IMPORT if cli_may is None else cli_may
    known = set(KNOWN_CYCLES if known_cycles is None else known_cycles)
    roots = roots or package_roots(repo)
    mods = modules(roots)
    tops = {pkg.split(".")[0] for pkg in roots}
    if len(tops) != 1:
        raise ValueError(f"expected one top-level package, found {sorted(tops)}")
    inner, outer = imports(mods, tops.pop())
    problems = []
    names = [n for n, _ in layers]
    for e in inner:
        a, b = layer_of(e.src, layers), layer_of(e.dst, layers)
        where = f"{os.path.relpath(e.path, repo)}:{e.line}"
        if a is not None and b is not None and b < a:
            problems.append(f"upward import: {e.src} ({names[a]}) imports {e.dst} ({names[b]}) at {where}")
        for src, dst, why in forbidden:
            if _under(e.src, src) and _under(e.dst, dst) and \
                    not any(_under(e.src, x) for x in forbidden_except):
                problems.append(f"forbidden import: {e.src} imports {e.dst} at {where} ({why})")
        if _under(e.src, cli_pkg) and not any(_under(e.dst, p) for p in cli_may):
            problems.append(f"cli imports a daemon internal: {e.src} imports {e.dst} at {where} "
                            "(cli holds argument parsing and output; the work is in a library)")
    for e in outer:
        if _under(e.src, cli_pkg) and e.dst.split(".")[0] in CLI_NO_THIRD_PARTY:
            problems.append(f"cli imports {e.dst} directly at {os.path.relpath(e.path, repo)}:{e.line}")
    layered = {m for m in mods if layer_of(m, layers) is not None}     # autogen (build time) is outside
    for c in cycles(inner, layered):
        if c not in known:
            problems.append("import cycle: " + " -> ".join(sorted(c)))
    return problems
