"""The spec role scalar_out (autogen/specload.py, gen_lib.py): a library
result written to host or device memory by the handle's pointer mode
(cublasSdot's `result`, cublas_api.h). What the generator emits for it and
what the spec loader refuses; the wire behaviour in both pointer modes is
tested through the shim in tests/test_linalg_remoting.py."""
from __future__ import annotations

import pytest

from conftest import REPO
from gpuproxy.autogen import gen_c, gen_lib, specload

SPECS = specload.load_specs(REPO / "specs")
CUBLAS = next(sf for sf in SPECS.files if sf.api == "cublas")


def _entry(sync=True, mode="gp_cublas_device_mode(handle)", status="supported"):
    result = {"name": "result", "type": "float *", "role": "scalar_out", "size": "sizeof(float)"}
    if mode:
        result["mode"] = mode
    return {"name": "cublasSdot_v2", "id": 20064, "returns": "cublasStatus_t",
            "params": [{"name": "handle", "type": "cublasHandle_t", "role": "handle", "kind": "cublas_handle"},
                       {"name": "n", "type": "int", "role": "scalar"},
                       {"name": "x", "type": "const float *", "role": "device_ptr"},
                       {"name": "incx", "type": "int", "role": "scalar"},
                       {"name": "y", "type": "const float *", "role": "device_ptr"},
                       {"name": "incy", "type": "int", "role": "scalar"}, result],
            "objects": [{"kind": "cublas_handle", "effect": "use"}], "sync": sync, "status": status,
            "restore": "memory"}


def test_generated_body_sends_room_or_the_address_and_copies_the_answer_back():
    body = gen_lib.generic_body(CUBLAS, _entry())
    # host pointer mode: room for the value; device mode: the pointer
    assert "else if (gp_cublas_device_mode(handle)) mp_uint(b_, (uint64_t)(uintptr_t)result);" in body
    assert "mp_bin(b_, z_" in body and "(size_t)(sizeof(float))" in body
    # the answer's value lands in the caller's variable (nil in device mode: nothing copied)
    assert "gp_out_buffer(&r_, result, result ? (size_t)(sizeof(float)) : 0);" in body
    assert "gp_lib_op_sync" in body and "gp_lib_op_async" not in body


def test_an_asynchronous_function_with_a_result_is_refused():
    f = _entry(sync=False)
    assert not gen_lib.can_be_generic(f)
    with pytest.raises(gen_c.GenError, match="not sendable generically"):
        gen_lib.gen_stubs(CUBLAS, [f], ["test"])


def test_the_spec_loader_wants_a_mode_and_a_size():
    errs = specload._Errors()
    specload._parse_function(_entry(mode=None), "cublas", "cublas", "test.yaml", errs)
    assert any("scalar_out needs a mode" in e for e in errs.items), errs.items
    errs = specload._Errors()
    raw = _entry()
    del raw["params"][-1]["size"]
    specload._parse_function(raw, "cublas", "cublas", "test.yaml", errs)
    assert any("role scalar_out needs a size" in e for e in errs.items), errs.items


def test_every_level1_result_in_the_spec_is_a_scalar_out_of_a_synchronous_call():
    """cublas_api.h: dot, nrm2, asum, iamax/iamin write `result` to host or
    device memory by the pointer mode; a device_ptr role would hand a host
    address to the worker."""
    seen = 0
    for f in SPECS.libraries:
        if f.api != "cublas" or not f.supported:
            continue
        for p in f.params:
            if p.name == "result":
                seen += 1
                assert p.role == "scalar_out" and p.mode and p.size, f.name
                assert f.sync, f"{f.name}: a host result needs the answer"
    assert seen == 56, seen       # dot/dotu/dotc, nrm2, asum, iamax, iamin, their Ex forms, x2 for _64
