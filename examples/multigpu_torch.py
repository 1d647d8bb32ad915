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


def ddp(steps: int):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    # collectives with values known in advance (computed here independently)
    t = torch.full((1000,), float(rank + 1), device="cuda")
    dist.all_reduce(t)
    want = world * (world + 1) / 2
    assert torch.all(t == want).item(), f"rank {rank}: all_reduce gave {t[0].item()}, expected {want}"
    parts = [torch.empty(4, device="cuda") for _ in range(world)]
    dist.all_gather(parts, torch.arange(4, device="cuda", dtype=torch.float32) + 10 * rank)
    for r, p in enumerate(parts):
        assert torch.equal(p.cpu(), torch.arange(4, dtype=torch.float32) + 10 * r), f"rank {rank}: all_gather {r}"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).cuda()
    model = DDP(model, device_ids=[local])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.use_deterministic_algorithms(True)
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(1, steps + 1):
        xb = torch.randn(64, 32, generator=g).cuda()
        yb = torch.randn(64, 4, generator=g).cuda()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        lt = loss.detach().clone()
        dist.all_reduce(lt)
        csum = sum(p.detach().double().sum().item() for p in model.parameters())
        if rank == 0:
            print("step", step, "loss", _hex(lt.item() / world), "params", csum.hex(), flush=True)
    dist.barrier()
    if rank == 0:
        print("ddp done", world)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("peer", "ddp"), required=True)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    (peer if a.mode == "peer" else ddp)(a.steps)


if __name__ == "__main__":
    main()
