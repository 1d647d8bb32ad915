#!/usr/bin/env python3
"""The shim's file-level dependency graph, its cycles and its layer violations.

    python3 scripts/shim_layers.py            # build objects in a temporary folder, report
    python3 scripts/shim_layers.py --objects build/temp.*/gpuproxy/gen/obj
    python3 scripts/shim_layers.py --edges    # also list every arrow with its symbols

Who uses whom is read from the compiled objects, not guessed from the text:
each interceptor/*.c is compiled on its own (the flags of autogen/build.py,
at -O0 so that no call is folded away) and `nm` lists, per object, the
global symbols it defines and the ones it leaves undefined. File A depends
on file B when A leaves undefined a symbol that B defines. That is exact for
calls and for taking the address of a function or variable; it cannot see
a call through a function pointer (a hook: which is the point of one).

Generated code (autogen/gen_c.py, gen_lib.py) takes part as follows: an
exported entry point cuX/cudaX that a hand-written file overrides (it
defines gpo_cuX, which the generated export calls) counts as defined by that
file; the generated files are nodes of their own (gen/<name>.c) with their
arrows to the gpo_* overrides left out: those arrows are the generated
entry points dispatching to the hand-written ones, which sit above
everything by design.

A generated file and the one hand-written file whose functions it calls
are allowed to use each other (lib_cudnn.c calls the generic gpg_cudnn*
and the generated stubs call its gp_cudnn_scalar_size; cuGetProcAddress in
proc_address.c reads the generated table that names cuGetProcAddress): that
is the override seam of autogen, not a circle between files. Any cycle
with two or more hand-written files in it, through generated files or not,
is reported.

Layers are declared in interceptor/LAYERS (bottom first). A file may use
files of its own layer or lower ones; any use of a higher layer is a
violation, and so is any cycle (Tarjan's strongly connected components),
within a layer too. `#include "..."` lines of the hand-written files are
checked against the same table (a header belongs to a layer like a .c file),
and so are those of the generated sources.
tests/test_shim_layers.py runs this check in the test suite.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# Tarjan's search, shared with tests/layering.py (scripts/sccs.py); this file
# also runs loaded by path (tests/test_shim_layers.py), so its folder is added
sys.path.insert(0, str(Path(__file__).resolve().parent))
from sccs import strongly_connected  # noqa: E402
sys.path.pop(0)

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "interceptor"
LAYERS = SRC / "LAYERS"

# nm -P symbol types: upper case is global; U undefined; w/v weak undefined
_DEFINED = set("TDBRCVWGSIi")


class LayersError(RuntimeError):
    pass


# ---------------------------------------------------------------- building

def _autogen():
    sys.path.insert(0, str(REPO))
    try:
        from autogen import build  # noqa: WPS433
    finally:
        sys.path.pop(0)
    return build


def build_objects(out: Path, src_dir: Path = SRC, jobs: int | None = None) -> dict[str, Path]:
    """Generates the build-time code into out/gen and compiles every
    interceptor/*.c and generated .c to out/obj/<name>.o (-O0, no debug
    information: only the symbol tables matter). Returns {node: object}."""
    build = _autogen()
    include = build.cuda_include()
    gen_dir = out / "gen"
    build.generate(REPO / "specs", gen_dir, out / "_generated.py", include)
    obj_dir = out / "obj"
    obj_dir.mkdir(parents=True, exist_ok=True)
    common = build.compile_flags(src_dir, gen_dir, include, "0.0.0-layers", optimise="-O0", debug=False)
    jobs_list = []
    for f in sorted(src_dir.glob("*.c")):
        jobs_list.append((f.name, f, []))
    for f in sorted(gen_dir.glob("*.c")):
        internal = build.internal_flags() if f.name in build.GENERATED_INTERNAL else []
        jobs_list.append(("gen/" + f.name, f, internal))

    def one(job):
        node, f, extra = job
        o = obj_dir / (node.replace("/", "_")[:-2] + ".o")
        r = subprocess.run(["cc", *common, *extra, "-c", str(f), "-o", str(o)], capture_output=True, text=True)
        if r.returncode != 0:
            raise LayersError(f"compiling {node} failed:\n{r.stderr[-4000:]}")
        return node, o

    with ThreadPoolExecutor(jobs or os.cpu_count() or 2) as ex:
        return dict(ex.map(one, jobs_list))


def objects_in(folder: Path, src_dir: Path = SRC) -> dict[str, Path]:
    """The objects of an earlier build (autogen/build.py's obj folder)."""
    nodes = {}
    for o in sorted(folder.glob("*.o")):
        name = o.stem + ".c"
        if (src_dir / name).exists():
            nodes[name] = o
        else:
            nodes["gen/" + name] = o
    return nodes


# ---------------------------------------------------------------- the graph

def read_symbols(objects: dict[str, Path]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """{node: global symbols defined}, {node: symbols used but not defined}."""
    defs: dict[str, set[str]] = {n: set() for n in objects}
    uses: dict[str, set[str]] = {n: set() for n in objects}
    by_path = {str(p): n for n, p in objects.items()}
    r = subprocess.run(["nm", "-P", "-A", *by_path], capture_output=True, text=True)
    if r.returncode != 0:
        raise LayersError("nm failed: " + r.stderr[-2000:])
    for line in r.stdout.splitlines():
        head, _, rest = line.partition(": ")
        parts = rest.split()
        if len(parts) < 2 or head not in by_path:
            continue
        node, sym, kind = by_path[head], parts[0], parts[1]
        if kind == "U" or kind in "wv":
            uses[node].add(sym)
        elif kind in _DEFINED:
            defs[node].add(sym)
    return defs, uses


def dependency_graph(defs: dict[str, set[str]], uses: dict[str, set[str]]) -> dict[tuple[str, str], set[str]]:
    """{(user, definer): symbols}. See the module comment for generated code."""
    owner: dict[str, str] = {}
    for node in sorted(defs, key=lambda n: n.startswith("gen/")):  # hand-written files first
        for s in defs[node]:
            owner.setdefault(s, node)
    # an exported cuX/cudaX whose behaviour a hand-written gpo_cuX holds
    for s, node in list(owner.items()):
        if s.startswith("gpo_") and not node.startswith("gen/"):
            api = s[4:]
            if owner.get(api, "").startswith("gen/"):
                owner[api] = node
    edges: dict[tuple[str, str], set[str]] = {}
    for node, used in uses.items():
        for s in used:
            target = owner.get(s)
            if target is None or target == node:
                continue
            if node.startswith("gen/") and s.startswith("gpo_"):
                continue  # generated entry points dispatching to their overrides
            edges.setdefault((node, target), set()).add(s)
    return edges


def include_graph(src_dir: Path = SRC, generated: dict[str, Path] | None = None) -> dict[tuple[str, str], set[str]]:
    """{(file, header): {"#include"}} for the quoted includes of the hand-written
    files, and of the generated sources given as {node: path}, whose header
    is in src_dir (generated headers are left out)."""
    files = [(f.name, f) for f in sorted(list(src_dir.glob("*.c")) + list(src_dir.glob("*.h")))]
    files += sorted((generated or {}).items())
    edges = {}
    for name, f in files:
        for h in re.findall(r'^\s*#\s*include\s+"([^"]+)"', f.read_text(), flags=re.M):
            if (src_dir / h).exists() and h != name:
                edges[(name, h)] = {"#include"}
    return edges


def generated_sources(objects: dict[str, Path]) -> dict[str, Path]:
    """The generated .c files next to their objects (build_objects puts them
    in ../gen, autogen/build.py in ..)."""
    out = {}
    for node, o in objects.items():
        if node.startswith("gen/"):
            for cand in (o.parent.parent / "gen" / node[4:], o.parent.parent / node[4:]):
                if cand.exists():
                    out[node] = cand
                    break
    return out


# ---------------------------------------------------------------- layers

def load_layers(path: Path = LAYERS) -> list[tuple[str, list[str]]]:
    """[(layer, [files])], bottom first. Format: `name: file file ...`, a
    layer may go on over several lines (lines starting with blanks); `#`
    starts a comment."""
    layers: list[tuple[str, list[str]]] = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if line[0].isspace():
            if not layers:
                raise LayersError(f"{path}: continuation line before any layer: {raw!r}")
            layers[-1][1].extend(line.split())
            continue
        name, sep, files = line.partition(":")
        if not sep:
            raise LayersError(f"{path}: expected `layer: files`, got {raw!r}")
        layers.append((name.strip(), files.split()))
    return layers


def layer_of(layers) -> dict[str, tuple[int, str]]:
    out = {}
    for i, (name, files) in enumerate(layers):
        for f in files:
            if f in out:
                raise LayersError(f"{f} is in two layers: {out[f][1]} and {name}")
            out[f] = (i, name)
    return out


def problems(layers, nodes, edges, src_dir: Path = SRC) -> list[str]:
    """Every reason the graph breaks the layering: files with no layer,
    layer entries with no file, cycles, upward arrows."""
    where = layer_of(layers)
    out = []
    for n in sorted(nodes):
        if n not in where:
            out.append(f"{n}: in no layer of {LAYERS.relative_to(REPO) if src_dir == SRC else 'LAYERS'}")
    for f in sorted(where):
        if not f.startswith("gen/") and not (src_dir / f).exists():
            out.append(f"LAYERS names {f}, which does not exist")
    for comp in strongly_connected(nodes, edges):
        if sum(1 for n in comp if not n.startswith("gen/")) < 2:
            continue  # one file and its generated counterpart: the override seam (module comment)
        inner = sorted(f"{a} -> {b}" for a, b in edges if a in comp and b in comp)
        out.append(f"cycle of {len(comp)} files: {' '.join(comp)}\n    " + "\n    ".join(inner))
    for (a, b), syms in sorted(edges.items()):
        if a in where and b in where and where[b][0] > where[a][0]:
            out.append(f"upward: {a} ({where[a][1]}) -> {b} ({where[b][1]}): {' '.join(sorted(syms))}")
    return out


def analyse(objects: dict[str, Path], src_dir: Path = SRC, layers_path: Path = LAYERS):
    """(nodes, edges, problems) for the objects plus the include lines."""
    defs, uses = read_symbols(objects)
    edges = dependency_graph(defs, uses)
    for k, v in include_graph(src_dir, generated_sources(objects)).items():
        edges.setdefault(k, set()).update(v)
    nodes = set(objects) | {f.name for f in src_dir.glob("*.h")}
    layers = load_layers(layers_path) if layers_path.exists() else []
    return nodes, edges, problems(layers, nodes, edges, src_dir) if layers else []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--objects", help="use the .o files of this folder instead of compiling")
    ap.add_argument("--layers", default=str(LAYERS), help="the layer table (default interceptor/LAYERS)")
    ap.add_argument("--edges", action="store_true", help="list every arrow with the symbols it stands for")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gp-layers-") as tmp:
        objects = objects_in(Path(a.objects)) if a.objects else build_objects(Path(tmp))
        nodes, edges, probs = analyse(objects, layers_path=Path(a.layers))
    calls = {k: v for k, v in edges.items() if v != {"#include"}}
    print(f"{len(nodes)} files, {len(calls)} call arrows, {len(edges) - len(calls)} include arrows")
    for comp in strongly_connected(nodes, calls):
        print(f"call cycle of {len(comp)} files (generated ones included): {' '.join(comp)}")
    if a.edges:
        for (x, y), syms in sorted(edges.items()):
            print(f"  {x} -> {y}: {' '.join(sorted(syms))}")
    if not Path(a.layers).exists():
        print(f"no layer table at {a.layers}")
        return 1
    for p in probs:
        print(p)
    print(f"{len(probs)} problem(s)")
    return 1 if probs else 0


if __name__ == "__main__":
    sys.exit(main())
