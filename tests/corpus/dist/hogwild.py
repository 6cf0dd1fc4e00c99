"""Hogwild training with ``torch.multiprocessing`` (after pytorch/examples mnist_hogwild).

    python hogwild.py --num-processes 2

CUDA idioms exercised: ``mp.set_start_method("spawn")`` (CUDA needs spawn), a model moved to
``torch.device("cuda")`` and then ``model.share_memory()``, the model and the device passed to
``mp.Process(target=train, args=(rank, model, device, ...))``, workers that build their own
optimizer over the shared parameters and move batches with ``.to(device)``, and a test pass in
the parent after ``join()``, which sees what the workers learned because the parameters are
shared.

Each worker prints ``worker <rank> <device of its parameters> <its last loss hex>``; the parent
prints ``eval before <hex>`` and ``eval after <hex>`` (full-batch MSE of the shared model).
"""

import argparse
import sys

import torch
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 1)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def dataset(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(512, 8, generator=g)
    y = torch.sin(x.sum(1, keepdim=True))
    return x, y


def train(rank, model, device, steps, lr):
    torch.manual_seed(100 + rank)
    x, y = dataset(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loss = None
    for _ in range(steps):
        idx = torch.randint(0, x.shape[0], (32,))
        xb, yb = x[idx].to(device), y[idx].to(device)
        optimizer.zero_grad()
        loss = F.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
    say(f"worker {rank} {next(model.parameters()).device} {loss.item().hex()}")


def evaluate(model, device):
    x, y = dataset(0)
    with torch.no_grad():
        return F.mse_loss(model(x.to(device)), y.to(device)).item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    mp.set_start_method("spawn", force=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = Net().to(device)
    model.share_memory()  # gradients are allocated lazily, so they are not shared here
    say(f"eval before {evaluate(model, device).hex()}")

    processes = []
    for rank in range(args.num_processes):
        p = mp.Process(target=train, args=(rank, model, device, args.steps, args.lr))
        p.start()
        processes.append(p)
    for p in processes:
        p.join()
    failed = [p.exitcode for p in processes if p.exitcode != 0]
    if failed:
        raise SystemExit(f"workers failed: exit codes {failed}")
    say(f"eval after {evaluate(model, device).hex()}")
    say(f"device {next(model.parameters()).device}")


if __name__ == "__main__":
    main()
