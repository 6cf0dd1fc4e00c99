"""MLP classifier on synthetic Gaussian blobs, trained with SGD + momentum.

CUDA idioms exercised: ``use_cuda = torch.cuda.is_available()`` with ``.cuda()`` calls guarded
by it (model and every batch), ``torch.cuda.manual_seed_all`` next to ``torch.manual_seed``,
``torch.cuda.get_device_name(0)`` printed to stderr, ``.cpu()`` before ``.item()``-free metrics.
"""

import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def make_blobs(n_samples, n_features, n_classes, seed):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(n_classes, n_features, generator=g)
    labels = torch.randint(0, n_classes, (n_samples,), generator=g)
    x = centers[labels] + 2.0 * torch.randn(n_samples, n_features, generator=g)
    return x, labels


class MLP(nn.Module):
    def __init__(self, in_features, hidden, n_classes):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, n_classes)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def main():
    parser = argparse.ArgumentParser(description="MLP on synthetic blobs")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-cuda", action="store_true", default=False)
    args = parser.parse_args()

    use_cuda = not args.no_cuda and torch.cuda.is_available()
    torch.manual_seed(args.seed)
    if use_cuda:
        torch.cuda.manual_seed_all(args.seed)
        print("GPU:", torch.cuda.get_device_name(0), file=sys.stderr)
    print("device", "cuda" if use_cuda else "cpu")

    x, y = make_blobs(1024, 20, 5, seed=1)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True)

    model = MLP(20, 64, 5)
    if use_cuda:
        model.cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    for epoch in range(1, args.epochs + 1):
        model.train()
        correct = 0
        for step, (data, target) in enumerate(loader):
            if use_cuda:
                data, target = data.cuda(), target.cuda()
            optimizer.zero_grad()
            output = model(data)
            loss = F.cross_entropy(output, target)
            loss.backward()
            optimizer.step()
            correct += (output.argmax(dim=1) == target).sum().cpu().item()
            print(f"loss {epoch} {step} {loss.item().hex()}")
        print(f"epoch {epoch} train_acc {correct / len(loader.dataset):.4f}")


if __name__ == "__main__":
    main()
