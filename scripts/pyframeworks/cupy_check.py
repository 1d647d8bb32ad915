"""CuPy feature checks, run natively and under gpuproxy by scripts/gpu_check.py
(--python). Each check computes something on the GPU and compares it with
numpy; prints one JSON object {check: "ok" | "FAIL: ..."}.

cupy.matmul goes through cuBLAS, which the proxy remotes to the worker
(docs/libraries.md); its checks also print a digest of the result's bytes,
so that the native and the proxied run can be compared bit for bit.
"""
import hashlib
import json

import numpy as np

from checks import check, results  # noqa: E402  (scripts/pyframeworks/checks.py)


import cupy as cp  # noqa: E402


@check("runtime.getDeviceCount")
def _():
    assert cp.cuda.runtime.getDeviceCount() >= 1


@check("runtime.getDeviceProperties/memGetInfo")
def _():
    p = cp.cuda.runtime.getDeviceProperties(0)
    free, total = cp.cuda.runtime.memGetInfo()
    assert p["totalGlobalMem"] > 0 and 0 < free <= total


@check("array creation + copy back")
def _():
    a = np.arange(1 << 20, dtype=np.float32)
    assert np.array_equal(cp.asnumpy(cp.asarray(a)), a)
    assert float(cp.zeros(10).sum()) == 0.0 and float(cp.ones((4, 4)).sum()) == 16.0


@check("elementwise (NVRTC)")
def _():
    x = cp.linspace(0, 1, 1000, dtype=cp.float32)
    y = cp.sin(x) * 2 + cp.exp(x)
    assert np.allclose(cp.asnumpy(y), np.sin(np.linspace(0, 1, 1000, dtype=np.float32)) * 2
                       + np.exp(np.linspace(0, 1, 1000, dtype=np.float32)), rtol=1e-5)


@check("ElementwiseKernel")
def _():
    k = cp.ElementwiseKernel("float32 x, float32 y", "float32 z", "z = x * y + 1", "gp_fma1")
    a = cp.arange(100, dtype=cp.float32)
    assert np.allclose(cp.asnumpy(k(a, a)), np.arange(100, dtype=np.float32) ** 2 + 1)


@check("reduction")
def _():
    a = np.random.default_rng(0).random((300, 200)).astype(np.float32)
    g = cp.asarray(a)
    assert np.allclose(cp.asnumpy(g.sum(axis=0)), a.sum(axis=0), rtol=1e-4)
    assert abs(float(g.max()) - a.max()) == 0


@check("ReductionKernel")
def _():
    k = cp.ReductionKernel("float32 x", "float32 y", "x * x", "a + b", "y = a", "0", "gp_sumsq")
    a = cp.arange(1000, dtype=cp.float32)
    # The kernel accumulates in float32 (24-bit significand); the exact sum,
    # 332833500, needs 29 bits, so the order CuPy's tree reduction adds in
    # decides the last bits. Compare with the exact float64 sum within a
    # float32 bound: a tree over n terms errs by about log2(n) * 2**-24
    # relative (10 * 6e-8 here); 1e-5 leaves room and still catches a wrong
    # operation or a missing block (1e-3 or worse).
    got = float(k(a))
    exact = float(np.sum(np.arange(1000, dtype=np.float64) ** 2))
    assert abs(got - exact) <= 1e-5 * exact, (got, exact)


@check("RawKernel")
def _():
    k = cp.RawKernel(r'''extern "C" __global__ void twice(const float *a, float *b, int n)
    { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) b[i] = 2 * a[i]; }''', "twice")
    a = cp.arange(1000, dtype=cp.float32)
    b = cp.empty_like(a)
    k((4,), (256,), (a, b, cp.int32(1000)))
    assert np.array_equal(cp.asnumpy(b), 2 * np.arange(1000, dtype=np.float32))


@check("streams + events")
def _():
    s = cp.cuda.Stream(non_blocking=True)
    e1, e2 = cp.cuda.Event(), cp.cuda.Event()
    with s:
        e1.record()
        a = cp.arange(1 << 20, dtype=cp.float32) * 3
        e2.record()
    s.synchronize()
    assert cp.cuda.get_elapsed_time(e1, e2) >= 0
    assert float(a[10]) == 30.0


