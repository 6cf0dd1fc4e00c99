"""The accelerate README loop, run by ``accelerate launch --num_processes 2`` (``--cpu`` is
``Accelerator(cpu=True)``, for a native reference on a machine without CUDA).

Stdout: the main process prints ``procs <num_processes> device <accelerator.device>`` and ``loss 1 <step> <hex>`` per step
(the mean over processes of each one's loss); every process prints ``params <rank> <sha1 of its
trained parameters>``.
"""

import argparse
import hashlib
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed


def say(line):
    # one write per line: the processes share stdout
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()

    accelerator = Accelerator(cpu=args.cpu)
    set_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.steps * 16, 16, generator=g)
    y = (x @ torch.randn(16, 1, generator=g)).squeeze(1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                         batch_size=16 // accelerator.num_processes)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if accelerator.is_main_process:
        say(f"procs {accelerator.num_processes} device {accelerator.device}")
    for step, (xb, yb) in enumerate(loader):
        optimizer.zero_grad()
        loss = F.mse_loss(model(xb).squeeze(1), yb)
        accelerator.backward(loss)
        optimizer.step()
        mean = accelerator.gather(loss.detach()[None]).mean().item()
        if accelerator.is_main_process:
            say(f"loss 1 {step} {mean.hex()}")
    params = accelerator.unwrap_model(model).parameters()
    flat = torch.cat([p.detach().cpu().reshape(-1) for p in params])
    say(f"params {accelerator.process_index} {hashlib.sha1(flat.numpy().tobytes()).hexdigest()}")
    accelerator.end_training()
    # as tests/corpus/dist/ddp_torchrun.py: gloo can hang or abort in interpreter teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
