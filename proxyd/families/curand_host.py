"""cuRAND host generators in the worker (issue 26; the shim's side is
interceptor/lib_curand_host.c).

curand.h: curandCreateGeneratorHost makes a generator that runs on the CPU
and writes host memory. The worker creates NVIDIA's host generator (or the
emulated one) as it creates a device generator -- the same session object
kind, restored by its create call and positioned like any generator
(libraries.curand_position) -- and a generate call on it writes into a
buffer of the worker's, whose bytes are the answer; the stand-in copies them
to the application's output before the call returns. So these calls are
synchronous here, whatever their spec says for device generators, and their
status is the library's own (not a deferred launch failure).

Locking: the worker's main loop only (like libraries.py). No import of
libraries.py (which calls this module).
"""
from __future__ import annotations

from .._generated import FUNCTIONS

# results' element sizes of the generate calls (curand.h)
ELEM = {"curandGenerate": 4, "curandGenerateLongLong": 8, "curandGenerateUniform": 4,
        "curandGenerateUniformDouble": 8, "curandGenerateNormal": 4, "curandGenerateNormalDouble": 8,
        "curandGenerateLogNormal": 4, "curandGenerateLogNormalDouble": 8, "curandGeneratePoisson": 4}
CURAND_STATUS_LENGTH_NOT_MULTIPLE = 105   # curand.h
MAX_RESULT = 1 << 31                       # bytes answered in one reply


def is_host(sess, fn, args, generator_of) -> bool:
    """Whether fn is a generate call on a generator made by
    curandCreateGeneratorHost; generator_of(handle) is its session object."""
    if fn.name not in ELEM or not args or not args[0]:
        return False
    g = generator_of(args[0])
    return g is not None and g.create is not None and \
        getattr(FUNCTIONS.get(g.create[0]), "name", "") == "curandCreateGeneratorHost"


def generate(lib, fn, cargs, n: int):
    """Runs the generate call into a host buffer of n results; (status,
    [bytes] or None)."""
    nbytes = n * ELEM[fn.name]
    if nbytes > MAX_RESULT:
        from ..core.session import CudaError
        raise CudaError(1, f"{fn.name}: {n} results from a host generator in one call "
                           f"(at most {MAX_RESULT // ELEM[fn.name]} through gpuproxy)")
    host = getattr(lib, "generate_host", None)
    if host is not None:            # the emulated library (proxyd/backends/emu/curand_host.py)
        return host(fn, list(cargs), nbytes)
    ffi = lib.ffi
    buf = ffi.new("char[]", max(nbytes, 1))
    args = list(cargs)
    args[1] = ffi.cast("void *", buf)
    code, _ = lib.call(fn, args)
    return code, ([bytes(ffi.buffer(buf, nbytes))] if code == 0 else None)
