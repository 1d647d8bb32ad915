"""Facts about C types, asked of the C compiler itself.

The generators need, for every type a supported driver function passes by
value or through an out-pointer, its size and whether it is a signed or
unsigned integer, a floating-point number, a pointer or a struct. Rather than
re-deriving that from typedef chains, we compile a small probe against the
real CUDA headers and run it (GCC's __builtin_classify_type gives the class).
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass

# __builtin_classify_type results (gcc/typeclass.h)
_CLASSES = {1: "int", 2: "int", 3: "int", 4: "int", 5: "pointer", 6: "pointer",
            8: "float", 12: "struct", 13: "struct", 14: "array"}


@dataclass(frozen=True)
class CType:
    name: str
    size: int
    cls: str          # 'int', 'uint', 'float', 'pointer', 'struct'

    @property
    def cffi(self) -> str:
        """The ABI-equivalent primitive cffi declares it as."""
        if self.cls == "pointer":
            return "void *"
        if self.cls == "float":
            return {4: "float", 8: "double"}[self.size]
        if self.cls in ("int", "uint"):
            return ("" if self.cls == "int" else "u") + f"int{8 * self.size}_t"
        raise ValueError(f"type {self.name} ({self.cls}) has no scalar cffi equivalent")


def _run(src: str, cc: str, include: str, workdir: str) -> str:
    c = os.path.join(workdir, "probe.c")
    exe = os.path.join(workdir, "probe")
    with open(c, "w") as f:
        f.write(src)
    r = subprocess.run([cc, "-std=gnu11", "-D__CUDA_API_VERSION_INTERNAL", f"-I{include}", c, "-o", exe],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"type probe failed to compile:\n{r.stderr[-4000:]}")
    return subprocess.run([exe], capture_output=True, text=True, check=True).stdout


def probe(types: list[str], include: str, cc: str = "cc") -> dict[str, CType]:
    """Returns CType for each C type name (as written in the specs)."""
    types = sorted(set(types))
    head = "#include <stdio.h>\n#include <cuda.h>\n#include <cuda_runtime_api.h>\nint main(void){\n"
    with tempfile.TemporaryDirectory() as d:
        body = "".join(
            f'printf("%d %d\\n", (int)sizeof({t}), __builtin_classify_type(*({t} *)0));\n' for t in types)
        out = _run(head + body + "return 0;}\n", cc, include, d).split("\n")
        info = {}
        for t, line in zip(types, out):
            size, klass = (int(x) for x in line.split())
            info[t] = [size, _CLASSES.get(klass, f"class{klass}")]
        ints = [t for t in types if info[t][1] == "int"]
        if ints:
            body = "".join(f'printf("%d\\n", (int)(({t})-1 < ({t})0));\n' for t in ints)
            out = _run(head + body + "return 0;}\n", cc, include, d).split("\n")
            for t, line in zip(ints, out):
                info[t][1] = "int" if line.strip() == "1" else "uint"
    return {t: CType(t, s, c) for t, (s, c) in info.items()}


def dump(info: dict[str, CType]) -> str:
    return json.dumps({t: [c.size, c.cls] for t, c in sorted(info.items())}, indent=0)
