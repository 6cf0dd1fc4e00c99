"""A CUDA training script as people write it for NVIDIA GPUs — run it unchanged with
``python -m dmlshim examples/train_cnn.py``.

It uses the usual CUDA idioms: ``.cuda()``, ``torch.device("cuda")``, ``pin_memory``,
``non_blocking``, cuDNN flags, CUDA events for timing, CUDA memory queries, a checkpoint saved
and re-loaded with ``map_location="cuda:0"``. The data is synthetic (a 10-class image problem
generated from a seed), so it needs no download.
"""

import argparse
import os
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.drop = nn.Dropout(0.25)
        self.fc = nn.Linear(32 * 8 * 8, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(self.drop(torch.flatten(x, 1)))


def make_data(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    # each class has its own mean colour pattern, plus noise: learnable, not trivial
    means = torch.randn(10, 3, 1, 1, generator=torch.Generator().manual_seed(0))
    images = means[labels] + 0.8 * torch.randn(n, 3, 32, 32, generator=g)
    return TensorDataset(images, labels)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    assert torch.cuda.is_available(), "this script needs a CUDA GPU"
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    torch.backends.cudnn.benchmark = True
    print(f"GPU: {torch.cuda.get_device_name(0)}")

    train = DataLoader(make_data(1024, 1), batch_size=args.batch_size, shuffle=True,
                       pin_memory=True, num_workers=2)
    val = DataLoader(make_data(512, 2), batch_size=256, pin_memory=True)

    model = Net().cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    for epoch in range(args.epochs):
        model.train()
        start.record()
        t0 = time.time()
        total = 0.0
        for images, labels in train:
            images = images.cuda(non_blocking=True)
            labels = labels.cuda(non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            total += loss.item()
        end.record()
        torch.cuda.synchronize()
        scheduler.step()

        model.eval()
        correct = 0
        with torch.no_grad():
            for images, labels in val:
                images, labels = images.to("cuda:0"), labels.to("cuda:0")
                correct += (model(images).argmax(1) == labels).sum().item()
        print(f"epoch {epoch}: train loss {total / len(train):.4f}  "
              f"val acc {correct / len(val.dataset):.3f}  "
              f"{start.elapsed_time(end) / 1000:.1f} s (wall {time.time() - t0:.1f} s)  "
              f"peak mem {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")

    path = os.path.join(tempfile.mkdtemp(), "checkpoint.pt")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
    state = torch.load(path, map_location="cuda:0")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    print(f"checkpoint saved and reloaded: {path}")


if __name__ == "__main__":
    main()
