"""PyTorch library checks, run natively and under gpuproxy by
scripts/gpu_check.py (--python, frameworks step): matrix products that go
through cuBLAS and cuBLASLt, convolutions and attention through cuDNN
(docs/libraries.md), compared with the CPU, and
a digest of each result's bytes so that the native and the proxied run can
be compared bit for bit (the same GPU, the same library, the same inputs
must give the same bits). Prints one JSON object {check: "ok" | "FAIL: ..."}
plus "result digests".
"""
import hashlib
import json

from checks import check, results  # noqa: E402  (scripts/pyframeworks/checks.py)

digests = {}


import torch  # noqa: E402


def _digest(name, t):
    digests[name] = hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def _inputs(seed, *shape_pairs, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=dtype) for s in shape_pairs]


@check("cuda available")
def _():
    assert torch.cuda.is_available() and torch.cuda.device_count() >= 1


for dt, tol in ((torch.float32, 1e-3), (torch.float64, 1e-10)):
    tag = str(dt).replace("torch.", "")

    @check(f"torch.mm {tag} vs CPU (cublas gemm)")
    def _():
        a, b = _inputs(1, (256, 192), (192, 128), dtype=dt)
        c = torch.mm(a.cuda(), b.cuda())
        torch.testing.assert_close(c.cpu(), a.double().mm(b.double()).to(dt), rtol=tol, atol=tol)
        _digest(f"mm {tag}", c)

    @check(f"torch.bmm {tag} vs CPU (strided batched gemm)")
    def _():
        a, b = _inputs(2, (8, 64, 32), (8, 32, 48), dtype=dt)
        c = torch.bmm(a.cuda(), b.cuda())
        torch.testing.assert_close(c.cpu(), a.double().bmm(b.double()).to(dt), rtol=tol, atol=tol)
        _digest(f"bmm {tag}", c)


@check("nn.Linear float32 forward/backward vs CPU (cublasLt addmm)")
def _():
    torch.manual_seed(3)
    lin = torch.nn.Linear(128, 64)
    x, = _inputs(4, (32, 128))
    ref = lin(x)
    ref.sum().backward()
    gref = lin.weight.grad.clone()
    lin.weight.grad = None
    lc = lin.cuda()
    y = lc(x.cuda())
    y.sum().backward()
    torch.testing.assert_close(y.cpu(), ref, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(lc.weight.grad.cpu(), gref, rtol=1e-3, atol=1e-3)
    _digest("linear out", y)
    _digest("linear grad", lc.weight.grad)


@check("bfloat16 matmul vs CPU (cublasLt, tensor cores)")
def _():
    a, b = _inputs(5, (128, 256), (256, 64))
    c = torch.mm(a.cuda().bfloat16(), b.cuda().bfloat16())
    torch.testing.assert_close(c.float().cpu(), a.bfloat16().float().mm(b.bfloat16().float()), rtol=2e-2, atol=2e-1)
    _digest("mm bf16", c.float())


@check("conv net (Conv2d+BatchNorm2d+ReLU) 3 training steps vs CPU (cuDNN backend API)")
def _():
    # deterministic cuDNN algorithms, no autotuning: the same engine natively
    # and proxied, so the same bits
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.allow_tf32 = False

    def net():
        torch.manual_seed(7)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                   torch.nn.Conv2d(8, 4, 3, stride=2, padding=1), torch.nn.ReLU())

    x, = _inputs(8, (4, 3, 16, 16))
    outs = {}
    for dev in ("cpu", "cuda"):
        m = net().to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        xd = x.to(dev)
        losses = []
        for _step in range(3):
            opt.zero_grad()
            loss = m(xd).square().mean()
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        outs[dev] = (torch.stack(losses).cpu(), m[0].weight.detach().cpu(), m(xd).detach().cpu())
    for a, b in zip(outs["cuda"], outs["cpu"]):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
    _digest("convnet losses", outs["cuda"][0])
    _digest("convnet conv1 weight", outs["cuda"][1])
    _digest("convnet output", outs["cuda"][2])


