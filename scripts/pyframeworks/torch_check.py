"""PyTorch library checks, run natively and under gpuproxy by
scripts/gpu_check.py (--python, frameworks step): matrix products that go
through cuBLAS and cuBLASLt (docs/libraries.md), compared with the CPU, and
a digest of each result's bytes so that the native and the proxied run can
be compared bit for bit (the same GPU, the same library, the same inputs
must give the same bits). Prints one JSON object {check: "ok" | "FAIL: ..."}
plus "result digests".
"""
import hashlib
import json
import sys
import traceback

results = {}
digests = {}


def check(name):
    def deco(fn):
        try:
            fn()
            results[name] = "ok"
        except Exception as e:  # record and go on: one line per check
            results[name] = "FAIL: " + (f"{type(e).__name__}: {e}".splitlines() or ["?"])[0][:300]
            traceback.print_exc(file=sys.stderr)
        return fn
    return deco


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


results["result digests"] = digests
print(json.dumps(results, indent=1))
