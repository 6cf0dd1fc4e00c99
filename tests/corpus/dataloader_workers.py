"""Regression on a map-style ``Dataset`` subclass served by a multi-process ``DataLoader``.

CUDA idioms exercised: ``torch.device("cuda" if torch.cuda.is_available() else "cpu")``,
``DataLoader(..., num_workers=2, pin_memory=True, persistent_workers=False)`` with the default
multiprocessing context (fork on Linux) or, with ``--spawn``, ``multiprocessing_context="spawn"``
(the Dataset and the collate function defined here must pickle into spawn workers, which
re-import this file as ``__mp_main__``), a ``worker_init_fn``, ``.to(device, non_blocking=True)``
on pinned batches, and the ``if __name__ == "__main__":`` guard.
"""

import argparse
import math

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset, get_worker_info


class SyntheticRegression(Dataset):
    """y = sin(w . x) + noise; every sample is generated from its index, so the values do not
    depend on which worker produces them."""

    def __init__(self, n, n_features, seed):
        self.n, self.n_features, self.seed = n, n_features, seed
        self.w = torch.randn(n_features, generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return self.n

    def __getitem__(self, idx):
        g = torch.Generator().manual_seed(self.seed * 100003 + idx)
        x = torch.randn(self.n_features, generator=g)
        y = torch.sin(x @ self.w / math.sqrt(self.n_features)) + 0.05 * torch.randn(1, generator=g)
        return x, y


def collate(batch):
    xs, ys = zip(*batch)
    return torch.stack(xs), torch.cat(ys)


def worker_init_fn(worker_id):
    info = get_worker_info()
    assert info is not None and info.id == worker_id
    torch.set_num_threads(1)


def main():
    parser = argparse.ArgumentParser(description="DataLoader with worker processes")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--spawn", action="store_true", help="use the spawn start method")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print("device", device)

    train_set = SyntheticRegression(512, 16, seed=1)
    loader = DataLoader(
        train_set,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=True,
        persistent_workers=False,
        collate_fn=collate,
        worker_init_fn=worker_init_fn,
        multiprocessing_context="spawn" if args.spawn else None,
    )

    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    criterion = nn.MSELoss()

    for epoch in range(1, args.epochs + 1):
        model.train()
        for step, (x, y) in enumerate(loader):
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            optimizer.zero_grad()
            loss = criterion(model(x).squeeze(1), y)
            loss.backward()
            optimizer.step()
            print(f"loss {epoch} {step} {loss.item().hex()}")


if __name__ == "__main__":
    main()
