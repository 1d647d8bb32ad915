"""Two builds of one gpuproxy version give byte-identical stand-in
libraries, wherever they ran (issue 26): CRIU validates the libraries a
restored process maps by their ELF build-id, a hash of their bytes, so a
reinstall of the same version must not change them, or every whole-process
image made before would be refused. autogen/build.py's reproducible() keeps
the build's folders (checkout, pip's temporary folder, generated code,
the compiler's working folder) out of the output."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_installed_stand_ins_name_no_build_folder(shim_installed):
    lib = Path(shim_installed.__file__).parent / "lib"
    libs = sorted(p for p in lib.iterdir() if ".so" in p.name)
    assert libs
    for p in libs:
        data = p.read_bytes()
        for bad in (str(REPO).encode(), b"gpuproxy-standin-", b"/build/temp", b"pip-"):
            assert bad not in data, f"{p.name} holds {bad!r}: it changes from one build to the next"


@pytest.mark.parametrize("cc", ["cc"])
def test_objects_do_not_depend_on_where_they_were_built(tmp_path, cc, monkeypatch):
    if shutil.which(cc) is None:
        pytest.skip(f"no {cc}")
    sys.path.insert(0, str(REPO))
    from autogen.build import reproducible
    objs = []
    for name in ("a", "a-much-longer-build-folder"):
        gen = tmp_path / name / "gen"
        gen.mkdir(parents=True)
        (gen / "gp_gen_test.h").write_text("#define GP_TEST_VALUE 42\n")
        (gen / "stub.c").write_text('#include "gp_msgpack.h"\n#include "gp_gen_test.h"\n'
                                    'int gp_test_value(void) { return GP_TEST_VALUE + (int)sizeof(gp_buf); }\n'
                                    'const char *gp_test_file(void) { return __FILE__; }\n')
        o = tmp_path / name / "stub.o"
        monkeypatch.chdir(tmp_path / name)       # the compiler's working folder is the build's (autogen/build.py)
        r = subprocess.run([cc, "-O2", "-g", "-fPIC", f"-I{REPO / 'interceptor'}", f"-I{gen}", *reproducible(gen),
                            "-c", str(gen / "stub.c"), "-o", str(o)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        objs.append(o.read_bytes())
    assert objs[0] == objs[1], "the object files differ with the folder they were built in"
