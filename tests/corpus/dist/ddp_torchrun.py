"""DistributedDataParallel training written for NCCL, launched by torchrun.

    torchrun --nproc_per_node=2 ddp_torchrun.py

CUDA idioms exercised: ``dist.init_process_group(backend="nccl")`` (gloo only where CUDA is
missing, as many scripts do), ``LOCAL_RANK`` from the environment,
``torch.cuda.set_device(local_rank)``, ``torch.device("cuda", local_rank)``,
``DDP(model, device_ids=[local_rank], output_device=local_rank)``, ``DistributedSampler`` with
``set_epoch``, ``x.cuda(local_rank, non_blocking=True)``, ``dist.all_reduce`` of the loss for
logging, ``dist.broadcast`` and ``dist.all_gather`` of device tensors, ``dist.barrier()``,
``dist.get_backend()`` and ``dist.is_nccl_available()``.

Rank 0 prints ``loss <epoch> <step> <hex>`` (the loss averaged over ranks); every rank prints
``params <rank> <sha1 of its parameters>`` at the end: DDP keeps them identical.
"""

import argparse
import hashlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def say(line):
    # one write per line: the ranks share stdout, and print() may write text and newline apart
    sys.stdout.write(line + "\n")
    sys.stdout.flush()

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x):
        return self.body(x)


def param_digest(module):
    flat = torch.cat([p.detach().cpu().reshape(-1) for p in module.parameters()])
    return hashlib.sha1(flat.numpy().tobytes()).hexdigest()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    local_rank = int(os.environ["LOCAL_RANK"])
    rank, world = dist.get_rank(), dist.get_world_size()
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if rank == 0:
        say(f"backend {dist.get_backend()} nccl_available {dist.is_nccl_available()}")
        say(f"device {device}")

    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 12, generator=g)
    y = (x[:, :3].sum(1) > 0).long() + (x[:, 3] > 1).long()
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(1234 + rank)  # different initial weights: DDP broadcasts rank 0's
    model = Net().to(device)
    ddp = DDP(model, device_ids=[local_rank] if use_cuda else None,
              output_device=local_rank if use_cuda else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        for step, (xb, yb) in enumerate(loader):
            xb = xb.cuda(local_rank, non_blocking=True) if use_cuda else xb
            yb = yb.to(device)
            optimizer.zero_grad()
            loss = criterion(ddp(xb), yb)
            loss.backward()
            optimizer.step()
            logged = loss.detach().clone()
            dist.all_reduce(logged, op=dist.ReduceOp.SUM)
            if rank == 0:
                say(f"loss {epoch} {step} {(logged / world).item().hex()}")

    token = torch.full((2,), float(rank + 1), device=device)
    dist.broadcast(token, src=1)
    gathered = [torch.zeros(2, device=device) for _ in range(world)]
    dist.all_gather(gathered, torch.full((2,), float(rank), device=device))
    dist.barrier()
    say(f"collectives {rank} broadcast={token.tolist()} "
        f"all_gather={[t[0].item() for t in gathered]} on={gathered[0].device}")
    say(f"params {rank} {param_digest(ddp.module)}")
    dist.destroy_process_group()
    # torch's gloo DDP can hang in interpreter teardown (the main thread joins gloo's threads
    # while a gloo worker waits for the GIL to free a tensor; seen natively, without dmlshim,
    # on torch 2.4.1 and 2.13): everything is printed, so leave without the teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
