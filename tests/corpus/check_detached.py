"""A training script with a planted bug: one branch is detached by mistake, so its parameters
never get a gradient (and a frozen embedding and an unused layer that must not be reported).

Prints ``loss <epoch> <step> <hex>`` like the other corpus scripts, then ``param <name>`` for
each parameter the optimizer steps and ``unchanged <name>`` for those the run left as they were.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class TwoBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(16, 32)
        self.branch = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32))
        self.head = nn.Linear(32, 4)
        self.frozen = nn.Linear(16, 16)
        self.frozen.requires_grad_(False)  # frozen on purpose: not reported
        self.unused = nn.Linear(8, 8)  # in no optimizer: not reported

    def forward(self, x):
        h = F.relu(self.trunk(self.frozen(x)))
        b = self.branch(h).detach()  # the bug: this should not be detached
        return self.head(h + b)


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = TwoBranch().to(device)
    params = [p for n, p in model.named_parameters() if not n.startswith("unused.")]
    optimizer = torch.optim.Adam(params, lr=1e-2)
    initial = {n: p.detach().cpu().clone() for n, p in model.named_parameters(prefix="model")}
    x = torch.randn(64, 16, device=device)
    y = torch.randint(0, 4, (64,), device=device)
    for step in range(4):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"loss 1 {step} {loss.item().hex()}")
    held = {id(p) for p in params if p.requires_grad}
    for name, p in model.named_parameters(prefix="model"):
        if id(p) in held:
            print("param", name)
            if torch.equal(p.detach().cpu(), initial[name]):
                print("unchanged", name)


if __name__ == "__main__":
    main()
