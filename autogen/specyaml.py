"""How the spec tools write YAML: compact, deterministic, one flow mapping a
line in a fixed key order (docs/spec-format.md). Shared by bootstrap.py
(the driver and runtime families) and libbootstrap.py (the libraries), so
that neither imports the other for it."""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Dict, List, Optional

import yaml

ENTRY_KEYS = ["name", "id", "returns", "params", "objects", "sync", "status", "proc",
              "handler", "shim", "restore"]
RESTORE_KEYS = ["rule", "key", "why"]
PARAM_KEYS = ["name", "type", "role", "kind", "size"]
PROC_KEYS = ["base", "version", "stream"]
OBJ_KEYS = ["kind", "effect"]
FILE_KEYS = ["api", "family", "library", "soname", "header", "doc_group", "cuda_version",
             "functions"]


_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def yaml_load(text):
    return yaml.load(text, Loader=_SAFE_LOADER)


def scalar(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return _scalar_str(str(v))


@lru_cache(maxsize=None)
def _scalar_str(s: str) -> str:
    if s and not re.search(r"[:#,\[\]{}&!|>'\"%@`]", s) and s == s.strip() and \
            not s.startswith(("*", "-", "?", "&", "!")):
        try:
            if yaml_load("{k: " + s + "}") == {"k": s}:
                return s
        except yaml.YAMLError:
            pass
    return "'" + s.replace("'", "''") + "'"


def ordered_keys(d: Dict, order: List[str]) -> List[str]:
    return [k for k in order if k in d] + sorted(k for k in d if k not in order)


def flow(v, order: Optional[List[str]] = None) -> str:
    if isinstance(v, dict):
        keys = ordered_keys(v, order or [])
        return "{" + ", ".join(f"{k}: {flow(v[k], _sub_order(k))}" for k in keys) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(flow(x, order) for x in v) + "]"
    return scalar(v)


def _sub_order(key: str) -> List[str]:
    return {"proc": PROC_KEYS, "objects": OBJ_KEYS, "cuda_version": ["min", "max"],
            "params": PARAM_KEYS, "restore": RESTORE_KEYS}.get(key, [])


def entry_lines(e: Dict, keys: List[str], param_keys: List[str], sub_order) -> List[str]:
    """One function's entry of a spec file, its keys in the order given: the
    first after "- ", params one a line, every other value as a flow mapping
    or list whose keys come in sub_order(key)'s order."""
    lines = []
    for i, k in enumerate(keys):
        v = e[k]
        prefix = "  " if i else "- "
        if k == "params":
            if not v:
                lines.append(f"{prefix}params: []")
            else:
                lines.append(f"{prefix}params:")
                lines += ["  - " + flow(q, param_keys) for q in v]
        else:
            lines.append(f"{prefix}{k}: {flow(v, sub_order(k))}")
    return lines
