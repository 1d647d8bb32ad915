"""Device ordinals inside structures (proxyd/families/devnum.py, LOCATED):
the table's layouts are cuda.h's, every structure a worker-handled call of
the specs takes that carries a device location (CUmemLocation, directly or
nested) is in the table or translated where the shim sends it in a form of
its own, and the translation itself (in both directions, arrays element by
element, host locations untouched). The end-to-end check is
tests/test_peer.py -k device_locations (a swapped restore on two emulated
devices)."""
from __future__ import annotations

import os
import re
import struct
import subprocess
from pathlib import Path

import pytest

from gpuproxy.proxyd._generated import FUNCTIONS
from gpuproxy.proxyd.families import devnum

INCLUDE = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda") / "include"
# structures that carry a device location but reach the worker in a form
# the shim chooses (not the C bytes), translated by their handlers
TRANSLATED_ELSEWHERE = {
    "CUDA_MEM_ALLOC_NODE_PARAMS": "graph_mem.py: the shim sends [bytesize, allocType, handleTypes, type, id]",
    # interceptor/graph_add_node.c sends each node type of cuGraphAddNode
    # through its own add call (an allocation node through
    # cuGraphAddMemAllocNode, above); only conditional nodes reach the
    # worker as this structure, and they hold no location
    "CUgraphNodeParams": "graph_add_node.c: by node type; conditional nodes carry no location",
}


def _cuda_h() -> str:
    p = INCLUDE / "cuda.h"
    if not p.is_file():
        pytest.skip(f"{p} not found (CUDA_HOME)")
    return p.read_text(errors="replace")


def _struct_bodies(text: str) -> dict[str, str]:
    """typedef name -> the body of the structure it names (cuda.h's
    `typedef struct X_st {...} X_v1;` and `typedef X_v1 X;`)."""
    out: dict[str, str] = {}
    for m in re.finditer(r"typedef\s+(?:struct|union)\s+\w*\s*\{", text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        tail = re.match(r"\s*(\w+)", text[i:])
        if tail:
            out[tail.group(1)] = text[m.end():i - 1]
    changed = True
    while changed:
        changed = False
        for a, b in re.findall(r"typedef\s+(\w+)\s+(\w+)\s*;", text):
            if a in out and b not in out:
                out[b] = out[a]
                changed = True
    return out


def _carrying(bodies: dict[str, str]) -> set[str]:
    """The typedef names whose structure holds a CUmemLocation, directly or
    through a member of such a type."""
    have = {"CUmemLocation"}
    grew = True
    while grew:
        grew = False
        for name, body in bodies.items():
            if name not in have and any(re.search(rf"\b{t}\b", body) for t in have):
                have.add(name)
                grew = True
    return have


def test_every_spec_structure_with_a_device_location_is_translated():
    carrying = _carrying(_struct_bodies(_cuda_h()))
    missing = []
    seen = set()
    for fn in FUNCTIONS.values():
        if fn.handler == "library" or fn.shim == "local":
            continue            # libraries take no locations; shim-local calls never reach the worker
        for p in fn.params:
            t = devnum.base_type(p[3]) if isinstance(p[3], str) else ""
            if t in carrying:
                seen.add(t)
                if t not in devnum.LOCATED and t not in TRANSLATED_ELSEWHERE:
                    missing.append(f"{fn.name}.{p[0]} ({t})")
    assert not missing, f"device locations not translated after a remapping restore: {missing}"
    assert {"CUmemAllocationProp", "CUmemAccessDesc", "CUmemPoolProps", "CUmemLocation"} <= seen, seen


def test_layouts_are_cuda_hs(tmp_path):
    cases = []
    for t, (size, offs) in devnum.LOCATED.items():
        cases.append(f'printf("%s %zu\\n", "{t}", sizeof({t}));')
        members = {"CUmemLocation": None, "CUmemAccessDesc": "location", "CUmemAllocationProp": "location",
                   "CUmemPoolProps": "location"}
        m = members[t]
        if m:
            cases.append(f'printf("%s.%s %zu\\n", "{t}", "{m}", offsetof({t}, {m}));')
    src = tmp_path / "off.c"
    src.write_text("#include <stdio.h>\n#include <stddef.h>\n#include <cuda.h>\nint main(void){\n"
                   + "\n".join(cases) + "\nreturn 0;}\n")
    _cuda_h()
    r = subprocess.run(["cc", "-I", str(INCLUDE), str(src), "-o", str(tmp_path / "off")], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    got = dict(line.split() for line in subprocess.run([str(tmp_path / "off")], capture_output=True, text=True,
                                                        check=True).stdout.splitlines())
    for t, (size, offs) in devnum.LOCATED.items():
        assert int(got[t]) == size, (t, got)
        if t != "CUmemLocation":
            assert (int(got[f"{t}.location"]),) == offs, (t, got)


class _Sess:
    def __init__(self, m):
        self.dev_map = m


def _fn(name):
    return next(f for f in FUNCTIONS.values() if f.name == name)


def test_translation_in_and_out():
    s = _Sess({0: 1, 1: 0})
    # cuMemSetAccess: an array of descriptors, one a host location (type 2) left alone
    desc = b"".join(struct.pack("<iii", t, i, 3) for t, i in ((1, 0), (1, 1), (2, 0)))
    fn = _fn("cuMemSetAccess")
    out = devnum.physical_args(s, fn, [0x1000, 4096, desc, 3])
    assert [struct.unpack_from("<iii", out[2], 12 * k) for k in range(3)] == [(1, 1, 3), (1, 0, 3), (2, 0, 3)]
    # cuMemCreate's properties: location at offset 8, the rest unchanged
    prop = struct.pack("<iiii", 1, 0, 1, 1) + bytes(range(16))
    out = devnum.physical_args(s, _fn("cuMemCreate"), [None, 1 << 21, prop, 0])
    assert out[2] == struct.pack("<iiii", 1, 0, 1, 0) + bytes(range(16))
    # cuMemPoolCreate's properties (88 bytes)
    pp = struct.pack("<iiii", 1, 0, 1, 0) + bytes(72)
    out = devnum.physical_args(s, _fn("cuMemPoolCreate"), [None, pp])
    assert struct.unpack_from("<iiii", out[1]) == (1, 0, 1, 1)
    # the answer of cuMemGetAllocationPropertiesFromHandle back in the app's numbers
    outs = devnum.app_outs(s, _fn("cuMemGetAllocationPropertiesFromHandle"), [struct.pack("<iiii", 1, 0, 1, 0)
                                                                              + bytes(16)])
    assert struct.unpack_from("<iiii", outs[0]) == (1, 0, 1, 1)
    # no map: nothing is copied or changed
    same = [0x1000, 4096, desc, 3]
    assert devnum.physical_args(_Sess({}), fn, same)[2] is desc
