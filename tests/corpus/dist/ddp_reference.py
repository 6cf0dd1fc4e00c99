"""One process, the same global batches: what the 2-rank DDP scripts must match.

    python ddp_reference.py torchrun --save ref.pt   # ddp_torchrun.py's model, data, optimizer
    python ddp_reference.py spawn --save ref.pt      # ddp_spawn.py's

Each step runs every rank's batch (as DistributedSampler gives it to that rank) through the
model in turn and backpropagates ``loss / world``: the gradients DDP averages. BatchNorm
running statistics follow rank 0's batches only (DDP broadcasts rank 0's buffers before each
forward), so the buffers rank 1's batch updates are put back. Prints ``loss`` lines in the
format of the script it stands for and saves the model's state dict.
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

WORLD = 2


def loaders(dataset, batch_size, seed):
    samplers = [DistributedSampler(dataset, num_replicas=WORLD, rank=r, shuffle=True, seed=seed)
                for r in range(WORLD)]
    return samplers, [DataLoader(dataset, batch_size=batch_size, sampler=s) for s in samplers]


def torchrun_reference(epochs, accum):
    import ddp_torchrun as script

    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 12, generator=g)
    y = (x[:, :3].sum(1) > 0).long() + (x[:, 3] > 1).long()
    samplers, rank_loaders = loaders(TensorDataset(x, y), 16, seed=0)
    torch.manual_seed(1234)  # rank 0's initial weights
    model = script.Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    criterion = torch.nn.CrossEntropyLoss()
    for epoch in range(1, epochs + 1):
        for s in samplers:
            s.set_epoch(epoch)
        for step, batches in enumerate(zip(*rank_loaders)):
            optimizer.zero_grad()
            logged = torch.zeros(())
            for xb, yb in batches:
                local = torch.zeros(())
                for xm, ym in zip(xb.chunk(accum), yb.chunk(accum)):
                    loss = criterion(model(xm), ym) / accum
                    (loss / WORLD).backward()
                    local += loss.detach()
                logged += local
            optimizer.step()
            print(f"loss {epoch} {step} {(logged / WORLD).item().hex()}")
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def spawn_reference(epochs):
    import ddp_spawn as script

    g = torch.Generator().manual_seed(7)
    images = torch.randn(128, 1, 8, 8, generator=g)
    labels = torch.randint(0, 5, (128,), generator=g)
    samplers, rank_loaders = loaders(TensorDataset(images, labels), 16, seed=3)
    torch.manual_seed(0)
    model = script.ConvNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(1, epochs + 1):
        for s in samplers:
            s.set_epoch(epoch)
        for step, batches in enumerate(zip(*rank_loaders)):
            optimizer.zero_grad()
            for rank, (xb, yb) in enumerate(batches):
                kept = [b.clone() for b in model.buffers()] if rank > 0 else None
                loss = F.cross_entropy(model(xb, use_aux=step % 2 == 0), yb)
                (loss / WORLD).backward()
                if kept is not None:
                    with torch.no_grad():
                        for b, k in zip(model.buffers(), kept):
                            b.copy_(k)
                if rank == 0:
                    print(f"loss {epoch} {step} {loss.item().hex()}")
            optimizer.step()
    return model.state_dict()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("script", choices=["torchrun", "spawn"])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--save", required=True)
    args = parser.parse_args()
    if args.script == "torchrun":
        state = torchrun_reference(args.epochs, args.accum)
    else:
        state = spawn_reference(args.epochs)
    torch.save(state, args.save)


if __name__ == "__main__":
    main()
