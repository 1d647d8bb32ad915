"""The training app of bench/real_workloads.py: a Llama built from a
transformers config (no download), trained with AdamW under bf16 autocast
on token sequences made on the CPU from a fixed seed.

    python bench/real_app.py --size small|big --steps-file F --loss-file L --control C [--max-steps N]

It runs until the control file C holds "stop N" and step N is done (or
--max-steps). After every step it appends "STEP END_NS" to F (END_NS:
time.monotonic_ns(), CLOCK_MONOTONIC, the clock of the shim's stall figure;
taken after loss.item(), so the step's GPU work is done) and "STEP LOSS_HEX"
to L (float.hex: exact, to compare runs). The batch of step s depends only
on s, so any two runs to the same step print the same curve on the same GPU
and software (torch.use_deterministic_algorithms, eager attention).

Sizes (parameters; GPU memory with AdamW, fp32 master weights):
  small: hidden 256, 4 layers, vocab 8000, batch 4 x 128: 7.3 M params,
         about 0.2 GiB;
  big:   hidden 1536, 24 layers, vocab 32000, batch 4 x 256: 0.78 B params,
         about 15 GiB (weights, grads, two moments: 16 B a parameter).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

SIZES = {
    "small": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=4, vocab_size=8000, batch=4, seq=128),
    "big": dict(hidden_size=1536, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=12,
                num_key_value_heads=12, vocab_size=32000, batch=4, seq=256),
}
SEED = 2311


def build(size: str):
    from transformers import LlamaConfig, LlamaForCausalLM
    s = dict(SIZES[size])
    batch, seq = s.pop("batch"), s.pop("seq")
    # eager attention: a deterministic backward (no flash/efficient kernels)
    cfg = LlamaConfig(max_position_embeddings=seq, tie_word_embeddings=False, attn_implementation="eager", **s)
    try:
        cfg._attn_implementation = "eager"
    except Exception:
        pass
    torch.manual_seed(SEED)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    model.train()
    return model, cfg, batch, seq


def batch_of(step: int, batch: int, seq: int, vocab: int):
    g = torch.Generator().manual_seed(SEED * 100003 + step)
    toks = torch.randint(0, vocab, (batch, seq), generator=g)
    return toks.to("cuda", non_blocking=False)


def control_stop(path: str) -> int | None:
    try:
        with open(path) as f:
            w = f.read().split()
    except OSError:
        return None
    if len(w) == 2 and w[0] == "stop":
        return int(w[1])
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", choices=sorted(SIZES), required=True)
    ap.add_argument("--steps-file", required=True)
    ap.add_argument("--loss-file", required=True)
    ap.add_argument("--control", required=True)
    ap.add_argument("--max-steps", type=int, default=100000)
    a = ap.parse_args()
    # warn_only: an op without a deterministic kernel warns; the curves compared show any effect
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    model, cfg, batch, seq = build(a.size)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01, foreach=True)
    nparams = sum(p.numel() for p in model.parameters())
    steps = open(a.steps_file, "a", buffering=1)
    losses = open(a.loss_file, "a", buffering=1)
    print(f"ready params={nparams} mem={torch.cuda.memory_allocated()}", flush=True)
    step = 0
    while step < a.max_steps:
        stop = control_stop(a.control)
        if stop is not None and step >= stop:
            break
        step += 1
        x = batch_of(step, batch, seq, cfg.vocab_size)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=x, labels=x)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = out.loss.item()
        t = time.monotonic_ns()
        steps.write(f"{step} {t}\n")
        losses.write(f"{step} {float(loss).hex()}\n")
        if step == 1:
            print(f"first step done mem={torch.cuda.memory_allocated()} "
                  f"peak={torch.cuda.max_memory_allocated()}", flush=True)
    print(f"done steps={step}", flush=True)
    steps.close()
    losses.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
