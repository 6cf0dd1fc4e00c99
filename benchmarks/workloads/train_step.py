"""A CUDA-style training loop for timing: prints `steps_per_s <value>`.

Written as scripts are written for NVIDIA GPUs (`device = "cuda" if available`, `.to(device)`,
`torch.cuda.synchronize()`), so the same file runs natively (CPU or CUDA) and through
`python -m dmlshim`. Only the timed loop counts, not start-up.
"""

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["mlp", "cnn", "resnet50"], default="mlp")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if a.model == "mlp":
        model, x = models.mlp(), torch.randn(a.batch, 64)
        y = torch.randint(0, 10, (a.batch,))
    elif a.model == "cnn":
        model, x = models.SmallCNN(), torch.randn(a.batch, 3, 32, 32)
        y = torch.randint(0, 10, (a.batch,))
    else:
        model, x = models.ResNet50(), torch.randn(a.batch, 3, 224, 224)
        y = torch.randint(0, 1000, (a.batch,))
    model = model.to(device)
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(a.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(f"device {device}")
    print(f"steps_per_s {a.steps / dt:.3f}")


if __name__ == "__main__":
    main()