@check("conv2d forward/backward alone vs CPU (cuDNN backend API, no BatchNorm)")
def _():
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    x, w = _inputs(9, (2, 4, 12, 12), (6, 4, 3, 3))
    xc, wc = x.cuda().requires_grad_(), w.cuda().requires_grad_()
    y = torch.nn.functional.conv2d(xc, wc, padding=1)
    y.square().sum().backward()
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    yr = torch.nn.functional.conv2d(xr, wr, padding=1)
    yr.square().sum().backward()
    torch.testing.assert_close(y.cpu(), yr.float().detach(), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(wc.grad.cpu(), wr.grad.float(), rtol=1e-3, atol=1e-2)
    _digest("conv2d out", y)
    _digest("conv2d wgrad", wc.grad)
    _digest("conv2d xgrad", xc.grad)


@check("scaled_dot_product_attention, cuDNN backend, bf16 forward/backward vs math")
def _():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = _inputs(10, (2, 4, 128, 64), (2, 4, 128, 64), (2, 4, 128, 64))
    q, k, v = (t.cuda().bfloat16().requires_grad_() for t in (q, k, v))
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    o.float().square().sum().backward()
    ref = torch.nn.functional.scaled_dot_product_attention(q.detach().float().cpu(), k.detach().float().cpu(),
                                                           v.detach().float().cpu(), is_causal=True)
    torch.testing.assert_close(o.float().cpu(), ref, rtol=3e-2, atol=3e-2)
    _digest("sdpa cudnn out", o.float())
    _digest("sdpa cudnn dq", q.grad.float())


# cuFFT and cuSOLVER (issue 12 part 2; docs/libraries.md). torch.randn on
# the GPU does not use cuRAND: PyTorch's own Philox kernels (ATen
# CUDAGeneratorImpl), so only its seed determinism is checked here.
@check("torch.fft.fft/ifft complex64 vs CPU (cuFFT cufftXtMakePlanMany/cufftXtExec)")
def _():
    x = torch.complex(*_inputs(6, (4, 256), (4, 256)))
    f = torch.fft.fft(x.cuda())
    torch.testing.assert_close(f.cpu(), torch.fft.fft(x.to(torch.complex128)).to(torch.complex64),
                               rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(torch.fft.ifft(f).cpu(), x, rtol=1e-4, atol=1e-5)
    _digest("fft c64", torch.view_as_real(f))


@check("torch.fft.rfft float64 vs CPU (cuFFT D2Z)")
def _():
    x, = _inputs(7, (3, 500), dtype=torch.float64)
    f = torch.fft.rfft(x.cuda())
    torch.testing.assert_close(f.cpu(), torch.fft.rfft(x), rtol=1e-10, atol=1e-9)
    _digest("rfft f64", torch.view_as_real(f))


@check("torch.randn(device='cuda'): same seed, same numbers (PyTorch's Philox, not cuRAND)")
def _():
    torch.manual_seed(123)
    a = torch.randn(100000, device="cuda")
    torch.manual_seed(123)
    b = torch.randn(100000, device="cuda")
    assert torch.equal(a, b)
    assert abs(a.mean().item()) < 0.02 and abs(a.std().item() - 1.0) < 0.02
    _digest("randn", a)


@check("torch.linalg.cholesky float64 vs CPU (cuSOLVER cusolverDnXpotrf)")
def _():
    m, = _inputs(8, (64, 64), dtype=torch.float64)
    spd = m @ m.T + 64 * torch.eye(64, dtype=torch.float64)
    lc = torch.linalg.cholesky(spd.cuda())
    torch.testing.assert_close(lc.cpu(), torch.linalg.cholesky(spd), rtol=1e-9, atol=1e-9)
    _digest("cholesky f64", lc)


@check("torch.linalg.solve float64 vs CPU (cuSOLVER getrf/getrs)")
def _():
    a, b = _inputs(9, (64, 64), (64, 3), dtype=torch.float64)
    a = a + 64 * torch.eye(64, dtype=torch.float64)
    x = torch.linalg.solve(a.cuda(), b.cuda())
    torch.testing.assert_close(x.cpu(), torch.linalg.solve(a, b), rtol=1e-9, atol=1e-9)
    _digest("solve f64", x)


results["result digests"] = digests
print(json.dumps(results, indent=1))
