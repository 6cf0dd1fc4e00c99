"""DistributedDataParallel written for NCCL, each rank started by hand (no launcher):

    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 RANK=0 python ddp_env.py
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 RANK=1 python ddp_env.py

CUDA idioms exercised: ``dist.init_process_group("nccl", init_method="env://")`` (gloo only
where CUDA is missing, as many scripts do), ``torch.cuda.set_device(rank)``,
``DDP(model, device_ids=[rank])``, a ``DistributedSampler``, ``dist.all_reduce`` of the loss.

Rank 0 prints ``backend <dist.get_backend()> device <device>`` and ``loss 1 <step> <hex>`` (the loss averaged over ranks); every rank prints
``params <rank> <sha1 of its parameters>`` at the end: DDP keeps them identical.
"""

import hashlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def say(line):
    # one write per line: the ranks share stdout
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main():
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(rank)
    if rank == 0:
        say(f"backend {dist.get_backend()} device {device}")

    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 10, generator=g)
    y = x[:, :2].sum(1, keepdim=True) - x[:, 2:3]
    sampler = DistributedSampler(TensorDataset(x, y), num_replicas=world, rank=rank, shuffle=False)
    loader = DataLoader(TensorDataset(x, y), batch_size=16, sampler=sampler)

    torch.manual_seed(7 + rank)  # different initial weights: DDP broadcasts rank 0's
    model = nn.Sequential(nn.Linear(10, 24), nn.Tanh(), nn.Linear(24, 1)).to(device)
    ddp = DDP(model, device_ids=[rank] if use_cuda else None)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=0.01)
    for step, (xb, yb) in enumerate(loader):
        xb, yb = xb.to(device), yb.to(device)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(ddp(xb), yb)
        loss.backward()
        optimizer.step()
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        if rank == 0:
            say(f"loss 1 {step} {(logged / world).item().hex()}")
    flat = torch.cat([p.detach().cpu().reshape(-1) for p in ddp.module.parameters()])
    say(f"params {rank} {hashlib.sha1(flat.numpy().tobytes()).hexdigest()}")
    dist.barrier()
    dist.destroy_process_group()
    # as tests/corpus/dist/ddp_torchrun.py: gloo can hang in interpreter teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
