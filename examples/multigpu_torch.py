"""Multi-GPU PyTorch probes, to compare native and proxied runs line by line
(issue 22). Every value is printed exactly (float.hex or integers).

``--mode peer`` (one process, two GPUs):
  * ``torch.cuda.can_device_access_peer`` both ways;
  * ``x.to('cuda:1')`` of a tensor made on cuda:0, arithmetic on cuda:1 and
    back (``.to('cuda:0')``, ``copy_(non_blocking=True)`` on a stream);
  * a model split over the two GPUs (first layer on cuda:0, second on
    cuda:1), trained a few SGD steps from CPU-initialised weights.

``--mode ddp`` (under ``torchrun --nproc_per_node=N``): one
DistributedDataParallel step per iteration on a small MLP over NCCL; rank 0
prints the loss and a checksum of the parameters after each step, every
rank checks an all_reduce and an all_gather of known values.

``--mode ddp --pace-s S --gate FILE --gate-step K``: the same, sleeping S
seconds after each step, and every rank waits at step K until FILE exists
(a checkpoint of the whole job is taken meanwhile; the losses must not
change).

``--mode fsdp`` (torchrun): FSDP2 (``fully_shard`` per layer and on the
model) over NCCL, Adam; rank 0 prints the loss and a checksum of the full
parameters after each step. ``--pace-s``/``--gate``/``--gate-step`` as for ddp.

``--hold-gib G`` (ddp, fsdp): every rank also keeps G GiB on its GPU, filled
once with a pattern of its rank and read back at the end (rank 0 prints two
sums over all ranks): a job of a real job's size for the checkpoint figures,
whose memory must come back exactly.

``--mode bench`` (torchrun): rank 0 prints one line ``BENCH {json}``:
all_reduce bus bandwidth for 1 MiB .. 1 GiB float32 buffers (nccl-tests'
busbw = algbw * 2 (n-1) / n) and the median step time of a GPT-style model
(token embedding, 4 transformer blocks, LM head) trained with DDP.
``--bench-parts ddp`` leaves the all_reduce sweep out (a profiled run).

NVLink multicast stays off (NCCL_NVLS_ENABLE=0 is set here before NCCL
starts, as on the shared GPU machines).
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402


def _hex(t) -> str:
    return float(t).hex()


def peer(steps: int):
    assert torch.cuda.device_count() >= 2, "needs two GPUs"
    print("can_access", int(torch.cuda.can_device_access_peer(0, 1)), int(torch.cuda.can_device_access_peer(1, 0)))
    x = torch.arange(1 << 20, dtype=torch.float32, device="cuda:0") * 0.5
    y = x.to("cuda:1")
    print("to cuda:1", y.device, _hex(y.sum()), _hex(y[12345]))
    z = (y * 3 + 1).to("cuda:0")
    print("back to cuda:0", z.device, _hex(z.sum()))
    s = torch.cuda.Stream(device="cuda:1")
    w = torch.empty_like(y)
    with torch.cuda.stream(s):
        w.copy_(z, non_blocking=True)       # cuda:0 -> cuda:1 on a stream of cuda:1
    s.synchronize()
    print("copy_ on a stream", _hex(w.sum()), bool(torch.equal(w.cpu(), z.cpu())))

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    l1 = torch.nn.Linear(64, 128)
    l2 = torch.nn.Linear(128, 10)
    l1.to("cuda:0")
    l2.to("cuda:1")
    opt = torch.optim.SGD(list(l1.parameters()) + list(l2.parameters()), lr=0.05)
    torch.use_deterministic_algorithms(True)
    for step in range(1, steps + 1):
        xb = torch.randn(256, 64, generator=g)
        yb = torch.randint(0, 10, (256,), generator=g)
        h = torch.relu(l1(xb.to("cuda:0")))
        out = l2(h.to("cuda:1"))
        loss = torch.nn.functional.cross_entropy(out, yb.to("cuda:1"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        print("step", step, "loss", _hex(loss.item()))
    print("peer done")


def _wait_gate(gate: str | None, step: int, gate_step: int):
    import time
    if gate and step == gate_step:
        t = time.monotonic()
        while not os.path.exists(gate) and time.monotonic() - t < 300:
            time.sleep(0.05)


def _hold(gib: float, rank: int):
    """gib GiB on this rank's GPU: rows of 1 Mi int32, row r holding
    0..2^20-1 plus r * (rank + 7) (so each position and each rank differ)."""
    if not gib:
        return None
    rows = int(gib * 256)          # 4 MiB a row
    h = torch.empty(rows, 1 << 20, dtype=torch.int32, device="cuda")
    h.copy_(torch.arange(1 << 20, dtype=torch.int32, device="cuda").unsqueeze(0).expand(rows, -1))
    h.add_(torch.arange(rows, dtype=torch.int32, device="cuda").unsqueeze(1) * (rank + 7))
    return h


def _hold_check(dist, h, rank: int, world: int):
    """Two sums of every rank's held memory (the plain sum and one weighted
    by column, so a moved row or column shows), summed over the ranks; the
    uninterrupted native run prints the same line."""
    if h is None:
        return
    w = torch.arange(0, 1 << 20, 4099, dtype=torch.int64, device="cuda")
    s = torch.stack([h.sum(dtype=torch.int64), (h[:, ::4099].to(torch.int64) * w).sum()])
    dist.all_reduce(s)
    if rank == 0:
        print("hold", h.numel() * 4 * world, "bytes", "sums", int(s[0]), int(s[1]), flush=True)


def ddp(steps: int, pace_s: float = 0.0, gate: str | None = None, gate_step: int = 0, hold_gib: float = 0.0):
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist, rank, world, local = _dist()
    # collectives with values known in advance (computed here independently)
    t = torch.full((1000,), float(rank + 1), device="cuda")
    dist.all_reduce(t)
    want = world * (world + 1) / 2
    assert torch.all(t == want).item(), f"rank {rank}: all_reduce gave {t[0].item()}, expected {want}"
    parts = [torch.empty(4, device="cuda") for _ in range(world)]
    dist.all_gather(parts, torch.arange(4, device="cuda", dtype=torch.float32) + 10 * rank)
    for r, p in enumerate(parts):
        assert torch.equal(p.cpu(), torch.arange(4, dtype=torch.float32) + 10 * r), f"rank {rank}: all_gather {r}"
    held = _hold(hold_gib, rank)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).cuda()
    model = DDP(model, device_ids=[local])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.use_deterministic_algorithms(True)
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(1, steps + 1):
        lt = _step(dist, model, opt, g)
        csum = sum(p.detach().double().sum().item() for p in model.parameters())
        if rank == 0:
            print("step", step, "loss", _hex(lt.item() / world), "params", csum.hex(), flush=True)
        if pace_s:
            import time
            time.sleep(pace_s)
        _wait_gate(gate, step, gate_step)
    _hold_check(dist, held, rank, world)
    _done(dist, rank, world, "ddp")


def _dist():
    import torch.distributed as dist
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    return dist, rank, world, local


def _step(dist, model, opt, g):
    """One training step (MSE) on a batch of 64 drawn from g; the loss
    summed over the ranks (all_reduce)."""
    xb = torch.randn(64, 32, generator=g).cuda()
    yb = torch.randn(64, 4, generator=g).cuda()
    loss = torch.nn.functional.mse_loss(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    lt = loss.detach().clone()
    dist.all_reduce(lt)
    return lt


def _done(dist, rank: int, world: int, mode: str):
    dist.barrier()
    if rank == 0:
        print(mode, "done", world)
    dist.destroy_process_group()


def fsdp(steps: int, pace_s: float = 0.0, gate: str | None = None, gate_step: int = 0, hold_gib: float = 0.0):
    from torch.distributed.fsdp import fully_shard
    dist, rank, world, local = _dist()
    held = _hold(hold_gib, rank)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, 4)).cuda()
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    torch.use_deterministic_algorithms(True)
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(1, steps + 1):
        lt = _step(dist, model, opt, g)
        # every rank takes part in gathering the full parameters
        csum = sum(p.full_tensor().double().sum().item() for p in model.parameters())
        if rank == 0:
            print("step", step, "loss", _hex(lt.item() / world), "params", csum.hex(), flush=True)
        if pace_s:
            import time
            time.sleep(pace_s)
        _wait_gate(gate, step, gate_step)
    _hold_check(dist, held, rank, world)
    _done(dist, rank, world, "fsdp")


def bench(steps: int, parts: str = "allreduce,ddp"):
    import json
    import statistics
    import time
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist, rank, world, local = _dist()
    out = {"world": world, "device": torch.cuda.get_device_name(local), "all_reduce": []}
    for size in (1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30) if "allreduce" in parts else ():
        t = torch.ones(size // 4, dtype=torch.float32, device="cuda")
        iters = 20
        for _ in range(3):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        # the GPU's own time of the loop (events on the current stream, which
        # waits for each all_reduce) beside the host's: a gap between the two
        # is time spent outside the collectives (launch, wake-up)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        e0.record()
        for _ in range(iters):
            dist.all_reduce(t)
        e1.record()
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / iters
        gdt = e0.elapsed_time(e1) / 1e3 / iters
        algbw = size / dt / 1e9
        out["all_reduce"].append({"bytes": size, "us": round(dt * 1e6, 1), "algbw_GBps": round(algbw, 2),
                                  "busbw_GBps": round(algbw * 2 * (world - 1) / world, 2),
                                  "gpu_us": round(gdt * 1e6, 1),
                                  "gpu_busbw_GBps": round(size / gdt / 1e9 * 2 * (world - 1) / world, 2)})
        del t
    torch.manual_seed(0)
    vocab, d, seq, batch = 8192, 512, 256, 8

    class GPT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, d)
            self.pos = torch.nn.Parameter(torch.zeros(seq, d))
            layer = torch.nn.TransformerEncoderLayer(d, 8, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
            self.blocks = torch.nn.TransformerEncoder(layer, 4)
            self.head = torch.nn.Linear(d, vocab)
            self.mask = torch.nn.Transformer.generate_square_subsequent_mask(seq)

        def forward(self, x):
            h = self.emb(x) + self.pos
            return self.head(self.blocks(h, mask=self.mask.to(x.device), is_causal=True))

    model = DDP(GPT().cuda(), device_ids=[local])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(7 + rank)
    times = []
    for step in range(3 + max(steps, 10)):
        xb = torch.randint(0, vocab, (batch, seq), generator=g).cuda()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        logits = model(xb)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, vocab), xb.roll(-1, 1).view(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        if step >= 3:
            times.append(time.perf_counter() - t0)
    out["ddp_gpt_step_ms"] = round(statistics.median(times) * 1000, 3)
    out["ddp_gpt_steps_ms"] = [round(x * 1000, 3) for x in times]
    out["ddp_gpt_params"] = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print("BENCH", json.dumps(out), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("peer", "ddp", "fsdp", "bench"), required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--pace-s", type=float, default=0.0)
    ap.add_argument("--gate", default=None)
    ap.add_argument("--gate-step", type=int, default=0)
    ap.add_argument("--hold-gib", type=float, default=0.0)
    ap.add_argument("--bench-parts", default="allreduce,ddp")
    a = ap.parse_args()
    if a.mode in ("ddp", "fsdp"):
        (ddp if a.mode == "ddp" else fsdp)(a.steps, a.pace_s, a.gate, a.gate_step, a.hold_gib)
    elif a.mode == "bench":
        bench(a.steps, a.bench_parts)
    else:
        peer(a.steps)


if __name__ == "__main__":
    main()
