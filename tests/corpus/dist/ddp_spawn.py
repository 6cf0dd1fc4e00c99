"""DistributedDataParallel launched with ``torch.multiprocessing.spawn``, one process per GPU.

    python ddp_spawn.py --nprocs 2

CUDA idioms exercised: ``mp.spawn(worker, nprocs=world_size)`` with the world size defaulting
to ``torch.cuda.device_count()``, ``MASTER_ADDR``/``MASTER_PORT`` set by the launcher,
``torch.cuda.set_device(rank)`` *before* ``dist.init_process_group("nccl", rank=, world_size=)``,
``model.cuda(rank)``, ``DDP(model, device_ids=[rank], find_unused_parameters=True)`` (an
auxiliary head runs on even steps only), BatchNorm buffers broadcast from rank 0,
``DistributedSampler``, a ``torch.cuda.amp``-free loop with ``loss.item()``, a checkpoint of
``ddp.module.state_dict()`` written by rank 0 (``--save``), and ``dist.destroy_process_group()``.

Rank 0 prints ``loss <epoch> <step> <hex>`` (its own loss); each rank prints
``params <rank> <sha1>`` at the end.
"""

import argparse
import hashlib
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def say(line):
    # one write per line: the ranks share stdout, and print() may write text and newline apart
    sys.stdout.write(line + "\n")
    sys.stdout.flush()

class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)  # buffers: DDP broadcasts them from rank 0 every step
        self.fc = nn.Linear(4 * 8 * 8, 5)
        self.aux = nn.Linear(5, 5)  # used on some steps only: find_unused_parameters=True
        self.never = nn.Linear(5, 5)  # used on no step: its grad stays None

    def forward(self, x, use_aux=False):
        out = self.fc(torch.flatten(F.relu(self.bn(self.conv(x))), 1))
        return out + self.aux(out) if use_aux else out


def worker(rank, world_size, port, epochs, save):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world_size)

    g = torch.Generator().manual_seed(7)
    images = torch.randn(128, 1, 8, 8, generator=g)
    labels = torch.randint(0, 5, (128,), generator=g)
    dataset = TensorDataset(images, labels)
    sampler = DistributedSampler(dataset, shuffle=True, seed=3)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)

    torch.manual_seed(0)
    model = ConvNet()
    model = model.cuda(rank) if use_cuda else model
    ddp = DDP(model, device_ids=[rank] if use_cuda else None, find_unused_parameters=True)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=1e-2)

    for epoch in range(1, epochs + 1):
        sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(loader):
            if use_cuda:
                x, y = x.cuda(rank), y.cuda(rank)
            optimizer.zero_grad()
            loss = F.cross_entropy(ddp(x, use_aux=step % 2 == 0), y)
            loss.backward()
            optimizer.step()
            if rank == 0:
                say(f"loss {epoch} {step} {loss.item().hex()}")

    if save and rank == 0:
        torch.save(ddp.module.state_dict(), save)
    flat = torch.cat([p.detach().cpu().reshape(-1) for p in ddp.module.parameters()])
    say(f"params {rank} {hashlib.sha1(flat.numpy().tobytes()).hexdigest()}")
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nprocs", type=int, default=None,
                        help="processes (default: one per GPU)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--save", default=None, help="checkpoint path (written by rank 0)")
    args = parser.parse_args()
    world_size = args.nprocs or max(torch.cuda.device_count(), 1)
    say(f"world_size {world_size}")
    mp.spawn(worker, args=(world_size, free_port(), args.epochs, args.save), nprocs=world_size, join=True)


if __name__ == "__main__":
    main()