@check("memory pool")
def _():
    pool = cp.get_default_memory_pool()
    a = cp.zeros(1 << 22, dtype=cp.uint8)
    used = pool.used_bytes()
    del a
    pool.free_all_blocks()
    assert used >= 1 << 22 and pool.used_bytes() < used


@check("pinned memory + async copy")
def _():
    pinned = cp.cuda.alloc_pinned_memory(4096)
    h = np.frombuffer(pinned, np.float32, 1024)
    h[:] = np.arange(1024)
    d = cp.empty(1024, cp.float32)
    d.set(h, stream=cp.cuda.Stream.null)
    assert float(d.sum()) == float(np.arange(1024).sum())


def _digest(x) -> str:
    return hashlib.sha256(cp.asnumpy(x).tobytes()).hexdigest()[:16]


@check("matmul (cuBLAS)")
def _():
    a = cp.ones((64, 64), cp.float32)
    assert float((a @ a)[0, 0]) == 64.0


digests = {}
for dt, tol in ((np.float32, 1e-4), (np.float64, 1e-12)):
    @check(f"matmul {np.dtype(dt).name} vs numpy (cuBLAS gemm)")
    def _():
        rng = np.random.default_rng(7)
        a, b = rng.standard_normal((192, 160)).astype(dt), rng.standard_normal((160, 96)).astype(dt)
        c = cp.asarray(a) @ cp.asarray(b)
        np.testing.assert_allclose(cp.asnumpy(c), a.astype(np.float64) @ b.astype(np.float64), rtol=tol, atol=tol)
        digests[f"matmul {np.dtype(dt).name}"] = _digest(c)

    @check(f"batched matmul {np.dtype(dt).name} vs numpy (strided batched gemm)")
    def _():
        rng = np.random.default_rng(8)
        a, b = rng.standard_normal((4, 32, 48)).astype(dt), rng.standard_normal((4, 48, 16)).astype(dt)
        c = cp.matmul(cp.asarray(a), cp.asarray(b))
        np.testing.assert_allclose(cp.asnumpy(c), a.astype(np.float64) @ b.astype(np.float64), rtol=tol, atol=tol)
        digests[f"batched matmul {np.dtype(dt).name}"] = _digest(c)


# cuFFT, cuRAND, cuSPARSE, cuSOLVER (issue 12 part 2; docs/libraries.md):
# against numpy with a tolerance, and digests compared with the native run
@check("cupy.fft.fft/ifft complex64 vs numpy (cuFFT C2C)")
def _():
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((4, 256)) + 1j * rng.standard_normal((4, 256))).astype(np.complex64)
    f = cp.fft.fft(cp.asarray(x))
    np.testing.assert_allclose(cp.asnumpy(f), np.fft.fft(x.astype(np.complex128)), rtol=1e-4, atol=1e-3)
    back = cp.fft.ifft(f)
    np.testing.assert_allclose(cp.asnumpy(back), x, rtol=1e-4, atol=1e-5)
    digests["fft c64"] = _digest(f)


@check("cupy.fft.rfft/irfft float64 vs numpy (cuFFT D2Z/Z2D)")
def _():
    x = np.random.default_rng(12).standard_normal((3, 500))
    f = cp.fft.rfft(cp.asarray(x))
    np.testing.assert_allclose(cp.asnumpy(f), np.fft.rfft(x), rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(cp.asnumpy(cp.fft.irfft(f, n=500)), x, rtol=1e-10, atol=1e-12)
    digests["rfft f64"] = _digest(f)


@check("cupy.random (cuRAND): range, mean, same seed same numbers")
def _():
    rs = cp.random.RandomState(seed=2024)
    u = rs.random_sample(100000, dtype=cp.float32)
    n = rs.standard_normal(100000, dtype=cp.float64)
    uh, nh = cp.asnumpy(u), cp.asnumpy(n)
    assert uh.min() >= 0.0 and uh.max() < 1.0 and abs(uh.mean() - 0.5) < 0.01, (uh.min(), uh.max(), uh.mean())
    assert abs(nh.mean()) < 0.02 and abs(nh.std() - 1.0) < 0.02, (nh.mean(), nh.std())
    again = cp.random.RandomState(seed=2024).random_sample(100000, dtype=cp.float32)
    assert (cp.asnumpy(again) == uh).all()
    digests["random uniform f32"] = _digest(u)
    digests["random normal f64"] = _digest(n)


@check("cupyx.scipy.sparse csr_matrix @ vector vs numpy (cuSPARSE SpMV)")
def _():
    import cupyx.scipy.sparse as csp
    rng = np.random.default_rng(13)
    dense = rng.standard_normal((300, 200)) * (rng.random((300, 200)) < 0.05)
    x = rng.standard_normal(200)
    # made from CSR arrays (numpy), not from a dense array: CuPy converts a
    # dense one with cusparseDenseToSparse_*, which is not remoted yet
    rows, cols = np.nonzero(dense)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=300))]).astype(np.int32)
    m = csp.csr_matrix((cp.asarray(dense[rows, cols]), cp.asarray(cols.astype(np.int32)), cp.asarray(indptr)),
                       shape=(300, 200))
    y = m @ cp.asarray(x)
    np.testing.assert_allclose(cp.asnumpy(y), dense @ x, rtol=1e-10, atol=1e-10)
    digests["spmv f64"] = _digest(y)


