"""Deterministic PyTorch training, to compare loss curves bit for bit.

Two models, both trained with AdamW on synthetic data made from a fixed seed
on the CPU (no download):

* ``--model mlp``: a three-layer MLP classifying Gaussian clusters (fp32);
* ``--model pointwise``: a model without matrix products (a per-feature
  sine expansion fitted to a target, fp32): torch's own kernels only
  (elementwise, reductions, indexing, the fused AdamW), no cuBLAS or cuDNN,
  so it also runs where those libraries are not available (under gpuproxy
  until their remoting lands);
* ``--model gpt``: a small GPT-style decoder (token and position embeddings,
  pre-norm blocks with causal self-attention through
  ``F.scaled_dot_product_attention`` and a GELU MLP, tied output head) on
  token sequences drawn from a fixed sparse Markov chain, under bf16
  autocast.

Determinism: ``torch.use_deterministic_algorithms(True)``, with
``CUBLAS_WORKSPACE_CONFIG=:4096:8`` set before torch is imported (cuBLAS
needs a fixed workspace configuration for reproducible results; PyTorch's
"Reproducibility" notes). Weights are initialised on the CPU and copied to
the GPU, batches are drawn with a CPU generator. Runs on the same GPU and
software print identical curves; gpuproxy must not change them, natively
versus proxied, nor across a checkpoint.

Output, one line per step::

    step 1 loss 0x1.26b1a60000000p+1

(the loss as ``float.hex``: exact). Other lines start with another word.

    python examples/train_torch.py --model gpt --steps 50
    env LD_PRELOAD=$(proxy-cli preload) python examples/train_torch.py --model gpt --steps 50

``--wait-at-step K``: after step K, print ``waiting`` and wait for a line on
stdin (a test dumps the GPU state there: ``proxy-cli --dump --gpu-only``,
restarts proxyd, ``--restore --gpu-only``, then sends the line).

``--bench``: instead of the curve, time training steps and print one
``bench`` line per configuration with the median step time: ``gpu-bound``
(a GPT of tens of milliseconds per step on an H100), ``launch-bound`` (a
tiny MLP whose step is dominated by kernel launches and the loss read-back)
and ``launch-bound-pointwise`` (as small, without matrix products: no
cuBLAS).

Every run first prints ``timing import_s=... first_kernel_s=...``: seconds
from the start of ``import torch`` to its end, and to the completion of the
first kernel (a ``torch.ones`` on the GPU; this includes CUDA's lazy
initialisation and, under gpuproxy, the session set-up and module load).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

# Before torch (and so cuBLAS) is loaded: a fixed cuBLAS workspace layout,
# required by torch.use_deterministic_algorithms(True) for deterministic GEMMs.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

_t_import = time.perf_counter()
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
_t_imported = time.perf_counter()

SEED = 1234


# ----------------------------------------------------------------------- data

def cluster_data(n: int, dim: int, classes: int, seed: int):
    """n points of `classes` Gaussian clusters in `dim` dimensions (CPU)."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=g) * 0.4
    labels = torch.randint(0, classes, (n,), generator=g)
    x = centres[labels] + torch.randn(n, dim, generator=g)     # overlapping: the loss keeps falling slowly
    return x, labels


def markov_tokens(n_seq: int, seq_len: int, vocab: int, seed: int):
    """n_seq sequences of seq_len + 1 tokens from a sparse Markov chain: each
    token has four possible successors with fixed probabilities (CPU)."""
    g = torch.Generator().manual_seed(seed)
    succ = torch.randint(0, vocab, (vocab, 4), generator=g)
    probs = torch.tensor([0.55, 0.25, 0.15, 0.05])
    toks = torch.empty(n_seq, seq_len + 1, dtype=torch.long)
    toks[:, 0] = torch.randint(0, vocab, (n_seq,), generator=g)
    for t in range(seq_len):
        choice = torch.multinomial(probs, n_seq, replacement=True, generator=g)
        toks[:, t + 1] = succ[toks[:, t], choice]
    return toks


# --------------------------------------------------------------------- models

class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, classes: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)


class Pointwise(nn.Module):
    """y ~ sum_k a_k * sin(w_k * x + p_k) + b, per feature: no matmul."""

    def __init__(self, dim: int, terms: int):
        super().__init__()
        self.w = nn.Parameter(torch.randn(terms, dim))
        self.p = nn.Parameter(torch.randn(terms, dim))
        self.a = nn.Parameter(torch.randn(terms, dim) * 0.1)
        self.b = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return (self.a * torch.sin(self.w * x.unsqueeze(1) + self.p)).sum(dim=1) + self.b


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, seq_len: int, d: int, layers: int, heads: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        for emb in (self.tok, self.pos):      # GPT-2's scale: the tied head starts with small logits
            nn.init.normal_(emb.weight, std=0.02)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.ln(x) @ self.tok.weight.t()


# ------------------------------------------------------------------ training

