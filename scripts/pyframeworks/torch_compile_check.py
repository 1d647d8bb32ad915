"""torch.compile checks, run natively and under gpuproxy by
scripts/gpu_check.py (--python, frameworks step; issue 12 part 7).

torch.compile's default backend (Inductor) generates Triton kernels at run
time: Triton compiles them to cubins, loads them with cuModuleLoadData and
launches them through a small C launcher it builds against libcuda, so under
the proxy every one of those calls must reach gpuproxy's shim. The
"reduce-overhead" mode also records CUDA graphs by stream capture and
replays them (torch's cudagraph trees).

Each check trains a small model for a few SGD steps compiled and eagerly
on the same GPU from the same seed and compares the losses (the reference
is PyTorch's eager mode, not gpuproxy), and records a digest of the final
weights so that the native and the proxied run can be compared bit for
bit. Prints one JSON object {check: "ok" | "FAIL: ..."} plus "result
digests".
"""
import hashlib
import json

from checks import check, results  # noqa: E402  (scripts/pyframeworks/checks.py)

digests = {}


import torch  # noqa: E402


def _digest(name, t):
    digests[name] = hashlib.sha256(t.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.LayerNorm(256),
                               torch.nn.Linear(256, 10)).cuda()


def _train(model, step_fn, steps, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    # one fixed batch: the loss must fall on it (fresh random batches of
    # random labels need not fall in a few steps)
    x = torch.randn(128, 64, device="cuda", generator=g)
    y = torch.randint(0, 10, (128,), device="cuda", generator=g)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = step_fn(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _compare(mode, steps):
    ref = _model(7)
    ref_losses = _train(ref, lambda x, y: torch.nn.functional.cross_entropy(ref(x), y), steps, 11)
    m = _model(7)
    cm = torch.compile(m, mode=mode)
    losses = _train(m, lambda x, y: torch.nn.functional.cross_entropy(cm(x), y), steps, 11)
    for i, (a, b) in enumerate(zip(ref_losses, losses)):
        if abs(a - b) > 1e-3 * max(1.0, abs(a)):
            raise AssertionError(f"step {i}: compiled loss {b!r} vs eager {a!r}")
    if not losses[-1] < losses[0]:
        raise AssertionError(f"loss did not fall: {losses}")
    _digest(f"{mode} weights", torch.cat([p.detach().flatten() for p in m.parameters()]))
    digests[f"{mode} losses"] = hashlib.sha256(json.dumps([float.hex(v) for v in losses]).encode()).hexdigest()[:16]


@check("cuda available")
def _():
    assert torch.cuda.is_available()


@check("torch.compile default (Inductor/Triton kernels) matches eager, 8 SGD steps")
def _():
    _compare("default", 8)


@check("torch.compile pointwise function (one fused Triton kernel) matches eager")
def _():
    @torch.compile
    def f(a, b):
        return torch.sin(a) * torch.exp(-b * b) + a.clamp(min=0)
    g = torch.Generator(device="cuda").manual_seed(3)
    a = torch.randn(1 << 20, device="cuda", generator=g)
    b = torch.randn(1 << 20, device="cuda", generator=g)
    out = f(a, b)
    torch.testing.assert_close(out, torch.sin(a) * torch.exp(-b * b) + a.clamp(min=0), rtol=1e-5, atol=1e-5)
    _digest("pointwise", out)


@check("torch.compile mode=reduce-overhead (CUDA graphs) matches eager, 12 SGD steps")
def _():
    _compare("reduce-overhead", 12)


print(json.dumps(dict(results, **{"result digests": digests})))
