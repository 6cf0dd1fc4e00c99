"""A LightningModule trained by ``Trainer(accelerator="gpu")``, written for a CUDA machine
(``--accelerator cpu``: the same run on the CPU). Lightning's automatic optimisation calls
``optimizer.step(closure)``: the backward runs inside ``step()``, so ``.grad`` is still None
when the step begins. ``--detach`` plants a bug: the second branch is detached by mistake, so
its parameters never get a gradient.

Stdout: ``loss 1 <step> <float.hex()>`` per step, then ``param <name>`` for each parameter
that requires grad (AdamW steps them all) and ``unchanged <name>`` for those the run left as
they were.
"""

import argparse
import os

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F


class TwoBranch(L.LightningModule):
    def __init__(self, detach):
        super().__init__()
        self.detach = detach
        self.trunk = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU())
        self.branch = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32))
        self.head = nn.Linear(32, 1)
        self.step_losses = []

    def forward(self, x):
        h = self.trunk(x)
        b = self.branch(h)
        return self.head(h + (b.detach() if self.detach else b))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x).squeeze(1), y)
        self.step_losses.append(loss.detach().float().item())
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)  # weight decay 0.01


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--accelerator", default="gpu")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--detach", action="store_true")
    args = parser.parse_args()
    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.steps * 16, 16, generator=g)
    y = (x @ torch.randn(16, 1, generator=g)).squeeze(1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    model = TwoBranch(args.detach)
    initial = {n: p.detach().clone() for n, p in model.named_parameters(prefix="model")}
    trainer = L.Trainer(accelerator=args.accelerator, devices=1, max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0,
                        default_root_dir=os.getcwd())
    trainer.fit(model, loader)
    for step, value in enumerate(model.step_losses):
        print(f"loss 1 {step} {value.hex()}")
    for name, p in model.named_parameters(prefix="model"):
        if p.requires_grad:
            print("param", name)
            if torch.equal(p.detach().cpu(), initial[name]):
                print("unchanged", name)


if __name__ == "__main__":
    main()
