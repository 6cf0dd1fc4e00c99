"""timm training the way its ``train.py`` does it, written for a CUDA machine: a
``timm.data.create_loader`` loader with the prefetcher on (normalisation on the device inside
``torch.cuda.stream(stream=s)``), ``timm.create_model`` (a ResNet or a ViT, tiny, from scratch),
``--amp``: ``torch.autocast("cuda", dtype=torch.float16)`` with timm's ``NativeScaler``, then
validation under ``torch.inference_mode()`` with ``timm.utils.accuracy`` and ``AverageMeter``.
``--no-prefetcher``: the loader yields CPU batches that the loop moves with ``.to(device)``, as
timm's ``train.py --no-prefetcher`` does. ``--device cpu`` is the same run told to use the CPU.

Stdout: ``device <device>``, ``loss 1 <step> <float.hex()>`` per step, ``eval <loss hex>
<top1>``; what timm's ``train.py`` logs, as ``logged <key> <step> <float.hex()>``: the running
mean of its ``AverageMeter`` each step (``train_loss_avg``; its log line's ``Loss: now (avg)``)
and the row ``timm.utils.update_summary`` wrote to its ``summary.csv`` (``train_loss``,
``eval_loss``, ``eval_top1``, ``lr``; step 0, the epoch); the trained parameters as ``param``
lines (fwreport.py).
"""

import argparse
import contextlib
import tempfile
from collections import OrderedDict
from functools import partial
from pathlib import Path

import fwreport
import numpy as np
import timm
import torch
import torch.nn as nn
from PIL import Image
from timm.data import create_loader
from timm.utils import AverageMeter, NativeScaler, accuracy, update_summary


class SyntheticImages(torch.utils.data.Dataset):
    """PIL images with labels; ``create_loader`` sets ``transform``."""

    def __init__(self, n, size, n_classes, seed):
        rng = np.random.default_rng(seed)
        self.images = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
        self.targets = rng.integers(0, n_classes, n).tolist()
        self.transform = None

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        img = Image.fromarray(self.images[i])
        return (self.transform(img) if self.transform else img), self.targets[i]


def make_model(name, n_classes, size):
    if name == "vit":
        return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=n_classes,
                                 img_size=size, patch_size=8, embed_dim=32, depth=2,
                                 num_heads=2)
    return timm.create_model("resnet10t", pretrained=False, num_classes=n_classes)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["resnet", "vit"], default="resnet")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--no-prefetcher", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device(args.device)
    size, n_classes, batch = 32, 4, 8
    model = make_model(args.model, n_classes, size).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss().to(device)
    amp_autocast = (partial(torch.autocast, device_type=device.type, dtype=torch.float16)
                    if args.amp else contextlib.nullcontext)
    loss_scaler = NativeScaler(device=device.type) if args.amp else None

    common = dict(input_size=(3, size, size), batch_size=batch,
                  use_prefetcher=not args.no_prefetcher, num_workers=0, persistent_workers=False, device=device,
                  interpolation="bilinear", crop_pct=1.0)
    train_loader = create_loader(SyntheticImages(args.steps * batch, size, n_classes, 1),
                                 is_training=True, no_aug=True, **common)
    val_loader = create_loader(SyntheticImages(16, size, n_classes, 2), is_training=False,
                               **common)
    print("device", device)

    model.train()
    train_losses_m = AverageMeter()
    for step, (inputs, target) in enumerate(train_loader):
        if args.no_prefetcher:
            inputs, target = inputs.to(device), target.to(device)
        with amp_autocast():
            loss = loss_fn(model(inputs), target)
        optimizer.zero_grad()
        if loss_scaler is not None:
            loss_scaler(loss, optimizer, clip_grad=5.0, parameters=model.parameters())
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
        torch.cuda.synchronize() if device.type == "cuda" else None
        print(f"loss 1 {step} {loss.float().item().hex()}")
        train_losses_m.update(loss.item(), inputs.size(0))
        fwreport.log("train_loss_avg", step, train_losses_m.avg)

    model.eval()
    losses_m, top1_m = AverageMeter(), AverageMeter()
    with torch.inference_mode():
        for inputs, target in val_loader:
            if args.no_prefetcher:
                inputs, target = inputs.to(device), target.to(device)
            with amp_autocast():
                output = model(inputs)
                loss = loss_fn(output, target)
            acc1, = accuracy(output, target, topk=(1,))
            losses_m.update(loss.item(), inputs.size(0))
            top1_m.update(acc1.item(), inputs.size(0))
    print(f"eval {float(losses_m.avg).hex()} {top1_m.avg:.2f}")
    # the epoch's summary row, as train.py writes it and a user reads it back
    with tempfile.TemporaryDirectory() as out:
        summary = Path(out) / "summary.csv"
        update_summary(0, OrderedDict([("loss", train_losses_m.avg)]),
                       OrderedDict([("loss", losses_m.avg), ("top1", top1_m.avg)]),
                       str(summary), lr=optimizer.param_groups[0]["lr"], write_header=True)
        fwreport.log_csv(summary, step_column="epoch")
    fwreport.params(model)


if __name__ == "__main__":
    main()
