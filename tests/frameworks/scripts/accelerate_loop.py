"""The accelerate README loop, written for a CUDA machine: ``Accelerator()`` picks the GPU
(``--mixed-precision fp16`` asks for fp16 autocast and a GradScaler; ``--cpu`` is
``Accelerator(cpu=True)``); ``accelerate launch --num_processes 2`` runs it data-parallel.

Stdout (main process only): ``device <accelerator.device>``, ``procs <num_processes>``,
``loss 1 <step> <float.hex()>`` per step (the mean over processes of each one's loss),
``params <float.hex()>`` (sum of the trained weights); what the loop logged through
``accelerator.log`` (a tracker passed as ``log_with``) as ``logged <key> <step> <float.hex()>``:
each step's gathered loss, and the epoch's mean of the process's losses accumulated on the
device as accelerate's tracking example does (``total_loss += loss.detach().float()``); the
trained parameters as ``param`` lines (fwreport.py).
"""

import argparse
import os
import sys

import fwreport
import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mixed-precision", default="no")
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()

    accelerator = Accelerator(mixed_precision=args.mixed_precision, cpu=args.cpu,
                              log_with=[fwreport.accelerate_tracker()])
    set_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.steps * 16, 16, generator=g)
    y = (x @ torch.randn(16, 1, generator=g)).squeeze(1) + 0.1 * torch.randn(x.size(0), generator=g)
    data = torch.utils.data.TensorDataset(x, y)
    # per-process batches of 16 // num_processes: the global batch is the same for 1 and 2 ranks
    loader = torch.utils.data.DataLoader(data, batch_size=16 // accelerator.num_processes,
                                         shuffle=False)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.init_trackers("accelerate_loop", config={"lr": 1e-2})
    if accelerator.is_main_process:
        print("device", accelerator.device)
        print("procs", accelerator.num_processes)

    model.train()
    total_loss = 0
    for step, (xb, yb) in enumerate(loader):
        optimizer.zero_grad()
        with accelerator.autocast():
            loss = F.mse_loss(model(xb).squeeze(1).float(), yb)
        accelerator.backward(loss)
        optimizer.step()
        total_loss += loss.detach().float()
        mean = accelerator.gather(loss.detach()[None]).mean().item()
        if accelerator.is_main_process:
            print(f"loss 1 {step} {mean.hex()}")
        accelerator.log({"loss": mean}, step=step)
    accelerator.log({"train_loss": total_loss.item() / len(loader)}, step=len(loader))
    total = sum(p.detach().float().sum() for p in accelerator.unwrap_model(model).parameters())
    if accelerator.is_main_process:
        print(f"params {total.item().hex()}")
        fwreport.params(accelerator.unwrap_model(model))
    accelerator.end_training()
    if accelerator.num_processes > 1:
        # torch's gloo process group can abort in interpreter teardown ("terminate called
        # without an active exception", seen natively under load, without dmlshim, like the
        # hang tests/corpus/dist/ddp_torchrun.py avoids): everything is printed, so leave
        # without the teardown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
