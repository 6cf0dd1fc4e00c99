"""A CUDA training script that hits one of torch-directml 0.2.5's silent wrong results: a
per-sample weighted loss (``cross_entropy(reduction="none")`` backward, #739): it trains, the
loss just does not go down as it should. Used by docs/correctness.md.

Prints ``loss <epoch> <step> <hex>`` like the other corpus scripts.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(256, 20, device=device)
    y = torch.randint(0, 5, (256,), device=device)
    weight = torch.rand(256, device=device)  # per-sample weights
    for step in range(8):
        idx = torch.arange(step * 32, (step + 1) * 32, device=device)
        logits = model(x[idx])
        per_sample = F.cross_entropy(logits, y[idx], reduction="none")
        loss = (per_sample * weight[idx]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"loss 1 {step} {loss.item().hex()}")


if __name__ == "__main__":
    main()
