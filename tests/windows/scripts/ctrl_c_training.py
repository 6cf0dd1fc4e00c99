"""A training loop the user stops with Ctrl-C at step 3 (``--import-dmlshim``: the script's
first line would be ``import dmlshim``).

Ctrl-C is raised in the process as the console's Ctrl-C reaches python (C's SIGINT, python's
handler: ``KeyboardInterrupt`` in the main thread); nothing catches it, so python ends as it
does on Ctrl-C. Stdout: ``loss 1 <step> <hex>`` per finished step.
"""

import sys

if "--import-dmlshim" in sys.argv:
    import dmlshim  # noqa: F401

import signal

import torch
import torch.nn as nn


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = nn.Linear(6, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for step in range(100):
        x = torch.randn(16, 6, generator=g).to(device)
        loss = (model(x) - x[:, :1]).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"loss 1 {step} {loss.item().hex()}", flush=True)
        if step == 3:
            signal.raise_signal(signal.SIGINT)


if __name__ == "__main__":
    main()