@check("cupy.linalg.solve / cholesky vs numpy (cuSOLVER getrf/getrs, potrf)")
def _():
    rng = np.random.default_rng(14)
    a = rng.standard_normal((64, 64)) + 64 * np.eye(64)
    b = rng.standard_normal((64, 3))
    x = cp.linalg.solve(cp.asarray(a), cp.asarray(b))
    np.testing.assert_allclose(cp.asnumpy(x), np.linalg.solve(a, b), rtol=1e-9, atol=1e-9)
    spd = a @ a.T
    l = cp.linalg.cholesky(cp.asarray(spd))
    np.testing.assert_allclose(cp.asnumpy(l), np.linalg.cholesky(spd), rtol=1e-9, atol=1e-8)
    digests["solve f64"] = _digest(x)
    digests["cholesky f64"] = _digest(l)


# the rest of cuBLAS and cuSOLVER that cupy.linalg and cupyx.scipy.linalg
# call (docs/libraries.md); references are numpy's, or the defining
# property where signs are free (Q, eigenvectors, singular vectors)
@check("cupy.dot of vectors f32/f64/c128 vs numpy (cuBLAS dot/dotu, result by pointer mode)")
def _():
    rng = np.random.default_rng(21)
    for dt, tol in ((np.float32, 1e-4), (np.float64, 1e-12), (np.complex128, 1e-12)):
        x = rng.standard_normal(1000).astype(dt)
        y = rng.standard_normal(1000).astype(dt)
        if dt == np.complex128:
            x, y = x + 1j * rng.standard_normal(1000), y + 1j * rng.standard_normal(1000)
        d = cp.dot(cp.asarray(x), cp.asarray(y))
        want = np.dot(x.astype(np.complex128), y.astype(np.complex128))
        assert abs(complex(d) - want) <= tol * (1 + abs(want)), (dt, complex(d), want)
        digests[f"dot {np.dtype(dt).name}"] = _digest(d)
    v = rng.standard_normal(500)
    assert abs(float(cp.vdot(cp.asarray(v), cp.asarray(v))) - float(v @ v)) < 1e-9


@check("cupy.linalg.inv 2-D and batched, matrix_power(-3) (cuSOLVER getrf/getrs, cuBLAS getrf/getriBatched)")
def _():
    rng = np.random.default_rng(22)
    a = rng.standard_normal((48, 48)) + 48 * np.eye(48)
    inv = cp.linalg.inv(cp.asarray(a))
    np.testing.assert_allclose(cp.asnumpy(inv) @ a, np.eye(48), atol=1e-10)
    ab = rng.standard_normal((5, 12, 12)) + 12 * np.eye(12)
    invb = cp.linalg.inv(cp.asarray(ab))
    np.testing.assert_allclose(np.einsum("bij,bjk->bik", cp.asnumpy(invb), ab), np.broadcast_to(np.eye(12), ab.shape),
                               atol=1e-10)
    small = rng.standard_normal((6, 6)) + 6 * np.eye(6)
    mp = cp.linalg.matrix_power(cp.asarray(small), -3)
    np.testing.assert_allclose(cp.asnumpy(mp) @ np.linalg.matrix_power(small, 3), np.eye(6), atol=1e-9)
    zc = rng.standard_normal((16, 16)) + 1j * rng.standard_normal((16, 16)) + 16 * np.eye(16)
    np.testing.assert_allclose(cp.asnumpy(cp.linalg.inv(cp.asarray(zc))) @ zc, np.eye(16), atol=1e-10)
    digests["inv f64"] = _digest(inv)
    digests["inv batched f64"] = _digest(invb)
    digests["matrix_power -3 f64"] = _digest(mp)


