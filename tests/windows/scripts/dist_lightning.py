"""Lightning's DDP strategy: ``Trainer(strategy="ddp", devices=2)``, one process per device
(Lightning starts the second by running this script again).

``--accelerator`` is passed to the Trainer as it is (default ``auto``).

Stdout: rank 0 prints ``world <world size>`` and ``loss 1 <step> <hex>`` per step (its own
loss); every rank prints ``params <rank> <sha1 of its trained parameters>``.
"""

import argparse
import hashlib
import os
import sys

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F


def say(line):
    # one write per line: the ranks share stdout
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.Tanh(), nn.Linear(32, 1))
        self.step_losses = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x).squeeze(1), y)
        self.step_losses.append(loss.detach().float().item())
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()

    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.steps * 16, 16, generator=g)
    y = (x @ torch.randn(16, 1, generator=g)).squeeze(1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    model = Regressor()
    trainer = L.Trainer(
        accelerator=args.accelerator, strategy="ddp", devices=2, max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, default_root_dir=os.getcwd(),
    )
    trainer.fit(model, loader)
    rank = trainer.global_rank
    if rank == 0:
        say(f"world {trainer.world_size}")
        for step, value in enumerate(model.step_losses):
            say(f"loss 1 {step} {value.hex()}")
    flat = torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()])
    say(f"params {rank} {hashlib.sha1(flat.numpy().tobytes()).hexdigest()}")
    # as tests/corpus/dist/ddp_torchrun.py: gloo can hang in interpreter teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
