"""Small CNN on synthetic 16x16 "digit" images: Conv2d, BatchNorm2d, Dropout, MaxPool2d, Adam,
StepLR, ``model.train()``/``model.eval()`` with a validation pass each epoch, best-checkpoint save
and reload.

CUDA idioms exercised: ``torch.device("cuda:0" if torch.cuda.is_available() else "cpu")``,
``torch.backends.cudnn.benchmark = True``, ``model.to(device)``,
``.to(device, non_blocking=True)`` on batches, ``torch.load(..., map_location=device)``.
"""

import argparse
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def make_images(n, n_classes, seed):
    """Each class is a fixed random 16x16 template; samples are noisy, shifted copies."""
    templates = (torch.rand(n_classes, 1, 16, 16, generator=torch.Generator().manual_seed(1234))
                 > 0.6).float()
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, n_classes, (n,), generator=g)
    images = templates[labels] + 0.5 * torch.randn(n, 1, 16, 16, generator=g)
    shifts = torch.randint(-1, 2, (n,), generator=g)
    for i in range(n):
        images[i] = torch.roll(images[i], shifts=int(shifts[i]), dims=2)
    return images, labels


class Net(nn.Module):
    def __init__(self, n_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.pool = nn.MaxPool2d(2)
        self.dropout = nn.Dropout(0.25)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, n_classes)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.pool(F.relu(self.bn2(self.conv2(x))))
        x = torch.flatten(x, 1)
        x = self.dropout(F.relu(self.fc1(x)))
        return self.fc2(x)


def train(model, device, loader, optimizer, epoch):
    model.train()
    for step, (images, labels) in enumerate(loader):
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        print(f"loss {epoch} {step} {loss.item().hex()}")


def validate(model, device, loader):
    model.eval()
    total_loss, correct = 0.0, 0
    with torch.no_grad():
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            output = model(images)
            total_loss += F.cross_entropy(output, labels, reduction="sum").item()
            correct += output.argmax(dim=1).eq(labels).sum().item()
    n = len(loader.dataset)
    return total_loss / n, correct / n


def main():
    parser = argparse.ArgumentParser(description="CNN on synthetic images")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    print("device", device)

    train_x, train_y = make_images(512, 10, seed=1)
    val_x, val_y = make_images(128, 10, seed=2)
    train_loader = DataLoader(TensorDataset(train_x, train_y), batch_size=args.batch_size,
                              shuffle=True)
    val_loader = DataLoader(TensorDataset(val_x, val_y), batch_size=64)

    model = Net().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)

    with tempfile.TemporaryDirectory() as ckpt_dir:
        ckpt_path = os.path.join(ckpt_dir, "best.pt")
        best_loss = float("inf")
        for epoch in range(1, args.epochs + 1):
            train(model, device, train_loader, optimizer, epoch)
            val_loss, val_acc = validate(model, device, val_loader)
            scheduler.step()
            print(f"loss {epoch} val {val_loss.hex()}")
            print(f"epoch {epoch} val_acc {val_acc:.4f} lr {scheduler.get_last_lr()[0]:.6f}")
            if val_loss < best_loss:
                best_loss = val_loss
                torch.save({"epoch": epoch, "model": model.state_dict(),
                            "optimizer": optimizer.state_dict()}, ckpt_path)

        # Reload the best checkpoint the way inference scripts do and re-evaluate it.
        checkpoint = torch.load(ckpt_path, map_location=device)
        model.load_state_dict(checkpoint["model"])
        best_val_loss, _ = validate(model, device, val_loader)
        print(f"loss best {checkpoint['epoch']} {best_val_loss.hex()}")


if __name__ == "__main__":
    main()
