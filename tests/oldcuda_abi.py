"""The ABI of a CUDA library major, read from its own headers, for the
per-major parity test (tests/test_oldcuda_libs.py; specs/abi/library_majors.yaml).

prototypes(api, include_dirs): name -> [return type, parameter types] of
  every function of the library's own headers (autogen's header parser).
enumerators(header, include_dirs, prefix): name -> (enum typedef, value)
  of every enumerator of the library's own enums (names starting with
  `prefix`), the values computed by the C compiler from those headers.
values_in(header, include_dirs, names): the same names evaluated against
  other headers (another major's): name -> value, absent names left out.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CRT = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda") / "include"


def _cc_incs(incs):
    return [a for i in incs for a in ("-I", str(i))] + ["-idirafter", str(CRT)]


def preprocessed(header: str, incs) -> str:
    r = subprocess.run(["cc", "-E", "-x", "c", *_cc_incs(incs), "-"], input=f"#include <{header}>\n",
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"preprocessing {header}: {r.stderr[-2000:]}")
    return r.stdout


def prototypes(api: str, incs) -> dict[str, list[str]]:
    sys.path.insert(0, str(REPO / "autogen"))
    import libbootstrap as lb
    text, _ = lb.preprocess(api, [str(i) for i in incs], str(CRT))
    return {n: [norm(p.returns)] + [norm(q.type) for q in p.params] for n, p in lb.parse_decls(api, text).items()}


def norm(t: str) -> str:
    t = re.sub(r"\s*\*\s*", "*", t)
    return re.sub(r"\s+", " ", t).strip()


def pointer_typedefs(header: str, incs) -> set[str]:
    """Typedef names that are pointers (cusparseSpMatDescr_t, cusparseConstSpMatDescr_t, handles)."""
    text = preprocessed(header, incs)
    return set(re.findall(r"typedef\s[^;{}]*\*\s*(\w+)\s*;", text))


def _evaluate(header: str, incs, names: list[str], expr: str = "{}") -> dict[str, int]:
    """name -> value of expr (with the name) for the names those headers
    define; the others dropped (found from the compiler's 'undeclared' errors)."""
    names = list(names)
    d = tempfile.mkdtemp(prefix="gp-enum-")
    for _ in range(50):
        body = "".join(f'  printf("{n} %lld\\n", (long long)({expr.format(n)}));\n' for n in names)
        Path(d, "e.c").write_text(f"#include <{header}>\n#include <stdio.h>\nint main(void)\n{{\n{body}  return 0;\n}}\n")
        r = subprocess.run(["cc", "-w", "-fmax-errors=0", *_cc_incs(incs), f"{d}/e.c", "-o", f"{d}/e"],
                           capture_output=True, text=True, timeout=120, env=dict(os.environ, LC_ALL="C"))
        if r.returncode == 0:
            out = subprocess.run([f"{d}/e"], capture_output=True, text=True, timeout=60).stdout
            return {a: int(b) for a, b in (line.split() for line in out.splitlines())}
        bad = set(re.findall(r"['\u2018](\w+)['\u2019] undeclared", r.stderr))
        if not bad:
            raise RuntimeError(f"evaluating enumerators of {header}: {r.stderr[-2000:]}")
        names = [n for n in names if n not in bad]
    raise RuntimeError("too many rounds")


def enumerators(header: str, incs, prefix: tuple[str, ...]) -> dict[str, tuple[str, int]]:
    # without the preprocessor's line markers, which split enum bodies
    text = re.sub(r"^#[^\n]*$", " ", preprocessed(header, incs), flags=re.M)
    owner = {}
    # "typedef enum [tag] { ... } name;" or "enum tag { ... };" (curand.h)
    for m in re.finditer(r"(typedef\s+)?enum\s*(\w*)\s*\{([^}]*)\}\s*(\w*)\s*;", text):
        typ = m.group(4) if m.group(1) else m.group(2)
        for e in m.group(3).split(","):
            n = e.split("=")[0].strip()
            if typ and re.fullmatch(r"[A-Za-z_]\w*", n) and n.startswith(prefix):
                owner[n] = typ
    vals = _evaluate(header, incs, sorted(owner))
    return {n: (owner[n], v) for n, v in vals.items()}


def values_in(header: str, incs, names) -> dict[str, int]:
    return _evaluate(header, incs, sorted(names))


def type_layouts(header: str, incs, names) -> dict[str, tuple[int, int]]:
    """type name -> (sizeof, _Alignof) for the names those headers define."""
    size = _evaluate(header, incs, sorted(names), "sizeof({})")
    align = _evaluate(header, incs, sorted(size), "_Alignof({})")
    return {n: (size[n], align[n]) for n in size}
