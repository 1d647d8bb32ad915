"""The cffi declarations proxyd uses for the real driver (backends/cuda.py)
must lay structs out exactly as cuda.h does. Checked against the C compiler;
no GPU needed."""
import os
import shutil
import subprocess

import pytest

cffi = pytest.importorskip("cffi")

CUDA_INC = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")


@pytest.mark.skipif(not os.path.exists(os.path.join(CUDA_INC, "cuda.h")) or not shutil.which("cc"),
                    reason="needs cuda.h and a C compiler")
def test_struct_layouts_match_cuda_h(tmp_path):
    from gpuproxy.proxyd.backends.cuda import HAND_CDEF
    ffi = cffi.FFI()
    ffi.cdef(HAND_CDEF)
    src = tmp_path / "p.c"
    src.write_text("""
#include <stdio.h>
#include <stddef.h>
#include <cuda.h>
int main(void) {
  printf("%zu %zu %zu %zu %zu %zu\\n", sizeof(CUmemAllocationProp), offsetof(CUmemAllocationProp, location),
         offsetof(CUmemAllocationProp, win32HandleMetaData), offsetof(CUmemAllocationProp, allocFlags),
         sizeof(CUmemAccessDesc), offsetof(CUmemAccessDesc, flags));
  printf("%zu %zu %zu %zu %zu %zu\\n", sizeof(CUlaunchAttribute), offsetof(CUlaunchAttribute, value),
         sizeof(CUlaunchConfig), offsetof(CUlaunchConfig, hStream), offsetof(CUlaunchConfig, attrs),
         offsetof(CUlaunchConfig, numAttrs));
  return 0; }
""")
    exe = tmp_path / "p"
    subprocess.run(["cc", f"-I{CUDA_INC}", str(src), "-o", str(exe)], check=True)
    want = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    got = [ffi.sizeof("CUmemAllocationProp"), ffi.offsetof("CUmemAllocationProp", "location"),
           ffi.offsetof("CUmemAllocationProp", "win32HandleMetaData"), ffi.offsetof("CUmemAllocationProp", "allocFlags"),
           ffi.sizeof("CUmemAccessDesc"), ffi.offsetof("CUmemAccessDesc", "flags"),
           ffi.sizeof("CUlaunchAttribute"), ffi.offsetof("CUlaunchAttribute", "value"),
           ffi.sizeof("CUlaunchConfig"), ffi.offsetof("CUlaunchConfig", "hStream"),
           ffi.offsetof("CUlaunchConfig", "attrs"), ffi.offsetof("CUlaunchConfig", "numAttrs")]
    assert got == want


def test_generated_cdef_parses():
    """The generic path's declarations, generated from the specs, are valid cffi."""
    from gpuproxy.proxyd._generated import CDEF, FUNCTIONS
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    generic = [f.name for f in FUNCTIONS.values() if not f.handler and f.shim != "local"]
    assert generic, "no generic functions"
    for name in generic:
        assert f" {name}(" in CDEF, f"{name} has no generated declaration"