@check("cupy.linalg.qr reduced and complete (cuSOLVER geqrf/orgqr)")
def _():
    rng = np.random.default_rng(23)
    a = rng.standard_normal((40, 24))
    q, r = cp.linalg.qr(cp.asarray(a))
    qh, rh = cp.asnumpy(q), cp.asnumpy(r)
    np.testing.assert_allclose(qh @ rh, a, atol=1e-10)
    np.testing.assert_allclose(qh.T @ qh, np.eye(24), atol=1e-10)
    np.testing.assert_allclose(np.abs(np.diag(rh)), np.abs(np.diag(np.linalg.qr(a)[1])), rtol=1e-9)
    qc, rc = cp.linalg.qr(cp.asarray(a), mode="complete")
    np.testing.assert_allclose(cp.asnumpy(qc) @ cp.asnumpy(rc), a, atol=1e-10)
    digests["qr r f64"] = _digest(r)


@check("cupy.linalg.svd (cuSOLVER gesvd) and batched (gesvdjBatched)")
def _():
    rng = np.random.default_rng(24)
    a = rng.standard_normal((50, 30))
    u, s, vt = cp.linalg.svd(cp.asarray(a), full_matrices=False)
    uh, sh, vth = cp.asnumpy(u), cp.asnumpy(s), cp.asnumpy(vt)
    np.testing.assert_allclose(sh, np.linalg.svd(a, compute_uv=False), rtol=1e-10)
    np.testing.assert_allclose((uh * sh) @ vth, a, atol=1e-10)
    ab = rng.standard_normal((4, 10, 8))
    sb = cp.linalg.svd(cp.asarray(ab), compute_uv=False)
    np.testing.assert_allclose(cp.asnumpy(sb), np.linalg.svd(ab, compute_uv=False), rtol=1e-9)
    digests["svd s f64"] = _digest(s)


@check("cupy.linalg.eigh 2-D (cuSOLVER syevd) and batched (syevjBatched)")
def _():
    rng = np.random.default_rng(25)
    m = rng.standard_normal((32, 32))
    a = m + m.T
    w, v = cp.linalg.eigh(cp.asarray(a))
    wh, vh = cp.asnumpy(w), cp.asnumpy(v)
    np.testing.assert_allclose(wh, np.linalg.eigvalsh(a), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(a @ vh, vh * wh, atol=1e-9)
    mb = rng.standard_normal((3, 8, 8))
    ab = mb + mb.transpose(0, 2, 1)
    wb = cp.linalg.eigvalsh(cp.asarray(ab))
    np.testing.assert_allclose(cp.asnumpy(wb), np.linalg.eigvalsh(ab), rtol=1e-8, atol=1e-8)
    h = m + 1j * rng.standard_normal((32, 32))
    h = h + h.conj().T
    np.testing.assert_allclose(cp.asnumpy(cp.linalg.eigvalsh(cp.asarray(h))), np.linalg.eigvalsh(h), rtol=1e-9,
                               atol=1e-9)
    digests["eigh w f64"] = _digest(w)


@check("cupyx.scipy.linalg.solve_triangular lower/upper/trans (cuBLAS trsm)")
def _():
    from cupyx.scipy.linalg import solve_triangular
    rng = np.random.default_rng(26)
    t = np.tril(rng.standard_normal((30, 30))) + 30 * np.eye(30)
    b = rng.standard_normal((30, 4))
    x = solve_triangular(cp.asarray(t), cp.asarray(b), lower=True)
    np.testing.assert_allclose(t @ cp.asnumpy(x), b, atol=1e-10)
    xu = solve_triangular(cp.asarray(t.T), cp.asarray(b), lower=False, trans="T")
    np.testing.assert_allclose(t @ cp.asnumpy(xu), b, atol=1e-10)
    digests["solve_triangular f64"] = _digest(x)


results["result digests"] = digests


print(json.dumps(results, indent=1))