CONFIGS = {
    # the curves (--model)
    "mlp": dict(kind="mlp", dim=64, hidden=512, classes=10, n=8192, batch=256),
    "pointwise": dict(kind="pointwise", dim=256, terms=16, n=8192, batch=512),
    "gpt": dict(kind="gpt", vocab=512, seq=128, d=256, layers=4, heads=4, n=1024, batch=16),
    # --bench
    "gpu-bound": dict(kind="gpt", vocab=4096, seq=512, d=768, layers=8, heads=12, n=256, batch=16),
    "launch-bound": dict(kind="mlp", dim=32, hidden=64, classes=10, n=4096, batch=32),
    # torch's own kernels only (no cuBLAS): a number where cuBLAS is not available
    "launch-bound-pointwise": dict(kind="pointwise", dim=32, terms=4, n=4096, batch=32),
}


class Trainer:
    def __init__(self, cfg: dict, dev: torch.device):
        self.cfg = cfg
        self.dev = dev
        torch.manual_seed(SEED)          # weights: initialised on the CPU
        if cfg["kind"] == "mlp":
            x, y = cluster_data(cfg["n"], cfg["dim"], cfg["classes"], SEED + 1)
            self.model = MLP(cfg["dim"], cfg["hidden"], cfg["classes"])
            self.data = (x.to(dev), y.to(dev))
        elif cfg["kind"] == "pointwise":
            g = torch.Generator().manual_seed(SEED + 1)
            x = torch.rand(cfg["n"], cfg["dim"], generator=g) * 6 - 3
            y = torch.sin(1.7 * x) * 0.8 + torch.cos(0.6 * x + 0.3) * 0.5 + 0.05 * torch.randn(x.shape, generator=g)
            self.model = Pointwise(cfg["dim"], cfg["terms"])
            self.data = (x.to(dev), y.to(dev))
        else:
            toks = markov_tokens(cfg["n"], cfg["seq"], cfg["vocab"], SEED + 1)
            self.model = GPT(cfg["vocab"], cfg["seq"], cfg["d"], cfg["layers"], cfg["heads"])
            self.data = (toks.to(dev),)
        self.model.to(dev)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3 if cfg["kind"] == "gpt" else 3e-3,
                                     weight_decay=0.01)
        self.gen = torch.Generator().manual_seed(SEED + 2)   # batch indices, on the CPU

    def step(self) -> float:
        cfg = self.cfg
        idx = torch.randint(0, cfg["n"], (cfg["batch"],), generator=self.gen).to(self.dev)
        self.opt.zero_grad(set_to_none=True)
        if cfg["kind"] == "mlp":
            x, y = self.data[0][idx], self.data[1][idx]
            loss = F.cross_entropy(self.model(x), y)
        elif cfg["kind"] == "pointwise":
            x, y = self.data[0][idx], self.data[1][idx]
            loss = F.mse_loss(self.model(x), y)
        else:
            seq = self.data[0][idx]
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                logits = self.model(seq[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, cfg["vocab"]), seq[:, 1:].reshape(-1))
        loss.backward()
        self.opt.step()
        return loss.item()


def bench(dev, name: str, steps: int, warmup: int) -> float:
    tr = Trainer(CONFIGS[name], dev)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        tr.step()                 # ends with loss.item(): the step has finished on the GPU
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("mlp", "pointwise", "gpt"), default="mlp")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--wait-at-step", type=int, default=0, metavar="K",
                    help="after step K print 'waiting' and wait for a line on stdin")
    ap.add_argument("--bench", action="store_true", help="print median step times of the two bench configs")
    ap.add_argument("--bench-steps", type=int, default=50)
    ap.add_argument("--bench-configs", default="launch-bound-pointwise,gpu-bound,launch-bound",
                    help="comma-separated bench configs (default: all three)")
    args = ap.parse_args()

    if not torch.cuda.is_available():
        print("error: torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    dev = torch.device("cuda", 0)
    t = time.perf_counter()
    torch.ones(1, device=dev).sum().item()        # the first kernel, completed
    t_first = time.perf_counter()
    print(f"timing import_s={_t_imported - _t_import:.6f} first_kernel_s={t_first - _t_import:.6f} "
          f"init_s={t_first - t:.6f}", flush=True)

    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False

    if args.bench:
        failed = 0
        for name in args.bench_configs.split(","):
            try:
                med = bench(dev, name, args.bench_steps, warmup=10)
            except RuntimeError as e:      # e.g. a library that cannot run here: the others still do
                print(f"bench {name} error {str(e).splitlines()[0]}", flush=True)
                failed += 1
                continue
            print(f"bench {name} median_ms {med * 1e3:.3f}", flush=True)
        return 1 if failed else 0

    tr = Trainer(CONFIGS[args.model], dev)
    for s in range(1, args.steps + 1):
        loss = tr.step()
        print(f"step {s} loss {float(loss).hex()}", flush=True)
        if s == args.wait_at_step:
            print("waiting", flush=True)
            sys.stdin.readline()
    return 0


if __name__ == "__main__":
    sys.exit(main())
