"""TensorBoard logging in a CUDA training script: ``SummaryWriter.add_graph(model, x)`` (which
traces the model with ``torch.jit.trace``; the trace check calls ``.double()``), ``add_scalar``
per step, into ``--logdir`` (``--device cpu``: the same run told to use the CPU).

Stdout: ``device <device>``, ``loss 1 <step> <float.hex()>``, ``graph <nodes in the logged
GraphDef>``, ``events <number of event files>``; the scalars read back from the event files
(``EventAccumulator``: the loss and the gradient norm, as float32 in the events) as ``logged
<tag> <step> <float.hex()>``, and the trained parameters as ``param`` lines (fwreport.py).
"""

import argparse
from pathlib import Path

import fwreport
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.tensorboard import SummaryWriter


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--logdir", default="tb")
    parser.add_argument("--model", choices=("cnn", "mlp"), default="cnn")
    args = parser.parse_args()

    device = torch.device(args.device)
    torch.manual_seed(0)
    if args.model == "cnn":
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    else:
        model = nn.Sequential(nn.Flatten(), nn.Linear(192, 16), nn.ReLU(), nn.Linear(16, 4))
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 3, 8, 8, generator=g).to(device)
    y = torch.randint(0, 4, (16,), generator=g).to(device)
    print("device", device)

    writer = SummaryWriter(args.logdir)
    model.eval()
    writer.add_graph(model, x[:2])
    model.train()
    for step in range(4):
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        # a tensor scalar: add_scalar reads it back itself
        writer.add_scalar("grad_norm", torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0),
                          step)
        optimizer.step()
        writer.add_scalar("loss", loss.item(), step)
        print(f"loss 1 {step} {loss.item().hex()}")
    writer.close()

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(args.logdir)
    acc.Reload()
    print("graph", len(acc.Graph().node))
    print("events", len(list(Path(args.logdir).glob("events.out.tfevents.*"))))
    for tag in acc.Tags()["scalars"]:
        for event in acc.Scalars(tag):
            fwreport.log(tag, event.step, event.value)
    fwreport.params(model)


if __name__ == "__main__":
    main()
