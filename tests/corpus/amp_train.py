"""Mixed-precision CUDA training loop, written the way the PyTorch AMP recipe teaches it.

CUDA idioms exercised: ``torch.backends.cudnn.benchmark = True``; ``torch.compile(model)``;
``torch.optim.AdamW(..., fused=True)``; ``torch.autocast(device_type="cuda", dtype=torch.float16)``
around the training forward pass and ``torch.cuda.amp.autocast()`` around evaluation;
``torch.amp.GradScaler("cuda")`` with ``scale(loss).backward()``, ``unscale_`` before gradient
clipping, ``step``, ``update``, ``get_scale``; a checkpoint with the scaler's ``state_dict`` that
a fresh ``torch.cuda.amp.GradScaler()`` loads (``--resume-check``); ``torch.cuda.Event`` timing
(guarded by ``torch.cuda.is_available()``, so the script also runs on a CPU-only machine).

Stdout: ``device <dev>``, ``loss <epoch> <step> <float.hex()>`` per step, ``eval <epoch> <acc>``
per epoch, ``resumed <ok|FAIL>`` with ``--resume-check``. Timing goes to stderr.
"""

import argparse
import io
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self, in_features=32, hidden=128, n_classes=4):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, n_classes)

    def forward(self, x):
        x = F.gelu(self.norm(self.fc1(x)))
        x = F.gelu(self.fc2(x)) + x
        return self.head(x)


def make_data(n, centers, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, centers.size(0), (n,), generator=g)
    x = centers[y] + 1.5 * torch.randn(n, centers.size(1), generator=g)
    return x, y


def main():
    parser = argparse.ArgumentParser(description="CUDA AMP training")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--resume-check", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(0)
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda" if use_cuda else "cpu")
    print("device", device)
    torch.backends.cudnn.benchmark = True

    centers = 0.5 * torch.randn(4, 32, generator=torch.Generator().manual_seed(1))
    x_all, y_all = make_data(args.steps * args.batch_size, centers, seed=2)
    x_val, y_val = make_data(256, centers, seed=3)
    x_val, y_val = x_val.to(device), y_val.to(device)

    model = Net().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, fused=True)
    scaler = torch.amp.GradScaler("cuda")
    train_model = model if args.no_compile else torch.compile(model)

    for epoch in range(1, args.epochs + 1):
        if use_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            t0 = time.perf_counter()
        model.train()
        for step in range(args.steps):
            sl = slice(step * args.batch_size, (step + 1) * args.batch_size)
            x = x_all[sl].to(device, non_blocking=True)
            y = y_all[sl].to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type="cuda", dtype=torch.float16):
                logits = train_model(x)
                loss = F.cross_entropy(logits, y)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=5.0)
            scaler.step(optimizer)
            scaler.update()
            print(f"loss {epoch} {step} {loss.float().item().hex()}")
        if use_cuda:
            end.record()
            torch.cuda.synchronize()
            print(f"epoch {epoch}: {start.elapsed_time(end):.1f} ms, scale {scaler.get_scale()}",
                  file=sys.stderr)
        else:
            print(f"epoch {epoch}: {(time.perf_counter() - t0) * 1e3:.1f} ms", file=sys.stderr)

        model.eval()
        with torch.no_grad(), torch.cuda.amp.autocast():
            acc = (model(x_val).argmax(dim=1) == y_val).float().mean().item()
        print(f"eval {epoch} {acc:.4f}")

    if args.resume_check:
        buf = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict(), "epoch": args.epochs}, buf)
        buf.seek(0)
        ckpt = torch.load(buf, map_location=device)
        model2 = Net().to(device)
        model2.load_state_dict(ckpt["model"])
        optimizer2 = torch.optim.AdamW(model2.parameters(), lr=args.lr, fused=True)
        optimizer2.load_state_dict(ckpt["optimizer"])
        scaler2 = torch.cuda.amp.GradScaler()
        scaler2.load_state_dict(ckpt["scaler"])
        same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                     model2.state_dict().values()))
        same = same and scaler2.state_dict() == scaler.state_dict()
        print(f"resumed {'ok' if same else 'FAIL'}")


if __name__ == "__main__":
    main()
