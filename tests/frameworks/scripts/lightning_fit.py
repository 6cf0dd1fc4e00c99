"""A LightningModule trained by ``Trainer(accelerator="gpu", devices=N, precision=P)``, written
for a CUDA machine (``--accelerator cpu`` is the same run told to use the CPU).

Stdout (rank 0): ``device <module device>``, ``tensors_on <device type of the batch>``, ``world <world size>``, ``loss 1 <step>
<float.hex()>`` per step (rank 0's loss), ``params <float.hex()>`` (sum of the trained weights);
what Lightning logged (``self.log("train_loss", on_step=True, on_epoch=True)``, as its logger
received it every step: ``train_loss_step`` and the epoch's mean ``train_loss_epoch``; with
``--sync-dist``, ``sync_dist=True``: averaged over the processes, as Lightning recommends for
epoch-level values under DDP) as ``logged <key> <step> <float.hex()>``, and the trained
parameters as ``param`` lines (fwreport.py).
"""

import argparse
import os

import fwreport
import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only


class Records(Logger):
    """A logger that keeps what Lightning hands its loggers (after its own reductions and
    cross-process sync): ``(step, {key: value})`` per call."""

    def __init__(self):
        super().__init__()
        self.rows = []

    @property
    def name(self):
        return "records"

    @property
    def version(self):
        return 0

    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs):
        pass

    @rank_zero_only
    def log_metrics(self, metrics, step=None):
        self.rows.append((step, dict(metrics)))


class Regressor(L.LightningModule):
    def __init__(self, sync_dist=False):
        super().__init__()
        self.sync_dist = sync_dist
        self.net = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 1))
        self.step_losses = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x).squeeze(1).float(), y)
        self.step_losses.append(loss.detach().float().item())
        # the step's value and the epoch's mean (Lightning accumulates it on the device)
        self.log("train_loss", loss, on_step=True, on_epoch=True, sync_dist=self.sync_dist)
        if batch_idx == 0:
            # Lightning moves the module back to the CPU after fit(): report it from inside
            self.seen_device = f"{self.device} {x.device.type}"
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--accelerator", default="gpu")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--sync-dist", action="store_true")
    args = parser.parse_args()

    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.steps * 16, 16, generator=g)
    y = (x @ torch.randn(16, 1, generator=g)).squeeze(1)
    # the global batch is 16 for any number of devices
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                         batch_size=16 // args.devices)
    model = Regressor(sync_dist=args.sync_dist)
    records = Records()
    trainer = L.Trainer(
        accelerator=args.accelerator, devices=args.devices, precision=args.precision,
        max_epochs=1, logger=records, log_every_n_steps=1, enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0,
        strategy="ddp" if args.devices > 1 else "auto",
        default_root_dir=os.getcwd(),
    )
    trainer.fit(model, loader)
    if trainer.global_rank == 0:
        print("device", model.seen_device.split()[0])
        print("tensors_on", model.seen_device.split()[1])
        print("world", trainer.world_size)
        for step, value in enumerate(model.step_losses):
            print(f"loss 1 {step} {value.hex()}")
        total = sum(p.detach().float().sum() for p in model.parameters())
        print(f"params {total.item().hex()}")
        for step, metrics in records.rows:
            for key, value in metrics.items():
                if key != "epoch":
                    fwreport.log(key, step, value)
        fwreport.params(model)


if __name__ == "__main__":
    main()
